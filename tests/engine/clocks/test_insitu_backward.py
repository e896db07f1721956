"""Each module's backward inside the step (issue 24 §2): the autograd nodes its forward built, timed on CPU."""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from cb_callback import profile_components
from cb_callback._engine.capture.inputs import ComponentInputs
from cb_callback._engine.clocks.clock import HookClock
from cb_callback._engine.clocks.insitu import hook_clock, time_in_situ
from cb_callback._engine.clocks.nodeclock import NodeClock
from cb_callback._engine.replay.isolate import Replay
from tests.conftest import FAST
from tests.engine.clocks.test_insitu import Sleepy

# min_run_time_s=0.05: the in-situ passes' budget (3 × 2 × 0.05 s) lets all 3 run on these small models.
TIMED: dict[str, Any] = FAST | dict(min_repeats=3, max_repeats=3, rounds=1, min_run_time_s=0.05)


class _SlowBack(torch.autograd.Function):
    """Identity forward; a backward that sleeps ``ms`` (a sleep is at least that long)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, ms: float) -> torch.Tensor:
        ctx.ms = ms
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        time.sleep(ctx.ms / 1e3)
        return grad, None


class BackHeavy(nn.Module):
    """A Linear, then a backward of at least ``ms``; its forward is the Linear's."""

    def __init__(self, ms: float) -> None:
        super().__init__()
        self.ms = ms
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SlowBack.apply(self.lin(x), self.ms)


class Pair(nn.Module):
    def __init__(self, front_ms: float = 10.0, back_ms: float = 40.0) -> None:
        super().__init__()
        self.front = Sleepy(front_ms)  # a forward that sleeps front_ms; its backward is a Linear's
        self.back = BackHeavy(back_ms)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.back(self.front(x)) + x  # a residual: the root sums two gradients of x


def _names(clock: NodeClock) -> dict[str, list[str]]:
    """Each path's claimed nodes' names, innermost owner only, sorted."""
    out: dict[str, list[str]] = {}
    for node, chain in clock.owners.items():
        out.setdefault(chain[-1][0], []).append(node.name())
    return {k: sorted(v) for k, v in sorted(out.items())}


def test_each_call_claims_the_nodes_its_forward_built() -> None:
    model = Pair(0.0, 0.0)
    x = torch.randn(2, 4, requires_grad=True)
    nodes = NodeClock()
    with hook_clock(model, HookClock(), None, nodes):
        out = model(x)
    try:
        # front: its Linear's addmm, the transposed weight and both parameters' accumulators (the input
        # x is a leaf: its accumulator is reached first from front.lin's addmm, so it is front.lin's);
        # back.lin the same but x's; back: its _SlowBack node; the root: the residual's add.
        assert _names(nodes) == {
            "": ["AddBackward0"],
            "back": ["_SlowBackBackward"],
            "back.lin": [
                "AddmmBackward0", "TBackward0", "torch::autograd::AccumulateGrad", "torch::autograd::AccumulateGrad",
            ],
            "front.lin": [
                "AddmmBackward0", "TBackward0", "torch::autograd::AccumulateGrad",
                "torch::autograd::AccumulateGrad", "torch::autograd::AccumulateGrad",
            ],
        }  # fmt: skip
        # A node is charged to every call on the stack that built it: front.lin's are front's and the root's.
        addmm = next(n for n, c in nodes.owners.items() if n.name() == "AddmmBackward0")
        assert [p for p, _ in nodes.owners[addmm]] == ["", "front", "front.lin"]
        out.sum().backward()
        assert set(nodes.seconds) == {"", "front", "front.lin", "back", "back.lin"}
        # A block holds its children's nodes: front built nothing but front.lin's; the root holds all.
        assert nodes.seconds[""] >= nodes.seconds["front"] + nodes.seconds["back"] - 1e-9
        assert nodes.seconds["front"] == nodes.seconds["front.lin"]
    finally:
        nodes.close()
    assert nodes.owners == {}


