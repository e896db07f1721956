"""``budget_s``: the whole profile's seconds, spent on the largest in-situ shares first; the rest keep their
in-situ time (issue 24)."""

from __future__ import annotations

import math
import time

import pytest
import torch
from torch import nn

from cb_callback import BenchmarkConfig, profile_components
from cb_callback._report.numbers import sig
from cb_callback._report.table import format_summary


class _Slow(nn.Module):
    """30 ms a forward (a sleep), then an op with a backward: the step's largest in-situ share."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.03)
        return x * 2.0


class _Model(nn.Module):
    """``small`` (a ReLU) comes first in the tree, ``big`` (30 ms) second: breadth-first would start ``small``
    before ``big``."""

    def __init__(self) -> None:
        super().__init__()
        self.small = nn.ReLU()
        self.big = _Slow()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.big(self.small(x))


def _x() -> torch.Tensor:
    return torch.randn(4, 8, requires_grad=True)


def test_the_largest_in_situ_share_is_replayed_first_and_the_rest_keep_their_in_situ_time() -> None:
    # Each replay commits its timing budget, 2 × min_run_time_s = 1.5 s (forward and backward; a run of about
    # 30 ms makes min_repeats × the pass far less). budget_s=2.25: the root starts (spent well under 2.25),
    # then the largest share, big (spent + 1.5 < 2.25 while the in-situ pass, the census and the root's
    # instrumented pass took under 0.75 s), then small finds spent + 3.0 >= 2.25: not started. Breadth-first
    # order would have started small, not big.
    # The first instrumented pass in a process pays the counters' one-off set-up (about 0.9 s here), and a
    # replay commits min_repeats × its pass when that is more: one cheap profile first.
    profile_components(_Model(), _x(), min_run_time_s=0.0, min_repeats=1, rounds=1, insitu_passes=0)
    # descend_share=0: the triage replays every row (small's share is far under the default's), so that
    # what leaves small unreplayed is the budget.
    report = profile_components(_Model(), _x(), budget_s=2.25, min_run_time_s=0.75, rounds=2, descend_share=0.0)
    rows = {r.path: r for r in report.rows}
    assert [r.path for r in report.rows] == ["", "small", "big"]  # rows in tree order, whatever the start order
    assert rows[""].status == "ok" and rows["big"].status == "ok" and "unreplayed" not in rows["big"].details
    small = rows["small"]
    assert small.status == "skipped" and small.details["unreplayed"] == "budget_s"
    assert small.note is not None and small.note.startswith("budget_s=2.25 reached: ")
    assert "its in-situ time stands" in small.note
    assert math.isfinite(small.insitu_ms) and small.insitu_ms > 0
    assert math.isnan(small.fwd_ms)
    budget = report.metadata["cost"]["budget"]
    assert budget["budget_s"] == 2.25 and budget["unreplayed"] == 1 and budget["root_unreplayed"] is False
    assert budget["largest_unreplayed_share"] == small.details["insitu"]["share"]
    line = next(x for x in format_summary(report).splitlines() if x.startswith("budget_s="))
    assert line.startswith("budget_s=2.25 s spent: 1 component not replayed (the largest in-situ share among them ")
    assert "the root too" not in line


def test_a_budget_too_small_for_the_root_still_returns_every_in_situ_time_and_says_so() -> None:
    report = profile_components(_Model(), _x(), budget_s=0.0, descend_share=0.0)  # the budget leaves all three
    assert [r.status for r in report.rows] == ["skipped"] * 3
    assert all(r.details["unreplayed"] == "budget_s" for r in report.rows)
    # the in-situ pass ran whole: every module has its forward inside the step
    assert all(math.isfinite(r.insitu_ms) and r.insitu_ms > 0 for r in report.rows)
    assert report.rows[1].insitu_ms < report.rows[2].insitu_ms  # the ReLU under the 30 ms sleep
    budget = report.metadata["cost"]["budget"]
    assert budget["unreplayed"] == 3 and budget["root_unreplayed"] is True
    summary = format_summary(report)
    assert "budget_s=0 s spent: 3 components not replayed" in summary
    assert "their in-situ times stand" in summary
    root = report.rows[0].details["insitu"]
    assert budget["root_insitu_ms"] == [root["fwd_ms"], root["bwd_ms"]]
    assert f"the root too: in situ {sig(root['fwd_ms'])} ms forward + {sig(root['bwd_ms'])} ms backward" in summary


class _Stack(nn.Module):
    """A ``ModuleList`` (a container, never called itself) of two blocks under the root."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_a_container_whose_children_the_budget_left_is_their_in_situ_sum_not_failed() -> None:
    report = profile_components(_Stack(), _x(), budget_s=0.0)
    rows = {r.path: r for r in report.rows}
    # blocks has nothing of its own to replay: its children kept their in-situ numbers, and it is their sum
    # (before: failed, "no child could be measured"; then skipped with them, without a number)
    assert rows["blocks"].status == "estimated" and rows["blocks"].error is None
    assert "estimated from 2 of 2 children (2 in situ" in (rows["blocks"].note or "")
    # each child an 8x8 Linear on (4, 8): 512 forward FLOPs by the census, once each; blocks is never called
    assert rows["blocks"].fwd_flops == 512 + 512
    assert rows["blocks"].fwd_ms == rows["blocks.0"].insitu_ms + rows["blocks.1"].insitu_ms
    budget = report.metadata["cost"]["budget"]
    # the triage's replays the budget left: the root and blocks.0 (blocks.1, an equal Linear on equal inputs,
    # would take blocks.0's row; blocks, the container, replays nothing of its own). With its representative
    # left unmeasured, blocks.1 shows its own in-situ time and the census's counts, as blocks.0 does
    assert rows["blocks.1"].details["as"] == rows["blocks.0"].details["as"] == "insitu"
    # an 8x8 Linear on a (4, 8) batch: 2*4*8*8 = 512 forward FLOPs, 1024 backward (input and weight grads)
    assert (rows["blocks.1"].fwd_flops, rows["blocks.1"].bwd_flops) == (512, 1024)
    # the rows the budget left: the root and the two blocks (blocks, their sum, is estimated from them); the
    # replays those stood for: the root's and blocks.0's (blocks.1 planned as its copy), or also blocks.1's
    # where the triage planned it alone or as a second representative (their in-situ times, which follow the
    # machine's load, read apart: seen once in about 40 profiles beside other work)
    group = rows["blocks.1"].details.get("group")
    assert budget["unreplayed"] == 3 and budget["replays_left"] in (2, 3), (budget, group)
    # the triage line says what was planned (the plan's count takes in the container) and what the budget left
    assert report.metadata["triage"]["replayed"] == 3
    assert "triage (in situ): 3 to replay, 2 of them left by budget_s" in format_summary(report)


