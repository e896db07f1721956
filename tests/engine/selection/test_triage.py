"""Triage from in-situ costs and repeated structure (issue 17 §1-§2), decided before any replay.

The costs here are given, not timed: every decision is exact arithmetic on them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from cb_callback._engine.capture.capture import Capture
from cb_callback._engine.capture.tree import build_tree
from cb_callback._engine.clocks.insitu import InSitu
from cb_callback._engine.selection.groups import sibling_groups
from cb_callback._engine.selection.triage import Plan, differs, insitu_costs, triage


class Attn(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, -1)
        return self.proj(torch.softmax(q @ k.transpose(-1, -2), -1) @ v)


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.attn = Attn(d)
        self.fc = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(self.attn(x))


class Stack(nn.Module):
    """``n`` identical blocks in a ``ModuleList`` and a head of another width."""

    def __init__(self, n: int, d: int = 8) -> None:
        super().__init__()
        self.h = nn.ModuleList([Block(d) for _ in range(n)])
        self.head = nn.Linear(d, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.h:
            x = b(x)
        return self.head(x)


def _plan(model: nn.Module, x: torch.Tensor, own_ms: dict[str, float], **kw: Any) -> Plan:
    """The plan for given per-call in-situ times (``own_ms``; containers sum their children).

    ``x`` requires grad, so every block gets an input gradient alike (the groups' key compares it).
    """
    with Capture(model) as cap:
        model(x)
    nodes, modules = build_tree(model, cap.calls)
    costs = insitu_costs(nodes, own_ms, cap.calls)
    step = costs[""]
    assert step is not None
    return triage(
        nodes, modules, cap.calls, costs, step,
        descend_share=kw.get("descend_share", 0.05), representatives=int(kw.get("representatives", 1)),
        insitu=kw.get("insitu"),
    )  # fmt: skip


def _stack_times(n: int, block_ms: float, head_ms: float) -> dict[str, float]:
    """Per-call times: each block ``block_ms`` (attn 60 %, of which qkv 2/3 and proj 1/3; fc 40 %)."""
    out = {"": n * block_ms + head_ms, "head": head_ms}
    for i in range(n):
        out |= {
            f"h.{i}": block_ms, f"h.{i}.attn": 0.6 * block_ms, f"h.{i}.attn.qkv": 0.4 * block_ms,
            f"h.{i}.attn.proj": 0.2 * block_ms, f"h.{i}.fc": 0.4 * block_ms,
        }  # fmt: skip
    return out


def test_blocks_each_under_the_share_are_descended_as_a_group() -> None:
    # 12 blocks of 4.7 ms and a head of 43.6 ms: a step of 100 ms. Each block holds 0.047 < 0.05,
    # together 0.564: the group's total decides, so the first block is measured in depth.
    plan = _plan(Stack(12), torch.randn(2, 8, requires_grad=True), _stack_times(12, 4.7, 43.6))
    assert plan.groups["h.3"]["members"] == [f"h.{i}" for i in range(12)]
    assert plan.groups["h.3"]["representatives"] == ["h.0"]
    assert abs(plan.groups["h.0"]["share"] - 12 * 0.047) < 1e-12
    # Block 0 and everything under it is replayed: attn (0.6 × 4.7 = 2.82 ms, × 12 = 0.338 of the
    # step) is descended into too, so qkv and proj are measured.
    replayed = [p for p in plan.shares if p not in plan.copy and p not in plan.skip]
    assert replayed == ["", "h", "head", "h.0", "h.0.attn", "h.0.fc", "h.0.attn.qkv", "h.0.attn.proj"]
    # The other blocks take block 0's rows, each subtree node its counterpart's.
    assert plan.copy["h.7"] == "h.0"
    assert plan.copy["h.7.attn.qkv"] == "h.0.attn.qkv"
    assert len(plan.copy) == 11 * 5  # 11 blocks × (block, attn, qkv, proj, fc)
    assert plan.alone == set() and plan.skip == {}  # no in-situ times given: no member differs
    # attn's effective share: 12 members stand behind h.0, so 12 × 0.0282 = 0.3384.
    assert abs((plan.effective["h.0.attn"] or 0) - 12 * 0.6 * 0.047) < 1e-12


def test_without_groups_no_small_block_is_replayed_but_the_top_hotspots_are() -> None:
    # representatives=0: the per-component rule; every block (0.047) is under 0.05, so a block is not
    # replayed at all (a container's share, h's 0.564, is not enough), and its rows keep the step's
    # numbers: skip[h.4] is h.4 itself. The top 5 leaves by share are replayed whatever theirs, and the
    # nodes on the way to them: head (0.436), then four of the equal 0.4 × 4.7 = 1.88 ms leaves, the
    # first in breadth-first order: h.0.fc … h.3.fc (fc, at depth 2, comes before qkv at depth 3).
    plan = _plan(Stack(12), torch.randn(2, 8, requires_grad=True), _stack_times(12, 4.7, 43.6), representatives=0)
    assert plan.groups == {} and plan.copy == {}
    assert plan.skip["h.4"] == ("h.4", 4.7 / 100) and plan.skip["h.4.attn.qkv"] == ("h.4", 4.7 / 100)
    # h.0 is replayed (on the way to h.0.fc) and descended into: its small attn is left itself.
    assert plan.skip["h.0.attn"] == ("h.0.attn", 0.6 * 4.7 / 100)
    top = [f"h.{i}.fc" for i in range(4)]
    assert sorted(p for p in plan.shares if p not in plan.skip) == sorted(
        ["", "h", "head", *(f"h.{i}" for i in range(4)), *top]
    )


def test_a_member_that_runs_unlike_its_representative_is_measured_alone_not_descended() -> None:
    # Blocks of 6 ms each, h.2 at 10 ms in situ: the median is 6 ms, so h.0 (the first at it) stands
    # for the group; 10 > (1 + 0.5 + 2 × (0.02 + 0.02)) × 6 = 9.48 (and by more than 0.05 ms): h.2 is
    # replayed at its own level; h.3 (6.3 < 9.48) takes h.0's row. Neither is descended into.
    times = _stack_times(5, 6.0, 66.0) | {"h.2": 10.0, "h.3": 6.3}
    spread = {p: InSitu(t, 1, 0.02) for p, t in times.items()}
    plan = _plan(Stack(5), torch.randn(2, 8, requires_grad=True), times, insitu=spread)
    assert plan.groups["h.0"]["representatives"] == ["h.0"]
    assert plan.alone == {"h.2"}
    assert "h.2" not in plan.copy and plan.copy["h.2.attn"] == "h.0.attn"
    assert plan.copy["h.1"] == "h.0" and plan.copy["h.3"] == "h.0"
    assert differs(InSitu(6.0, 1, 0.02), InSitu(9.47, 1, 0.02)) is False
    assert differs(InSitu(6.0, 1, 0.02), InSitu(9.49, 1, 0.02)) is True
    # Sub-slack differences are never news: 0.01 vs 0.05 ms differ by 0.04 ms < 0.05 ms.
    assert differs(InSitu(0.01, 1, 0.0), InSitu(0.05, 1, 0.0)) is False


def test_the_representative_is_the_member_nearest_the_median_not_a_cold_first_one() -> None:
    # h.0 runs first and cold, 12 ms; the others 6 ms: h.1 stands for the group, and h.0, twice as slow
    # (12 > 1.5 × 6 = 9), is measured alone.
    times = _stack_times(4, 6.0, 70.0) | {"h.0": 12.0}
    plan = _plan(
        Stack(4), torch.randn(2, 8, requires_grad=True), times, insitu={p: InSitu(t, 1, 0.0) for p, t in times.items()}
    )
    assert plan.groups["h.0"]["representatives"] == ["h.1"]
    assert plan.alone == {"h.0"} and plan.copy["h.0.attn"] == "h.1.attn" and plan.copy["h.3"] == "h.1"


def test_the_wide_model_measures_one_member_of_300_and_a_cold_container_none() -> None:
    # 300 blocks of 7/300 ms under a ModuleList and a head of 93 ms: the container holds 0.07 of the
    # step, each block 0.00023; the group's total 0.07 >= 0.05, so block 0 is replayed and descended
    # into, and the 299 others take its rows (5 nodes each). Its children are each under descend_share
    # themselves: attn stands for 300 × 0.6 × 7/300 ms = 4.2 ms, 0.042 < 0.05, fc for 0.028. But block
    # 0's leaves stand for 300 each: fc and qkv 0.028, proj 0.014, all at least descend_share / 5 =
    # 0.01: with head they are the top hotspots, replayed with the way to them (attn).
    n = 300
    plan = _plan(Stack(n), torch.randn(2, 8, requires_grad=True), _stack_times(n, 7.0 / n, 93.0))
    replayed = [p for p in plan.shares if p not in plan.copy and p not in plan.skip]
    assert replayed == ["", "h", "head", "h.0", "h.0.attn", "h.0.fc", "h.0.attn.qkv", "h.0.attn.proj"]
    assert len(plan.copy) == 299 * 5 and plan.copy["h.299"] == "h.0"
    # The same blocks at 0.0001 ms: the container holds 0.0003 < 0.05: neither it nor anything under it
    # is replayed.
    cold = _plan(Stack(n), torch.randn(2, 8, requires_grad=True), _stack_times(n, 0.0001, 100.0 - n * 0.0001))
    assert cold.skip["h.0"] == ("h", cold.shares["h"]) and abs((cold.shares["h"] or 0) - 0.0003) < 1e-12
    assert cold.skip["h"] == ("h", cold.shares["h"])
    assert [p for p in cold.shares if p not in cold.skip] == ["", "head"]


def test_two_representatives_are_both_measured_in_depth() -> None:
    two = _plan(Stack(6), torch.randn(2, 8, requires_grad=True), _stack_times(6, 10.0, 40.0), representatives=2)
    assert two.groups["h.5"]["representatives"] == ["h.0", "h.1"]
    assert "h.1.attn.qkv" not in two.copy and "h.1.attn.qkv" not in two.skip
    assert two.copy["h.4.attn"] == "h.0.attn"


def test_siblings_differing_in_shape_or_input_are_not_a_group() -> None:
    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(8, 8)
            self.b = nn.Linear(8, 8)
            self.c = nn.Linear(8, 4)  # another weight shape
            self.d = nn.Linear(8, 8)  # called on another input shape

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c(self.b(self.a(x))).sum() + self.d(x[:1]).sum()

    model = Mixed()
    with Capture(model) as cap:
        model(torch.randn(2, 8, requires_grad=True))
    nodes, modules = build_tree(model, cap.calls)
    assert sibling_groups(nodes[0], modules, cap.calls) == [["a", "b"], ["c"], ["d"]]
    # An input that needs no gradient (the first layer of a stack) makes another backward: not one group.
    with Capture(model) as cap:
        model(torch.randn(2, 8))
    assert sibling_groups(nodes[0], modules, cap.calls) == [["a"], ["b"], ["c"], ["d"]]


def test_of_leaves_each_under_the_share_the_five_largest_are_replayed_the_rest_keep_the_steps_numbers() -> None:
    # Eight Linears of distinct widths (no group) holding 5 … 15 ms of an 80 ms step: each under
    # descend_share=0.2 (the largest 15/80 = 0.1875) and over descend_share / 5 = 0.04 (the least 5/80).
    # The root's children are replayed by their own share only, so none would be; the five largest (15,
    # 14, 13, 12, 8 ms: layers 1, 3, 5, 7, 6) are the top hotspots and replayed anyway; 5, 6 and 7 ms
    # (layers 0, 2, 4) keep the step's numbers, each skipped itself.
    model = nn.Sequential(*[nn.Linear(8 + i, 9 + i) for i in range(8)])
    own = [5.0, 15.0, 6.0, 14.0, 7.0, 13.0, 8.0, 12.0]
    times = {"": sum(own)} | {str(i): t for i, t in enumerate(own)}
    plan = _plan(model, torch.randn(2, 8, requires_grad=True), times, descend_share=0.2)
    assert plan.groups == {}
    assert sorted(p for p in plan.shares if p not in plan.skip) == ["", "1", "3", "5", "6", "7"]
    assert {p: plan.skip[p] for p in plan.skip} == {str(i): (str(i), own[i] / 80) for i in (0, 2, 4)}
