"""Replaying what communicates on every rank together, on a plan rank 0 decides, never a hang.

Under a process group of several ranks each rank profiles its own replica or
shard of the model on its own captured inputs. A component whose replay
communicates (an FSDP2 unit, a torchrec sharded module, a module that
all-reduces, a DTensor module) cannot be replayed on one rank alone: its
collectives would wait for the others forever. Those components are replayed in
*lockstep*: every rank runs the same replays in the same order, so their
collectives complete and are measured for real. What does not communicate is
replayed rank-locally, as on one process.

The protocol, on a gloo group of its own (:class:`Coordinator`) whose timeout
bounds every agreement (``BenchmarkConfig.lockstep_timeout_s``; default half the
default process group's timeout, 15 min):

1. *Fingerprint* (:func:`check_plan`): every rank's component paths and types,
   the options that decide the plan, and the dense input shapes of what it
   captured, gathered first. Ranks with different models or options fail on
   every rank with one ``ValueError`` naming the first difference, before
   anything is replayed.
2. *Which components communicate* is found rank-locally (their instrumented
   pass refuses collectives and raises at the first one; see
   :mod:`cb_callback._engine.distributed.collectives`); FSDP2 units' children are known from
   the tree. Rank 0 takes the union of every rank's and broadcasts the plan:
   the components, in breadth-first order.
3. Per component, every rank: a probe that refuses collectives (an error before
   the first collective is reported, not waited for), then the instrumented
   pass with collectives running (FLOPs, bytes, memory, and each collective's
   payload), then an *agreement point* where every rank says whether it got
   there. Rank 0 decides the number of timed runs (from the slowest rank's pass)
   and broadcasts it; every rank runs that many, in ``rounds`` slices
   with an agreement point after each (a long component stops at the first
   where every rank's runs agree, :func:`_timed_runs`). A rank whose run raises issues the rest
   of that run's collectives on zero tensors (:func:`cb_callback._engine.distributed.comm.drain`; what it
   issued counted by its process groups' sequence numbers, :class:`cb_callback._engine.distributed.comm.RunCount`,
   so that no dispatch mode adds to the timed ops) so the others finish it, and every later
   run of that slice only as its collectives on zeros (running a component that raised part way again would
   issue other collectives: an FSDP2 unit left unsharded skips its all-gather);
   then every rank fails the component at the next agreement point, puts its
   FSDP2 units back as before it, and goes on. The same holds in the warm-up
   runs and in the communication timing passes. Last, three passes time each collective
   (waited for as it is issued): ``comm_ms``.
4. An FSDP2 unit's children are replayed with the unit unsharded: one
   all-gather on every rank, then each rank's own replays (rank-local, no
   collective), then the unit is resharded.

What is bounded by what: an agreement point waits at most the coordinator's
timeout for the slowest rank. A rank that dies (or does not answer in time)
ends the lockstep phase on the others at the collective that finds it gone:
every lockstep row not measured yet fails with the lost rank named
(:meth:`Coordinator.lost_message`, ``metadata["ranks"]["lost"]``, one warning),
the report is built from what was measured, and nothing more is asked of the
other ranks. A rank that fails between two collectives of a component's very
first lockstep pass has no record of its own to drain from: every rank writes
that pass's collectives to the process group's store as it issues them
(:mod:`cb_callback._engine.distributed.ledger`), and the rank that raised issues the rest
of the others' on zeros, so the component fails on every rank at the agreement
point and the rest is measured. Where that cannot be done (an op argument the
ledger cannot write down, or no other rank's next collective within the
timeout) the rank that raised ends the lockstep phase with its own error named,
and the others come back when their collective finds it gone.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from cb_callback._engine.capture.inputs import ComponentInputs
from cb_callback._engine.clocks.timing import Sample, SampleSet, runs_settled
from cb_callback._engine.distributed.collectives import CollectiveInReplay, refuse_collectives
from cb_callback._engine.distributed.comm import CommCounter, KeptCall, RunCount, comm_table, drain
from cb_callback._engine.distributed.coordinator import DEFAULT_TIMEOUT_S, Coordinator
from cb_callback._engine.distributed.fsdp import is_unit, save_fsdp_state, unsharded
from cb_callback._engine.replay.isolate import PassContext, Phase, Replay, instrumented_pass
from cb_callback._engine.run.component import ComponentRun, Pending
from cb_callback._engine.run.context import RunContext
from cb_callback._engine.run.schedule import Schedule
from cb_callback._report.model import ComponentRow
from cb_callback._report.model import error_text as _error_text
from cb_callback._types import OptionValue

__all__ = ["COMM_PASSES", "DEFAULT_TIMEOUT_S", "Coordinator", "Step", "check_plan", "lost_peer", "run_plan"]

#: Passes that time each collective of a lockstep component (``comm_ms`` is their median).
COMM_PASSES = 3


def _dense_shapes(inputs: ComponentInputs | None) -> list[tuple[int, ...]] | None:
    if inputs is None:
        return None
    leaves = torch.utils._pytree.tree_leaves((inputs.args, inputs.kwargs))
    return [tuple(t.shape) for t in leaves if isinstance(t, torch.Tensor) and t.layout == torch.strided]


def check_plan(coord: Coordinator, paths: Sequence[tuple[str, str]], options: Mapping[str, OptionValue]) -> None:
    """Fail on every rank, naming the first difference, when the ranks' trees or plan options differ.

    Args:
        coord: the coordinator.
        paths: every component's ``(path, module type)``, in the tree's order.
        options: the options every rank must share (descend, ranks, backward …).

    Raises:
        ValueError: on every rank, the same message.
    """
    mine = {"paths": list(paths), "options": dict(options)}
    every = coord.gather(mine)
    first = every[0]
    for rank, theirs in enumerate(every[1:], start=1):
        if theirs == first:
            continue
        if theirs["options"] != first["options"]:
            diff = sorted(k for k in first["options"] if first["options"][k] != theirs["options"].get(k))
            what = (
                f"options differ: {diff[0]}={first['options'][diff[0]]!r} on rank 0, {theirs['options'].get(diff[0])!r}"
            )
        else:
            at = next(
                (i for i, (a, b) in enumerate(zip(first["paths"], theirs["paths"], strict=False)) if a != b),
                min(len(first["paths"]), len(theirs["paths"])),
            )
            what = f"component {at} is {_named(first['paths'], at)} on rank 0 and {_named(theirs['paths'], at)}"
        raise ValueError(
            f"cb_callback: the ranks cannot profile in lockstep: {what} on rank {rank}. Every rank must "
            "profile the same model (same tree) with the same options; nothing was replayed"
        )


def _named(paths: Sequence[tuple[str, str]], at: int) -> str:
    return f"{paths[at][0] or 'root'} ({paths[at][1]})" if at < len(paths) else "missing"


@dataclass
class Step:
    """One item of the lockstep plan: a component (``unit=None``), or a unit's children under it unsharded."""

    path: str
    batch: int
    children: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, int]:
        return (self.path, self.batch)


