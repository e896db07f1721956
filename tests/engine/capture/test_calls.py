"""A module called several times per step: every call measured, each in its grad mode, only the backward that ran.

Issue 22 items 2 and 3 (grad modes per call; only the backward that ran) and the
generic half of item 8's first torchrec bullet (a module called with different
inputs is measured on all of its calls). FLOPs are exact: a ``Linear(k -> n)`` on
``m`` rows is ``2*m*k*n`` forward (one GEMM), and its backward is one GEMM for the
weight's gradient plus one for the input's when the input requires grad.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from cb_callback import BenchmarkConfig, ComponentBenchmark, profile_components
from cb_callback._engine.capture import capture as capture_module
from cb_callback._engine.capture.capture import MAX_VARIANTS, Capture
from cb_callback._engine.capture.inputs import ComponentInputs
from cb_callback._engine.replay.callset import MAX_EXACT
from cb_callback._engine.run.profile import profile_captured
from cb_callback._report.model import Report
from cb_callback._whatif.snapshot import _calls_from_plain, load_snapshot, save_snapshot
from tests._callback_models import BATCH, MLPModule, run_fit
from tests.conftest import FAST

PEAKS: dict[str, Any] = dict(peak_flops=1e11, peak_bandwidth=1e10)
MODES = ("all", "hotspots")


def _profile(model: nn.Module, x: torch.Tensor, descend: str, **kw: Any) -> Report:
    # descend_share=0: "hotspots" replays every row too (triaged and copied, never left in situ for a share)
    return profile_components(model, x, descend=descend, **FAST, **PEAKS, **{"descend_share": 0.0, **kw})


def _children_bwd(report: Report, paths: list[str]) -> float:
    """The step's backward FLOPs of ``paths``: per-call ``bwd_flops`` × ``calls``."""
    return sum(report.row(p).bwd_flops * report.row(p).calls for p in paths)


# --- grad modes per call: self-conditioning -------------------------------------------------


class SelfConditioning(nn.Module):
    """A diffusion model's self-conditioning: the denoiser runs under no_grad, then with grad."""

    def __init__(self) -> None:
        super().__init__()
        self.denoise = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            guess = self.denoise(x)
        return self.denoise(x + guess)


@pytest.mark.parametrize("descend", MODES)
def test_a_call_under_no_grad_then_one_with_grad_keeps_the_second_calls_backward(descend: str) -> None:
    report = _profile(SelfConditioning(), torch.randn(4, 8), descend)
    row = report.row("denoise")
    assert row.status == "ok" and row.calls == 2
    assert row.fwd_flops == 2 * 4 * 8 * 8  # each call: one GEMM on 4 rows
    # Only the second call has a backward: its weight's gradient, 2*4*8*8 (x requires no grad),
    # averaged over the 2 calls so that x calls it is the step's.
    assert row.bwd_flops == 2 * 4 * 8 * 8 / 2
    assert "backward from 1 of 2 calls; the other ran under no_grad" in (row.note or "")
    assert row.details["call_set"] == {
        "replayed": 2, "step_calls": 2, "approximated": False, "backward_calls": 1, "no_grad_calls": 1,
    }  # fmt: skip
    root = report.row("")
    assert root.fwd_flops == 2 * (2 * 4 * 8 * 8)  # both calls' forward
    assert root.bwd_flops == _children_bwd(report, ["denoise"]) == 2 * 4 * 8 * 8


def test_the_capture_keeps_each_grad_mode_apart() -> None:
    model = SelfConditioning()
    with Capture(model) as cap:
        out = model(torch.randn(4, 8))
        cap.mark_backward(out)
    first = cap.calls["denoise"]
    assert (first.calls, first.grad_enabled, first.own_calls) == (2, False, 1)
    (variant,) = first.variants
    assert (variant.calls, variant.grad_enabled, variant.reaches_loss, variant.grad_calls) == (1, True, True, 1)
    assert (first.reaches_loss, first.grad_calls) == (True, 1)  # over the step's 2 calls
    assert first.own_grad_calls == 0


# --- only the backward that ran: a logged probe ---------------------------------------------