def test_without_in_situ_times_the_budget_goes_breadth_first_and_the_root_is_not_exempt() -> None:
    report = profile_components(_Model(), _x(), budget_s=0.0, insitu_passes=0)
    assert [r.status for r in report.rows] == ["skipped"] * 3
    assert all(math.isnan(r.insitu_ms) for r in report.rows)
    assert all("without an in-situ time (no in-situ pass ran): no numbers" in (r.note or "") for r in report.rows)
    budget = report.metadata["cost"]["budget"]
    assert budget["largest_unreplayed_share"] is None and budget["with_insitu"] == 0
    assert "and no in-situ pass ran: these rows have no numbers" in format_summary(report)
    # max_total_time_s, by contrast, always measures the root when above 0
    assert profile_components(_Model(), _x(), budget_s=None, max_total_time_s=1e-9).rows[0].status == "ok"


def test_no_budget_changes_nothing_and_a_bad_budget_is_refused() -> None:
    report = profile_components(_Model(), _x())
    assert "budget" not in report.metadata["cost"]
    assert all("unreplayed" not in r.details for r in report.rows)
    assert not any(x.startswith("budget_s=") for x in format_summary(report).splitlines())
    with pytest.raises(ValueError, match=r"BenchmarkConfig.budget_s=-1 is invalid"):
        BenchmarkConfig(budget_s=-1)