def test_a_modules_backward_in_situ_is_the_time_of_the_nodes_it_built() -> None:
    # back's backward sleeps 40 ms, front's forward 10 ms: in situ, back's bwd_ms is at least its
    # sleep, front's far less (one 2×4 Linear); the root's whole backward holds back's.
    report = profile_components(Pair(10.0, 40.0), torch.randn(2, 4), descend="all", **TIMED)
    info = {r.path: r.details.get("insitu", {}) for r in report.rows}
    assert info["back"]["bwd_ms"] >= 40.0
    # front's is sub-millisecond on a quiet machine; the median of 3 passes stays under 20 ms unless two
    # of them were stalled a time slice (~15 ms) by other work.
    assert info["front"]["bwd_ms"] < 20.0
    # back holds back.lin's nodes and its own sleeping one: pass by pass, at least back.lin's + 40 ms.
    assert info["back"]["bwd_ms"] >= info["back.lin"]["bwd_ms"] + 40.0
    assert report.metadata["insitu"]["bwd_ms"][""] >= 40.0
    assert report.metadata["insitu"]["shares_of"] == "forward and backward"
    # The isolated replay sees the same sleep.
    assert report.row("back").bwd_ms >= 40.0


def test_the_triage_sees_the_backward() -> None:
    # In situ, front costs 10 ms forward, back ~0 forward and 40 ms backward. Forward alone, back's share
    # would be ~0 (left in situ); of the forward and backward it is 40 / 50+ ≥ 0.5 > descend_share=0.3,
    # and front's 10 / 50+ is under it: back is replayed, front keeps the step's numbers.
    report = profile_components(Pair(10.0, 40.0), torch.randn(2, 4), descend_share=0.3, **TIMED)
    back, front = report.row("back"), report.row("front")
    assert back.status == "ok" and back.details.get("as") != "insitu"
    assert back.details["insitu"]["share"] >= 0.5
    assert front.details.get("as") == "insitu" and front.details["insitu"]["share"] < 0.3


class Checkpointed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
        self.head = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(checkpoint(self.inner, x, use_reentrant=False))


def test_a_checkpoints_recompute_claims_nothing_and_the_backward_is_timed() -> None:
    model = Checkpointed()
    x = torch.randn(3, 4, requires_grad=True)
    nodes = NodeClock()
    with hook_clock(model, HookClock(), None, nodes):
        out = model(x)
    claimed = dict(nodes.owners)
    try:
        out.sum().backward()  # the recompute runs inner's forward hooks inside the backward
        assert nodes.owners == claimed  # nothing claimed while the backward ran
        # inner.0 and inner.2 built their addmm in the first forward; their backward ran (recomputed
        # graph or not, the recompute's new nodes belong to nobody: their time is in the unpacking node's).
        assert all(math.isfinite(v) and v >= 0.0 for v in nodes.seconds.values())
        assert {"", "head", "inner", "inner.0", "inner.1", "inner.2"} <= set(nodes.seconds)
    finally:
        nodes.close()


def test_on_cuda_no_module_below_a_top_gets_a_backward() -> None:
    # The node clock is CPU-only: time_in_situ on a "cuda" device without CUDA falls back to the CPU
    # clock for the forward (HookClock), but by_nodes is off: every path below the top is NaN.
    model = Pair(0.0, 0.0)
    x = torch.randn(2, 4)
    cpu = torch.device("cpu")
    times = time_in_situ([""], lambda top: Replay(model, _inputs(x), device=cpu), model, torch.device("cuda"), passes=1)
    assert math.isfinite(times.times[""].bwd_ms)
    assert all(math.isnan(t.bwd_ms) for p, t in times.times.items() if p)
    assert not times.backward_timed and times.cost_ms("front") == times.times["front"].fwd_ms


def _inputs(x: torch.Tensor) -> ComponentInputs:
    return ComponentInputs(args=(x,), kwargs={})


class SlowInCheckpoint(nn.Module):
    """``back`` (a 40 ms backward) under a reentrant checkpoint: its recompute and inner backward run
    inside the checkpoint's node, in the backward."""

    def __init__(self) -> None:
        super().__init__()
        self.back = BackHeavy(40.0)
        self.head = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(checkpoint(self.back, x, use_reentrant=True))