def run_plan(
    coord: Coordinator,
    plan: Sequence[Step],
    ctx: RunContext,
    *,
    rows: Callable[[str, int], ComponentRow],
    profiles: bool,
    time_local: Callable[[list[Pending]], None],
) -> dict[tuple[str, int], Pending]:
    """Run the plan on every rank (see the module docstring); return the lockstep components' pendings.

    Args:
        coord: the coordinator (``ctx.coord``).
        plan: the steps, the same on every rank.
        ctx: the run: how each component is measured (``ctx.run``), the modules by path, each batch's
            captured calls.
        rows: the row of ``(path, batch)``.
        profiles: whether this rank fills rows (``ranks="zero"``: rank 0 only); every rank takes part
            in the collectives.
        time_local: times rank-local pendings (an FSDP unit's children) and fills their rows.
    """
    run, modules, batches = ctx.run, ctx.modules, ctx.batches
    done: dict[tuple[str, int], Pending] = {}
    for i, step in enumerate(plan):
        try:
            if step.children:
                _children(coord, step, ctx, rows, profiles, time_local)
                continue
            pending = _component(
                coord, step, run, rows(step.path, step.batch), modules[step.path], batches[step.batch]
            )  # fmt: skip
        except Exception as e:  # a component's own errors are agreed on inside: the ranks stopped answering
            if isinstance(e, _Stuck):
                coord.lost = str(e)
            elif lost_peer(e):
                coord.lost = coord.lost_message(step.path, e)
            else:
                raise
            # (the model's units are put back with the rest of its state when the profile ends: StateGuard)
            for rest in plan[i:]:
                for path in rest.children or (rest.path,):
                    row = rows(path, rest.batch)
                    if row.status != "ok":
                        _fail(row, coord.lost)
            break
        if pending is not None:
            done[step.key] = pending
    return done


class _Stuck(Exception):
    """This rank's first lockstep pass of a component raised and it could not issue the rest of the others'
    collectives (:meth:`cb_callback._engine.distributed.ledger.Ledger.finish_for_others`): the lockstep phase ends."""


