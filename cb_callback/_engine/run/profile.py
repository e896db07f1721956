"""The entry points, ``profile_components`` and ``profile_captured``: the phases of a run, in order."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cb_callback._engine.capture.capture import Capture
from cb_callback._engine.capture.inputs import (
    ComponentInputs,
    InputCopyError,
    copy_call,
    leading_batch_size,
    tensor_copier,
    to_device,
)
from cb_callback._engine.capture.tree import build_tree
from cb_callback._engine.clocks.insitu import InSituTimes
from cb_callback._engine.clocks.timing import canary_best, cpu_canary, timed_seconds
from cb_callback._engine.derive.quality import Assessment, LoadProbe, assess
from cb_callback._engine.derive.rollup import derive_all, estimate_parents, fill_share, pairs_by_batch
from cb_callback._engine.distributed import lockstep
from cb_callback._engine.distributed.coordinator import Coordinator
from cb_callback._engine.distributed.fsdp import fsdp1_problem
from cb_callback._engine.distributed.lockstep import check_plan
from cb_callback._engine.replay.batches import batch_size_of, merged_calls
from cb_callback._engine.replay.preprocessors import builtin_preprocessors
from cb_callback._engine.replay.state import StateGuard
from cb_callback._engine.run.component import ComponentRun
from cb_callback._engine.run.config import BenchmarkConfig, config_or_default
from cb_callback._engine.run.context import RunContext
from cb_callback._engine.run.extensions import EXTENSIONS
from cb_callback._engine.run.metadata import insitu_ratio, run_cost, run_metadata
from cb_callback._engine.run.plugins import models_restored
from cb_callback._engine.run.preparation import Prepared, infer_dtype, prepare
from cb_callback._engine.run.schedule import Schedule
from cb_callback._engine.run.triage_phase import triage_phase
from cb_callback._engine.selection.triage import Plan
from cb_callback._hardware.peaks import (
    Peaks,
    calibration_spread,
    recalibrate_cpu_flops,
    resolve_peaks,
)
from cb_callback._report.context import ReportContext, Reporter
from cb_callback._report.model import ComponentRow, Report
from cb_callback._report.model import error_text as _error_text
from cb_callback._types import OptionValue, UserValue

__all__ = ["profile_captured", "profile_components"]


def profile_captured(
    model: nn.Module,
    calls: Mapping[str, ComponentInputs] | Sequence[Mapping[str, ComponentInputs]],
    *,
    config: BenchmarkConfig | None = None,
    captured_batch_size: int | None = None,
    forward_context: Callable[[], AbstractContextManager[object]] | None = None,
    metadata: Mapping[str, Any] | None = None,
    report_context: ReportContext | None = None,
    prepare: bool = True,
) -> Report:
    """Profile ``model`` from inputs captured elsewhere (by :class:`Capture`).

    Args:
        model: the root of the tree. If it is not on ``config.device``, a deep
            copy is moved there (the model itself is left where it is).
        calls: captured first calls by path; or one such mapping per captured
            batch (then every component is measured on each batch it ran in and
            its row is its median batch: :func:`cb_callback._engine.replay.batches.merge_batches`).
        config: options.
        captured_batch_size: the batch size the captured inputs hold (for
            ``config.batch_size`` replication).
        forward_context: a context entered around each replayed forward (the
            Lightning callback passes the Trainer's precision context).
        metadata: extra metadata merged into the report's.
        report_context: what reporters get (the step, a TensorBoard writer);
            default: ``config.output_dir`` at step 0.
        prepare: apply the preprocessors' ``prepare_model`` to ``model`` first
            (:func:`profile_components` did so before its capture already).

    Returns:
        The report; the model's state (weights, buffers, grads, flags, RNG) is as
        it was.

    Notes:
        First the in-situ pass (``config.insitu_passes``): the step's outermost
        called components run whole with a clock hook on every module
        (``insitu_ms``). ``config.descend="hotspots"`` (the default) then decides
        from those times which components to replay
        (:func:`cb_callback._engine.selection.triage.triage`: only below components, or
        groups of repeated siblings, whose in-situ share reaches
        ``config.descend_share``; one representative per group measured in
        depth, the other members taking its rows), starts them breadth-first
        (one instrumented pass each) and times them in one interleaving;
        without in-situ times it goes one depth level at a time on measured
        shares. ``"all"`` starts and times every component.
    """
    cfg = config_or_default(config)
    batches = [calls] if isinstance(calls, Mapping) else list(calls)
    if not batches or not all(isinstance(c, Mapping) for c in batches):
        raise ValueError("calls: expected {path: ComponentInputs}, or a non-empty list of them (one per batch)")
    prepared = _prepare(model, cfg, dict(metadata or {}), captured_batch_size, apply=prepare)
    return _profile(prepared, batches, forward_context=forward_context, report_context=report_context)


_prepare = prepare  # the module's own name `prepare` is profile_captured's argument


def _profile(
    prepared: Prepared,
    batches: Sequence[Mapping[str, ComponentInputs]],
    *,
    forward_context: Callable[[], AbstractContextManager[object]] | None = None,
    report_context: ReportContext | None = None,
) -> Report:
    """The phases of a run on a prepared model: tree, peaks, levels, what-ifs, artifacts, roll-up, report."""
    wall0, timed0 = time.perf_counter(), timed_seconds()
    cfg, device, meta = prepared.config, prepared.device, prepared.metadata
    if len(batches) > 1:
        meta["batches"] = len(batches)
    dtype = infer_dtype(prepared.model, device, cfg, forward_context)
    ctx = _run_context(prepared, batches, forward_context)
    measured = _measure(ctx, prepared, dtype, meta)
    schedule, insitu, plan, peaks = measured.schedule, measured.insitu, measured.plan, measured.peaks
    rows = schedule.rows
    _roll_up(ctx, schedule, peaks, meta)
    assessment = _assess(schedule, peaks, dtype, device, measured.load, len(batches))
    for path, row in rows.items():  # always a list: [] on a clean row
        row.details["flags"] = list(assessment.flags.get(path, []))
        row.details.update(assessment.details.get(path, {}))  # what a flag explains (above_parent's why)
    meta["quality"] = assessment.quality
    meta["quality"]["insitu_ratio"] = insitu_ratio(rows, insitu[0] if insitu else None)
    wall_s, timed_s = time.perf_counter() - wall0, timed_seconds() - timed0
    meta.update(
        run_metadata(
            device=device, peaks=peaks, dtype=dtype, cfg=cfg, captured_batch_size=prepared.context.batch_size,
            wall_s=wall_s, timed_s=timed_s, calibration_s=measured.calibration_s,
        )
    )  # fmt: skip
    meta["cost"] = run_cost(
        wall_s=wall_s, timed_s=timed_s, calibration_s=measured.calibration_s,
        insitu_s=sum(t.seconds for t in insitu), insitu_timed_s=sum(t.timed_s for t in insitu),
        instrumented_s=ctx.run.instrumented_s, floor_s=ctx.run.floor_s, compile_s=measured.compile_s,
        artifacts_s=measured.artifacts_s, census_s=plan.census_s if plan is not None else 0.0,
    )  # fmt: skip
    if (budget := schedule.budget_info()) is not None:
        meta["cost"]["budget"] = budget
    report = Report([rows[n.path] for n in ctx.nodes], meta)
    where = report_context or ReportContext(output_dir=Path(cfg.output_dir) if cfg.output_dir else None)
    _write(report, prepared.reporters, where)
    return report


def _run_context(
    prepared: Prepared,
    batches: Sequence[Mapping[str, ComponentInputs]],
    forward_context: Callable[[], AbstractContextManager[object]] | None,
) -> RunContext:
    """The run's context: its component measurer, its tree and, under several ranks, its coordinator.

    Raises:
        ValueError: a model sharded with FSDP1; ``budget_s`` under several ranks; ranks whose trees or
            plan options differ (:func:`check_plan`, on every rank).
    """
    model, cfg, device = prepared.model, prepared.config, prepared.device
    multi = len(batches) > 1
    calls = batches[0] if not multi else merged_calls(batches)
    sizes = [prepared.context.batch_size, *(batch_size_of(c) for c in batches[1:])] if multi else []
    if (problem := fsdp1_problem(model)) is not None:
        raise ValueError(f"cb_callback: {problem}")
    coord = Coordinator.create(cfg.lockstep_timeout_s)  # several ranks: what communicates runs in lockstep
    if coord is not None and cfg.budget_s is not None:
        raise ValueError(
            f"cb_callback: budget_s={cfg.budget_s:g} is not supported under several ranks yet (each rank's clock "
            "would start other replays, and lockstep needs the same on every rank); use max_total_time_s"
        )
    run = ComponentRun(
        model, calls, cfg, device, prepared.context, [*builtin_preprocessors(cfg), *prepared.preprocessors],
        prepared.metrics, forward_context, sizes, lockstep=coord is not None,
    )  # fmt: skip
    nodes, modules = build_tree(model, calls, cfg.max_depth)
    ctx = RunContext(run, nodes, modules, batches, coord)
    if coord is not None:
        check_plan(coord, [(n.path, n.module_type) for n in nodes], _plan_options(cfg, len(batches)))
    return ctx


@dataclass(frozen=True)
class _Measured:
    """What the measuring phases of a run leave (:func:`_measure`).

    Attributes:
        schedule: the rows, samples and pendings of every replay.
        insitu: each batch's in-situ pass (empty: none ran).
        plan: the triage's plan (``None``: none).
        peaks: the peaks MFU and bandwidth utilisation divide by.
        load: the machine's load over the timed phases (stopped before the artifact passes).
        calibration_s: seconds the peaks' calibration took (outside ``max_total_time_s``).
        compile_s: seconds the compile what-ifs took (0 without ``compile``).
        artifacts_s: seconds the artifact passes took.
    """

    schedule: Schedule
    insitu: list[InSituTimes]
    plan: Plan | None
    peaks: Peaks
    load: LoadProbe
    calibration_s: float
    compile_s: float
    artifacts_s: float


def _measure(ctx: RunContext, prepared: Prepared, dtype: str, meta: dict[str, Any]) -> _Measured:
    """Every phase that runs the model, in order: the peaks' calibration, the in-situ pass and the triage,
    the levels, the lockstep phase, the compile what-ifs, the artifact passes; then the rows taken from
    elsewhere (copies, in-situ). The model's state is put back after them (also on error)."""
    model, cfg, device, coord = prepared.model, ctx.cfg, ctx.device, ctx.coord
    # The guard also restores the RNG a CPU calibration draws from; every preprocessor of the run
    # (profile_components prepared them) is undone after the replays, also on error.
    with models_restored(prepared.preprocessors, model, prepared.context), StateGuard(model):
        calibration0 = time.perf_counter()
        peaks = _peaks(device, dtype, cfg)
        budget0 = time.perf_counter()  # max_total_time_s excludes the one-off calibration
        load = LoadProbe()
        canary = cpu_canary() if device.type == "cpu" and cfg.insitu_passes else None
        around = [canary()] if canary is not None else []  # the machine's speed around the in-situ pass
        insitu, plan = triage_phase(ctx, meta)
        around += [canary()] if canary is not None else []
        schedule = Schedule(ctx, budget0, insitu, plan)
        schedule.canary_s += around
        schedule.run_levels()
        if coord is not None:
            lockstep.phase(schedule, coord)
        compile0 = time.perf_counter()
        if cfg.compile:
            schedule.compile_phase()
        load.stop()
        artifacts0 = time.perf_counter()
        schedule.artifact_passes()
        artifacts_s, compile_s = time.perf_counter() - artifacts0, artifacts0 - compile0
        _compiled_net_of_floor(schedule.rows.values())
        schedule.fill_copies()
        schedule.fill_insitu()
    return _Measured(schedule, insitu, plan, peaks, load, budget0 - calibration0, compile_s, artifacts_s)


def _roll_up(ctx: RunContext, schedule: Schedule, peaks: Peaks, meta: dict[str, Any]) -> None:
    """The numbers derived from the measured rows: parents estimated from children, rates and shares,
    under several ranks ``metadata["ranks"]`` (and with ``ranks="all"`` every rank's figures), the
    compile speed-ups."""
    rows, cfg, coord = schedule.rows, ctx.cfg, ctx.coord
    estimate_parents(ctx.nodes, rows)
    derive_all(rows.values(), peaks)
    fill_share(rows, schedule.per_batch)
    if coord is not None:
        meta["ranks"] = {"world_size": coord.world, "rank": coord.rank, "profiles": cfg.ranks}
        if coord.lost is not None:
            meta["ranks"]["lost"] = coord.lost
            warnings.warn(f"cb_callback: {coord.lost}", RuntimeWarning, stacklevel=3)  # the entry point's caller
        if cfg.ranks == "all":
            lockstep.merge_ranks(coord, rows)
    for row in rows.values():
        row.compile_speedup = EXTENSIONS.get("compile_speedup")(row)
    if cfg.compile:
        EXTENSIONS.get("fill_children_separately")(rows, {n.path: n.children for n in ctx.nodes})


def _compiled_net_of_floor(rows: Iterable[ComponentRow]) -> None:
    """``compiled_ms`` less the harness floor, as ``total_ms`` is (the what-if runs in the same harness)."""
    for row in rows:
        floor = row.details.get("floor_ms")
        if floor and math.isfinite(row.compiled_ms):
            row.compiled_ms = max(row.compiled_ms - floor["fwd"] - floor["bwd"], 0.0)


def _plan_options(cfg: BenchmarkConfig, n_batches: int) -> dict[str, Any]:
    """The options every rank's plan depends on: ranks with different ones cannot replay in lockstep."""
    names = ("descend", "descend_share", "ranks", "backward", "max_depth", "warmup", "rounds", "min_repeats",
             "max_repeats", "include", "exclude", "representatives", "insitu_passes")  # fmt: skip
    return {**{n: getattr(cfg, n) for n in names}, "batches": n_batches}


def _peaks(device: torch.device, dtype: str, cfg: BenchmarkConfig) -> Peaks:
    """The peaks MFU and bandwidth utilisation divide by; on CPU, calibrated again if the first was unsure."""
    peaks = resolve_peaks(device, dtype, peak_flops=cfg.peak_flops, peak_bandwidth=cfg.peak_bandwidth)
    if device.type == "cpu" and peaks.flops_source == "measured" and peaks.flops is not None:
        again = recalibrate_cpu_flops(dtype)  # only when the calibration disagreed with itself
        if again is not None and again > peaks.flops:
            peaks = dataclasses.replace(peaks, flops=again)
    return peaks


def _assess(
    schedule: Schedule, peaks: Peaks, dtype: str, device: torch.device, load: LoadProbe, n_batches: int
) -> Assessment:
    """The quality flags of every row and the run's verdict (:func:`cb_callback._engine.derive.quality.assess`)."""
    measured_cpu = device.type == "cpu" and peaks.flops_source == "measured"
    best = canary_best()
    canary = schedule.canary_s
    return assess(
        list(schedule.rows.values()), schedule.samples, load=load, threads=torch.get_num_threads(),
        config=schedule.cfg,
        calibration_spread=calibration_spread(dtype) if measured_cpu else None,
        slowdown=statistics.median(canary) / best if canary and best else None,
        peaks=peaks.to_metadata(),
        pairs=pairs_by_batch(schedule.per_batch, n_batches) if n_batches > 1 else None,
    )  # fmt: skip


def _write(report: Report, reporters: Sequence[Reporter], ctx: ReportContext) -> None:
    for reporter in reporters:
        try:
            reporter.write(report, ctx)
        except Exception as e:
            warnings.warn(f"cb_callback: reporter {reporter.name!r} failed: {e}", RuntimeWarning, stacklevel=3)


def profile_components(
    model: nn.Module,
    args: UserValue = (),
    kwargs: Mapping[str, UserValue] | None = None,
    *,
    batches: Sequence[UserValue] | None = None,
    config: BenchmarkConfig | None = None,
    **options: OptionValue,
) -> Report:
    """Profile every component of ``model`` on the inputs ``model(*args, **kwargs)``.

    One forward is run with capture hooks (its result is discarded), then each
    component is replayed alone, forward and backward, breadth-first from the
    root, and measured by the metric plugins. A component that cannot be
    measured whole is estimated from its children.

    Args:
        model: any ``nn.Module``; its state is the same afterwards.
        args: positional inputs of ``model`` (a tensor is taken as ``(tensor,)``).
        kwargs: keyword inputs.
        batches: instead of ``args``/``kwargs``, several inputs ``[(args, kwargs),
            …]`` (a tensor alone is ``((tensor,), {})``), e.g. sequences of
            different lengths: one capture forward each, every component measured
            on each batch it ran in; the row is its median batch (by fwd + bwd) and
            ``details`` holds ``batches`` (per batch), ``median_ms``, ``p90_ms``
            and ``shapes`` (the distinct input shapes; a KeyedJaggedTensor's
            values per feature).
        config: a :class:`BenchmarkConfig`; ``options`` override its fields.
        **options: :class:`BenchmarkConfig` fields. With ``output_dir`` and no
            ``reporters`` of your own, the report is written there
            (``report.json``, ``components.csv``, ``report.html``, icicle PNGs),
            beside any artifacts.

    Returns:
        A :class:`Report`, one row per component.

    Raises:
        ValueError: an unknown option or an invalid value (naming it), or
            ``batches`` together with ``args``/``kwargs``, or a batch that is
            not ``(args, kwargs)``, or a model sharded with FSDP1
            (``FullyShardedDataParallel``; the message names FSDP2, the
            supported path).
        TypeError: ``config`` not a :class:`BenchmarkConfig` (nor ``None``), e.g. a dict of its
            fields: pass ``BenchmarkConfig(**fields)`` or the fields as keywords.

    Notes:
        Isolation cannot see cross-module fusion, cache warmth left by the
        previous component, or overlap with communication in a real step.
        The capture forward runs on a copy of the inputs (the model's own
        parameters and buffers by reference), so objects passed in (a KV cache)
        and the tensors are left as they were; the copy is held during that
        forward (one more input's memory). Inputs that cannot be copied are used
        as they are (the row of the component that takes them names why).
        Called under ``torch.no_grad()`` or ``torch.inference_mode()``, it
        profiles the forward only (as ``backward=False``), replayed without grad,
        and says so in ``report.metadata["grad_mode"]`` (one warning when a
        backward was asked for).
    """
    cfg = config_or_default(config)
    cfg = cfg.replace(**options) if options else cfg
    if not isinstance(model, nn.Module):
        raise ValueError(f"model={type(model).__name__!r} is not an nn.Module")
    if (problem := fsdp1_problem(model)) is not None:  # before the capture forward: nothing runs
        raise ValueError(f"cb_callback: {problem}")
    inference = torch.is_inference_mode_enabled()
    grad_note = _grad_mode_note(inference)
    if grad_note is not None and cfg.backward:
        warnings.warn(f"cb_callback: {grad_note}", RuntimeWarning, stacklevel=3)
        cfg = cfg.replace(backward=False)
    inputs = _batch_inputs(args, kwargs, batches)
    meta: dict[str, Any] = {} if grad_note is None else {"grad_mode": grad_note}
    prepared = _prepare(model, cfg, meta, leading_batch_size(inputs[0]))
    captures = _capture(prepared, inputs)
    calls = [c.calls for c in captures]
    with contextlib.ExitStack() as mode:
        if inference:  # the captured copies are normal tensors: replay them outside it, without grad
            mode.enter_context(torch.inference_mode(False))
            mode.enter_context(torch.no_grad())
        return _profile(prepared.with_batch_size(captures[0].batch_size), calls)


def _capture(prepared: Prepared, inputs: Sequence[tuple[tuple[UserValue, ...], dict[str, UserValue]]]) -> list[Capture]:
    """One capture forward per batch, each on a copy of its inputs; a forward that raises is one warning.

    The root's output is marked as what the step's backward runs through
    (:meth:`Capture.mark_backward`: the replays differentiate it), so a call whose
    output does not reach it (a probe only logged) gets no backward.
    """
    model, meta = prepared.model, prepared.metadata
    # The model's own parameters and buffers are kept (an argument may be one, or a dict keyed by one).
    own = tensor_copier(leaf="as_given", keep=(*model.parameters(), *model.buffers()))
    captures = []
    for i, (b_args, b_kwargs) in enumerate(inputs):
        b_args, b_kwargs = to_device((tuple(b_args), b_kwargs), prepared.device)
        with contextlib.suppress(InputCopyError):  # uncopyable: the capture's row names it
            # The capture forward is a real forward: it runs on a copy, so that a cache object the
            # caller passed (a KV cache appended to) or an input changed in place stays as it was.
            b_args, b_kwargs = copy_call(tuple(b_args), dict(b_kwargs), own)
        capture = Capture(model)
        captures.append(capture)
        with StateGuard(model):
            try:
                with capture:
                    out = model(*b_args, **b_kwargs)
                    # What the replays differentiate is the root's output: its graph decides
                    # which calls have a backward (a probe only logged with .item() has none).
                    capture.mark_backward(out)
                    del out
            except Exception as e:
                which = "" if len(inputs) == 1 else f" of batch {i}"
                meta.setdefault("capture_error", _error_text(e) + which)
                warnings.warn(
                    f"cb_callback: the capture forward{which} raised {_error_text(e)}; profiling what was captured",
                    RuntimeWarning,
                    stacklevel=4,
                )
    return captures


def _batch_inputs(
    args: UserValue, kwargs: Mapping[str, UserValue] | None, batches: Sequence[UserValue] | None
) -> list[tuple[tuple[UserValue, ...], dict[str, UserValue]]]:
    """``[(args, kwargs), …]``: the one call given, or each of ``batches``."""

    def as_args(a: UserValue) -> tuple[UserValue, ...]:
        return (a,) if isinstance(a, (torch.Tensor, dict)) or not isinstance(a, (tuple, list)) else tuple(a)

    if batches is None:
        return [(as_args(args), dict(kwargs or {}))]
    given = not (isinstance(args, (tuple, list)) and len(args) == 0) or bool(kwargs)
    if given:
        raise ValueError("profile_components: pass either args/kwargs or batches=[(args, kwargs), ...], not both")
    if isinstance(batches, (torch.Tensor, str)) or not isinstance(batches, Sequence) or not batches:
        raise ValueError(f"batches={type(batches).__name__}: expected a non-empty list of (args, kwargs)")
    out: list[tuple[tuple[UserValue, ...], dict[str, UserValue]]] = []
    for i, item in enumerate(batches):
        if isinstance(item, torch.Tensor):
            out.append(((item,), {}))
        elif isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[1], Mapping):
            out.append((as_args(item[0]), dict(item[1])))
        else:
            raise ValueError(
                f"batches[{i}] is a {type(item).__name__}: expected (args, kwargs) with kwargs a dict, or a tensor"
            )
    return out


def _grad_mode_note(inference: bool) -> str | None:
    """What profiling under the caller's ``no_grad``/``inference_mode`` does, or ``None``."""
    if not inference and torch.is_grad_enabled():
        return None
    mode = "torch.inference_mode()" if inference else "torch.no_grad()"
    return (
        f"profile_components was called under {mode}: profiled the forward only (backward=False), "
        "replayed without grad; for backward numbers call it outside no_grad/inference_mode"
    )