def test_a_reentrant_checkpoints_inner_backward_is_its_modules() -> None:
    # The recompute's calls claim the inner graph's nodes (for themselves and the checkpoint node's
    # owners): back's 40 ms sleep is back's in situ, its share of the step most of it, so it is replayed.
    report = profile_components(SlowInCheckpoint(), torch.randn(2, 4, requires_grad=True), descend_share=0.3, **TIMED)
    back = report.row("back")
    assert back.details["insitu"]["bwd_ms"] >= 40.0 and back.details["insitu"]["share"] >= 0.5
    assert back.status == "ok" and back.details.get("as") != "insitu"
    assert report.row("head").details["insitu"]["bwd_ms"] < 20.0  # a 4x4 Linear (< 20 ms: see above)


@dataclasses.dataclass
class State:
    h: torch.Tensor


class Child(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, state: State) -> torch.Tensor:
        return self.lin(state.h)


class Caller(nn.Module):
    """The root's own matmul, its result handed to the child inside a dataclass (no pytree node)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))
        self.child = Child()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.child(State(x @ self.w))


def test_a_call_claims_no_node_built_before_it_whatever_holds_its_input() -> None:
    # child's input is inside a State the stop set cannot see into; the nodes numbered before its call
    # (the root's MmBackward and w's accumulator) stay the root's.
    model = Caller()
    nodes = NodeClock()
    with hook_clock(model, HookClock(), None, nodes):
        model(torch.randn(2, 4))
    try:
        assert _names(nodes) == {
            "": ["MmBackward0", "torch::autograd::AccumulateGrad"],
            "child.lin": [
                "AddmmBackward0", "TBackward0", "torch::autograd::AccumulateGrad", "torch::autograd::AccumulateGrad",
            ],
        }  # fmt: skip
    finally:
        nodes.close()


def _forwards(model: nn.Module) -> tuple[list[int], Any]:
    calls = [0]

    def count(*_: Any) -> None:
        calls[0] += 1

    return calls, model.register_forward_pre_hook(count)


def test_a_top_the_census_warmed_runs_no_warm_up_of_its_own() -> None:
    """Issue 24 §1: the census's forward and backward of a top is the in-situ pass's warm-up. A top named in
    ``warmed`` runs its timed passes only (2 forwards for 2 passes); another runs one more, its warm-up."""
    model = Pair(0.0, 0.0)
    x = torch.randn(2, 4)
    cpu = torch.device("cpu")
    for warmed, want in (({""}, 2), (set(), 3)):
        calls, handle = _forwards(model)
        try:
            times = time_in_situ(
                [""], lambda top: Replay(model, _inputs(x), device=cpu), model, cpu, passes=2, warmed=warmed
            )
        finally:
            handle.remove()
        assert calls[0] == want and times.passes == 2, (warmed, calls[0], times.passes)


def test_the_default_profile_runs_the_census_once_as_its_in_situ_warm_up() -> None:
    """In a default profile the root runs forward once in the census and ``insitu_passes`` times in the
    in-situ pass, which needs no warm-up of its own, and the census's pass is the root's instrumented pass
    too; under ``descend="all"`` (no census) the in-situ pass runs its own warm-up and the root's replay an
    instrumented pass first. The timed runs are alike (the same options), so the default's root runs one
    forward fewer: 1 + 2 + its timed runs against 1 + 2 + 1 + the same. (Before this, the default ran
    1 + 1 + 2 + 1 + them: one more than "all".)"""
    counted = {}
    for descend in ("hotspots", "all"):
        model = Pair(0.0, 0.0)
        calls, handle = _forwards(model)
        try:
            opts = FAST | dict(rounds=1, insitu_passes=2, harness_floor=False, min_run_time_s=1.0)
            report = profile_components(model, (torch.randn(2, 4),), descend=descend, **opts)
        finally:
            handle.remove()
        assert report.metadata["insitu"]["passes"] == 2, report.metadata["insitu"]
        assert ("census" in report.metadata.get("triage", {})) == (descend == "hotspots")
        # the root's timed forwards are its own count (a busy machine can make a run read noisy and
        # re-measure it: more timed runs); what the test is of is the forwards around them
        counted[descend] = calls[0] - report.row("").details["fwd_repeats"]
    assert counted["hotspots"] == counted["all"] - 1, counted
