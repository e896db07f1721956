"""Many batches (issue 10 §3): each component measured on each batch, the row their median."""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any

import pytest
import torch
from torch import nn

from cb_callback import Capture, profile_components
from cb_callback._engine.capture.inputs import ComponentInputs
from cb_callback._engine.replay.batches import input_signature, merge_batches, p90
from cb_callback._report.model import ComponentRow
from cb_callback.reporters import format_table
from tests.conftest import FAST


def _totals(row: ComponentRow) -> list[float]:
    return [b["total_ms"] for b in row.details["batches"]]


def test_variable_sequence_lengths_give_per_batch_rows_and_their_median() -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    lengths = (4, 8, 16)
    batches = [((torch.randn(2, n, 16),), {}) for n in lengths]
    # descend="all": linear1 is replayed whatever the in-situ times (the default triage decides by them)
    report = profile_components(model, batches=batches, descend="all", **FAST)
    assert report.metadata["batches"] == 3
    lin = report.row("layers.0.linear1")  # Linear(16, 32) on (2, n, 16): 2·(2n)·16·32 FLOPs forward
    assert [b["shape"] for b in lin.details["batches"]] == [f"float32[2,{n},16]" for n in lengths]
    assert lin.details["shapes"] == [f"float32[2,{n},16]" for n in lengths]
    # backward: grad of the input and of the weight, 2 GEMMs of the forward's size each
    assert [b["flops"] for b in lin.details["batches"]] == [3 * 2 * (2 * n) * 16 * 32 for n in lengths]
    # the row is its median batch (by fwd + bwd): that batch's FLOPs, not another's
    assert lin.fwd_flops == 2 * (2 * lengths[lin.details["median_batch"]]) * 16 * 32
    for row in report:
        if row.status != "ok":
            continue
        totals = _totals(row)
        mid_batch = row.details["median_batch"]
        assert len(totals) == 3 and row.details["median_ms"] == statistics.median(totals) == totals[mid_batch]
        _low, mid, high = sorted(totals)
        assert row.details["p90_ms"] == pytest.approx(mid + (high - mid) * 0.8)  # 0.9 · (3 − 1) = 1.8
        assert row.fwd_ms == row.details["batches"][mid_batch]["fwd_ms"]
        assert row.total_ms == pytest.approx(row.details["median_ms"])
    assert "p90 ms" in report.summary() and "batches: 3" in report.summary()
    assert "| total ms | p90 ms |" in format_table(report)
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k


class _Router(nn.Module):
    """Routes the whole batch to the expert its ``which`` argument names (MoE-style)."""

    def __init__(self) -> None:
        super().__init__()
        self.experts = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])

    def forward(self, x: torch.Tensor, which: int) -> torch.Tensor:
        return self.experts[which](x)


def test_a_component_measured_only_on_the_batches_it_ran_in() -> None:
    x = torch.randn(3, 4)
    # descend="all": which rows the default replays follows the in-situ times (the machine's load)
    report = profile_components(_Router(), batches=[((x,), {"which": 0}), ((x,), {"which": 1})], descend="all", **FAST)
    e0, e1 = report.row("experts.0"), report.row("experts.1")
    assert e0.status == e1.status == "ok"
    assert [b["batch"] for b in e0.details["batches"]] == [0]
    assert [b["batch"] for b in e1.details["batches"]] == [1]
    assert e1.fwd_flops == 2 * 3 * 4 * 4 and e1.details["p90_ms"] == e1.details["median_ms"]
    assert [b["batch"] for b in report.row("").details["batches"]] == [0, 1]
    assert report.row("").details["shapes"] == ["float32[3,4]"]  # `which` is not a tensor


def test_kjts_of_different_lengths_are_told_apart() -> None:
    pytest.importorskip("torchrec")
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    ebc = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name=f"t_{k}", embedding_dim=8, num_embeddings=50, feature_names=[k])
                for k in ("a", "b")],
        device=torch.device("cpu"),
    )  # fmt: skip

    def kjt(lengths: list[int]) -> KeyedJaggedTensor:
        n = sum(lengths)
        return KeyedJaggedTensor.from_lengths_sync(
            keys=["a", "b"], values=torch.arange(n) % 50, lengths=torch.tensor(lengths)
        )

    # two samples per batch; per key a, then b
    short, long = kjt([1, 2, 1, 1]), kjt([5, 7, 6, 9])
    report = profile_components(ebc, batches=[((short,), {}), ((long,), {})], **FAST)
    root = report.row("")
    assert root.status == "ok"
    assert root.details["shapes"] == ["KJT(a:3,b:2)", "KJT(a:12,b:15)"]
    # bytes grow with the rows looked up: the long batch reads more
    assert len(root.details["batches"]) == 2


