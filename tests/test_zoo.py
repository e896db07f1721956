"""The model zoo (issue 22, "a test that guards all of this"): the default profile and ``descend="all"`` agree.

A copy is a claim (docs: DESIGN, "A copy is a claim"): the default's triage measures repeated structure
once and copies it to the other members, so on every row its FLOPs, bytes, saved activations and status
must be those of the complete tree, which measures every component itself. Only times may differ.
Each model of :mod:`tests._zoo_models` is one case: a MoE with routing, a stack with one checkpointed
member, convs differing in attributes, blocks with a scalar argument, self-conditioning, a logged probe,
torchrec's DLRM with a shared table, a GPT and a CNN with BatchNorm in train mode.

Three properties are wrong in *both* modes when they are wrong (a module called under ``no_grad`` and
then with grad, a probe no loss reaches, a table shared by two features): the agreement cannot see them,
so those cases also check them (``test_zoo_backward_is_the_one_that_ran_*``,
:func:`test_zoo_shared_table_is_measured_on_both_features`). The profiles of a case are taken once per
session and shared by its tests.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn

from cb_callback import Report, profile_components
from cb_callback._report.model import ComponentRow
from cb_callback._report.table import format_text_table
from tests._zoo_models import BUILDERS, expert_tokens
from tests.conftest import FAST, load_example

#: FAST (one untimed-warm-up-free run per pass), fixed peaks (no CPU calibration: rates are not compared),
#: and a triage that is still the default's: one in-situ pass (the groups and the members measured
#: alone need in-situ times; without them "hotspots" goes level by level and groups nothing),
#: ``representatives=1`` (the default) and ``descend_share=0``, so no subtree is left ``skipped`` for a
#: small share: every row the default reports is measured or copied, and comparable with "all".
SETTINGS: dict[str, Any] = dict(
    FAST, peak_flops=1e12, peak_bandwidth=1e11, insitu_passes=1, representatives=1, descend_share=0.0, rounds=1
)

#: The columns that must agree: the work (FLOPs, bytes), the memory, what happened (status) and how
#: often it happened (``calls``, from the capture: the same in both modes by construction).
COLUMNS = ("status", "calls", "fwd_flops", "bwd_flops", "bytes", "activation_mb")

#: Relative tolerance of the float columns. FLOPs and bytes are integer counts, exact in float64 (below
#: 2**53), and ``activation_mb`` is a byte count over 2**20: measured twice on the same inputs they are
#: equal bit for bit. The tolerance only absorbs a different summation order in an estimated
#: container (a sum of children); one FLOP in 1e8 (1e-8) is still a difference.
REL_TOL = 1e-9


@dataclass
class Profiled:
    """Both profiles of one model and what changed in its training state."""

    default: Report
    full: Report
    state_changes: list[str]
    #: The default with ``descend_share=1``: no node's own share reaches it, so its rows but the top
    #: hotspots' (and their copies) are ``details["as"] = "insitu"`` (the in-situ time, the census's FLOPs
    #: and bytes).
    insitu: Report


def _same(a: Any, b: Any) -> bool:
    """Equal values; NaN equals NaN (a column neither mode could fill)."""
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=0.0)
    return bool(a == b)


def _provenance(row: ComponentRow) -> str:
    """How the default got the row (``as``/``from`` of the triage), its error if any."""
    bits = [f"as={row.details['as']}"] if "as" in row.details else []
    bits += [f"from={row.details['from']}"] if "from" in row.details else []
    bits += [f"error={row.error}"] if row.error else []
    return f" [{', '.join(bits)}]" if bits else ""


def row_diff(default: Report, full: Report, columns: Iterable[str] = COLUMNS) -> list[str]:
    """Every difference, one line each: ``path  column  default=…  all=…  [how the default got it]``."""
    d_paths, a_paths = [r.path for r in default], [r.path for r in full]
    if d_paths != a_paths:
        missing = [p for p in a_paths if p not in d_paths]
        extra = [p for p in d_paths if p not in a_paths]
        if not missing and not extra:
            return [f"row paths in another order: default={d_paths}, all={a_paths}"]
        return [f"row paths differ: only in all={missing}, only in default={extra}"]
    lines = []
    for d_row, a_row in zip(default, full, strict=True):
        for col in columns:
            dv, av = getattr(d_row, col), getattr(a_row, col)
            if not _same(dv, av):
                lines.append(f"{d_row.path or '<root>'}  {col}  default={dv!r}  all={av!r}{_provenance(d_row)}")
    return lines


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}


def _state_changes(model: nn.Module, before: dict[str, torch.Tensor], when: str) -> list[str]:
    """What differs from ``before``: a tensor of the state dict (values, dtype, shape), a gradient, a mode."""
    after = model.state_dict()
    out = [f"{when}: {k} changed" for k in before if k not in after or not torch.equal(before[k], after[k])]
    out += [f"{when}: {k} appeared" for k in after if k not in before]
    out += [f"{when}: {n}.grad is set" for n, p in model.named_parameters() if p.grad is not None]
    out += [f"{when}: {n or '<root>'} is in eval mode" for n, m in model.named_modules() if not m.training]
    return out


@functools.cache
def _profiled(case: str) -> Profiled:
    """Profile ``case`` under the default and under ``descend="all"`` (the same model and inputs)."""
    if case == "dlrm_shared":
        pytest.importorskip("torchrec")
    model, args = BUILDERS[case]()
    assert model.training and all(p.grad is None for p in model.parameters())
    before = _state(model)
    torch.manual_seed(0)
    default = profile_components(model, args, **SETTINGS)
    changes = _state_changes(model, before, "after the default")
    torch.manual_seed(0)
    full = profile_components(model, args, descend="all", **SETTINGS)
    changes += _state_changes(model, before, 'after descend="all"')
    torch.manual_seed(0)
    insitu = profile_components(model, args, **{**SETTINGS, "descend_share": 1.0})
    changes += _state_changes(model, before, "after descend_share=1")
    return Profiled(default, full, changes, insitu)


CASES = list(BUILDERS)


@pytest.mark.parametrize("case", CASES)
def test_zoo_default_agrees_with_descend_all(case: str) -> None:
    """Every row: the same paths, status, calls, FLOPs, bytes and saved activations in both modes."""
    p = _profiled(case)
    diff = row_diff(p.default, p.full)
    assert not diff, f"{case}: the default and descend='all' differ on {len(diff)} cells:\n" + "\n".join(diff)


@pytest.mark.parametrize("case", CASES)
def test_zoo_leaves_training_state_untouched(case: str) -> None:
    """Weights, buffers (BatchNorm's running statistics), gradients and train mode are as before both runs."""
    p = _profiled(case)
    assert not p.state_changes, "\n".join(p.state_changes)


def test_zoo_moe_blocks_really_route_differently() -> None:
    """The MoE case is only a case if its blocks differ: counted by hooks on one plain forward."""
    model, args = BUILDERS["moe"]()
    tokens = expert_tokens(model, args)
    # 96 tokens per block; block 0 never picks expert 2, block 1 never expert 0 (router biases of -1e3).
    assert [sum(b) for b in tokens] == [96, 96]
    assert tokens[0][2] == 0 and tokens[1][0] == 0 and tokens[0][0] > 0 and tokens[1][2] > 0
    assert tokens[0][1] != tokens[1][1]  # the expert both blocks run sees other token counts


def _both(case: str) -> list[tuple[str, Report]]:
    p = _profiled(case)
    return [("default", p.default), ("all", p.full)]


def _over_children(report: Report, column: str, path: str = "") -> float:
    """The children's ``column`` over the step: per-call values times calls (NaN: none, 0)."""
    values = (getattr(c, column) * c.calls for c in report.children(path))
    return math.fsum(0.0 if math.isnan(v) else v for v in values)


def test_zoo_backward_is_the_one_that_ran_self_conditioning() -> None:
    """The denoiser's first call is under ``no_grad``, its second builds the graph the loss runs through:
    its row has the second call's backward, not 0, and the root's FLOPs are its children's over the step
    (``embed`` once, the denoiser twice; the root's own ``zeros_like`` counts none), in both modes."""
    for mode, report in _both("self_cond"):
        row = report.row("denoiser")
        assert row.calls == 2, mode
        assert row.bwd_flops > 0, f"{mode}: denoiser bwd_flops={row.bwd_flops!r} ({row.note})"
        for col in ("fwd_flops", "bwd_flops"):
            assert getattr(report.row(""), col) == _over_children(report, col), f"{mode}: {col}"


def test_zoo_backward_is_the_one_that_ran_probe() -> None:
    """The probe's output only reaches ``.item()``: the step runs no backward through it (0 or NaN), and
    the root's backward is its children's (every child called once; the root's own ops count no FLOPs)."""
    for mode, report in _both("probe"):
        assert not report.row("probe").bwd_flops > 0, f"{mode}: probe bwd_flops={report.row('probe').bwd_flops!r}"
        assert report.row("").bwd_flops == _over_children(report, "bwd_flops"), mode


def test_zoo_shared_table_is_measured_on_both_features() -> None:
    """``t_shared`` serves ``f_one`` (1 id per sample) and ``f_many`` (50): the step gathers 16 × (1 + 50) =
    816 of its rows of 8 float32, 816 × 8 × 4 = 26,112 bytes, in the forward alone. Whether the row holds
    a call's share or the step's, its bytes times its calls reach that (in both modes)."""
    for mode, report in _both("dlrm_shared"):
        row = report.row("sparse_arch.embedding_bag_collection.embedding_bags.t_shared")
        assert row.bytes * max(row.calls, 1) >= 16 * (1 + 50) * 8 * 4, f"{mode}: bytes={row.bytes!r} calls={row.calls}"


#: Cases whose equal blocks stay one group under any correct key (same configuration, calls and counted
#: work): the default must still copy rows there, or their agreement says nothing about copies.
COPYING = ("checkpoint", "gpt", "bn_cnn")


@pytest.mark.parametrize("case", COPYING)
def test_zoo_default_still_copies_equal_blocks(case: str) -> None:
    triage = _profiled(case).default.metadata["triage"]
    assert triage["groups"] >= 1 and triage["copied"] > 0, triage


#: (W + b) of a looper's ``Linear(64, 64)`` in float32: (64 * 64 + 64) * 4 bytes.
_LOOPER_PARAM_BYTES = (64 * 64 + 64) * 4


def _insitu_expected(case: str, row: ComponentRow, full: Report) -> dict[str, float]:
    """What the census must give an in-situ row: ``descend="all"``'s measured row, except where the whole
    step's attribution differs from a replay alone (docs/columns.md, "Rows not replayed"), exactly:

    * ``checkpoint``: ``blocks.1.mlp`` runs under activation checkpointing. In the step its recompute
      runs when ``mlp.2``'s backward first unpacks a saved tensor, and stops once the tensors it needs
      are saved again: ``mlp.0`` and ``mlp.1`` run their forward again (``mlp.2``, whose input they
      make, does not), and the census charges each its own recompute as backward, its forward's FLOPs
      and bytes once more; a replay of either alone checkpoints nothing. Together that is what the
      checkpointed ``mlp`` (replayed whole) does more than its unwrapped twin ``blocks.0.mlp``
      (8,388,608 FLOPs and 394,240 + 524,288 bytes here).
    * ``scalar_arg``: a looper calls its ``lin`` n (4, 5, 6) times; the step sums the weight's and bias's
      gradients over the n calls, n - 1 sums each reading two and writing one: 3 (n - 1) (W + b) bytes
      over n calls. A replay of one call sums nothing.
    * ``conv_attrs``: a ``ConvBlock``'s gradient is a slice of ``torch.cat``'s (4, 48) gradient, and the
      bytes rule counts a view's whole storage: its mean's backward reads 4 * 48 * 4 bytes, not the
      4 * 8 * 4 of the contiguous gradient a replay makes (+640).
    """
    f = full.row(row.path)
    want = {"fwd_flops": f.fwd_flops, "bwd_flops": f.bwd_flops, "bytes": f.bytes}
    if case == "checkpoint" and row.path in ("blocks.1.mlp.0", "blocks.1.mlp.1"):
        want["bwd_flops"] += f.fwd_flops
        want["bytes"] += f.details["fwd_bytes"]
    elif case == "scalar_arg" and row.path.endswith(".lin"):
        n = row.calls
        want["bytes"] += 3 * (n - 1) * _LOOPER_PARAM_BYTES / n
    elif case == "conv_attrs" and row.module_type == "ConvBlock":
        want["bytes"] += 4 * (48 - 8) * 4
    return want


@pytest.mark.parametrize("case", CASES)
def test_zoo_rows_not_replayed_have_the_census_numbers(case: str) -> None:
    """Issue 24, "rows not replayed keep a row": every row the triage did not descend into carries its
    in-situ time and, per call, the FLOPs and bytes the census counted in the step, equal to the ones
    ``descend="all"`` measures alone except where :func:`_insitu_expected` derives the difference. Its
    status stays ``skipped`` and the table says ``(in situ)``."""
    p = _profiled(case)
    rows = [r for r in p.insitu if r.details.get("as") == "insitu"]
    assert rows, f"{case}: no row was left in situ: {[(r.path, r.details.get('as')) for r in p.insitu]}"
    bad = []
    for row in rows:
        assert row.status == "skipped" and math.isfinite(row.insitu_ms), (row.path, row.status, row.insitu_ms)
        assert row.details["insitu"]["counted"] == "census", (row.path, row.details["insitu"])
        for col, want in _insitu_expected(case, row, p.full).items():
            if not _same(getattr(row, col), want):
                bad.append(f"{row.path}  {col}  in situ={getattr(row, col)!r}  want={want!r}")
    assert not bad, f"{case}: " + "\n".join(bad)
    assert "skipped (in situ)" in format_text_table(p.insitu)


#: The details the census gives a replayed row, which its replay's own pass gave before (issue 24 §1).
#: ``working_set_bytes`` is not among them: its storages are told apart by address, and which address the
#: allocator reuses differs between two replays of one component alone (docs/columns.md).
CENSUS_DETAILS = ("fwd_bytes", "bwd_bytes", "top_bytes_ops", "uncounted_ops")

#: Rows whose census is not what their replay alone counts (``_insitu_expected`` derives by how much): they
#: must keep their own instrumented pass.
_OWN_PASS = {
    "checkpoint": lambda r: r.path in ("blocks.1.mlp.0", "blocks.1.mlp.1"),
    "scalar_arg": lambda r: r.path.endswith(".lin"),
    "conv_attrs": lambda r: r.module_type == "ConvBlock",
}


#: How the census's reasons for a row's own pass begin (cb_callback._engine.counting.census).
_REASONS = (
    "called ",
    "an activation checkpoint",
    "an output's gradient in the step",
    "an input is a view",
    "two of its",
    "its call in the census differs",
    "a backward ran for it",
    "its output has a gradient hook",
    "called under an autocast",
)


def census_diff(default: Report, full: Report) -> tuple[list[str], int]:
    """Every replayed row of ``default`` whose FLOPs and bytes came from the census (``details["counted"]``)
    against ``descend="all"``'s own pass: each column of :data:`COLUMNS` and of :data:`CENSUS_DETAILS`.
    Returns the differences and how many rows were compared."""
    bad, n = [], 0
    for row in default:
        if row.details.get("counted") != "census":
            continue
        n += 1
        f = full.row(row.path)
        for col in COLUMNS:
            if not _same(getattr(row, col), getattr(f, col)):
                bad.append(f"{row.path}  {col}  census={getattr(row, col)!r}  own pass={getattr(f, col)!r}")
        for key in CENSUS_DETAILS:
            if row.details.get(key) != f.details.get(key):
                bad.append(f"{row.path}  {key}  census={row.details.get(key)!r}  own pass={f.details.get(key)!r}")
    return bad, n


@pytest.mark.parametrize("case", CASES)
def test_zoo_replayed_rows_take_the_census_counts_and_equal_their_own_pass(case: str) -> None:
    """Issue 24 §1, one instrumented pass: a replayed row's FLOPs and bytes come from the census, counted in
    the step, and its replay only times (and observes memory). Each equals what the row's own instrumented
    pass counts under ``descend="all"``, exactly; the rows whose step differs from a replay alone
    (``_OWN_PASS``) keep their own pass, and so does a row called several times in the step."""
    p = _profiled(case)
    bad, n = census_diff(p.default, p.full)
    assert not bad, f"{case}: {len(bad)} census cells differ:\n" + "\n".join(bad)
    replayed = [r for r in p.default if r.status == "ok" and r.details.get("as") != "representative"]
    must_own = _OWN_PASS.get(case, lambda r: False)
    wrongly = [r.path for r in replayed if (must_own(r) or r.calls > 1) and r.details.get("counted") == "census"]
    assert not wrongly, f"{case}: census-counted, but the step's counts are not a replay's: {wrongly}"
    # Every other replayed row is census-counted, or says which of the census's reasons it is not.
    own = {r.path: r.details.get("counted") for r in replayed if r.details.get("counted") != "census"}
    reasons = tuple(f"own pass: {why}" for why in _REASONS)
    assert all(str(why).startswith(reasons) for why in own.values()), own
    if case in ("gpt", "bn_cnn", "moe"):  # the models: each row called once is counted in the step
        assert not [p for p, why in own.items() if not str(why).startswith("own pass: called ")], own
    assert n >= 1, (case, own)


def test_the_dlrm_demos_replayed_rows_take_the_census_counts_and_equal_their_own_pass() -> None:
    """The same on the DLRM demo (examples/dlrm.py: 26 tables in an EmbeddingBagCollection, KJT inputs)."""
    pytest.importorskip("torchrec")
    import cb_callback.integrations.torchrec  # noqa: F401  (the KJT and embedding rules)

    ex = load_example("dlrm")
    cfg = ex.DLRMConfig(table_rows=(2000, 200, 50))
    dense, kjt, _ = ex.synthetic_batch(64, cfg)
    torch.manual_seed(0)
    model = ex.build_dlrm(cfg)
    torch.manual_seed(0)
    default = profile_components(model, (dense, kjt), **SETTINGS)
    torch.manual_seed(0)
    full = profile_components(model, (dense, kjt), descend="all", **SETTINGS)
    bad, n = census_diff(default, full)
    assert not bad, f"{len(bad)} census cells differ:\n" + "\n".join(bad)
    counted = {r.path: r.details.get("counted") for r in default if r.status == "ok" and "as" not in r.details}
    assert n >= 10, counted
    # The embedding collection is counted in the step (its lookups and their backward, 26 tables); the
    # sparse arch around it by its own pass: its output's gradient in the step is a slice of the
    # interaction's, which the bytes rule may read whole.
    assert counted["sparse_arch.embedding_bag_collection"] == "census", counted
    assert counted["sparse_arch"].startswith("own pass: an output's gradient"), counted


def test_a_census_counted_replay_runs_no_flop_or_byte_counter(monkeypatch: pytest.MonkeyPatch) -> None:
    """The isolated replay of a row the census counted only times (and observes memory): the FLOP and byte
    counters run for the rows with a pass of their own only, one each; under ``descend="all"`` (no census)
    for every replayed row."""
    from cb_callback._metrics.flops import FlopsMetric
    from cb_callback._metrics.traffic import TrafficMetric

    opened: list[str] = []
    for cls in (FlopsMetric, TrafficMetric):
        real = cls.instrument
        monkeypatch.setattr(cls, "instrument", lambda self, ctx, real=real: opened.append(ctx.path) or real(self, ctx))
    model, args = BUILDERS["gpt"]()
    for descend in ("hotspots", "all"):
        opened.clear()
        torch.manual_seed(0)
        report = profile_components(model, args, **{**SETTINGS, "descend": descend})
        replayed = [r for r in report if "fwd_repeats" in r.details and r.details.get("as") != "representative"]
        own = sorted(r.path for r in replayed if r.details.get("counted") != "census")
        assert sorted(opened) == sorted(own * 2), (descend, sorted(opened), own)
        if descend == "hotspots":
            assert len(own) < len(replayed) // 2, (own, len(replayed))
        else:
            assert len(own) == len(replayed)


# --- where the step does to a component what its replay alone does not (the breaker's cases) -------------


class _Transposing(nn.Module):
    """The parent transposes a child's output: the child's gradient in the step is a transposed tensor
    that owns its storage, and ``Linear``'s 3-D backward copies it; a replay's gradient is contiguous."""

    def __init__(self) -> None:
        super().__init__()
        self.lin, self.out = nn.Linear(16, 16), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.lin(x).transpose(1, 2))