class Probed(nn.Module):
    """A body whose features a probe reads; the probe's value is only logged (``.item()``)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.probe = nn.Linear(16, 1)
        self.head = nn.Linear(16, 4)
        self.logged: float = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        self.logged = self.probe(h).mean().item()
        return self.head(h)


@pytest.mark.parametrize("descend", MODES)
def test_a_probe_that_reaches_no_loss_has_no_backward(descend: str) -> None:
    report = _profile(Probed(), torch.randn(4, 8), descend)
    probe = report.row("probe")
    assert probe.status == "ok"
    assert probe.fwd_flops == 2 * 4 * 16 * 1
    # It requires grad, but the step's backward never runs through it: 0, and the row says why.
    assert probe.bwd_flops == 0 and probe.bwd_ms == 0
    assert "reaches no loss" in (probe.note or "")
    assert report.row("head").bwd_flops == 2 * (2 * 4 * 16 * 4)  # weight and input gradients
    assert report.row("body").bwd_flops == 2 * 4 * 8 * 16  # weight only: x requires no grad
    root = report.row("")
    assert root.bwd_flops == _children_bwd(report, ["body", "probe", "head"]) == 2 * 4 * 8 * 16 + 4 * 4 * 16 * 4


class ProbedModule(MLPModule):
    """The callback tests' MLP with a probe on the encoder's features, only logged."""

    def __init__(self) -> None:
        super().__init__(validate=False)
        self.probe = nn.Linear(16, 1)
        self.logged: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        self.logged.append(self.probe(h).mean().item())
        return self.head(h)


def _same_training(a: tuple[Any, Any, Any], b: tuple[Any, Any, Any]) -> None:
    (_, ma, ra), (_, mb, rb) = a, b
    assert len(ra.losses) == len(rb.losses) == 3
    assert all(torch.equal(la, lb) for la, lb in zip(ra.losses, rb.losses, strict=True))
    sa, sb = ma.state_dict(), mb.state_dict()
    assert list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("descend", MODES)
def test_a_logged_probe_in_a_lightning_step_has_no_backward_and_training_is_unchanged(
    tmp_path: Path, descend: str
) -> None:
    baseline = run_fit(tmp_path / "base", model_cls=ProbedModule, max_steps=3, logger=False)
    cb = ComponentBenchmark(capture_step=1, descend=descend, descend_share=0.0, **FAST, **PEAKS)  # every row replayed
    run = run_fit(tmp_path / "cb", [cb], model_cls=ProbedModule, max_steps=3, logger=False)
    _same_training(baseline, run)
    report = cb.report
    assert report is not None
    probe = report.row("probe")
    assert probe.status == "ok" and probe.bwd_flops == 0 and "reaches no loss" in (probe.note or "")
    batch = BATCH
    assert probe.fwd_flops == 2 * batch * 16 * 1
    root = report.row("")
    # The root's backward is that of the modules the step's backward ran through, the probe's 0 included.
    assert root.bwd_flops == _children_bwd(report, ["encoder", "head", "probe"])
    assert report.row("head").bwd_flops == 2 * (2 * batch * 16 * 3)  # weight and input gradients


# --- a shared module called with inputs of different shapes ---------------------------------


class SharedTable(nn.Module):
    """One projection shared by a 1-row and a 50-row input (a table shared by two features)."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared(x[:1]).sum() + self.shared(x).sum()


@pytest.mark.parametrize("descend", MODES)
def test_a_module_called_with_two_shapes_is_measured_on_both_calls(descend: str) -> None:
    report = _profile(SharedTable(), torch.randn(50, 16), descend)
    row = report.row("shared")
    assert row.calls == 2
    assert row.fwd_flops * row.calls == 2 * 16 * 4 * (1 + 50)  # both calls' GEMMs
    assert row.bwd_flops * row.calls == 2 * 16 * 4 * (1 + 50)  # both weight gradients (x requires no grad)
    assert report.row("").fwd_flops == 2 * 16 * 4 * (1 + 50)