def test_merge_names_the_batch_that_failed_and_keeps_the_others() -> None:
    def row(status: str, fwd: float, error: str | None = None) -> ComponentRow:
        return ComponentRow("m", "M", 1, "", status=status, calls=1, fwd_ms=fwd, bwd_ms=1.0, error=error)

    merged = ComponentRow("m", "M", 1, "")
    batches = {0: row("ok", 2.0), 1: row("failed", math.nan, "RuntimeError: boom"), 2: row("ok", 4.0)}
    assert merge_batches(merged, batches, {}) == 0  # of totals 3 and 5 the lower middle: batch 0
    assert merged.status == "ok" and merged.fwd_ms == 2.0 and merged.bwd_ms == 1.0
    assert merged.error == "not measured on 1 of 3 batches (batch 1: RuntimeError: boom)"
    assert merged.details["median_ms"] == 3.0 and merged.details["p90_ms"] == pytest.approx(3.0 + 2.0 * 0.9)
    none = ComponentRow("m", "M", 1, "")
    merge_batches(none, {0: row("failed", math.nan, "E: a"), 1: row("failed", math.nan, "E: b")}, {})
    assert none.status == "failed" and none.error == "E: a"


class _Switch:
    """A flag in an object of its own: profiling restores a module's own attributes, not other objects."""

    on = False