class _Expanding(nn.Module):
    """A child called on an expanded tensor (``h[:, :1].expand_as(h)``: stride 0, and as many elements as
    ``h``'s storage holds, so the storage's size alone does not tell): the step runs ``mm`` + ``add`` on it,
    a replay's dense copy ``addmm``."""

    def __init__(self) -> None:
        super().__init__()
        self.pre, self.a = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pre(x)
        return self.a(h[:, :1].expand_as(h))


class _Loss(nn.Module):
    def forward(self, y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((y - target) * y).sum()


class _Aliasing(nn.Module):
    """Two inputs of one call share a storage (``y`` and ``y.detach()``): the step's bytes count it once
    per op, a replay's two copies twice."""

    def __init__(self) -> None:
        super().__init__()
        self.lin, self.loss = nn.Linear(16, 16), _Loss()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return self.loss(y, y.detach())


class _Autocasting(nn.Module):
    """The parent enters autocast around a child: the step casts and multiplies in bfloat16, a replay of
    the child alone in float32."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = self.a(x)
        return self.b(h.float())


class _Hooking(nn.Module):
    """The parent hooks a child's output (``register_hook`` or ``retain_grad``): the hook runs inside the
    child's first backward node in the step; a replay has none."""

    def __init__(self, retain: bool) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)
        self.retain = retain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if self.retain:
            h.retain_grad()
        else:
            h.register_hook(lambda g: g * 2)
        return self.b(h)


