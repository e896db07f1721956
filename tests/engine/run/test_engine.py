"""profile_components end to end: statuses, order, tree shapes, inputs and outputs."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch
from torch import nn

from cb_callback import COLUMNS, BenchmarkConfig, Report, profile_components
from tests.conftest import FAST


class Shared(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(8, 8)
        self.dec = nn.Sequential(self.enc, nn.ReLU())  # "dec.0" is the same module as "enc"
        self.unused = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dec(self.enc(x))


def test_columns_are_the_contract() -> None:
    report = profile_components(nn.Linear(4, 2), (torch.randn(3, 4),), **FAST)
    assert list(report.to_dataframe().columns) == [
        "path",
        "module_type",
        "depth",
        "parent",
        "status",
        "error",
        "note",  # issue 8: what is not an error ("estimated from 2 of 2 children") moved out of error
        "calls",
        "fwd_ms",
        "bwd_ms",
        "total_ms",
        "cpu_ms",
        "device_ms",
        "fwd_flops",
        "bwd_flops",
        "tflops",
        "mfu",
        "params_mb",
        "activation_mb",
        "peak_mem_mb",
        "bytes",
        "gbps",
        "bw_util",
        "intensity",
        "bound",
        "share",
        "noise",  # issue 7: appended after bound
        "compiled_ms",
        "compile_speedup",  # issue 10: the compile what-if, after noise
        "comm_bytes",  # issue 16: the collectives of the component, after compile_speedup
        "comm_ms",
        "insitu_ms",  # issue 17: the in-situ forward, after comm_ms
        "headroom_ms",  # issue 26: the time saved at the row's own roof, after insitu_ms
    ]
    assert list(COLUMNS) == list(report.to_dataframe().columns)


def test_shared_module_has_a_row_under_each_parent_with_its_calls_there() -> None:
    # enc is called once by the root itself and once inside dec (as dec.0): one row under each
    # parent with the calls made there (issue 14: before, one row "enc" with 2 calls, which the
    # parent check then divided by the root's 1 call), each measured on its first call there.
    # descend="all": both rows replayed whatever the in-situ times (beside two CPU hogs the default triage
    # left enc in situ)
    report = profile_components(Shared(), (torch.randn(2, 8),), descend="all", **FAST)
    enc, dec0 = report.row("enc"), report.row("dec.0")
    assert (enc.calls, dec0.calls) == (1, 1)
    assert enc.status == dec0.status == "ok"
    assert (enc.parent, dec0.parent) == ("", "dec")
    assert enc.details["shared_with"] == ["dec.0"] and dec0.details["shared_with"] == ["enc"]
    assert enc.fwd_flops == dec0.fwd_flops == 2 * 2 * 8 * 8  # the same Linear(8, 8) on [2, 8]
    assert report.row("dec.1").calls == 1
    assert report.row("unused").status == "not_run"
    assert report.children("dec") == [report.row("dec.0"), report.row("dec.1")]


def test_rows_are_breadth_first_in_execution_order() -> None:
    class Reversed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Sequential(nn.Linear(4, 4))
            self.b = nn.Sequential(nn.Linear(4, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.a(self.b(x))  # b runs first

    report = profile_components(Reversed(), (torch.randn(2, 4),), **FAST)
    assert [r.path for r in report] == ["", "b", "a", "b.0", "a.0"]
    assert [r.depth for r in report] == [0, 1, 1, 2, 2]
    assert [r.parent for r in report] == [None, "", "", "b", "a"]


class Fragile(nn.Module):
    """Works in the real step, raises when replayed (its second and later calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.n = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.n += 1
        if self.n > 1:
            raise RuntimeError("boom in isolation")
        return self.inner(x)


def test_a_component_that_raises_is_estimated_from_its_children() -> None:
    model = nn.Sequential(Fragile(), nn.Linear(4, 2))
    report = profile_components(model, (torch.randn(3, 4),), **FAST)
    frag, inner = report.row("0"), report.row("0.inner")
    assert inner.status == "ok"
    assert frag.status == "estimated"
    assert "RuntimeError: boom in isolation" in (frag.error or "")
    assert frag.fwd_flops == inner.fwd_flops == 2 * 3 * 4 * 4
    assert frag.fwd_ms == inner.fwd_ms and frag.bwd_ms == inner.bwd_ms
    # The root replays Fragile too, so it fails and is estimated from "0" and "1".
    root = report.row("")
    assert root.status == "estimated"
    assert root.fwd_flops == 2 * 3 * 4 * 4 + 2 * 3 * 4 * 2


def test_a_leaf_that_raises_is_failed_and_the_run_goes_on() -> None:
    class Bad(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.n = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.n += 1
            if self.n > 1:
                raise ValueError("nope")
            return x

    model = nn.Sequential(nn.Linear(4, 4), Bad())
    report = profile_components(model, (torch.randn(2, 4),), **FAST)
    assert report.row("1").status == "failed"
    assert report.row("1").error == "replay raised ValueError: nope"
    assert report.row("0").status == "ok"
    assert report.row("").status == "estimated"
    assert "missing: 1" in (report.row("").note or "")


def test_container_never_called_is_estimated_with_weighted_calls() -> None:
    class Looped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(3):
                x = self.layers[0](x)
            return self.layers[1](x)

    # descend="all": both layers replayed whatever the in-situ times (the default triage may leave one in situ)
    report = profile_components(Looped(), (torch.randn(2, 4),), descend="all", **FAST)
    lst = report.row("layers")
    assert lst.status == "estimated" and lst.calls == 0
    # a container is estimated as a matter of course: no error, and a note that says how
    assert lst.error is None
    assert lst.note == "never called itself (a container); estimated from 2 of 2 children"
    assert report.row("layers.0").calls == 3
    # 3 calls of layers.0 + 1 of layers.1, each 2*2*4*4 = 64 FLOPs forward
    assert lst.fwd_flops == 4 * 64
    assert lst.fwd_ms == pytest.approx(3 * report.row("layers.0").fwd_ms + report.row("layers.1").fwd_ms)


def test_inplace_op_after_capture_does_not_change_the_captured_input() -> None:
    class InPlace(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4, bias=False)
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.lin(x)
            h = self.relu(h)  # in place on lin's output, after relu's capture copied it
            return h + 1

    from cb_callback import Capture

    model = InPlace()
    x = torch.randn(2, 4)
    with Capture(model) as cap:
        expected = model.lin(x).detach().clone()
        model(x)
    assert torch.equal(cap.calls["relu"].args[0], expected)  # taken before relu_ ran
    report = profile_components(model, (x,), **FAST)
    assert all(r.status == "ok" for r in report)  # ReLU(inplace) replays on a leaf's clone


def test_kwargs_only_inputs() -> None:
    class Kw(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, *, x: torch.Tensor, scale: float) -> torch.Tensor:
            return self.lin(x) * scale

    report = profile_components(Kw(), kwargs={"x": torch.randn(2, 4), "scale": 2.0}, **FAST)
    assert report.row("").status == "ok"
    assert report.row("").fwd_flops == 2 * 2 * 4 * 4


def test_int_only_inputs_embedding() -> None:
    ids = torch.randint(0, 100, (4, 5))
    report = profile_components(nn.Embedding(100, 8), (ids,), **FAST)
    row = report.row("")
    assert row.status == "ok"
    assert row.bwd_ms > 0.0  # the weight still gets a gradient although no input can
    assert "no_backward" not in row.details


Pair = namedtuple("Pair", ["a", "b"])


@pytest.mark.parametrize(
    "wrap",
    [
        lambda a, b: {"a": a, "b": b},
        lambda a, b: (a, b),
        lambda a, b: Pair(a, b),
    ],
    ids=["dict", "tuple", "namedtuple"],
)
def test_structured_outputs(wrap) -> None:  # type: ignore[no-untyped-def]
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l1 = nn.Linear(4, 3)
            self.l2 = nn.Linear(4, 5)

        def forward(self, x: torch.Tensor):  # type: ignore[no-untyped-def]
            return wrap(self.l1(x), self.l2(x))

    row = profile_components(Two(), (torch.randn(2, 4),), **FAST).row("")
    assert row.status == "ok"
    assert row.fwd_flops == 2 * 2 * 4 * 3 + 2 * 2 * 4 * 5
    assert row.bwd_flops == 2 * 3 * 2 * 4 + 2 * 5 * 2 * 4  # dW of each (x needs no grad)


def test_outputs_without_grad_have_no_backward() -> None:
    class Argmax(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.argmax(-1)

    row = profile_components(Argmax(), (torch.randn(2, 4, requires_grad=True),), **FAST).row("")
    assert row.status == "ok"
    assert row.bwd_ms == 0.0 and row.bwd_flops == 0.0
    assert row.details["no_backward"] == "no output requires grad"


def test_exclude_include_and_depth() -> None:
    model = nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), nn.Linear(4, 2))
    x = torch.randn(2, 4)
    # descend="all": which rows are skipped is the patterns' and the depth's alone (the default triage
    # would add the small leaves a busy machine's in-situ times read negligible)
    report = profile_components(model, (x,), exclude=["0.*"], descend="all", **FAST)
    assert report.row("0.0").status == "skipped"
    assert report.row("0.0").note == "matched exclude pattern '0.*'"
    assert report.row("0").status == "ok"
    shallow = profile_components(model, (x,), max_depth=1, descend="all", **FAST)
    assert [r.path for r in shallow] == ["", "0", "1"]
    only = profile_components(model, (x,), include=["1"], descend="all", **FAST)
    # the root leads to "1", so it is profiled too (issue 7: include keeps ancestors)
    assert [r.status for r in only] == ["ok", "skipped", "ok", "skipped", "skipped"]


def test_time_budget_skips_the_rest() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    report = profile_components(model, (torch.randn(2, 4),), max_total_time_s=0.0, **FAST)
    assert {r.status for r in report} == {"skipped"}
    assert (report.row("").note or "").startswith("max_total_time_s=0 reached: ")


def test_batch_size_replicates_inputs() -> None:
    lin = nn.Linear(4, 4)
    report = profile_components(lin, (torch.randn(2, 4),), batch_size=8, **FAST)
    assert report.row("").fwd_flops == 2 * 8 * 4 * 4  # replayed on 8 rows, not the captured 2
    assert report.metadata["captured_batch_size"] == 2


def test_unknown_option_and_bad_values_raise_value_error() -> None:
    with pytest.raises(ValueError, match="unknown option"):
        profile_components(nn.Linear(2, 2), (torch.randn(1, 2),), max_dpeth=1)
    with pytest.raises(ValueError, match=r"BenchmarkConfig.warmup=-1 is invalid"):
        profile_components(nn.Linear(2, 2), (torch.randn(1, 2),), warmup=-1)
    with pytest.raises(ValueError, match=r"BenchmarkConfig.min_run_time_s='1' is invalid"):
        BenchmarkConfig(min_run_time_s="1")  # type: ignore[arg-type]


def test_metadata_and_round_trip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # big enough (2·256·512·512 = 134 MFLOP forward) to stay clear of the harness floor, where no rate is derived
    report = profile_components(nn.Linear(512, 512), (torch.randn(256, 512),), peak_flops=1e12, **FAST)
    md = report.metadata
    assert md["device"] == "cpu" and md["dtype"] == "fp32"
    assert md["peaks"]["flops"] == 1e12 and md["peaks"]["flops_source"] == "user"
    assert md["peaks"]["bandwidth_source"] == "measured"
    assert md["versions"]["torch"] == torch.__version__
    assert md["config"]["peak_flops"] == 1e12
    row = report.row("")
    assert row.mfu == pytest.approx((row.fwd_flops + row.bwd_flops) / (row.total_ms / 1e3) / 1e12)
    back = Report.load(report.save(tmp_path))
    assert back.to_dataframe().equals(report.to_dataframe())


def test_params_mb_is_exact_and_unique() -> None:
    report = profile_components(Shared(), (torch.randn(2, 8),), **FAST)
    # enc: 8*8 weight + 8 bias floats = 72 * 4 bytes; shared by dec, counted once in the root
    assert report.row("enc").params_mb == 72 * 4 / 2**20
    assert report.row("").params_mb == (72 + 9 + 3) * 4 / 2**20


def test_an_unused_child_is_not_missing_from_an_estimate() -> None:
    class WithUnused(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used = nn.ModuleList([nn.Linear(4, 4)])
            self.unused = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.used[0](x)

    model = nn.Sequential(Fragile(), WithUnused())
    report = profile_components(model, (torch.randn(2, 4),), **FAST)
    assert report.row("1.unused").status == "not_run"
    # the root's own replay raised (an error); it is estimated from both children (a note)
    assert report.row("").error == "replay raised RuntimeError: boom in isolation"
    assert report.row("").note == "estimated from 2 of 2 children"


def test_parameter_holders_are_not_components() -> None:
    class Cross(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.kernels = nn.ParameterList([nn.Parameter(torch.randn(4, 4)) for _ in range(2)])
            self.out = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for w in self.kernels:
                x = x @ w
            return self.out(x)

    report = profile_components(Cross(), (torch.randn(3, 4),), **FAST)
    assert [r.path for r in report] == ["", "out"]
    assert all(r.status == "ok" for r in report)
    root = report.row("")
    assert root.params_mb == (2 * 16 + 8 + 2) * 4 / 2**20  # the kernels count in the parent
    assert root.fwd_flops == 2 * (2 * 3 * 4 * 4) + 2 * 3 * 4 * 2