class _FailsOnLong(nn.Module):
    """Raises in a replay of a batch longer than 8 (not in the capture forward, under the hooks)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.replaying = _Switch()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.replaying.on and x.shape[0] > 8:
            raise RuntimeError("too long")
        return self.lin(x)


def test_a_failure_on_one_batch_is_an_error_in_the_row_and_the_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    model = nn.Sequential(_FailsOnLong())
    real = Capture.__exit__

    def exit_and_arm(self: Capture, *a: Any) -> Any:
        model[0].replaying.on = True  # every forward after the capture is a replay
        return real(self, *a)

    monkeypatch.setattr(Capture, "__exit__", exit_and_arm)
    report = profile_components(model, batches=[torch.randn(n, 4) for n in (4, 16, 8)], **FAST)
    row = report.row("0")
    assert row.status == "ok" and row.error is not None
    assert row.error.startswith("not measured on 1 of 3 batches (batch 1: ") and "too long" in row.error
    assert [b["batch"] for b in row.details["batches"] if b["status"] == "ok"] == [0, 2]
    assert "0 [ok]: not measured on 1 of 3 batches" in report.summary()


class _Sometimes(nn.Module):
    """A cheap Linear always; six more Linears only for a batch of more than 100 rows."""

    def __init__(self) -> None:
        super().__init__()
        self.small = nn.Linear(32, 32)
        self.big = nn.Sequential(*[nn.Linear(32, 32) for _ in range(6)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.small(x)
        return self.big(x) if x.shape[0] > 100 else x


def test_share_counts_a_component_only_in_the_batches_it_ran_in() -> None:
    # a warm-up run and the median of 3 (not FAST's single run): big is most of the root's work in
    # batch 2, so a single noisy run could make it look slower than the root there
    opts = {**FAST, "warmup": 1, "min_repeats": 3, "max_repeats": 3}
    report = profile_components(_Sometimes(), batches=[torch.randn(n, 32) for n in (8, 16, 512, 32)], **opts)

    def cost(row: ComponentRow, b: int) -> float:
        found = [x for x in row.details["batches"] if x["batch"] == b]
        return found[0]["total_ms"] * found[0]["calls"] if found else 0.0  # not run in b: 0

    root, big = report.row(""), report.row("big")
    assert [x["batch"] for x in big.details["batches"]] == [2]
    # Σ_b big's time ÷ Σ_b the root's: batch 2 counted once, not as if in every batch
    assert big.share == pytest.approx(cost(big, 2) / sum(cost(root, b) for b in range(4)))
    assert root.share == 1.0
    # not flagged slower than its parent for being counted in one batch only; a busy machine can still
    # make its own medians cross the root's, and then the row says it was noisy
    flags = big.details.get("flags") or []
    assert "slower_than_parent" not in flags or "noisy" in flags, flags


def test_batch_size_replicates_each_batch_from_its_own_size() -> None:
    # batch_size=16 from captured batches of 8, 4 and 2 rows: each is tiled to 16 rows
    report = profile_components(nn.Linear(4, 4), batches=[torch.randn(n, 4) for n in (8, 4, 2)], batch_size=16, **FAST)
    assert [b["flops"] for b in report.row("").details["batches"]] == [2 * 16 * 4 * 4 * 2] * 3  # fwd + weight grad
    assert report.row("").details["shapes"] == ["float32[16,4]"]


def test_p90_interpolates_between_order_statistics() -> None:
    assert p90([1.0]) == 1.0
    assert p90([1.0, 2.0]) == pytest.approx(1.9)  # position 0.9
    assert p90([5.0, 1.0, 3.0, 2.0, 4.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0]) == pytest.approx(10.0)  # position 9
    assert math.isnan(p90([]))


def test_input_signature_names_kwargs_and_skips_objects() -> None:
    sig = input_signature(
        ComponentInputs(args=(torch.zeros(2, 3), 7), kwargs={"mask": torch.ones(2, dtype=torch.bool)})
    )
    assert sig == "float32[2,3], mask=bool[2]"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"args": (torch.randn(2, 4),), "batches": [torch.randn(2, 4)]}, "not both"),
        ({"batches": []}, "non-empty"),
        ({"batches": [(torch.randn(2, 4), torch.randn(2, 4))]}, r"batches\[0\]"),
    ],
)
def test_bad_batches_are_refused_by_name(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        profile_components(nn.Linear(4, 4), **kwargs, **FAST)


def test_artifacts_come_from_the_rows_median_batch(tmp_path: Any) -> None:
    report = profile_components(
        nn.Linear(8, 8), batches=[torch.randn(n, 8) for n in (2, 64, 16)], artifacts=("ops",),
        output_dir=str(tmp_path), **FAST,
    )  # fmt: skip
    row = report.row("")
    assert row.details["artifacts"] == {"ops": "artifacts/root/ops.csv"}
    ops = (tmp_path / "artifacts/root/ops.csv").read_text()
    n = [2, 64, 16][row.details["median_batch"]]
    assert "aten::linear,1," in ops and f'"[[{n}, 8], [8, 8], [8]]"' in ops  # linear(x, weight, bias) of that batch


@dataclasses.dataclass
class _Cache:
    k: list[torch.Tensor]


class _Appends(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, cache: _Cache) -> torch.Tensor:
        y = self.lin(x)
        cache.k.append(y)  # a KV cache grows by this step's keys
        return y


def test_the_capture_forward_leaves_the_callers_objects_alone() -> None:
    cache = _Cache([torch.zeros(2, 4)])
    x = torch.randn(2, 4)
    profile_components(_Appends(), (x,), {"cache": cache}, **FAST)
    assert len(cache.k) == 1  # not 2: the capture forward ran on a copy
    many = _Cache([])
    profile_components(_Appends(), batches=[((x,), {"cache": many}), ((x[:1],), {"cache": many})], **FAST)
    assert many.k == []


def test_the_capture_copy_keeps_non_leaf_inputs_and_the_models_own_tensors() -> None:
    # ReLU(inplace=True) on an upstream output (a non-leaf that requires grad) works on the copy
    h = torch.randn(2, 4, requires_grad=True) * 1.0
    # descend="all": every row replayed (the default triage leaves a leaf whose in-situ share a busy
    # machine reads small in situ, "skipped")
    report = profile_components(nn.Sequential(nn.ReLU(inplace=True), nn.Linear(4, 4)), (h,), descend="all", **FAST)
    assert [r.status for r in report] == ["ok", "ok", "ok"]

    class Keyed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor, scale: dict[Any, float]) -> torch.Tensor:
            return self.lin(x) * scale[self.lin.weight]  # a dict keyed by the model's own parameter

    m = Keyed()
    report = profile_components(m, (torch.randn(2, 4),), {"scale": {m.lin.weight: 2.0}}, **FAST)
    # the capture forward ran (the key is the model's own weight on the copy too) and lin was captured;
    # the root's replay, on the capture's own copy, cannot find that key (estimated, as before)
    assert "capture_error" not in report.metadata and report.row("lin").status == "ok"


@dataclasses.dataclass
class _Odd:
    y: torch.Tensor
    extra: int = dataclasses.field(init=False)  # never set
    me: Any = None


class _OddOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> _Odd:
        out = _Odd(self.lin(x))
        out.me = out  # refers to itself
        return out


def test_odd_dataclass_outputs_are_opened_safely() -> None:
    row = profile_components(_OddOut(), (torch.randn(2, 4),), **FAST).row("")
    assert row.status == "ok" and row.bwd_flops == 2 * 2 * 4 * 4  # the weight's gradient of y