class _TwoOf(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2, x * 3

    @staticmethod
    def backward(ctx: Any, g1: torch.Tensor, g2: torch.Tensor) -> torch.Tensor:
        return g1 + g2


class _TwoOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _TwoOf.apply(self.lin(x))


class _SameGradient(nn.Module):
    """The parent adds a child's two outputs: ``add``'s backward hands both one gradient tensor, which the
    child's backward reads twice and the bytes rule counts once; a replay gives each output its own."""

    def __init__(self) -> None:
        super().__init__()
        self.t, self.o = _TwoOut(), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.t(x)
        return self.o(a + b)


#: (model, input, the row, how its reason begins)
_STEP_DIFFERS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...], str, str]] = {
    "transposed gradient": (_Transposing, (4, 8, 16), "lin", "an output's gradient in the step"),
    "expanded input": (_Expanding, (8, 16), "a", "an input is a view"),
    "aliased inputs": (_Aliasing, (8, 16), "loss", "two of its inputs share a storage"),
    "parent's autocast": (_Autocasting, (8, 16), "a", "called under an autocast"),
    "register_hook": (lambda: _Hooking(False), (8, 16), "a", "its output has a gradient hook"),
    "retain_grad": (lambda: _Hooking(True), (8, 16), "a", "its output has a gradient hook"),
    "one gradient, two outputs": (_SameGradient, (8, 16), "t", "two of its outputs get one gradient"),
}