def test_batch_replication_replicates_each_call_by_its_own_rule() -> None:
    # batch_size=100: the 50-row call (leading dim = the captured batch) is tiled to 100 rows; the
    # 1-row call is not a batch of the capture's size and stays as it was.
    report = _profile(SharedTable(), torch.randn(50, 16), "all", batch_size=100)
    row = report.row("shared")
    assert row.fwd_flops * row.calls == 2 * 16 * 4 * (1 + 100)


def test_a_snapshot_keeps_the_calls_unlike_the_first(tmp_path: Path) -> None:
    model = SharedTable()
    with Capture(model) as cap:
        cap.mark_backward(model(torch.randn(50, 16)))
    save_snapshot(tmp_path, model, cap.calls, captured_batch_size=50)
    snap = load_snapshot(tmp_path)
    (variant,) = snap.calls["shared"].variants
    assert tuple(variant.args[0].shape) == (50, 16) and variant.calls == 1 and variant.grad_calls == 1
    report = snap.profile(device="cpu", descend="all", **FAST, **PEAKS)
    assert report.row("shared").fwd_flops * 2 == 2 * 16 * 4 * (1 + 50)


def test_a_snapshot_written_before_the_call_fields_still_loads() -> None:
    old = {"": {"args": (torch.zeros(2, 3),), "kwargs": {}, "calls": 1, "training": True, "order": 0,
                "unknown_leaves": [], "modes": {}, "capture_error": None, "grad_enabled": True}}  # fmt: skip
    (inputs,) = _calls_from_plain(old).values()
    assert inputs.variants == [] and inputs.reaches_loss is None and inputs.grad_calls is None
    assert inputs.wrapped is None and inputs.output_mask is None and inputs.unrepresented == 0


