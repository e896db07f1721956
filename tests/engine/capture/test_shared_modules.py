"""A module reachable from several places: one row per parent, calls counted inside that parent."""

from __future__ import annotations

import torch
from torch import nn

from cb_callback import profile_components
from cb_callback._engine.capture.capture import Capture
from cb_callback._engine.capture.tree import build_tree, component_paths

# One Linear(16, 16) forward on a [4, 16] input: 2 * 4 * 16 * 16 FLOPs (bias adds are not counted).
LIN_FLOPS = 2 * 4 * 16 * 16


class _Twice(nn.Module):
    """Applies its (possibly shared) linear ``n`` times."""

    def __init__(self, lin: nn.Module, n: int) -> None:
        super().__init__()
        self.lin = lin
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.n):
            x = torch.relu(self.lin(x))
        return x


class _Shared(nn.Module):
    """``a`` calls the shared linear twice, ``b`` once."""

    def __init__(self) -> None:
        super().__init__()
        lin = nn.Linear(16, 16)
        self.a = _Twice(lin, 2)
        self.b = _Twice(lin, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


def test_component_paths_one_node_per_parent_and_aliases_under_one_parent() -> None:
    lin = nn.Linear(2, 2)
    block = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    model = nn.Module()
    model.a = nn.Sequential(lin)
    model.b = nn.Sequential(lin)
    model.blocks = nn.ModuleList([block] * 3)
    placed = component_paths(model)
    # lin is under a and under b: one node each. The three names of block share the parent
    # "blocks": one node, blocks.0, the others its aliases; block's children once, under blocks.0.
    assert list(placed) == ["", "a", "a.0", "b", "b.0", "blocks", "blocks.0", "blocks.0.0", "blocks.0.1"]
    assert placed["b.0"].parent == "b" and placed["b.0"].module is lin
    assert placed["blocks.0"].aliases == ["blocks.1", "blocks.2"]
    assert placed["blocks.0.0"].aliases == []  # blocks.1.0 is reached through an alias, not an alias itself
    nodes, _ = build_tree(model, {})
    by = {n.path: n for n in nodes}
    assert by["a.0"].shared_with == ["b.0"] and by["b.0"].shared_with == ["a.0"]
    assert by["blocks"].children == ["blocks.0"]


def test_capture_counts_a_shared_module_inside_each_parent() -> None:
    model = _Shared()
    with Capture(model) as cap:
        model(torch.randn(4, 16))
    # a's forward calls lin twice, b's once: 2 calls are a.lin's, 1 is b.lin's (before: a.lin had all 3).
    assert {p: c.calls for p, c in cap.calls.items()} == {"": 1, "a": 1, "a.lin": 2, "b": 1, "b.lin": 1}
    # b.lin's first call is inside b: its input is a's output (a [4, 16] tensor like a.lin's own).
    assert cap.calls["b.lin"].order > cap.calls["b"].order > cap.calls["a.lin"].order


def test_shared_module_rows_flops_and_no_parent_flag() -> None:
    torch.manual_seed(0)
    # descend="all": both rows replayed whatever the in-situ times make of the triage (beside two CPU hogs
    # it left b.lin in situ, without the replay's FLOPs)
    report = profile_components(_Shared(), torch.randn(4, 16), min_run_time_s=0.002, rounds=2, descend="all")
    a_lin, b_lin = report.row("a.lin"), report.row("b.lin")
    assert (a_lin.calls, b_lin.calls) == (2, 1)
    assert a_lin.fwd_flops == b_lin.fwd_flops == LIN_FLOPS  # per call
    # a (one call) runs lin twice: 2 * LIN_FLOPS; the root runs it three times.
    assert report.row("a").fwd_flops == 2 * LIN_FLOPS
    assert report.row("").fwd_flops == 3 * LIN_FLOPS
    assert a_lin.details["shared_with"] == ["b.lin"] and b_lin.details["shared_with"] == ["a.lin"]
    # The parent check divides a.lin's time over the step by a's calls inside a (2 calls of one
    # linear inside one call of a): the shared child is no longer compared with 3 calls' worth.
    # Flags are always a list.
    for row in report.rows:
        assert isinstance(row.details["flags"], list)


class _FailsOnReplay(nn.Module):
    """Runs its shared linear twice; raises on every call after the first (the capture's)."""

    def __init__(self, lin: nn.Module) -> None:
        super().__init__()
        self.lin = lin
        self.seen = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += 1
        if self.seen > 1:
            raise RuntimeError("only once")
        return self.lin(self.lin(x))


def test_failed_parent_is_estimated_from_its_shared_child_per_parent_calls() -> None:
    lin = nn.Linear(16, 16)
    model = nn.Module()
    model.a = nn.Sequential(lin)
    model.b = _FailsOnReplay(lin)
    model.forward = lambda x: model.b(model.a(x))  # type: ignore[method-assign]
    report = profile_components(model, torch.randn(4, 16), min_run_time_s=0.002, rounds=2)
    b = report.row("b")
    # b's replays raise; it is estimated from b.lin, whose 2 calls are inside b's 1 call:
    # 2 * LIN_FLOPS per call of b. (Before, lin had one row, a.0, and b had no child: failed.)
    assert b.status == "estimated", (b.status, b.error)
    assert b.fwd_flops == 2 * LIN_FLOPS
    assert report.row("b.lin").calls == 2 and report.row("a.0").calls == 1