@pytest.mark.parametrize("case", list(_STEP_DIFFERS))
def test_a_row_whose_step_differs_from_its_replay_keeps_its_own_pass(case: str) -> None:
    """Issue 24 §1, found by the breaker: each of these made a census-counted row's bytes differ from its
    replay alone (a ``clone`` more in the step, ``mm`` + ``add`` for ``addmm``, a storage counted once
    instead of twice, bfloat16 casts, a hook's ``mul``). The census now sends each such row to its own
    pass, with its reason, and every row it does count equals its own pass."""
    build, shape, path, why = _STEP_DIFFERS[case]
    torch.manual_seed(0)
    model, x = build(), torch.randn(*shape)
    torch.manual_seed(0)
    default = profile_components(model, (x,), **SETTINGS)
    torch.manual_seed(0)
    full = profile_components(model, (x,), descend="all", **SETTINGS)
    assert str(default.row(path).details.get("counted")).startswith(f"own pass: {why}"), default.row(path).details
    bad, n = census_diff(default, full)
    assert not bad, "\n".join(bad)
    assert n >= 1  # the rest (at least the root) still census-counted


@pytest.mark.parametrize("case", ["gpt", "bn_cnn", "moe"])
def test_a_top_observed_in_its_census_pass_has_its_own_pass_numbers(case: str) -> None:
    """The census replays each top whole on its call, as the top's replay would: the memory metric observes
    that pass (``details["observed_in"] == "census"``) and the top runs no instrumented pass of its own. Its
    saved activations and allocator peak equal the root's own pass under ``descend="all"``, and so do
    its FLOPs and bytes (``census_diff``)."""
    p = _profiled(case)
    root, own = p.default.row(""), p.full.row("")
    assert root.details.get("observed_in") == "census" and "observed_in" not in own.details
    assert root.activation_mb == own.activation_mb and root.activation_mb > 0
    assert root.peak_mem_mb == own.peak_mem_mb and root.peak_mem_mb > 0
    assert root.details["mutates_inputs"] is own.details["mutates_inputs"] is False


