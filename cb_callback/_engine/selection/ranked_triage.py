"""The in-situ pass, the census and the triage under several ranks: one plan, the same on every rank.

On one process the triage decides the replays from this process's in-situ
times (:mod:`cb_callback._engine.selection.triage`). Under a process group of several
ranks every rank must decide the *same* replays, or the lockstep phase would
wait for a component another rank never replays. So:

1. Every rank runs the in-situ pass (and later the census) at once, the same
   tops, the same number of passes (no time budget cuts a rank's passes
   short), collectives running: an FSDP2 unit all-gathers, a sharded table
   exchanges its lookups, as in the real step. The in-situ times of a
   communicating module include its collectives, and the waits for the
   slowest rank in them (the step's straggler is charged to the module whose
   collective waits: the root's nodes, under FSDP2, hold its reduce-scatters).
2. What could hang is guarded as a lockstep component's first pass is
   (:mod:`cb_callback._engine.distributed.ledger`), in the in-situ pass's warm-up and in
   the census: every rank writes each collective it issues to the store, and
   a rank whose pass raises issues the rest of the others' on zeros, so every
   rank reaches the agreement point, where the error is agreed on (named by
   its rank). A pass that failed on any rank leaves every rank without
   in-situ times (``metadata["insitu"]["errors"]``) or without a plan
   (``metadata["triage"]["skipped"]``), and the profile descends level by
   level on measured shares, as it did before the triage ran under several
   ranks. The in-situ pass's *timed* passes run without the ledger: the
   dispatch mode that writes each collective down sees every op, and its
   Python call per op would be in every module's in-situ time (a ``Linear``
   of 16 features read 4× its time). A rank whose timed pass raises counts
   what it issued by its process groups' sequence numbers and issues the rest
   of the warm-up's record of that top on zeros (:class:`PassGuard`); the
   ranks agree after every pass. After any failed pass every rank puts its
   FSDP2 units back and resets each ``DistributedDataParallel`` reducer. A
   rank that dies is found by the others' next collective (gloo: connection
   closed) and named.
3. The triage's inputs are reduced across ranks before it decides: each
   component's in-situ cost over the step and the step's are the **max** over
   the ranks (the slowest rank's share decides), its per-call times the max
   too (:func:`reduce_costs`, :func:`reduce_times`); the census's counts and
   the captured calls are every rank's, each rank's compared on its own
   (:func:`every_rank_counts`, :func:`every_rank_calls`: siblings group, and a
   member copies its representative's rows, only when they were called alike
   and did the same work on every rank).
4. Each rank's plan is then compared with rank 0's (:func:`plan_difference`);
   a difference (which nothing above should leave) leaves every rank without a
   plan, and says so.

What this cannot see: a rank's rows keep its own in-situ times and counts
(``details["insitu"]``); the reduction only decides what is replayed.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import torch
from torch import nn

from cb_callback._engine.clocks.insitu import InSitu, InSituTimes
from cb_callback._engine.counting.census import CountsOf
from cb_callback._engine.distributed.comm import CommCounter, drain, issued_collectives
from cb_callback._engine.distributed.coordinator import Coordinator
from cb_callback._engine.distributed.fsdp import save_fsdp_state
from cb_callback._engine.distributed.lockstep import lost_peer
from cb_callback._engine.selection.groups import ViewsOf, call_view
from cb_callback._engine.selection.triage import Plan
from cb_callback._report.model import error_text

__all__ = [
    "PassGuard",
    "every_rank_calls",
    "every_rank_counts",
    "in_situ",
    "plan_difference",
    "reduce_costs",
    "reduce_times",
    "together",
]

T = TypeVar("T")


def in_situ(
    coord: Coordinator, model: nn.Module, passes: Callable[[int, bool, PassGuard], list[InSituTimes]], n: int
) -> tuple[list[InSituTimes] | None, str | None]:
    """The in-situ pass on every rank at once: ``passes(0, True, guard)`` (the warm-up, its collectives
    written down: :func:`together` with the ledger, the guard keeping each top's record), then
    ``passes(n, False, guard)`` (the timed passes, no dispatch mode; the guard drains a pass that
    raises and stops every rank at the same one). ``(each batch's times, None)``, or ``(None, the
    error)`` on every rank (the first rank's, named by its rank when another's)."""
    guard = PassGuard(coord)

    def checked(times: list[InSituTimes]) -> tuple[list[InSituTimes], str | None]:
        errors = [f"{top or 'root'}: {e}" for t in times for top, e in t.errors.items()]
        if not errors:
            return times, None
        if coord.lost is not None:
            return times, coord.lost
        text = f"the in-situ pass of {errors[0]}"
        return times, text if guard.source == coord.rank else f"on rank {guard.source}: {text}"

    warm, error = together(
        coord, model, "the in-situ pass", lambda: checked(passes(0, True, guard)), watch=guard.record
    )
    if warm is None:
        return None, error
    guard.timed()
    restore = save_fsdp_state(model)
    out, error = checked(passes(n, False, guard))  # every rank stopped at the same pass, its error agreed on
    if error is not None:
        _after_failure(model, restore)
        return None, error
    for timed, first in zip(out, warm, strict=False):
        timed.seconds += first.seconds  # what the pass cost, its warm-up included
    return out, None


def together(
    coord: Coordinator,
    model: nn.Module,
    what: str,
    work: Callable[[], tuple[T, str | None]],
    *,
    watch: Callable[[CommCounter], None] | None = None,
) -> tuple[T | None, str | None]:
    """``work()`` on every rank at once, its collectives written down (:mod:`cb_callback._engine.distributed.ledger`);
    ``work`` returns its value and its error (``None``: it succeeded). ``(the value, None)`` when it
    succeeded on every rank, else ``(None, the first rank's error)`` on every rank (``what`` names the
    pass in the message of one that raised).

    A rank whose ``work`` raised or returned an error issues the rest of the
    others' collectives on zeros, then puts the model's FSDP2 units back as before; one that cannot
    (an op the ledger cannot write down) marks the ranks lost (:attr:`Coordinator.lost`): nothing
    more is asked of the others. ``watch`` is given the counter that writes the collectives down (it
    keeps each one's op and arguments: :class:`PassGuard`'s record) before ``work`` runs.
    """
    restore = save_fsdp_state(model)
    book = coord.ledger()
    value: T | None = None
    error: str | None = None
    try:
        counter = CommCounter(keep=watch is not None, ledger=book)
        if watch is not None:
            watch(counter)
        with counter:
            value, error = work()
    except Exception as e:
        error = f"{what} raised {error_text(e)}"
    finally:
        book.end()
    if error is not None and lost_peer(error):  # a rank died: nobody is left to finish the pass for
        restore()
        coord.lost = f"lost a rank during {what}: it died or did not answer ({error}); nothing was replayed in lockstep"
        return None, coord.lost
    if error is not None:
        why = book.finish_for_others()
        if why is not None:
            restore()
            coord.lost = (
                f"{what} failed on rank {coord.rank} ({error}) and could not be finished for the other ranks "
                f"({why}); nothing after it was replayed in lockstep"
            )
            return None, coord.lost
    try:
        agreed = coord.agree(error)
    except Exception as e:
        if not lost_peer(e):
            raise
        restore()
        coord.lost = (
            f"lost a rank after {what}: it died or did not answer ({error_text(e)}); nothing was replayed in lockstep"
        )
        return None, coord.lost
    if agreed is not None:
        _after_failure(model, restore)
        return None, agreed
    return value, None


def _after_failure(model: nn.Module, restore: Callable[[], None]) -> None:
    """Every rank, after a pass that failed on one: the model's FSDP2 units back as before (``restore``),
    and each ``DistributedDataParallel``'s reducer reset: a backward that raised after some of its
    gradient hooks fired leaves the reducer expecting that iteration's reduction to finish, and the next
    forward (a replay, the next training step) raises. Reset on every rank alike (it rebuilds its
    buckets at the next iteration, which broadcasts their order: one rank alone would wait for it)."""
    restore()
    for m in model.modules() if isinstance(model, torch.nn.Module) else ():
        if isinstance(m, torch.nn.parallel.DistributedDataParallel):
            m.reducer._reset_state()


class PassGuard:
    """The in-situ pass's passes under several ranks (:class:`cb_callback._engine.clocks.insitu.PassGuard`).

    In the warm-up (:meth:`record`) it keeps each top's collectives as the ledger's counter saw them
    (:class:`~cb_callback._engine.distributed.comm.CommCounter`, ``keep``); the warm-up itself is guarded by the
    ledger. In the timed passes (:meth:`timed`) no dispatch mode runs: a rank whose pass raises
    counts the collectives it issued in that pass by its process groups' sequence numbers and issues
    the rest of the warm-up's record of that top on zeros (:func:`cb_callback._engine.distributed.comm.drain`), so
    the others finish the pass; every rank then agrees after each pass (the first rank's error, named
    by its rank), and all stop at the same one.
    """

    def __init__(self, coord: Coordinator) -> None:
        self.coord = coord
        self.batch = 0
        self.counter: CommCounter | None = None
        self.records: dict[tuple[int, str], list[tuple[Any, Any, Any]]] = {}
        #: The rank whose error :meth:`end` returned last (this rank's own, or another's).
        self.source = coord.rank
        self._top = ""
        self._start = 0
        self._issued: int | None = None

    def record(self, counter: CommCounter) -> None:
        """The warm-up: keep each top's collectives from ``counter`` (a ``keep`` counter)."""
        self.counter = counter

    def timed(self) -> None:
        """The timed passes: no counter; a pass that raises is drained from the warm-up's record."""
        self.counter = None

    def begin(self, top: str) -> None:
        self._top = top
        if self.counter is not None:
            self._start = len(self.counter.kept)
        else:
            self._issued = issued_collectives(self.coord.group)

    def failed(self) -> None:
        if self.counter is not None:
            return  # the warm-up: the ledger finishes the others' pass
        now = issued_collectives(self.coord.group)
        kept = self.records.get((self.batch, self._top))
        if now is None or self._issued is None or kept is None:
            return  # cannot tell what the others still wait for: their collective finds it at their timeout
        issuing = [k for k in kept if k[0].overloadpacket.__name__ != "wait_tensor"]  # what a sequence counts
        with contextlib.suppress(Exception):  # a lost rank: the agreement finds it
            drain(issuing[now - self._issued :])

    def end(self, error: str | None) -> str | None:
        if self.counter is not None:  # the warm-up: agreed on after it (together)
            if error is None:
                self.records[(self.batch, self._top)] = list(self.counter.kept[self._start :])
            self.source = self.coord.rank
            return error
        try:
            every = self.coord.gather(error)
        except Exception as e:
            if not lost_peer(e):
                raise
            self.source = self.coord.rank
            self.coord.lost = (
                f"lost a rank during the in-situ pass: it died or did not answer ({error_text(e)}); nothing was "
                "replayed in lockstep"
            )
            return self.coord.lost
        first = next(((r, e) for r, e in enumerate(every) if e is not None), None)
        if first is None:
            return None
        self.source, text = first
        return text


def reduce_costs(
    coord: Coordinator, costs: Mapping[str, float | None], step_ms: float
) -> tuple[dict[str, float | None], float]:
    """Each component's in-situ cost over the step, and the step's, as the max over the ranks (a
    component one rank did not time: the others' max; none: ``None``)."""
    every = coord.gather((dict(costs), step_ms))
    out: dict[str, float | None] = {}
    for path in dict.fromkeys(p for mine, _ in every for p in mine):
        seen = [c for mine, _ in every if (c := mine.get(path)) is not None]
        out[path] = max(seen) if seen else None
    return out, max(s for _, s in every)


def reduce_times(coord: Coordinator, times: Mapping[str, InSitu]) -> dict[str, InSitu]:
    """Each component's in-situ times per call as the max over the ranks: forward, spread, backward
    (NaN on any rank: NaN, so that every rank's triage sees the same); its calls this rank's."""
    every = coord.gather({p: (t.fwd_ms, t.calls, t.spread, t.bwd_ms) for p, t in times.items()})
    out: dict[str, InSitu] = {}
    for path in dict.fromkeys(p for mine in every for p in mine):
        seen = [mine[path] for mine in every if path in mine]
        calls = times[path].calls if path in times else seen[0][1]
        fwd, spread, bwd = (_max(s[i] for s in seen) for i in (0, 2, 3))
        out[path] = InSitu(fwd_ms=fwd, calls=calls, spread=spread, bwd_ms=bwd)
    return out


def _max(values: Iterable[float]) -> float:
    """The max; NaN when any is NaN (Python's ``max`` would depend on the order)."""
    values = list(values)
    return math.nan if any(math.isnan(v) for v in values) else max(values)


def every_rank_counts(coord: Coordinator, flops: Sequence[Mapping[str, tuple[int, int, int] | None]]) -> list[CountsOf]:
    """Every rank's census counts, per rank and batch (what the triage compares a member's with its
    representative's in: the same work on every rank, each rank's against its own), each named by its
    rank (and batch) in the triage's message."""
    every = coord.gather([dict(c) for c in flops])
    out: list[CountsOf] = []
    for rank, mine in enumerate(every):
        for b, counts in enumerate(mine):
            out.append(CountsOf(counts, f" (rank {rank})" if len(mine) == 1 else f" (rank {rank}, batch {b})"))
    return out


def every_rank_calls(coord: Coordinator, batches: Sequence[Mapping[str, Any]]) -> list[ViewsOf]:
    """Every other rank's calls of each batch, as their views (plain values: shapes, flags, counts:
    :func:`cb_callback._engine.selection.groups.call_view`), named by rank (and batch): the triage
    groups members, and copies one onto another, only when they were called alike on every rank
    (an MoE expert routed tokens on one rank and none on another is not its sibling's copy there)."""
    mine = [{p: call_view(c) for p, c in calls.items()} for calls in batches]
    every = coord.gather(mine)
    out: list[ViewsOf] = []
    for rank, theirs in enumerate(every):
        if rank == coord.rank:
            continue
        for b, views in enumerate(theirs):
            out.append(ViewsOf(views, f" (rank {rank})" if len(theirs) == 1 else f" (rank {rank}, batch {b})"))
    return out


def _decisions(plan: Plan) -> dict[str, Any]:
    """What a plan decides (the replays), not the figures it decided them by."""
    return {
        "skip": sorted(plan.skip),
        "copy": sorted(plan.copy.items()),
        "alone": sorted(plan.alone),
        "not_copies": sorted(plan.not_copies),
        "groups": sorted((p, tuple(g["representatives"])) for p, g in plan.groups.items()),
    }


def plan_difference(coord: Coordinator, plan: Plan) -> str | None:
    """``None`` when every rank's triage decided the same replays as rank 0's, else what differs first."""
    every = coord.gather(_decisions(plan))
    for rank, theirs in enumerate(every[1:], start=1):
        for key, value in every[0].items():
            if theirs[key] != value:
                ours, other = set(map(str, value)), set(map(str, theirs[key]))
                first = sorted(ours ^ other)[:1]
                return (
                    f"the triage's plans differ between rank 0 and rank {rank} ({key}: "
                    f"{first[0] if first else 'the order'}); the ranks descend level by level instead"
                )
    return None