class ManyCalls(nn.Module):
    """A module called ``n`` times on 1 row, then once on 3 rows."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n
        self.lin = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = sum(self.lin(x[:1]).sum() for _ in range(self.n))
        return out + self.lin(x[:3]).sum()


def test_many_calls_are_approximated_by_kind_and_say_so() -> None:
    n = 19  # 20 calls > MAX_EXACT: each kind replayed in proportion, at least once
    report = _profile(ManyCalls(n), torch.randn(3, 8), "all")
    row = report.row("lin")
    assert row.calls == n + 1 and row.details["call_set"]["approximated"] is True
    reps = round(MAX_EXACT * n / (n + 1))  # 15 one-row calls, then max(1, round(16/20)) = 1 three-row call
    assert row.details["call_set"]["replayed"] == reps + 1
    assert row.fwd_flops == pytest.approx((reps * 2 * 1 * 8 * 2 + 2 * 3 * 8 * 2) / (reps + 1))
    assert "approximated" in (row.note or "")


def test_kinds_of_call_beyond_the_cap_are_counted_in_the_last_kept_kind_of_their_class() -> None:
    class Shapes(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return sum(self.lin(x[: i + 1]).sum() for i in range(MAX_VARIANTS + 2))

    model = Shapes()
    with Capture(model) as cap:
        model(torch.randn(MAX_VARIANTS + 2, 4))
    rec = cap.calls["lin"]
    assert rec.calls == MAX_VARIANTS + 2 and len(rec.variants) == MAX_VARIANTS
    # The call beyond the cap (MAX_VARIANTS + 2 rows) is counted in the last kept kind (MAX_VARIANTS + 1 rows).
    assert rec.own_calls == 1 and rec.unrepresented == 0
    assert (rec.variants[-1].calls, rec.variants[-1].unrepresented) == (2, 1)


# --- more kinds of call than the old cap of 8: a decoder loop over a growing sequence ------------


class Growing(nn.Module):
    """A projection called ``steps`` times on a sequence one row longer each time; the first
    ``no_grad_steps`` calls run under no_grad (a rollout), the others with grad."""

    def __init__(self, steps: int, no_grad_steps: int = 0) -> None:
        super().__init__()
        self.steps, self.no_grad_steps = steps, no_grad_steps
        self.emb = nn.Linear(8, 8)
        self.dec = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq = self.emb(x)
        for i in range(self.steps):
            with torch.set_grad_enabled(i >= self.no_grad_steps):
                h = self.dec(seq)
            seq = torch.cat([seq, h[-1:]], 0)
        return seq


@pytest.mark.parametrize("descend", MODES)
def test_a_loop_over_a_growing_sequence_is_exact_on_each_of_its_twenty_kinds(descend: str) -> None:
    steps, rows = 20, 4
    report = _profile(Growing(steps), torch.randn(rows, 8), descend)
    row = report.row("dec")
    assert row.calls == steps and row.details["call_set"]["approximated"] is False
    # Call i runs on rows + i rows: one GEMM of 2 * (rows + i) * 8 * 8 each.
    fwd = sum(2 * (rows + i) * 8 * 8 for i in range(steps))
    assert row.fwd_flops * row.calls == pytest.approx(fwd)
    # Backward: the weight's gradient and the input's (seq requires grad: it comes from emb), each one GEMM.
    assert row.bwd_flops * row.calls == pytest.approx(2 * fwd)
    assert "approximated" not in (row.note or "")


@pytest.mark.parametrize("descend", MODES)
def test_nine_calls_under_no_grad_then_three_with_grad_keep_the_three_backwards(descend: str) -> None:
    rows = 4
    report = _profile(Growing(12, no_grad_steps=9), torch.randn(rows, 8), descend)
    row = report.row("dec")
    assert row.calls == 12 and row.details["call_set"]["approximated"] is False
    assert row.fwd_flops * row.calls == pytest.approx(sum(2 * (rows + i) * 8 * 8 for i in range(12)))
    # Calls 9..11 built graph: each an input and a weight gradient, 2 GEMMs of 2 * (rows + i) * 8 * 8.
    assert row.bwd_flops * row.calls == pytest.approx(sum(2 * 2 * (rows + i) * 8 * 8 for i in range(9, 12)))
    assert "backward from 3 of 12 calls; 9 ran under no_grad" in (row.note or "")


def test_beyond_the_cap_the_row_is_approximated_and_a_new_grad_mode_is_still_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(capture_module, "MAX_VARIANTS", 2)
    rows = 4
    model = Growing(6, no_grad_steps=5)  # 5 no_grad kinds (3 kept: the first and 2 variants), then 1 with grad
    with Capture(model) as cap:
        cap.mark_backward(model(torch.randn(rows, 8)))
    rec = cap.calls["dec"]
    assert len(rec.variants) == 3 and rec.variants[-1].grad_enabled  # the grad call is kept beyond the cap
    assert (rec.variants[1].calls, rec.variants[1].unrepresented) == (3, 2)  # calls 3 and 4 counted in call 2's kind
    report = profile_captured(model, cap.calls, config=BenchmarkConfig(descend="all", **FAST, **PEAKS))
    row = report.row("dec")
    info = row.details["call_set"]
    assert info["approximated"] is True and info["unrepresented"] == 2
    assert "2 of its calls are of kinds beyond the capture's cap" in (row.note or "")
    # Calls 3 and 4 replayed as call 2 (rows + 2 rows): the forward is below the step's, and says so.
    approx = sum(2 * (rows + i) * 8 * 8 for i in (0, 1, 2, 2, 2, 5))
    assert row.fwd_flops * row.calls == pytest.approx(approx)
    # The one call with grad is kept as itself: its backward (input and weight gradients) is exact.
    assert row.bwd_flops * row.calls == pytest.approx(2 * 2 * (rows + 5) * 8 * 8)


# --- activation checkpointing -----------------------------------------------------------------


class Checkpointed(nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.reentrant = reentrant
        self.inner = nn.Linear(8, 8)
        self.out = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = checkpoint(self.inner, x, use_reentrant=self.reentrant)
        return self.out(h)


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_checkpoints_recomputation_is_not_a_call_and_the_call_says_it_was_wrapped(reentrant: bool) -> None:
    model = Checkpointed(reentrant)
    x = torch.randn(4, 8, requires_grad=True)
    with Capture(model) as cap:
        loss = model(x).sum()
        cap.mark_backward(loss)
        loss.backward()  # recomputes inner's forward inside the backward: not a call of the step
    inner = cap.calls["inner"]
    assert inner.calls == 1 and inner.variants == []
    assert inner.wrapped == ("checkpoint (reentrant)" if reentrant else "checkpoint")
    assert inner.grad_enabled is True  # its backward ran (by recomputation), also when reentrant
    assert cap.calls["out"].wrapped is None and cap.calls[""].wrapped is None
    assert cap.calls["out"].calls == 1


@pytest.mark.parametrize("descend", MODES)
def test_a_checkpointed_call_keeps_its_backward(descend: str) -> None:
    report = _profile(Checkpointed(False), torch.randn(4, 8), descend)
    inner = report.row("inner")
    assert inner.calls == 1 and inner.bwd_flops == 2 * 4 * 8 * 8  # weight gradient (x requires no grad)


class Block(nn.Module):
    """``d -> 4d -> d``, no biases: its forward is two GEMMs of ``2 * t * d * 4d`` each."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, 4 * d, bias=False)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(x)))