def test_a_top_with_a_discarded_branch_keeps_its_own_pass() -> None:
    """The zoo's ``probe``: a module whose output only feeds ``.item()``. The census keeps the autograd
    nodes that branch built (its attribution's), so its pass holds their saved tensors past the point
    where the step frees them, and its peak would read high (0.148 MiB against 0.133): the root keeps
    its own pass, and its peak is that pass's."""
    p = _profiled("probe")
    root, own = p.default.row(""), p.full.row("")
    assert "observed_in" not in root.details and root.details["counted"] == "census"
    assert root.peak_mem_mb == own.peak_mem_mb


def test_a_users_instrument_gets_the_tops_own_pass() -> None:
    """A user's InstrumentingMetric observes the replay, not the census: the top then keeps its own pass."""
    from cb_callback.plugins import MeasureContext

    class Ops:
        name = "ops"

        def instrument(self, ctx: MeasureContext) -> Any:
            class Seen:
                def __init__(self) -> None:
                    self.n = 0

                @contextlib.contextmanager
                def observe(self, pctx: Any) -> Any:
                    self.n += 1
                    yield

                def values(self) -> dict[str, Any]:
                    return {"phases_seen": self.n}

            return Seen()

    model, args = BUILDERS["gpt"]()
    report = profile_components(model, args, metrics=[Ops()], **SETTINGS)
    root = report.row("")
    assert "observed_in" not in root.details and root.details["phases_seen"] == 3  # pass, forward, backward


