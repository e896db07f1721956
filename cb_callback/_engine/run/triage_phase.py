"""The run's first phase: each batch's in-situ pass, the census of the step's FLOPs and bytes, and the
triage's plan of which components are replayed (before any isolated replay)."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from cb_callback._engine.capture.inputs import ComponentInputs
from cb_callback._engine.capture.tree import Node
from cb_callback._engine.clocks.insitu import InSituTimes, time_in_situ, top_paths
from cb_callback._engine.counting.census import Census, census_of
from cb_callback._engine.distributed.fsdp import has_unit
from cb_callback._engine.replay.isolate import Replay
from cb_callback._engine.run.config import BenchmarkConfig
from cb_callback._engine.run.context import RunContext
from cb_callback._engine.selection import ranked_triage
from cb_callback._engine.selection.triage import Plan, insitu_costs, triage

__all__ = ["triage_phase"]


def triage_phase(ctx: RunContext, meta: dict[str, Any]) -> tuple[list[InSituTimes], Plan | None]:
    """Each batch's in-situ pass, then (``descend="hotspots"``) the triage's plan from its times.

    No in-situ pass with ``insitu_passes=0`` or ``max_total_time_s=0``. Under
    several ranks every rank runs the passes at once and decides one plan
    (:mod:`cb_callback._engine.selection.ranked_triage`). No plan (``hotspots`` descends
    level by level on measured shares) when a top component's pass raised
    (under several ranks: on any rank), nothing was timed, or the ranks'
    plans differ. ``meta`` (the report's metadata) gets ``insitu`` and ``triage``.
    """
    run, nodes, modules, batches, calls, cfg, coord = (
        ctx.run, ctx.nodes, ctx.modules, ctx.batches, ctx.calls, ctx.cfg, ctx.coord
    )  # fmt: skip
    if cfg.insitu_passes == 0 or cfg.max_total_time_s == 0:
        return [], None
    census: Census | None = None
    if coord is None and cfg.descend == "hotspots":
        # The census first: its forward and backward of each top is the in-situ pass's warm-up too.
        paths = [n.path for n in nodes]
        census = census_of(run, nodes, modules, batches, [top_paths(b, paths) for b in batches])
        run.instrumented_s += census.seconds  # an observed pass (cost: instrumented_s, of it census_s)
    out = _insitu_times(ctx, meta, census)
    if out is None:
        return [], None
    untimed = any(t.errors for t in out) or not all(t.times for t in out)
    if coord is not None:  # every rank decides, or none (the triage's agreements are collectives)
        untimed = any(coord.gather(untimed))
    if cfg.descend != "hotspots" or untimed:
        return out, None
    costs, step = _step_costs(nodes, out, batches)
    times = out[0].times
    others: list[Mapping[str, Any]] = []
    if coord is not None:
        costs, step = ranked_triage.reduce_costs(coord, costs, step)
        times = ranked_triage.reduce_times(coord, times)
        others = list(ranked_triage.every_rank_calls(coord, batches))
    decide = functools.partial(
        triage, nodes, modules, calls, costs, step, descend_share=cfg.descend_share,
        representatives=cfg.representatives, insitu=times, batches=batches, others=others,
    )  # fmt: skip
    plan = decide()
    # The census: every module's FLOPs and bytes in the step, in one instrumented pass of each top. A copy is
    # proven by them (repeated structure); rows not replayed take theirs from it (details["as"] = "insitu"),
    # and so do replayed rows on one rank, whose replays then only time (and observe memory). Under several
    # ranks every rank counts (the census communicates); the plans are compared below.
    if census is None:
        census, why = _census(ctx, [t.tops for t in out])
        if census is None:
            meta["triage"] = {"skipped": why}
            return out, None
        run.instrumented_s += census.seconds
    counts: Sequence[Mapping[str, Any]] = census.flops
    if coord is not None:
        counts = ranked_triage.every_rank_counts(coord, census.flops)
    plan = decide(census=counts) if plan.groups else plan
    plan.census_s, plan.census = census.seconds, census.flops
    if coord is None:  # a rank-local replay under several ranks counts its own (an FSDP2 unit's children)
        run.take_census(census)
    if coord is not None and (differs := ranked_triage.plan_difference(coord, plan)) is not None:
        meta["triage"] = {"skipped": differs}
        return out, None
    groups = {id(info) for info in plan.groups.values()}
    meta["triage"] = {
        "replayed": plan.replayed, "copied": len(plan.copy), "not_descended": len(plan.skip),
        "groups": len(groups), "measured_alone": len(plan.alone), "not_copies": len(plan.not_copies),
    }  # fmt: skip
    meta["triage"]["census"] = census.to_metadata()
    return out, plan


def _insitu_times(ctx: RunContext, meta: dict[str, Any], census: Census | None = None) -> list[InSituTimes] | None:
    """Each batch's in-situ pass (:func:`time_in_situ`; ``metadata["insitu"]``); under several ranks on
    every rank at once (:func:`cb_callback._engine.selection.ranked_triage.in_situ`), ``None`` when it failed on one.
    A top the ``census`` counted (a forward and backward on the same call, just before) needs no warm-up."""
    run, modules, batches, cfg, device, coord = ctx.run, ctx.modules, ctx.batches, ctx.cfg, ctx.device, ctx.coord
    paths = [n.path for n in ctx.nodes]
    only = set(paths)
    ranked = coord is not None

    def warmed(b: int) -> set[str]:
        if census is None or b >= len(census.flops):
            return set()
        return {top for top in census.tops if top not in census.errors and top in batches[b]}

    def passes(n: int, warm_up: bool = True, guard: ranked_triage.PassGuard | None = None) -> list[InSituTimes]:
        out: list[InSituTimes] = []
        for b, batch_calls in enumerate(batches):
            if ranked and any(t.errors for t in out):
                break  # a rank that went on would issue collectives the others do not
            if guard is not None:
                guard.batch = b

            def replay_of(top: str, batch_calls: Mapping[str, ComponentInputs] = batch_calls, b: int = b) -> Replay:
                inputs = run.inputs_for(top, modules[top], batch_calls, b, keep=True)
                # the backward as the step's (every node runs): an FSDP2 unit's own nodes lead to no target
                accumulate = ranked or has_unit(modules[top])
                return run.replay(modules[top], inputs, batch_calls[top], accumulate=accumulate)

            out.append(
                time_in_situ(
                    top_paths(batch_calls, paths), replay_of, run.model, device, passes=n,
                    budget_s=None if ranked else _insitu_budget(cfg), backward=cfg.backward, only=only,
                    collectives=ranked, warm_up=warm_up, guard=guard, warmed=warmed(b),
                )
            )  # fmt: skip
        return out

    if coord is None:
        out = passes(cfg.insitu_passes)
    else:
        ran, error = ranked_triage.in_situ(coord, run.model, passes, cfg.insitu_passes)
        if ran is None:
            meta["insitu"] = {"errors": {"": error}, "ranks": coord.world}
            return None
        out = ran
    meta["insitu"] = out[0].to_metadata() if len(out) == 1 else {"batches": [t.to_metadata() for t in out]}
    if coord is not None:
        meta["insitu"]["ranks"] = coord.world  # every rank ran it; the triage decided on the max over them
    return out


def _step_costs(
    nodes: Sequence[Node], out: Sequence[InSituTimes], batches: Sequence[Mapping[str, ComponentInputs]]
) -> tuple[dict[str, float | None], float]:
    """Each node's in-situ cost over the step (:func:`insitu_costs`, summed over the batches) and the
    step's (the tops'), what the triage's shares divide."""
    costs: dict[str, float | None] = {}
    step = 0.0
    for t, batch_calls in zip(out, batches, strict=True):
        for path, c in insitu_costs(nodes, {p: t.cost_ms(p) for p in t.times}, batch_calls).items():
            if c is not None:
                costs[path] = (costs.get(path) or 0.0) + c
        step += t.step_ms({p: c.calls for p, c in batch_calls.items()})
    return costs, step


def _census(ctx: RunContext, tops: Sequence[Sequence[str]]) -> tuple[Census | None, str]:
    """The census of the step's FLOPs (:func:`census_of`); under several ranks every rank's at once
    (``None`` and why, on every rank, when it raised on any: the triage then has no plan)."""
    run, nodes, modules, batches, coord = ctx.run, ctx.nodes, ctx.modules, ctx.batches, ctx.coord
    if coord is None:
        return census_of(run, nodes, modules, batches, tops), ""

    def count() -> tuple[Census, str | None]:
        census = census_of(run, nodes, modules, batches, tops, collectives=True)
        errors = [f"{top or 'root'}: {e}" for top, e in census.errors.items()]
        return census, f"the census of {errors[0]}" if errors else None

    census, error = ranked_triage.together(coord, run.model, "the census", count)
    return census, f"{error}; the ranks descend level by level instead"


def _insitu_budget(cfg: BenchmarkConfig) -> float:
    """How long a top's in-situ passes may take before they stop (after the first): what its own
    timed runs aim for (``min_run_time_s`` per pass), once per in-situ pass."""
    return cfg.min_run_time_s * (2 if cfg.backward else 1) * cfg.insitu_passes