class ParentCheckpoints(nn.Module):
    """The HF pattern: the parent calls ``checkpoint(self.blocks[1], x)``; the other block runs plainly."""

    def __init__(self, reentrant: bool, d: int = 16) -> None:
        super().__init__()
        self.reentrant = reentrant
        self.inp = nn.Linear(d, d, bias=False)
        self.blocks = nn.ModuleList([Block(d), Block(d)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        x = self.blocks[0](x)
        return checkpoint(self.blocks[1], x, use_reentrant=self.reentrant)


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("descend", MODES)
def test_a_call_checkpointed_by_its_parent_replays_under_the_checkpoint(descend: str, reentrant: bool) -> None:
    t, d = 8, 16
    report = _profile(ParentCheckpoints(reentrant), torch.randn(t, d), descend)
    gemm = 2 * t * d * 4 * d
    plain, ckpt = report.row("blocks.0"), report.row("blocks.1")
    assert plain.status == ckpt.status == "ok"
    # Plain: each GEMM's input and weight gradient, 4 GEMMs (the input comes from inp: it requires grad).
    assert plain.bwd_flops == 4 * gemm
    # Checkpointed: the backward also recomputes the forward. Non-reentrant stops once what the backward
    # needs is back (fc2's input: the first GEMM, + 1); reentrant recomputes all of it (+ 2).
    assert ckpt.bwd_flops == (6 if reentrant else 5) * gemm
    assert ckpt.activation_mb == 0  # the checkpoint saves its input only (the block's own)
    root = report.row("")
    assert root.status == "ok"  # a reentrant checkpoint in its graph: its backward runs as loss.backward() does
    # inp on data: its weight gradient only, 2 * t * d * d.
    assert report.row("inp").bwd_flops == 2 * t * d * d
    assert root.bwd_flops == _children_bwd(report, ["inp", "blocks.0", "blocks.1"])
    if reentrant:  # no early stop: the recompute is every child's forward again, so the children sum up
        assert report.row("blocks.1.fc1").bwd_flops == report.row("blocks.1.fc2").bwd_flops == 3 * gemm
        assert ckpt.bwd_flops == _children_bwd(report, ["blocks.1.fc1", "blocks.1.act", "blocks.1.fc2"])


def test_inside_a_reentrant_checkpoint_a_computed_input_is_copied_as_requiring_grad() -> None:
    model = ParentCheckpoints(reentrant=True)
    with Capture(model) as cap:
        cap.mark_backward(model(torch.randn(8, 16)))
    # fc1 gets the checkpoint's own input (it requires grad: it comes from inp); fc2 and act get tensors
    # computed under the checkpoint's no_grad, which the step's backward recomputes with grad.
    assert cap.calls["blocks.1.fc1"].args[0].requires_grad
    assert cap.calls["blocks.1.act"].args[0].requires_grad and cap.calls["blocks.1.fc2"].args[0].requires_grad
    assert cap.calls["blocks.1.fc2"].wrapped == "checkpoint (reentrant)"
    assert cap.calls["blocks.0.fc2"].wrapped is None  # the plain block: not inside a checkpoint


class FrozenStem(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 8).requires_grad_(False)
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stem(x))


def test_a_frozen_module_on_data_says_nothing_requires_grad_not_that_it_reaches_no_loss() -> None:
    report = _profile(FrozenStem(), torch.randn(4, 8), "all")
    stem = report.row("stem")
    assert stem.bwd_flops == 0
    assert stem.details["no_backward"] == "no input or parameter of the component requires grad"
    assert "reaches no loss" not in (stem.note or "")


# --- the capture never changes the step -------------------------------------------------------


def test_marking_a_backward_changes_nothing_and_never_raises() -> None:
    torch.manual_seed(0)
    a, b = Probed(), Probed()
    b.load_state_dict(a.state_dict())
    x = torch.randn(4, 8)
    la = a(x).sum()
    la.backward()
    with Capture(b) as cap:
        lb = b(x).sum()
        cap.mark_backward(lb)
        cap.mark_backward(object())  # nothing to walk: marks nothing, raises nothing
        lb.backward()
    assert torch.equal(la, lb)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):  # the probe's stay None in both
        assert (pa.grad is None and pb.grad is None) or torch.equal(pa.grad, pb.grad)
    assert cap.calls["probe"].reaches_loss is False and cap.calls["probe"].grad_calls == 0
    assert not cap._outs  # the output nodes are dropped with the hooks