class _Flattening(nn.Module):
    """Flattens its input before its ``inner`` Linear: under ``batch_size=`` the top's input is tiled, this
    child's ``(B·T, D)`` input (its first dimension not the batch size) is not."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x.reshape(-1, 32))


def test_a_child_whose_census_call_is_tiled_and_its_replay_not_keeps_its_own_pass() -> None:
    """The breaker's F1: with ``batch_size=8`` the census replays the top on its tiled (8, 6, 32) input, so
    ``1.inner`` counted 48 rows in it, while its own replay runs its captured 24 (4 · 6): census FLOPs twice
    the replay's, against the replay's time. The census's call of each module is now compared with its
    replay's (shapes, dtypes, what requires grad): ``1.inner`` keeps its own pass, 2 · 24 · 32 · 32 FLOPs."""
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(32, 32), _Flattening()), torch.randn(4, 6, 32)
    default = profile_components(model, (x,), batch_size=8, **SETTINGS)
    full = profile_components(model, (x,), batch_size=8, descend="all", **SETTINGS)
    inner = default.row("1.inner")
    assert str(inner.details["counted"]).startswith("own pass: its call in the census differs"), inner.details
    assert inner.fwd_flops == 2 * 24 * 32 * 32
    bad, n = census_diff(default, full)
    assert not bad and n >= 2, bad  # the root and the tiled Linear are still the census's