def lost_peer(error: BaseException | str) -> bool:
    """Whether ``error`` is a collective's that lost its peers (torch's ``DistError``, or gloo's
    ``RuntimeError``: "Connection closed by peer", "Timed out waiting ... for send"), not a bug of ours.

    Given only an error's text (a pass that recorded it, :func:`cb_callback._report.model.error_text`), only
    gloo's own words count: "Connection closed", "Connection reset", or a gloo "Timed out" (a model's
    error that merely names a connection is not a lost rank)."""
    if isinstance(error, str):
        return "Connection closed" in error or "Connection reset" in error or ("gloo" in error and "Timed out" in error)
    dist_error = getattr(torch.distributed, "DistError", None)
    if dist_error is not None and isinstance(error, dist_error):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ("gloo" in text or "Connection" in text or "Timed out" in text)


def _fail(row: ComponentRow, error: str) -> None:
    row.status, row.error = "failed", error
    row.note = None


def _component(
    coord: Coordinator,
    step: Step,
    run: ComponentRun,
    row: ComponentRow,
    module: nn.Module,
    calls: Mapping[str, ComponentInputs],
) -> Pending | None:
    """One communicating component, replayed in lockstep; its pending (samples and comm filled) or ``None``."""
    cfg = run.cfg
    probe_error = None if step.path in calls else "the real step did not call it on this rank"
    if probe_error is None:
        probe_error = _probe(run, row, module, calls, step.batch)
    error = coord.agree(probe_error)
    if error is not None:
        _fail(row, error)
        return None
    reference = CommCounter(keep=True)
    row.status, row.note = "not_run", None
    # A run that raises part way (on one rank) leaves its FSDP2 units there: unsharded, in the forward. Put
    # back, every rank's units are as before the component, so the next lockstep step (a unit's children
    # replayed unsharded: one all-gather on every rank) issues the same collectives on every rank.
    restore = save_fsdp_state(module)
    # One pass: the sequence of collectives every run issues (to drain a later run that fails), written to
    # the store as it runs, so that a rank whose pass raises can issue the rest of the others' (ledger).
    ledger = coord.ledger()
    reference.ledger = ledger
    try:
        with reference:
            pending = run.start(row, module, calls, step.batch, collectives=True, warm=False)
    finally:
        ledger.end()
    if pending is None:
        why = ledger.finish_for_others()
        if why is not None:
            restore()
            raise _Stuck(
                f"its first lockstep pass on rank {coord.rank} failed ({row.error or 'its replay failed'}) and could "
                f"not be finished for the other ranks ({why}); nothing after it was replayed in lockstep"
            )
    error = coord.agree(None if pending is not None else (row.error or "its replay failed"))
    if error is not None or pending is None:
        restore()
        _fail(row, error or row.error or "its replay failed")
        return None
    repeats = coord.broadcast(
        _repeats(pending.budget_s, max(coord.gather(pending.pass_s)), cfg.min_repeats, cfg.max_repeats)
    )
    kept = reference.kept
    error = _warm(coord, pending, max(cfg.warmup - 1, 0), kept)
    samples, error = (
        (SampleSet(), error) if error is not None else _timed_runs(coord, pending, repeats, max(cfg.rounds, 1), kept)
    )
    if error is not None:
        restore()
        _fail(row, error)
        return None
    samples.timed_s = sum(s.total_ms for s in samples.samples) / 1e3
    comm, error = _comm_times(coord, pending, cfg.backward, kept)
    if error is not None:
        restore()
        _fail(row, error)
        return None
    pending.values.update(comm)
    run.finish(pending, samples)
    pending.row.details["lockstep"] = {"ranks": coord.world, "repeats": repeats}
    pending.samples = samples
    return pending


def _drained(error: str | None, kept: Sequence[KeptCall]) -> bool:
    """After a run raised on this rank (``error``), each further run of the slice is only its collectives on
    zeros (``kept``: the reference pass's), so the other ranks finish theirs until the agreement point: a
    component that raised part way leaves its units mid-forward (FSDP2: unsharded), and running it again
    would issue other collectives than the others' (one all-gather fewer). Returns whether it drained."""
    if error is None:
        return False
    drain(kept)
    return True


def _warm(coord: Coordinator, pending: Pending, n: int, kept: Sequence[KeptCall]) -> str | None:
    """``n`` untimed runs on every rank (the rest of ``warmup``); a run that raises is drained, and so is
    every run after it on this rank (:func:`_drained`)."""
    error = None
    for _ in range(n):
        if _drained(error, kept):
            continue
        count = RunCount(coord.group)
        try:
            with count:
                pending.sampler()
        except Exception as e:
            error = error or f"a warm-up run raised {_error_text(e)}"
            drain(count.rest(kept))
    return coord.agree(error)


