"""Copies proven equal before they are copied; failed components descended into; copied rows' provenance
(issue 22, items 1, 5 and 7).

A group member takes its representative's rows only where it did the same work: the same configuration,
arguments and subtree calls, and the same FLOPs counted for every module in the step (the census). Each
model here is profiled under the default (the triage, repeated structure measured once) and under
``descend="all"`` (every component measured itself): every row's FLOPs, bytes, saved activations and
status must agree. ``descend_share=0`` so that no subtree is left ``skipped`` for a small share.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

import cb_callback._engine.selection.triage as triage_module
from cb_callback import Report, profile_components
from cb_callback._engine.capture.capture import Capture
from cb_callback._engine.capture.tree import build_tree
from cb_callback._engine.selection.groups import sibling_groups, take_row
from cb_callback._report.model import ComponentRow
from tests.conftest import FAST

#: FAST, fixed peaks (no CPU calibration), one in-situ pass (the triage needs in-situ times) and every
#: group descended: each row of the default is measured or copied, comparable with descend="all".
SETTINGS: dict[str, Any] = dict(FAST, peak_flops=1e12, peak_bandwidth=1e11, insitu_passes=1, descend_share=0.0)
COLUMNS = ("status", "fwd_flops", "bwd_flops", "bytes", "activation_mb")


def _both(model: nn.Module, *args: Any, **options: Any) -> tuple[Report, Report]:
    torch.manual_seed(0)
    default = profile_components(model, args, **(SETTINGS | options))
    torch.manual_seed(0)
    full = profile_components(model, args, **(SETTINGS | options | {"descend": "all"}))
    return default, full


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and (math.isnan(a) or math.isnan(b)):
        return math.isnan(a) and math.isnan(b)
    return bool(a == b) or (isinstance(a, float) and math.isclose(a, b, rel_tol=1e-9))


def _differences(default: Report, full: Report, paths: list[str] | None = None) -> list[str]:
    """Every cell of :data:`COLUMNS` where the default and descend="all" disagree, with how the row was got."""
    assert [r.path for r in default.rows] == [r.path for r in full.rows]
    out = []
    for d, a in zip(default.rows, full.rows, strict=True):
        if paths is not None and d.path not in paths:
            continue
        for col in COLUMNS:
            if not _same(getattr(d, col), getattr(a, col)):
                how = f"as={d.details.get('as')} from={d.details.get('from')}"
                out.append(f"{d.path or '<root>'} {col}: default={getattr(d, col)!r} all={getattr(a, col)!r} [{how}]")
    return out


# --- MoE: experts routed different token counts in each block -------------------------------------------

D, T = 16, 12


class Expert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(D, D, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(x)


class MoE(nn.Module):
    """Three experts; token ``i`` goes to expert ``route[i]`` (a fixed index buffer: deterministic routing)."""

    route: Tensor

    def __init__(self, route: list[int]) -> None:
        super().__init__()
        self.experts = nn.ModuleList([Expert() for _ in range(3)])
        self.register_buffer("route", torch.tensor(route))

    def forward(self, x: Tensor) -> Tensor:
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            idx = (self.route == e).nonzero().squeeze(1)
            if idx.numel():
                out = out.index_add(0, idx, expert(x[idx]))
        return x + out


class MoEStack(nn.Module):
    #: Tokens per expert: block 0 (4, 4, 4); block 1 (8, 4, 0): expert 2 not called; block 2 (0, 2, 10).
    ROUTES = ([0] * 4 + [1] * 4 + [2] * 4, [0] * 8 + [1] * 4, [1] * 2 + [2] * 10)

    def __init__(self) -> None:
        super().__init__()
        self.h = nn.ModuleList([MoE(list(r)) for r in self.ROUTES])

    def forward(self, x: Tensor) -> Tensor:
        for b in self.h:
            x = b(x)
        return x


def test_moe_experts_routed_unlike_the_representative_are_measured_on_their_own_tokens() -> None:
    default, full = _both(MoEStack(), torch.randn(T, D, requires_grad=True))
    assert _differences(default, full) == []
    rows = {r.path: r for r in default.rows}
    # An expert's fwd is one GEMM over its tokens: 2 * t * 16 * 16; bwd the input and the weight gradient, 2x.
    for b, route in enumerate(MoEStack.ROUTES):
        for e in range(3):
            t = route.count(e)
            row = rows[f"h.{b}.experts.{e}"]
            if t == 0:  # not routed a token in this block: not called, whatever the representative did
                assert row.status == "not_run", row
                continue
            assert (row.status, row.fwd_flops, row.bwd_flops) == ("ok", 2 * t * D * D, 4 * t * D * D), row
    assert rows["h.1.experts.0"].fwd_flops == 2 * 8 * D * D  # 4096, where block 0's expert 0 does 2048
    # The blocks are one group (the same configuration and call); blocks whose experts ran unlike the
    # representative's are replayed themselves, and the census counted the step's FLOPs to prove the rest.
    triage = default.metadata["triage"]
    assert triage["groups"] >= 1 and triage["not_copies"] >= 2 and triage["census"]["errors"] == {}
    assert default.metadata["cost"]["census_s"] > 0
    rep = rows["h.0"].details["group"]["representatives"][0]
    for b in range(3):
        if f"h.{b}" != rep:  # every block routes unlike every other: none is a copy
            assert rows[f"h.{b}"].details["as"] == "measured" and "not_copy" in rows[f"h.{b}"].details


# --- one member of a stack runs its MLP under activation checkpointing ---------------------------------


class CkptBlock(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ckpt = False  # a plain attribute: neither the weights nor extra_repr() show it
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d, bias=False), nn.GELU(), nn.Linear(4 * d, d, bias=False))

    def forward(self, x: Tensor) -> Tensor:
        y = checkpoint(self.mlp, x, use_reentrant=False) if self.ckpt else self.mlp(x)
        return x + y


class CkptStack(nn.Module):
    def __init__(self, n: int = 3, d: int = 16) -> None:
        super().__init__()
        blocks = [CkptBlock(d) for _ in range(n)]
        blocks[1].ckpt = True
        self.h = nn.ModuleList(blocks)

    def forward(self, x: Tensor) -> Tensor:
        for b in self.h:
            x = b(x)
        return x


def test_a_checkpointed_member_keeps_its_recompute_and_saves_no_activations(monkeypatch: pytest.MonkeyPatch) -> None:
    # A plain block stands for the group and no member is measured alone for its in-situ time (pinned: the
    # member nearest the median in-situ time could be the checkpointed one).
    monkeypatch.setattr(triage_module, "_representatives", lambda members, k, insitu: [members[0]])
    monkeypatch.setattr(triage_module, "differs", lambda a, b: False)
    d, t = 16, 8
    default, full = _both(CkptStack(), torch.randn(t, d, requires_grad=True))
    assert _differences(default, full) == []
    rows = {r.path: r for r in default.rows}
    # Forward: two GEMMs of 2 * 8 * 16 * 64 = 16384 each, 32768. Backward: the input and the weight gradient
    # of each, 2 x 32768; under the checkpoint the first GEMM runs again inside the backward (+ 16384: the
    # recompute stops once what the backward needs is back, the second GEMM's input).
    gemm = 2 * t * d * 4 * d
    assert [rows[f"h.{i}"].fwd_flops for i in range(3)] == [2 * gemm] * 3
    assert [rows[f"h.{i}"].bwd_flops for i in range(3)] == [4 * gemm, 5 * gemm, 4 * gemm]
    # The checkpoint keeps only its input (the block's own): nothing else is saved for the backward.
    assert rows["h.1"].activation_mb < rows["h.0"].activation_mb
    assert rows["h.1"].details.get("as") != "representative"


# --- sibling Conv2d differing only in padding / dilation ------------------------------------------------


class Convs(nn.Module):
    #: (padding, dilation) per branch; on an 8x8 input the outputs are 8x8, 8x8, 6x6 and 6x6.
    CONFIGS = ((1, 1), (1, 1), (0, 1), (1, 2))

    def __init__(self) -> None:
        super().__init__()
        self.branches = nn.ModuleList(
            [nn.Conv2d(4, 4, 3, padding=p, dilation=dl, bias=False) for p, dl in self.CONFIGS]
        )

    def forward(self, x: Tensor) -> Tensor:
        return sum((b(x).mean() for b in self.branches), torch.zeros(()))


def test_convs_differing_in_padding_or_dilation_are_not_one_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triage_module, "differs", lambda a, b: False)  # the copy is asserted, not timing
    model, x = Convs(), torch.randn(2, 4, 8, 8, requires_grad=True)
    with Capture(model) as cap:
        model(x)
    nodes, modules = build_tree(model, cap.calls)
    by_path = {n.path: n for n in nodes}
    # Same class, weight shape and input: only extra_repr() (padding, dilation) tells them apart.
    assert sibling_groups(by_path["branches"], modules, cap.calls) == [
        ["branches.0", "branches.1"],
        ["branches.2"],
        ["branches.3"],
    ]
    default, full = _both(model, x)
    assert _differences(default, full) == []
    rows = {r.path: r for r in default.rows}
    # 2 * N * Cout * Cin * 3 * 3 * Hout * Wout: 2 * 2 * 4 * 4 * 9 * 64 = 36864 (8x8), * 36 = 20736 (6x6).
    assert [rows[f"branches.{i}"].fwd_flops for i in range(4)] == [36864, 36864, 20736, 20736]
    # The two alike are one group: one measured, the other its copy (the census counted the same FLOPs for
    # both, though they read one input: each branch's backward is its own, not its order's).
    assert sorted(rows[f"branches.{i}"].details["as"] for i in range(2)) == ["measured", "representative"]


# --- TorchScript siblings: one class name, the code tells them apart ----------------------------------------


class Branch(nn.Module):
    """``lin(lin(x))`` or ``lin(x)``: a Python attribute a trace bakes into the code it records."""

    def __init__(self, twice: bool) -> None:
        super().__init__()
        self.twice = twice
        self.lin = nn.Linear(8, 8)

    def forward(self, x: Tensor) -> Tensor:
        return self.lin(self.lin(x)) if self.twice else self.lin(x)


class Traced(nn.Module):
    """Three traced branches on one input: ``twice`` True, True, False."""

    def __init__(self, x: Tensor) -> None:
        super().__init__()
        self.branches = nn.ModuleList([torch.jit.trace(Branch(t), x) for t in (True, True, False)])

    def forward(self, x: Tensor) -> Tensor:
        return sum((b(x) for b in self.branches), torch.zeros(()))


@pytest.mark.filterwarnings("ignore:`torch.jit.trace.*` is deprecated:DeprecationWarning")
def test_traced_siblings_with_other_code_are_not_one_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triage_module, "differs", lambda a, b: False)  # the copy is asserted, not timing
    x = torch.randn(4, 8)
    model = Traced(x)
    with Capture(model) as cap:
        model(x)
    nodes, modules = build_tree(model, cap.calls)
    by_path = {n.path: n for n in nodes}
    # Same class (TopLevelTracedModule), original_name, weights and input: only the traced code differs
    assert sibling_groups(by_path["branches"], modules, cap.calls) == [["branches.0", "branches.1"], ["branches.2"]]
    default, full = _both(model, x)
    assert _differences(default, full) == []
    # Linear(8 -> 8) on 4 rows: 2 * 4 * 8 * 8 = 512 FLOPs a call; twice in the first two
    assert [default.row(f"branches.{i}").fwd_flops for i in range(3)] == [1024, 1024, 512]
    # the census cannot hook a ScriptModule, so it proves no copy of one: even the group of two alike
    # is measured twice, each counted in its own pass
    assert [default.row(f"branches.{i}").details["as"] for i in range(2)] == ["measured", "measured"]
    assert default.row("branches.1").details["not_copy"] == (
        "branches.1: the census of the step's FLOPs could not count branches.1: not proven equal"
    )
    assert default.row("branches.2").details["counted"] == "own pass: a TorchScript module: the census cannot hook it"


# --- blocks with a scalar loop-count argument -----------------------------------------------------------


class Loop(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d, bias=False)

    def forward(self, x: Tensor, n: int) -> Tensor:
        for _ in range(n):
            x = torch.tanh(self.fc(x))
        return x


class Loops(nn.Module):
    STEPS = (2, 2, 3)

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.h = nn.ModuleList([Loop(d) for _ in self.STEPS])

    def forward(self, x: Tensor) -> Tensor:
        for b, n in zip(self.h, self.STEPS, strict=True):
            x = b(x, n)
        return x


def test_blocks_with_another_loop_count_are_not_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triage_module, "differs", lambda a, b: False)  # 3 steps against 2: never "alone" by time
    d, t = 16, 8
    default, full = _both(Loops(d), torch.randn(t, d, requires_grad=True))
    assert _differences(default, full) == []
    rows = {r.path: r for r in default.rows}
    # n GEMMs of 2 * 8 * 16 * 16 = 4096: 8192 for n = 2, 12288 for n = 3; the backward twice that.
    assert [rows[f"h.{i}"].fwd_flops for i in range(3)] == [8192, 8192, 12288]
    assert [rows[f"h.{i}"].bwd_flops for i in range(3)] == [16384, 16384, 24576]
    assert [rows[f"h.{i}.fc"].calls for i in range(3)] == [2, 2, 3]
    assert rows["h.2"].details.get("group", {}).get("members", ["h.2"]) == ["h.2"] or "not_copy" in rows["h.2"].details


# --- work set by a buffer's value: only the census sees it --------------------------------------------


class Steps(nn.Module):
    """``steps`` GEMMs with its own weight; ``steps`` is a buffer (same shape in every block, another value)."""

    steps: Tensor

    def __init__(self, d: int, steps: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(d, d) / d)
        self.register_buffer("steps", torch.tensor(steps))

    def forward(self, x: Tensor) -> Tensor:
        for _ in range(int(self.steps)):
            x = torch.tanh(x @ self.w)
        return x


class StepStack(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.h = nn.ModuleList([Steps(d, n) for n in (1, 1, 2)])

    def forward(self, x: Tensor) -> Tensor:
        for b in self.h:
            x = b(x)
        return x


def test_a_member_counting_other_flops_in_the_step_is_not_a_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triage_module, "differs", lambda a, b: False)  # 2 steps against 1: never "alone" by time
    d, t = 16, 8
    default, full = _both(StepStack(d), torch.randn(t, d, requires_grad=True))
    assert _differences(default, full) == []
    rows = {r.path: r for r in default.rows}
    # One group (same class, shapes, call), so the census decides: 2 * 8 * 16 * 16 = 4096 FLOPs a step.
    assert rows["h.0"].details["group"]["members"] == ["h.0", "h.1", "h.2"]
    assert [rows[f"h.{i}"].fwd_flops for i in range(3)] == [4096, 4096, 8192]
    # The members whose step count differs from the representative's are replayed, the census saying why.
    (rep,) = rows["h.0"].details["group"]["representatives"]
    steps = {"h.0": 1, "h.1": 1, "h.2": 2}
    unlike = [m for m in steps if steps[m] != steps[rep]]
    census = "FLOPs in the step where its counterpart counted"
    assert unlike and all(census in rows[m].details["not_copy"] for m in unlike)
    assert default.metadata["triage"]["not_copies"] == len(unlike)


# --- a component that fails alone (it reads a flag its parent sets), its children each tiny -------------


class Fragile(nn.Module):
    """60 ms of its own in the step (a sleep: most of it, above ``descend_share=0.5``), around two 4x4
    GEMMs on 8 rows that are each far below it; replayed alone it raises before the sleep."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.a = nn.Linear(4, 4, bias=False)
        self.b = nn.Linear(4, 4, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        if not self.armed:
            raise RuntimeError("needs its parent")
        time.sleep(0.06)
        return self.b(self.a(x))


class HeavyAndFragile(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.heavy = nn.Linear(512, 512)
        self.tiny = Fragile()

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        self.tiny.armed = True
        try:
            z = self.tiny(y)
        finally:
            self.tiny.armed = False
        return self.heavy(x).sum() + z.sum()


def test_a_component_that_fails_alone_is_descended_into_whatever_its_childrens_shares() -> None:
    # descend_share=0.5: tiny (60 ms beside a 512x512 GEMM on 512 rows) is replayed, its two 4x4 GEMMs on
    # 8 rows are each far below and left in the step's numbers; its replay fails: they are replayed.
    model, args = HeavyAndFragile(), (torch.randn(512, 512), torch.randn(8, 4))
    default, full = _both(model, *args, descend_share=0.5)
    rows = {r.path: r for r in default.rows}
    tiny = rows["tiny"]
    assert tiny.status == "estimated", tiny
    assert "replay raised RuntimeError: needs its parent" in (tiny.error or "")
    assert "its replay failed: descended into all the same (share " in (tiny.note or "")
    # Both children are what the descent skipped on a quiet machine; on a busy one the in-situ times the triage
    # reads can put one above the share already (then the failure opens only the other): any timing, both end ok.
    assert re.search(r"its [12] children replayed", tiny.note or ""), tiny.note
    assert "estimated from 2 of 2 children" in (tiny.note or "")
    # Estimated from its children as under descend="all": 2 * 8 * 4 * 4 = 256 FLOPs each, forward.
    assert tiny.fwd_flops == 2 * 256
    assert [rows[p].status for p in ("tiny.a", "tiny.b")] == ["ok", "ok"]
    assert _differences(default, full, ["tiny", "tiny.a", "tiny.b"]) == []


# --- a representative that fails where its members do not ----------------------------------------------


class Picky(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fail_alone = False  # set on one block: it raises when replayed without its parent
        self.inside = False
        self.fc = nn.Linear(d, d, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        if self.fail_alone and not self.inside:
            raise RuntimeError("replayed without its parent")
        return x + self.fc(x)


class PickyStack(nn.Module):
    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.blocks = [Picky(d) for _ in range(3)]
        self.blocks[1].fail_alone = True
        self.h = nn.ModuleList(self.blocks)

    def forward(self, x: Tensor) -> Tensor:
        for b in self.blocks:
            b.inside = True
        try:
            for b in self.blocks:
                x = b(x)
        finally:
            for b in self.blocks:
                b.inside = False
        return x


def test_members_of_a_failed_representative_are_measured_themselves(monkeypatch: pytest.MonkeyPatch) -> None:
    # h.1, the one that fails alone, stands for the group (the member nearest the median in-situ time
    # would be any of the three, and one might run slower in situ and be measured alone: both pinned).
    monkeypatch.setattr(triage_module, "_representatives", lambda members, k, insitu: [members[1]])
    monkeypatch.setattr(triage_module, "differs", lambda a, b: False)  # no member measured alone for its time
    default, full = _both(PickyStack(), torch.randn(4, 8, requires_grad=True))
    assert _differences(default, full) == []
    rows = {r.path: r for r in default.rows}
    assert rows["h.0"].details["group"]["representatives"] == ["h.1"]
    assert (rows["h.1"].status, rows["h.1"].fwd_flops) == ("estimated", 2 * 4 * 8 * 8)  # from h.1.fc
    for m in ("h.0", "h.2"):  # never failed: measured on their own calls, no inherited error
        assert (rows[m].status, rows[m].error, rows[m].details["as"]) == ("ok", None, "measured"), rows[m]
        assert "its source h.1 failed" in rows[m].details["not_copy"]
    assert not [r.path for r in default.rows if r.details.get("as") == "representative" and r.error]


# --- item 7: copied rows' provenance, folded calls -------------------------------------------------------


def test_a_copied_row_carries_its_provenance_not_the_representatives_error() -> None:
    source = ComponentRow(
        path="h.0", module_type="Block", depth=2, parent="h", calls=1, status="estimated", fwd_ms=1.0,
        error="replay raised RuntimeError: boom", note="estimated from 2 of 2 children",
    )  # fmt: skip
    row = ComponentRow(path="h.3", module_type="Block", depth=2, parent="h", calls=2)
    take_row(row, source)
    assert (row.status, row.fwd_ms, row.calls, row.error) == ("estimated", 1.0, 2, None)
    assert (row.details["as"], row.details["from"]) == ("representative", "h.0")
    assert row.note == "taken from h.0, a representative of its repeated structure"


def test_a_folded_line_shows_the_calls_of_every_member() -> None:
    def row(path: str, calls: int, **details: Any) -> ComponentRow:
        r = ComponentRow(
            path=path, module_type="Linear", depth=2, parent="h", status="ok", calls=calls, fwd_ms=1.0, bwd_ms=0.0,
            total_ms=1.0, share=0.2 * calls,
        )  # fmt: skip
        r.details.update(details)
        return r

    root = ComponentRow(
        path="", module_type="Net", depth=0, parent=None, status="ok", calls=1, fwd_ms=5.0, bwd_ms=0.0, total_ms=5.0,
        share=1.0,
    )  # fmt: skip
    rows = [
        root,
        ComponentRow(path="h", module_type="ModuleList", depth=1, parent="", status="estimated", total_ms=5.0),
        row("h.0", 3),
        row("h.1", 1, **{"as": "representative", "from": "h.0"}),
        row("h.2", 1, **{"as": "representative", "from": "h.0"}),
    ]
    hot = Report(rows, {}).summary(top=3).split("top ")[1].splitlines()
    line = next(x for x in hot if x.startswith("h.0 ×3"))
    assert " 3+1+1 " in line, line  # each member's calls, the measured one first
    assert "calls each one's (a+b+…: unequal)" in hot[0]


# --- a census that cannot make every input require grad ---------------------------------------------------


class Looped(nn.Module):
    """``k`` matmuls: blocks that differ only in this Python attribute do different work."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(D, D) / D**0.5)
        self.k = k

    def forward(self, x: Tensor) -> Tensor:
        for _ in range(self.k):
            x = torch.tanh(x @ self.w)
        return x


class NormalisedInPlace(nn.Module):
    """The root normalises its input in place: a census replay whose inputs all require grad raises
    (an in-place op on a leaf that requires grad), the step's own call does not."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[Looped(k) for k in (1, 1, 3, 1)])

    def forward(self, x: Tensor) -> Tensor:
        x.sub_(x.mean())
        return self.blocks(x)


def test_a_census_that_raises_with_every_input_requiring_grad_counts_the_steps_own_call() -> None:
    torch.manual_seed(0)
    default, full = _both(NormalisedInPlace(), torch.randn(T, D))
    assert _differences(default, full) == []
    rows = {r.path: r for r in default.rows}
    assert rows["blocks.2"].fwd_flops == 3 * 2 * T * D * D  # 3 matmuls of (T, D) @ (D, D)
    assert rows["blocks.2"].details.get("as") == "measured"
    assert default.metadata["triage"]["census"]["errors"] == {}


def test_a_node_the_census_could_not_count_is_never_a_copy() -> None:
    # Two nodes with one and the same captured call; the census counted one and not the other (its
    # top raised): nothing proves they did the same work.
    model = nn.Sequential(nn.Linear(D, D))
    with Capture(model) as cap:
        model(torch.randn(T, D))
    calls = {"0": cap.calls["0"], "1": cap.calls["0"]}
    census = [{"0": (1, 2, 3), "1": None}]
    why = triage_module._own_difference("1", "0", [calls], census)
    assert why is not None and "could not count 1" in why
    assert triage_module._own_difference("1", "0", [calls], [{"0": (1, 2, 3), "1": (1, 2, 3)}]) is None