class _Routed(nn.Module):
    """Top-1 routing of 64 tokens over 4 experts by a router's argmax: which expert gets how many tokens
    follows the router's weights."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(16, 4)
        self.experts = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        choice = self.router(x).argmax(-1)
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            picked = choice == i
            out[picked] = expert(x[picked])
        return out


def test_experts_routed_otherwise_in_the_census_keep_their_own_pass() -> None:
    """The breaker's F2: the callback profiles after the optimizer step, so the census replays the top with
    weights that moved, and the router sends other tokens to each expert than the step did; each expert's
    replay runs its captured call. Here the router's weights move between the capture and the profile: an
    expert whose call in the census has another shape keeps its own pass, and every census-counted row
    equals ``descend="all"``'s."""
    from cb_callback import BenchmarkConfig, Capture, profile_captured

    torch.manual_seed(0)
    model, x = _Routed(), torch.randn(64, 16)
    with Capture(model) as cap:
        model(x)
    captured = [len(c.args[0]) for c in (cap.calls[f"experts.{i}"] for i in range(4)) if c.args]
    with torch.no_grad():
        model.router.weight.copy_(torch.randn(4, 16))  # as an optimizer step might
    reports = {
        descend: profile_captured(model, cap.calls, config=BenchmarkConfig(**{**SETTINGS, "descend": descend}))
        for descend in ("hotspots", "all")
    }
    default = reports["hotspots"]
    moved = [r.path for r in default if r.path.startswith("experts.") and "differs" in str(r.details.get("counted"))]
    assert moved, (captured, [(r.path, r.details.get("counted")) for r in default])
    # The router's output feeds only argmax: no gradient reaches it in the census. This capture saw no
    # backward, so its replay alone runs one: it keeps its own pass too, found after its replay's pass.
    assert str(default.row("router").details["counted"]).startswith("own pass: a backward ran"), default.row("router")
    bad, _ = census_diff(default, reports["all"])
    assert not bad, "\n".join(bad)


class _ReturnsItsHidden(nn.Module):
    """Returns ``(head(h), h)``: ``h``'s two gradients (from the head and from the top's own output) are
    summed in the top's backward, as the head's node hands its gradient back."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.head = nn.Linear(16, 16), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.stem(x)
        return self.head(h), h


def test_a_gradient_summed_with_the_tops_own_output_is_the_tops() -> None:
    """The breaker's F3: the sum of ``h``'s gradients ran as ``head``'s backward handed its gradient back,
    so the census charged its ``add`` to ``head`` (3,072 bytes more than ``head`` alone). The top's outputs
    now read as the top's: the sum is the root's, as in its own pass, and ``head`` is census-counted and
    equal to its replay alone."""
    torch.manual_seed(0)
    model, x = _ReturnsItsHidden(), torch.randn(64, 16)
    default = profile_components(model, (x,), **SETTINGS)
    full = profile_components(model, (x,), descend="all", **SETTINGS)
    assert default.row("head").details["counted"] == "census"
    assert "aten.add" not in default.row("head").details["top_bytes_ops"]
    bad, n = census_diff(default, full)
    assert not bad, "\n".join(bad)
    assert default.row("").details["counted"] == "census" and n == 3