def _probe(
    run: ComponentRun, row: ComponentRow, module: nn.Module, calls: Mapping[str, ComponentInputs], batch: int
) -> str | None:
    """A replay that refuses collectives: ``None`` when it reaches its first collective (or has none),
    else why it failed before communicating."""
    try:
        inputs = run.inputs_for(row.path, module, calls, batch)
        replay = Replay(module, inputs, device=run.device, seed=run.cfg.seed, forward_context=run.forward_context)
        restore = save_fsdp_state(module)  # a refused collective leaves FSDP's hooks half way
        try:
            with refuse_collectives():
                replay.probe(run.cfg.backward)
        finally:
            restore()
    except CollectiveInReplay:
        return None
    except Exception as e:
        return f"replay raised {_error_text(e)} (before its first collective)"
    return None


def _repeats(budget_s: float, pass_s: float, low: int, high: int) -> int:
    """Timed runs for a component: its budget over the slowest rank's instrumented pass, in ``[low, high]``."""
    need = math.ceil(budget_s / pass_s) if pass_s > 0 else high
    return min(max(need, low, 1), high)


def _timed_runs(
    coord: Coordinator, pending: Pending, repeats: int, rounds: int, kept: Sequence[KeptCall]
) -> tuple[SampleSet, str | None]:
    """``repeats`` timed runs in ``rounds`` slices, an agreement point after each; a run that raises is drained.

    A long component (its first timed run took its whole timing budget on every rank) stops at the
    agreement point where every rank's runs agree (:func:`cb_callback._engine.clocks.timing.runs_settled`), as
    on one process: ``repeats`` is then the most it takes (``samples.settled``)."""
    samples = SampleSet()
    for r in range(rounds):
        n = math.ceil((repeats - len(samples.samples)) / (rounds - r)) if repeats > len(samples.samples) else 0
        error: str | None = None
        for i in range(n + (1 if n >= 2 else 0)):  # a slice of two or more starts with an untimed run
            if _drained(error, kept):
                continue
            count = RunCount(coord.group)  # no dispatch mode on the timed ops (sequence numbers)
            try:
                with count:
                    sample = pending.sampler()
            except Exception as e:
                error = error or f"a timed run raised {_error_text(e)}"
                drain(count.rest(kept))
                continue
            if i > 0 or n < 2:
                samples.samples.append(sample)
        samples.rounds += 1 if n else 0
        runs = samples.samples
        long = pending.budget_s > 0 and bool(runs) and runs[0].total_ms / 1e3 >= pending.budget_s
        states = coord.gather((error, long and runs_settled(runs)))
        error = coord.first_error([e for e, _ in states])
        if error is not None:
            return samples, error
        if len(runs) < repeats and all(done for _, done in states):
            samples.settled = True
            return samples, None
    return samples, None