def test_without_a_marked_backward_reach_stays_unknown() -> None:
    model = Probed()
    with Capture(model) as cap:
        model(torch.randn(4, 8))
    assert all(c.reaches_loss is None and c.grad_calls is None for c in cap.calls.values())


def test_hand_built_inputs_replay_as_before() -> None:
    lin = nn.Linear(8, 4)
    calls = {"": ComponentInputs(args=(torch.randn(3, 8),), kwargs={})}
    report = profile_captured(lin, calls, config=BenchmarkConfig(**FAST, **PEAKS))
    row = report.row("")
    assert row.fwd_flops == 2 * 3 * 8 * 4 and row.bwd_flops == 2 * 3 * 8 * 4
    assert math.isfinite(row.fwd_ms) and "call_set" not in row.details


def test_a_torchrec_table_shared_by_two_features_is_measured_on_both_features() -> None:
    pytest.importorskip("torchrec")
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    import cb_callback.integrations.torchrec  # noqa: F401  (the KJT's batch rule and traffic rules)

    table = EmbeddingBagConfig(name="t0", embedding_dim=8, num_embeddings=1000, feature_names=["a", "b"])
    ebc = EmbeddingBagCollection(tables=[table])
    batch, dim, i64, f32 = 4, 8, 8, 4
    values = torch.cat([torch.tensor([3]), torch.arange(50) + 100])  # feature a: 1 id; feature b: 50 ids
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["a", "b"], values=values, lengths=torch.tensor([1, 0, 0, 0, 20, 10, 10, 10])
    )

    def fwd_bytes(n: int) -> int:
        # _embedding_bag (sum, CPU): read ids + offsets[B+1] + one row per id; write the pooled
        # [B, D] output, bag_size[B] and max_indices[B] (see test_torchrec_embedding)
        return n * i64 + (batch + 1) * i64 + n * dim * f32 + batch * dim * f32 + 2 * batch * i64

    for descend in MODES:
        row = profile_components(ebc, (kjt,), descend=descend, **FAST, **PEAKS).row("embedding_bags.t0")
        assert row.status == "ok" and row.calls == 2
        assert row.details["fwd_bytes"] * row.calls == fwd_bytes(1) + fwd_bytes(50)  # both features' gathers
        assert "replayed on its 2 calls" in (row.note or "")


def test_the_compile_what_if_of_a_call_set_is_per_call_too() -> None:
    report = _profile(SharedTable(), torch.randn(50, 16), "all", compile=True, compile_options={"backend": "eager"})
    row = report.row("shared")
    info = row.details["compile"]
    assert row.details["call_set"]["replayed"] == 2 and "error" not in info, info
    assert info["graph_breaks"] == 0  # explained on the first call alone (explain returns a report, not an output)
    assert math.isfinite(row.compiled_ms) and row.compile_speedup == pytest.approx(row.total_ms / row.compiled_ms)
