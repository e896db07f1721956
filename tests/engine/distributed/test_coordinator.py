"""The coordinator's agreement rule without a process group: the first rank's error, named when another's."""

from __future__ import annotations

from typing import Any

from cb_callback._engine.distributed import lockstep
from cb_callback._engine.distributed.coordinator import Coordinator


def _rank(rank: int, gathered: list[Any] | None = None) -> Coordinator:
    """A coordinator of ``rank`` (of two) whose gathers answer ``gathered``."""
    coord = Coordinator.__new__(Coordinator)
    coord.rank, coord.world = rank, 2
    coord.gather = lambda obj: gathered if gathered is not None else [obj, obj]  # type: ignore[method-assign]
    return coord


def test_the_first_error_is_named_by_its_rank_when_it_is_another_ranks() -> None:
    assert _rank(1).first_error([None, "boom"]) == "boom"  # this rank's own: as it is
    assert _rank(1).first_error(["x", "y"]) == "on rank 0: x"  # rank 0's comes first, named
    assert _rank(0).first_error([None, None]) is None


def test_an_agreement_point_is_the_first_of_the_gathered_errors() -> None:
    assert _rank(0, [None, "lost"]).agree(None) == "on rank 1: lost"
    assert _rank(0, [None, None]).agree(None) is None


def test_lockstep_still_names_the_coordinator() -> None:
    assert lockstep.Coordinator is Coordinator and lockstep.DEFAULT_TIMEOUT_S == 900.0
