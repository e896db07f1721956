"""The compile what-if (issue 10 §1): each component compiled alone, timed like its eager run.

Most tests compile with the ``eager``/``aot_eager`` backends (dynamo and
AOTAutograd without inductor's code generation: fractions of a second); the
fusion test uses inductor's C++ backend, as a user on CPU would.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch
import torch._dynamo
from torch import nn
from torch._dynamo.utils import counters

from cb_callback import BenchmarkConfig, compare_components, profile_components
from cb_callback._report.model import ComponentRow, Report
from cb_callback._report.numbers import sig
from cb_callback._whatif.compile import children_separately
from tests.conftest import FAST

EAGER = {"backend": "eager"}


class Chain(nn.Module):
    """Ten elementwise ops: eager reads and writes the tensor ten times, fused once."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(5):
            x = torch.sin(x) * 1.01 + 0.1
        return x


class Break(nn.Module):
    """A Linear, a forced graph break, the Linear again."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.lin(x).relu()
        torch._dynamo.graph_break()
        return self.lin(x)


def _info(report: Report, path: str) -> dict[str, Any]:
    info = report.row(path).details["compile"]
    assert isinstance(info, dict)
    return info


@pytest.mark.slow
def test_fused_elementwise_chain_compiles_whole_with_the_same_outputs() -> None:
    # 256 x 4096 fp32 = 4 MiB, beyond the L2 of this class of machine: eager makes 15 passes
    # over it in the forward (sin, mul, add per step) and more in the backward; inductor fuses
    # the forward into one loop and the backward into a few. How much faster that is, is a
    # benchmark's question (benchmarks/compile_whatif.py, docs/benchmarks.md): here 3-5x alone,
    # 1.37x and 1.13x inside the whole suite on a busy machine, so no timing margin is asserted.
    # What is exact: one graph, no break, the same outputs, and the speedup column's definition.
    model = Chain()
    x = torch.randn(256, 4096, requires_grad=True)
    before = model(x)
    report = profile_components(
        model, (x,), compile=True, warmup=1, min_run_time_s=0.05, min_repeats=5, load_plugins=False
    )
    row, info = report.row(""), _info(report, "")
    assert row.status == "ok" and "error" not in info, info
    assert info["graphs"] >= 1 and info["graph_breaks"] == 0 and info["recompiles"] == 0
    assert info["outputs_close"] is True and info["max_abs_error"] <= 1e-5
    assert info["eager_ms_same_rounds"] > 0 and row.compiled_ms > 0, info
    assert row.compile_speedup == pytest.approx(row.total_ms / row.compiled_ms)
    assert math.isfinite(info["bwd_ms"]) and info["compile_s"] > 0
    assert "compiling root whole:" in report.summary()
    torch.testing.assert_close(model(x), before, rtol=0, atol=0)


def test_a_forced_graph_break_is_counted_with_its_reason_and_place() -> None:
    report = profile_components(Break(), (torch.randn(4, 8),), compile=True, compile_options=EAGER, **FAST)
    info = _info(report, "")
    assert report.row("").status == "ok" and "error" not in info, info
    # explain: one break, so two graphs (before and after it); the warm-up compiles the same two
    assert info["graph_breaks"] == 1 and info["graphs"] == 2
    (reason,) = info["break_reasons"]
    assert "graph_break()" in reason["reason"] and reason["count"] == 1
    assert reason["where"].endswith(f"{__file__.rsplit('/', 1)[-1]}:{Break.forward.__code__.co_firstlineno + 2}")
    assert math.isfinite(report.row("").compiled_ms)
    # the Linear alone has no break
    assert _info(report, "lin")["graph_breaks"] == 0


def test_a_component_that_cannot_compile_keeps_its_eager_row() -> None:
    model = nn.Sequential(nn.Linear(8, 8), Break())
    report = profile_components(
        model, (torch.randn(4, 8),), compile=True, compile_options={**EAGER, "fullgraph": True}, **FAST
    )
    # fullgraph=True turns the break into an error for the two components that contain it
    for path in ("", "1"):
        row, info = report.row(path), _info(report, path)
        assert row.status == "ok" and row.error is None and math.isfinite(row.total_ms)
        assert math.isnan(row.compiled_ms) and math.isnan(row.compile_speedup)
        assert "graph_break" in info["error"] or "Unsupported" in info["error"], info["error"]
    for path in ("0", "1.lin"):
        assert "error" not in _info(report, path) and math.isfinite(report.row(path).compiled_ms)
    summary = report.summary()
    assert "could not compile root: " in summary and "could not compile 1: " in summary


def test_nothing_is_compiled_when_compile_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*a: Any, **k: Any) -> Any:
        raise AssertionError("torch.compile called with compile=False")

    monkeypatch.setattr(torch, "compile", refuse)
    report = profile_components(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), (torch.randn(2, 4),), **FAST)
    assert all("compile" not in r.details and math.isnan(r.compiled_ms) for r in report)
    assert "compile what-if" not in report.summary()


def test_compile_top_takes_the_most_expensive_first() -> None:
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU())
    report = profile_components(
        model, (torch.randn(32, 64),), compile=True, compile_top=2, compile_options=EAGER, **FAST
    )
    compiled = [r.path for r in report if "compile" in r.details]
    by_cost = sorted(report, key=lambda r: -r.total_ms * r.calls)
    assert compiled and sorted(compiled) == sorted(r.path for r in by_cost[:2])
    assert "" in compiled  # the root costs at least as much as any one child


def test_compile_respects_max_total_time_s() -> None:
    # A budget of 1 ns: the root is always measured, nothing else is, and no compile starts.
    report = profile_components(
        nn.Sequential(nn.Linear(4, 4)), (torch.randn(2, 4),), compile=True, compile_options=EAGER,
        max_total_time_s=1e-9, **FAST,
    )  # fmt: skip
    assert report.row("").status == "ok"
    assert _info(report, "")["skipped"].startswith("max_total_time_s=1e-09 spent")
    assert math.isnan(report.row("").compiled_ms)


def test_the_users_torch_compile_starts_clean_afterwards() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    x = torch.randn(2, 4)
    profile_components(model, (x,), compile=True, compile_options=EAGER, **FAST)
    # Without the reset, the user's compile of the same module would hit the what-if's cache
    # entries (same code object, same guards) and compile no new graph.
    graphs = counters["stats"]["unique_graphs"]
    torch.compile(model, backend="eager")(x)
    assert counters["stats"]["unique_graphs"] == graphs + 1
    torch._dynamo.reset()


def test_state_and_rng_are_restored_after_compiled_replays() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 2)).train()
    x = torch.randn(16, 8)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    # descend_share=0: every row replayed and compiled (the triage's choice follows the machine's load)
    opts = dict(compile=True, compile_options={"backend": "aot_eager"}, descend_share=0.0)
    report = profile_components(model, (x,), **opts, **FAST)
    assert all(r.status == "ok" and "error" not in r.details["compile"] for r in report)
    for k, v in model.state_dict().items():  # BatchNorm statistics, num_batches_tracked
        assert torch.equal(v, state[k]), k
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in model.parameters())
    # aot_eager draws dropout's mask from the same RNG: seeded alike, the outputs match
    assert _info(report, "2")["outputs_close"] is True


def test_an_encoder_layer_with_kwargs_compiles_per_component() -> None:
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    x = torch.randn(2, 5, 16)
    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[1, 3:] = True
    report = profile_components(
        model, (x,), {"src_key_padding_mask": mask}, compile=True, compile_options={"backend": "aot_eager"},
        max_depth=2, **FAST,
    )  # fmt: skip
    ok = [r for r in report if r.status == "ok"]
    assert ok and all("compile" in r.details for r in ok)
    failed = {r.path: r.details["compile"]["error"] for r in ok if "error" in r.details["compile"]}
    assert not failed, failed
    assert all(r.details["compile"]["outputs_close"] for r in ok)


def test_children_separately_keeps_the_parents_own_time_eager() -> None:
    parent = ComponentRow("p", "P", 0, None, status="ok", calls=1, total_ms=10.0, compiled_ms=4.0)
    a = ComponentRow("p.a", "A", 1, "p", status="ok", calls=2, total_ms=3.0, compiled_ms=2.0)
    b = ComponentRow("p.b", "B", 1, "p", status="ok", calls=1, total_ms=2.0)  # not compiled
    # 10 − (3 − 2) × 2 calls ÷ 1 parent call = 8; b stays eager (a has no what-if rounds: its total_ms)
    assert children_separately(parent, [a, b]) == {"children_separately_ms": 8.0, "children_compiled": "1/2"}
    a.details["compile"] = {"eager_ms_same_rounds": 3.5}  # eager measured in the compiled runs' rounds
    # 10 − (3.5 − 2) × 2 = 7
    assert children_separately(parent, [a, b]) == {"children_separately_ms": 7.0, "children_compiled": "1/2"}
    assert children_separately(parent, [b]) is None


def test_the_summary_sets_whole_against_children_separately() -> None:
    model = nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 32))
    # descend="all": the 3 children are replayed (and compiled) whatever the in-situ times the triage reads
    report = profile_components(
        model, (torch.randn(8, 32),), compile=True, compile_options=EAGER, descend="all", **FAST
    )
    root = report.row("")
    sep = root.details["compile"]["children_separately_ms"]
    kids = report.children("")
    assert root.details["compile"]["children_compiled"] == "3/3"
    # each child's saving against its eager runs of the same rounds as its compiled ones
    assert sep == pytest.approx(
        root.total_ms - sum(k.details["compile"]["eager_ms_same_rounds"] - k.compiled_ms for k in kids)
    )
    line = next(x for x in report.summary().splitlines() if "compiling root whole" in x)
    assert f"{sig(root.total_ms)} -> {sig(root.compiled_ms)} ms" in line  # 3 significant figures (numbers.sig)
    assert f"its children separately: {sig(root.total_ms)} -> {sig(sep)} ms (3/3 compiled)" in line


def test_compare_components_compiles_both_sides() -> None:
    ref = nn.Linear(16, 1)

    class Gemv(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(1, 16))
            self.bias = nn.Parameter(torch.randn(1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x * self.weight).sum(-1, keepdim=True) + self.bias

    x = torch.randn(32, 16, requires_grad=True)
    cmp = compare_components(ref, Gemv(), ((x,), {}), compile=True, compile_options=EAGER, **FAST)
    assert cmp.equivalent
    assert all(math.isfinite(r.compiled_ms) for r in cmp.rows)
    assert "compiled_ms" in cmp.summary()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"compile_options": {"backnd": "eager"}}, "compile_options"),
        ({"compile_top": 0}, "compile_top"),
        ({"compile": "yes"}, "compile="),
    ],
)
def test_compile_options_are_validated(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BenchmarkConfig(**options)


@pytest.mark.parametrize(("dynamic", "recompiles"), [(None, 1), (False, 2)])
def test_new_shapes_in_later_batches_count_as_recompiles(dynamic: bool | None, recompiles: int) -> None:
    # Three batch sizes. By default the second shape makes dynamo recompile once with a dynamic
    # batch dimension, which the third reuses; dynamic=False specialises every shape: two more.
    batches = [torch.randn(n, 8) for n in (2, 4, 8)]
    options: dict[str, Any] = {**EAGER, **({} if dynamic is None else {"dynamic": dynamic})}
    report = profile_components(nn.Linear(8, 8), batches=batches, compile=True, compile_options=options, **FAST)
    info = _info(report, "")
    assert "error" not in info, info
    assert info["recompiles"] == recompiles
    assert [b["batch"] for b in info["batches"]] == [0, 1, 2]
    # the compiled time of the batch the row is (its median batch), so the speedup compares one batch
    row = report.row("")
    (mine,) = [b for b in info["batches"] if b["batch"] == row.details["median_batch"]]
    # Net of the harness floor, as total_ms is (details["compile"] keeps the raw what-if times).
    floor = row.details["floor_ms"]
    net = max(mine["compiled_ms"] - floor["fwd"] - floor["bwd"], 0.0)
    assert row.compiled_ms == net and row.compile_speedup == row.total_ms / net


class _Masked(nn.Module):
    """Scores with ``-inf`` where masked (as attention builds them before the softmax)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ x.transpose(-1, -2)).masked_fill(torch.ones(4, 4).triu(1).bool(), float("-inf"))


