"""The triage's inputs under several ranks, reduced as every rank must see them (no process group: a
coordinator stand-in that answers with the ranks' values)."""

from __future__ import annotations

import math
from typing import Any, cast

from cb_callback._engine.clocks.insitu import InSitu
from cb_callback._engine.counting.census import CountsOf
from cb_callback._engine.distributed.lockstep import Coordinator
from cb_callback._engine.selection.ranked_triage import every_rank_counts, plan_difference, reduce_costs, reduce_times
from cb_callback._engine.selection.triage import Plan, _own_difference

NAN = math.nan


class _Ranks:
    """A coordinator of rank 0 whose gathers answer ``theirs`` (rank 1's value) beside this rank's own."""

    rank, world = 0, 2

    def __init__(self, theirs: Any) -> None:
        self.theirs = theirs

    def gather(self, obj: Any) -> list[Any]:
        return [obj, self.theirs]


def _ranks(theirs: Any) -> Coordinator:
    return cast(Coordinator, _Ranks(theirs))


def test_costs_and_the_step_are_the_max_over_the_ranks() -> None:
    # rank 0: a 2 ms, b 5 ms, step 10 ms; rank 1: a 4 ms, b untimed, c 1 ms, step 8 ms
    costs, step = reduce_costs(_ranks(({"a": 4.0, "b": None, "c": 1.0}, 8.0)), {"a": 2.0, "b": 5.0}, 10.0)
    assert costs == {"a": 4.0, "b": 5.0, "c": 1.0} and step == 10.0


def test_per_call_times_are_the_max_and_a_nan_on_any_rank_stays_nan() -> None:
    mine = {"a": InSitu(fwd_ms=1.0, calls=2, spread=0.1, bwd_ms=3.0), "b": InSitu(1.0, 1, 0.2, 2.0)}
    theirs = {"a": (2.0, 3, 0.05, 1.0), "b": (0.5, 1, 0.3, NAN)}  # rank 1's (fwd, calls, spread, bwd)
    out = reduce_times(_ranks(theirs), mine)
    assert (out["a"].fwd_ms, out["a"].calls, out["a"].spread, out["a"].bwd_ms) == (2.0, 2, 0.1, 3.0)  # calls: mine
    assert (out["b"].fwd_ms, out["b"].spread) == (1.0, 0.3) and math.isnan(out["b"].bwd_ms)


def test_every_ranks_counts_are_compared_on_their_own_and_named_by_rank() -> None:
    # members p and q did the same work on rank 0 and differ on rank 1 only: not proven equal
    mine = [{"p": (10, 20, 64), "q": (10, 20, 64)}]
    theirs = [{"p": (10, 20, 64), "q": (12, 24, 64)}]
    counts = every_rank_counts(_ranks(theirs), mine)
    assert [c.where for c in counts] == [" (rank 0)", " (rank 1)"] and all(isinstance(c, CountsOf) for c in counts)
    why = _own_difference("p", "q", [{}], counts)
    assert why == (
        "counted 10 forward and 20 backward FLOPs in the step where its counterpart counted 12 and 24 (rank 1)"
    )
    # the same on both: no difference
    assert _own_difference("p", "q", [{}], every_rank_counts(_ranks(mine), mine)) is None


def test_two_batches_per_rank_are_named_by_rank_and_batch() -> None:
    mine = [{"p": (1, 1, 1)}, {"p": (2, 2, 2)}]
    counts = every_rank_counts(_ranks(mine), mine)
    where = [c.where for c in counts]
    assert where == [" (rank 0, batch 0)", " (rank 0, batch 1)", " (rank 1, batch 0)", " (rank 1, batch 1)"]


def test_plans_that_differ_in_what_they_replay_are_named() -> None:
    plan = Plan(skip={"head": ("head", 0.01)}, copy={"b.2": "b.1"})
    same = Plan(skip={"head": ("head", 0.02)}, copy={"b.2": "b.1"})  # another share, the same decision
    assert plan_difference(_ranks({**_decisions_of(same)}), plan) is None
    other = Plan(skip={}, copy={"b.2": "b.1"})
    assert plan_difference(_ranks(_decisions_of(other)), plan) == (
        "the triage's plans differ between rank 0 and rank 1 (skip: head); the ranks descend level by level instead"
    )


def _decisions_of(plan: Plan) -> dict[str, Any]:
    from cb_callback._engine.selection.ranked_triage import _decisions

    return _decisions(plan)


def test_another_ranks_calls_tell_members_apart_and_are_named_by_rank() -> None:
    from cb_callback._engine.selection.groups import ViewsOf

    # call views (call count, grad mode, training, wrapper, reach of the loss, calls with a backward, other
    # calls, input signature): p and q alike here, on rank 1 called on 2 and 6 rows
    def view(rows: int) -> tuple[Any, ...]:
        return (1, True, True, None, True, 1, (), ((("float32", (rows, 16)),), (False,), (), "spec"))

    rank1 = ViewsOf({"p": view(2), "q": view(6)}, " (rank 1)")
    assert _own_difference("p", "q", [{}], (), [rank1]) == (
        "called on (('float32', (2, 16)),) where its counterpart on (('float32', (6, 16)),) (rank 1)"
    )
    assert _own_difference("p", "q", [{}], (), [ViewsOf({"p": view(4), "q": view(4)}, " (rank 1)")]) is None
    # not called on rank 1: a difference too
    assert _own_difference("p", "q", [{}], (), [ViewsOf({"q": view(4)}, " (rank 1)")]) == (
        "not called in the step (rank 1)"
    )