def _comm_times(
    coord: Coordinator, pending: Pending, backward: bool, kept: Sequence[KeptCall]
) -> tuple[dict[str, Any], str | None]:
    """``comm_ms`` (median over :data:`COMM_PASSES` passes of the sum of every collective's time, each
    waited for as it is issued) and ``details["comm"]`` with each op's ``ms`` (that pass's); with the
    error of a pass that raised on any rank (drained, then agreed on: the component fails everywhere)."""
    totals: list[float] = []
    tables: list[list[dict[str, Any]]] = []
    error: str | None = None
    for _ in range(COMM_PASSES):
        if _drained(error, kept):
            continue
        counter = CommCounter(wait=True)
        try:
            with counter:
                instrumented_pass(pending.ctx.replay, [_Phases(counter)], backward, path=pending.row.path)
        except Exception as e:
            error = error or f"a communication timing pass raised {_error_text(e)}"
            drain(kept[len(counter.calls) :])
            continue
        totals.append(sum(c.ms for c in counter.calls))
        tables.append(comm_table(counter.calls))
    error = coord.agree(error)
    if error is not None:
        return {}, error
    mid = sorted(range(len(totals)), key=totals.__getitem__)[len(totals) // 2]
    return {"comm_ms": statistics.median(totals), "comm": tables[mid], "comm_passes": COMM_PASSES}, None


class _Phases:
    """An instrument that names the phase each collective of a comm pass ran in."""

    def __init__(self, counter: CommCounter) -> None:
        self.counter = counter

    def observe(self, ctx: PassContext) -> AbstractContextManager[None]:
        if ctx.phase is Phase.PASS:
            return contextlib.nullcontext()
        return self.counter.in_phase(ctx.phase.value)

    def values(self) -> dict[str, Any]:
        return {}


def _children(
    coord: Coordinator,
    step: Step,
    ctx: RunContext,
    rows: Callable[[str, int], ComponentRow],
    profiles: bool,
    time_local: Callable[[list[Pending]], None],
) -> None:
    """A unit's children, replayed rank-locally while the unit is unsharded (one all-gather on every rank)."""
    run, modules, batches = ctx.run, ctx.modules, ctx.batches
    unit = modules[step.path]
    error = coord.agree(None if is_unit(unit) else f"{step.path or 'root'} is not an FSDP unit on this rank")
    if error is not None:
        for child in step.children:
            _fail(rows(child, step.batch), error)
        return
    started: list[Pending] = []
    with unsharded(unit):
        if profiles:
            for child in step.children:
                row = rows(child, step.batch)
                row.status, row.note = "not_run", None
                calls = batches[step.batch]
                if child not in calls:
                    row.status, row.note = "not_run", "neither it nor a descendant ran in the captured forward"
                    continue
                begun = run.start(row, modules[child], calls, step.batch)
                if begun is not None:
                    row.details["fsdp"] = f"replayed with its unit {step.path or 'root'} unsharded (compute only)"
                    started.append(begun)
            time_local(started)
        coord.gather(None)  # the others wait here while this rank times its children


def _now() -> float:
    return time.perf_counter()


def _sample_total(s: Sample) -> float:
    return s.total_ms


def plan_of(deferred: Sequence[Sequence[tuple[str, int, str]]], order: Sequence[str], units: set[str]) -> list[Step]:
    """The lockstep plan from every rank's deferred components (rank 0 decides it; every rank runs it).

    The union of what each rank deferred, in the tree's order: an FSDP2 unit's children as one step
    under their unit (placed at the first child), every other component a step of its own.
    """
    from cb_callback._engine.distributed.fsdp import unit_of

    keys = sorted({(p, b) for rank in deferred for p, b, _ in rank}, key=lambda k: (order.index(k[0]), k[1]))
    steps: list[Step] = []
    groups: dict[tuple[str, int], int] = {}
    for path, batch in keys:
        unit = unit_of(path, units) if path not in units else None
        if unit is None:
            steps.append(Step(path, batch))
        elif (unit, batch) in groups:
            at = groups[(unit, batch)]
            steps[at] = Step(unit, batch, (*steps[at].children, path))
        else:
            groups[(unit, batch)] = len(steps)
            steps.append(Step(unit, batch, (path,)))
    return steps


def phase(schedule: Schedule, coord: Coordinator) -> None:
    """The lockstep phase of a run (after every level's rank-local replays; see the module docstring).
    With the ranks already lost (the in-situ pass found a rank gone), every deferred row fails with why."""
    if coord.lost is not None:
        for path, batch, _ in schedule.run.deferred:
            _fail(schedule.row_of(path, batch), coord.lost)
        return
    every = coord.gather(list(schedule.run.deferred))
    order = [n.path for n in schedule.nodes]
    plan = coord.broadcast(plan_of(every, order, schedule.units) if coord.rank == 0 else None)
    done = run_plan(
        coord, plan, schedule.ctx, rows=schedule.row_of, profiles=schedule.profiles, time_local=schedule.time_local
    )
    for (path, _), pending in done.items():
        schedule.pending.append(pending)
        if not schedule.multi and pending.samples is not None:
            schedule.samples[path] = pending.samples
    schedule.merge({s.path for s in plan} | {c for s in plan for c in s.children})


def merge_ranks(coord: Coordinator, rows: Mapping[str, ComponentRow]) -> None:
    """Each row's ``total_ms`` and ``comm_ms`` on every rank, in ``details["ranks"]`` (min, median,
    max, the straggler: the rank of the max), on every rank (the same figures; rank 0 reports them).
    Nothing once a rank was lost (:attr:`Coordinator.lost`)."""
    if coord.lost is not None:
        return
    mine = {p: (r.total_ms, r.comm_ms, r.status) for p, r in rows.items()}
    every = coord.gather(mine)
    for path, row in rows.items():
        out: dict[str, Any] = {}
        for i, name in enumerate(("total_ms", "comm_ms")):
            per_rank = [e.get(path, (math.nan, math.nan, ""))[i] for e in every]
            finite = [(v, r) for r, v in enumerate(per_rank) if isinstance(v, float) and math.isfinite(v)]
            if not finite:
                continue
            values = sorted(v for v, _ in finite)
            out[name] = {
                "per_rank": per_rank, "min": values[0], "median": statistics.median(values), "max": values[-1],
            }  # fmt: skip
            if name == "total_ms":
                out["straggler"] = max(finite)[1]
        if out:
            row.details["ranks"] = out