def test_equal_infinities_count_as_close() -> None:
    report = profile_components(_Masked(), (torch.randn(4, 3),), compile=True, compile_options=EAGER, **FAST)
    info = _info(report, "")
    assert info["outputs_close"] is True and info["max_abs_error"] == 0.0


def test_children_separately_looks_through_a_module_list() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(16, 16), nn.Linear(16, 16)])
            self.head = nn.Linear(16, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for b in self.blocks:
                x = b(x)
            return self.head(x)

    # descend="all": every child is a candidate whatever the in-situ times make of the triage (a busy
    # machine's triage left one of the three leaves unreplayed: 2/2)
    report = profile_components(
        Net(), (torch.randn(8, 16),), compile=True, compile_options=EAGER, descend="all", **FAST
    )
    assert report.row("blocks").status == "estimated"  # a container: never called itself
    info = _info(report, "")
    assert info["children_compiled"] == "3/3"  # blocks.0, blocks.1 (through the ModuleList) and head
    leaves = [report.row(p) for p in ("blocks.0", "blocks.1", "head")]
    root = report.row("")
    assert info["children_separately_ms"] == pytest.approx(
        root.total_ms - sum(r.details["compile"]["eager_ms_same_rounds"] - r.compiled_ms for r in leaves)
    )


def test_more_shapes_than_dynamos_recompile_limit_are_still_compiled() -> None:
    # dynamic=False over 10 batch sizes: one graph each. Past dynamo's recompile limit (8) the
    # later shapes would silently run eagerly; the what-if raises the limit while it runs.
    batches = [torch.randn(n, 8) for n in range(1, 11)]
    report = profile_components(
        nn.Linear(8, 8), batches=batches, compile=True, compile_options={**EAGER, "dynamic": False}, **FAST
    )
    info = _info(report, "")
    assert [b["graphs"] for b in info["batches"]] == [1] * 10
    assert info["recompiles"] == 9
    import torch._dynamo.config as dc

    assert dc.recompile_limit == 8  # restored


def test_the_output_check_never_touches_the_global_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    # torch.manual_seed would also queue a seed for CUDA devices not initialised yet,
    # which the engine's RNG guard cannot undo.
    def refuse(seed: int) -> Any:
        raise AssertionError("torch.manual_seed called")

    monkeypatch.setattr(torch, "manual_seed", refuse)
    report = profile_components(nn.Linear(4, 4), (torch.randn(2, 4),), compile=True, compile_options=EAGER, **FAST)
    assert _info(report, "")["outputs_close"] is True


def test_compile_stops_when_the_longest_what_if_no_longer_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from cb_callback._engine.run.extensions import EXTENSIONS

    def slow(items: Any, sampler: Any, **kwargs: Any) -> tuple[float, dict[str, Any]]:
        time.sleep(2.0)
        return 1.0, {"fake": True}

    monkeypatch.setattr(EXTENSIONS, "compile_what_if", slow)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    # The eager part (the census, the in-situ pass, the replays) takes well under a second here, more than
    # one on a busy machine; the first what-if (2 s) starts as long as the eager part took under 4 s;
    # then 2 s more would always pass 4 s.
    # descend="all": every row is a what-if candidate (the default triage can leave a leaf in situ on a
    # busy machine, and it would have no "compile" entry at all)
    report = profile_components(model, (torch.randn(2, 4),), compile=True, max_total_time_s=4.0, descend="all", **FAST)
    infos = [r.details["compile"] for r in sorted(report, key=lambda r: -r.total_ms * r.calls)]
    assert infos[0] == {"fake": True}
    assert all("longest compile what-if so far" in i["skipped"] for i in infos[1:]), infos


@dataclasses.dataclass
class _Out:
    logits: torch.Tensor
    steps: int


class _DataclassHead(nn.Module):
    """Returns a plain ``@dataclass`` (not registered with pytree), as LLM blocks often do."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> _Out:
        return _Out(self.lin(x), 3)


def test_a_dataclass_output_has_its_backward_and_compiles() -> None:
    report = profile_components(_DataclassHead(), (torch.randn(2, 4),), compile=True, compile_options=EAGER, **FAST)
    row = report.row("")
    # Linear(4, 4) on 2 rows: 2·2·4·4 forward; backward: the weight's gradient only (x needs none)
    assert row.fwd_flops == row.bwd_flops == 2 * 2 * 4 * 4
    assert "no_backward" not in row.details
    info = _info(report, "")
    assert "error" not in info and info["outputs_close"] is True


def test_outputs_that_differ_compiled_are_said_in_the_summary() -> None:
    def off_by_one_percent(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        def run(*args: Any) -> Any:
            return [t * 1.01 if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in gm(*args)]

        return run

    report = profile_components(
        nn.Sequential(nn.Linear(4, 4)), (torch.randn(2, 4),), compile=True,
        compile_options={"backend": off_by_one_percent}, **FAST,
    )  # fmt: skip
    info = _info(report, "")
    assert info["outputs_close"] is False and info["max_abs_error"] > 0
    assert "outputs differ from eager (max abs error" in report.summary()


def test_compare_components_opens_dataclass_outputs() -> None:
    ref, cand = _DataclassHead(), _DataclassHead()
    cmp = compare_components(ref, cand, ((torch.randn(2, 4),), {}), **FAST)
    names = [t.name for t in cmp.tensors]
    assert cmp.equivalent and "output[0]" in names and "grad[lin.weight]" in names  # the logits, and their grads


def test_a_saved_report_with_a_non_finite_output_error_still_summarises(tmp_path: Any) -> None:
    def to_nan(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        def run(*args: Any) -> Any:
            return [t * math.nan if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in gm(*args)]

        return run

    report = profile_components(
        nn.Linear(4, 4), (torch.randn(2, 4),), compile=True, compile_options={"backend": to_nan}, **FAST
    )
    assert _info(report, "")["max_abs_error"] == math.inf
    loaded = Report.load(report.save(tmp_path))
    assert loaded.row("").details["compile"]["max_abs_error"] is None  # JSON has no inf
    assert "outputs differ from eager (max abs error -)" in loaded.summary()


class _LongOnly(nn.Module):
    """``a`` always; ``b`` only for sequences longer than 8."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(256, 256)
        self.b = nn.Linear(256, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        return self.b(x) if x.shape[1] > 8 else x


def test_children_separately_uses_the_parents_batch_only() -> None:
    # batches of length 2, 4 and 2048: the root's median batch is a short one, where b did not run
    batches = [torch.randn(1, n, 256) for n in (2, 4, 2048)]
    # a warm-up run and the median of 3: one cold first run (7.7 ms for the 2-row batch once, on a busy
    # machine) must not make a short batch look like the long one
    opts = {**FAST, "warmup": 1, "min_repeats": 3, "max_repeats": 3}
    report = profile_components(_LongOnly(), batches=batches, compile=True, compile_options=EAGER, **opts)
    root, a = report.row(""), report.row("a")
    mid = root.details["median_batch"]
    # 2048 rows through two Linear(256, 256), ~1 GFLOP with the backward, is never the median
    assert mid in (0, 1), root.details["batches"]
    info = _info(report, "")
    assert info["children_compiled"] == "1/1"  # only a ran in that batch
    (ab,) = [p for p in a.details["compile"]["batches"] if p["batch"] == mid]
    assert info["children_separately_ms"] == pytest.approx(
        root.total_ms - (ab["eager_ms_same_rounds"] - ab["compiled_ms"])
    )


# --- issue 14 §1: the output check shares compare_components' closeness rule and the module's state ---


class _Counter(nn.Module):
    """Counts its calls in a buffer: ``n += 1; return x * n``."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("n", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.n += 1
        return x * self.n


def test_a_module_counting_its_calls_compiles_with_the_same_outputs_and_is_left_as_it_was() -> None:
    model = _Counter()
    model.n.fill_(5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = profile_components(model, (torch.ones(2, 3),), compile=True, compile_options=EAGER, **FAST)
    info = _info(report, "")
    # Both forwards of the check start from the same count c: both return ones * (c + 1), error 0.
    # (Before: the compiled forward saw c + 1 and returned ones * (c + 2): max abs error 1.)
    assert "error" not in info and info["outputs_close"] is True
    assert info["max_abs_error"] == 0.0 and info["max_rel_error"] == 0.0
    after = model.state_dict()
    assert after.keys() == before.keys()
    for k, v in before.items():  # bit-identical: the counter still reads 5
        assert after[k].dtype == v.dtype and torch.equal(after[k], v), k
    assert int(model.n) == 5


def _replays(module: nn.Module, *args: Any) -> Any:
    from cb_callback._engine.capture.inputs import ComponentInputs
    from cb_callback._engine.replay.isolate import Replay

    return Replay(module, ComponentInputs(args=args, kwargs={}, training=False), device=torch.device("cpu"))


def test_the_output_check_restores_the_state_between_and_after_its_forwards() -> None:
    from cb_callback._whatif.compile import outputs_agree

    model = _Counter()
    eager = _replays(model, torch.ones(2, 3))
    # The module itself stands in for the compiled call: same ops, so any difference is the state.
    got = outputs_agree(eager, eager.with_call(model), seed=0)
    assert got == {"outputs_close": True, "max_abs_error": 0.0, "max_rel_error": 0.0}
    assert int(model.n) == 0  # both forwards' increments undone


def test_an_infinity_replaced_by_a_number_is_an_error_of_inf_not_the_largest_float() -> None:
    def neginf_to_zero(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        def run(*args: Any) -> Any:
            return [t.nan_to_num(neginf=0.0) if isinstance(t, torch.Tensor) else t for t in gm(*args)]

        return run

    report = profile_components(_Masked(), (torch.randn(4, 3),), compile=True,
                                compile_options={"backend": neginf_to_zero}, **FAST)  # fmt: skip
    info = _info(report, "")
    # The masked scores are -inf eager, 0 "compiled": |0 - (-inf)| = inf (torch.nan_to_num's default
    # would clamp it to 1.797e308), relative error inf; never close.
    assert info["outputs_close"] is False
    assert info["max_abs_error"] == math.inf and info["max_rel_error"] == math.inf


def test_the_output_check_compares_int64_exactly_and_number_leaves_under_the_tolerances() -> None:
    from cb_callback._whatif.compile import outputs_agree

    class Hash(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 1

    x = torch.tensor([2**60], dtype=torch.int64)
    eager = _replays(Hash(), x)
    # 2**60 + 1 vs 2**60: equal in float64, 1 apart as integers; int64's tolerance is 0.
    got = outputs_agree(eager, eager.with_call(lambda t: t + 1), seed=0)
    assert got == {"outputs_close": False, "max_abs_error": 1.0, "max_rel_error": 2.0**-60}

    class WithAux(nn.Module):
        def forward(self, y: torch.Tensor) -> Any:
            return y * 1, 1.0

    aux = _replays(WithAux(), torch.ones(2))
    # A float leaf 1.0 vs 1.0 + 2**-30 (exact in a double): error 2**-30 ~ 9.3e-10, within fp32's
    # atol 1e-5 + rtol 1.3e-6 * 1: close, and the error is counted like a tensor's.
    near = outputs_agree(aux, aux.with_call(lambda y: (y * 1, 1.0 + 2**-30)), seed=0)
    assert near == {"outputs_close": True, "max_abs_error": 2.0**-30, "max_rel_error": 2.0**-30}
    # 1.0 vs 1.0 + 2**-10 (~9.8e-4 > 1e-5 + 1.3e-6): not close.
    far = outputs_agree(aux, aux.with_call(lambda y: (y * 1, 1.0 + 2**-10)), seed=0)
    assert far == {"outputs_close": False, "max_abs_error": 2.0**-10, "max_rel_error": 2.0**-10}
    # An int leaf against a float of the same value: the types differ, not close (error 0).
    kind = outputs_agree(aux, aux.with_call(lambda y: (y * 1, 1)), seed=0)
    assert kind == {"outputs_close": False, "max_abs_error": 0.0, "max_rel_error": 0.0}
