"""One component's lifecycle in a run: its instrumented pass, its row from its samples, its artifacts."""

from __future__ import annotations

import contextlib
import dataclasses
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

import torch
from torch import nn
from torch.utils import _pytree as pytree

from cb_callback._engine.capture.inputs import ComponentInputs, call_signature
from cb_callback._engine.capture.storage import unique_storage_bytes
from cb_callback._engine.clocks.floor import Floor, FloorModule, measure_floor, subtract_floor
from cb_callback._engine.clocks.timing import Sample, SampleSet
from cb_callback._engine.derive.estimate import ADDITIVE
from cb_callback._engine.distributed.collectives import CollectiveInReplay, refuse_collectives
from cb_callback._engine.distributed.fsdp import has_unit, save_fsdp_state
from cb_callback._engine.replay.isolate import Instrument, Replay, instrumented_pass
from cb_callback._engine.run.config import BenchmarkConfig
from cb_callback._engine.run.extensions import EXTENSIONS, WhatIfInput
from cb_callback._engine.run.plugins import (
    COUNTED_KEYS,
    ArtifactMetric,
    InstrumentingMetric,
    MeasureContext,
    Metric,
    MetricPlugin,
    PrepareContext,
    Preprocessor,
    TimedMetric,
    checked_values,
)
from cb_callback._report.model import ComponentRow
from cb_callback._report.model import error_text as _error_text
from cb_callback._report.schema import plugin_details

__all__ = ["ComponentRun", "Pending", "artifact_dir", "params_mb"]

_V = TypeVar("_V")


# What a run reads of the step's census (:class:`cb_callback._engine.counting.census.Census`, which imports
# this module: named by its shape here, so that no import runs the other way).
class _TopPass(Protocol):
    """A top's census pass (:class:`cb_callback._engine.counting.census.TopPass`)."""

    @property
    def instruments(self) -> Sequence[tuple[InstrumentingMetric, Instrument]]: ...
    @property
    def mutates_inputs(self) -> bool: ...
    @property
    def seconds(self) -> float: ...


class _Census(Protocol):
    """The step's census (:class:`cb_callback._engine.counting.census.Census`) as :meth:`ComponentRun.take_census`
    reads it."""

    @property
    def values(self) -> Sequence[Mapping[str, Mapping[str, Any]]]: ...
    @property
    def inexact(self) -> Sequence[Mapping[str, str]]: ...
    @property
    def signatures(self) -> Sequence[Mapping[str, tuple[tuple[object, ...], bool]]]: ...
    @property
    def tops_observed(self) -> Mapping[int, Mapping[str, _TopPass]]: ...


_MIB = 1024.0 * 1024.0


def params_mb(module: nn.Module) -> float:
    """Parameters and buffers of ``module``'s subtree, unique storages, MiB."""
    return unique_storage_bytes([*module.parameters(), *module.buffers()]) / _MIB


def collective_in(e: BaseException) -> CollectiveInReplay | None:
    """The :class:`CollectiveInReplay` behind ``e`` (itself, its cause or context), if any."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, CollectiveInReplay):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def artifact_dir(cfg: BenchmarkConfig, path: str) -> Path | None:
    """``<output_dir>/artifacts/<path or "root">`` (not created), ``None`` without an ``output_dir``.

    The path is percent-encoded (a ``ModuleDict`` key may hold ``/``), and a
    top-level component literally named ``root`` gets ``%72oot`` so it cannot
    share the root's directory.
    """
    if cfg.output_dir is None:
        return None
    name = quote(path, safe="._-") if path else "root"
    if path == "root":
        name = "%72oot"
    return Path(cfg.output_dir) / "artifacts" / name


def artifact_files(
    plugin: ArtifactMetric, found: Mapping[str, Any], artifact_dir: Path, report_dir: Path
) -> dict[str, str]:
    """An artifact plugin's ``{kind: file}``, each file relative to the report's directory.

    Raises:
        ValueError: a kind that is not a string, or a file that does not exist
            or lies outside ``artifact_dir`` (naming the plugin).
    """
    home = artifact_dir.resolve()
    out: dict[str, str] = {}
    for kind, where in found.items():
        file = Path(where)
        file = (file if file.is_absolute() else artifact_dir / file).resolve()
        if not isinstance(kind, str) or not file.exists() or not file.is_relative_to(home):
            raise ValueError(
                f"artifact plugin {plugin.name!r} returned {kind!r}: {str(where)!r}; expected "
                f"{{kind: a file it wrote under {artifact_dir}}}"
            )
        out[kind] = file.relative_to(report_dir.resolve()).as_posix()
    return out


#: Per-run values besides ADDITIVE that a call set's run holds once per replayed call (a dict: each value).
_PER_RUN = ("fwd_iqr_ms", "bwd_iqr_ms", "fwd_bytes", "bwd_bytes", "top_bytes_ops", "floor_ms")


#: The compile what-if's times of one run (``details["compile"]`` and each of its ``batches``).
_COMPILE_MS = ("compiled_ms", "eager_ms_same_rounds", "fwd_ms", "bwd_ms", "children_separately_ms")


def per_call(values: Mapping[str, Any], n: int, keys: Sequence[str] = ()) -> dict[str, Any]:
    """``values`` of one run of ``n`` replayed calls (a call set), per call: every additive value
    (:data:`cb_callback._engine.derive.estimate.ADDITIVE`: times, FLOPs, bytes, activation memory,
    communication), the spreads, the bytes per pass and per op, and the harness floor's times
    divided by ``n`` (only ``keys``, if given). Peak memory and the working set stay the run's
    (the set's)."""
    out = dict(values)
    if n <= 1:
        return out
    for key in keys or (*ADDITIVE, *_PER_RUN):
        v = out.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[key] = v / n
        elif isinstance(v, Mapping):  # {op: bytes}, the floor's times
            out[key] = {k: x / n if _number(x) else x for k, x in v.items()}
    return out


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _describe_calls(row: ComponentRow, replay: Replay) -> None:
    """Say on the row how a component called in several ways was replayed (``details["call_set"]``)."""
    plan = replay.plan
    if plan is None:
        if replay.no_backward is not None and "reaches no loss" in replay.no_backward:
            row.note = f"{row.note}; {replay.no_backward}" if row.note else replay.no_backward
        return
    row.note = f"{row.note}; {plan.note}" if row.note else plan.note
    row.details["call_set"] = {
        "replayed": len(plan.calls), "step_calls": plan.step_calls, "approximated": plan.approximated,
        "backward_calls": sum(1 for c in plan.calls if c.backward),
        "no_grad_calls": sum(1 for c in plan.calls if not c.grad),
    }  # fmt: skip
    if plan.unrepresented:  # calls of kinds beyond the capture's cap, replayed as a kept kind
        row.details["call_set"]["unrepresented"] = plan.unrepresented


@dataclass
class Pending:
    """A component whose instrumented pass ran, waiting for its timed runs."""

    row: ComponentRow
    ctx: MeasureContext
    values: dict[str, Any]
    sampler: Callable[[], Sample]
    budget_s: float
    #: What its timed runs will cost at least, for ``max_total_time_s``: the timing
    #: budget, or ``min_repeats`` runs at the instrumented pass's speed when slower.
    committed_s: float = 0.0
    #: Which captured batch it replays (0 with one batch).
    batch: int = 0
    #: The instrumented pass's seconds.
    pass_s: float = 0.0
    #: Its timed samples, once the lockstep phase took them (the schedule keeps the others').
    samples: SampleSet | None = None
    #: The harness's fixed cost on its inputs, subtracted from its times (``None``: not measured).
    floor: Floor | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.row.path, self.batch)


class ComponentRun:
    """How one run measures each component: replay it once observed, then fill its row from its samples.

    The schedule (:mod:`cb_callback._engine.run.schedule`) decides which components and
    when; this class does each one's lifecycle: :meth:`start` (inputs, replay, the
    one instrumented pass every :class:`InstrumentingMetric` observes, the warm-up),
    :meth:`finish` (the timing plugin's values, then the plugins that replay on
    their own), and after every timed run :meth:`record_artifacts` and :meth:`compile`.
    """

    def __init__(
        self,
        model: nn.Module,
        calls: Mapping[str, ComponentInputs],
        cfg: BenchmarkConfig,
        device: torch.device,
        prepare_ctx: PrepareContext,
        preprocessors: Sequence[Preprocessor],
        metrics: Sequence[Metric],
        forward_context: Callable[[], AbstractContextManager[object]] | None,
        batch_sizes: Sequence[int | None] = (),
        lockstep: bool = False,
    ) -> None:
        self.model = model
        #: Under a process group of several ranks: a component that communicates is not given up
        #: but left for the lockstep phase (:mod:`cb_callback._engine.distributed.lockstep`), in ``deferred``.
        self.lockstep = lockstep
        self.deferred: list[tuple[str, int, str]] = []  # (path, batch, why)
        #: Each captured batch's batch size (for ``ReplicateBatch``); empty: the run's one.
        self.batch_sizes = list(batch_sizes)
        self.calls = calls
        self.cfg = cfg
        self.device = device
        self.prepare_ctx = prepare_ctx
        self.preprocessors = preprocessors
        self.user_metrics = list(metrics)
        # One timing plugin: a user's TimedMetric replaces the built-in LatencyMetric.
        timers = [p for p in self.user_metrics if isinstance(p, TimedMetric)]
        if len(timers) > 1:
            names = [getattr(p, "name", type(p).__name__) for p in timers]
            raise ValueError(f"metrics={names}: one timing plugin (TimedMetric) at most replaces the latency metric")
        user_timing = timers[0] if timers else None
        every = EXTENSIONS.get("builtin_metrics")()
        #: The built-in timing plugin's class: the harness floor is measured for its clock only.
        self._builtin_timing = type(next(p for p in every if isinstance(p, TimedMetric)))
        self.builtin = [p for p in every if user_timing is None or not isinstance(p, TimedMetric)]
        plugins: list[object] = [*self.builtin, *self.user_metrics]
        #: Times every component's runs, interleaved by the schedule.
        self.timing: TimedMetric = next(p for p in plugins if isinstance(p, TimedMetric))
        # A plugin may be of several kinds (protocols mypy takes for disjoint): compared before isinstance.
        #: Observe the one shared pass (FLOPs, bytes, memory, and users' instruments).
        self.observing = [p for p in plugins if p is not self.timing and isinstance(p, InstrumentingMetric)]
        #: Replay on their own after the timed runs.
        self.replaying = [
            p for p in plugins if p not in self.observing and p is not self.timing and isinstance(p, MetricPlugin)
        ]
        #: Observe a pass of their own each, after every component's timed runs.
        self.artifact_plugins = [
            *EXTENSIONS.get("artifact_plugins")(cfg.artifacts),
            *(p for p in plugins if isinstance(p, ArtifactMetric)),
        ]
        if cfg.artifacts and cfg.output_dir is None:
            warnings.warn(
                f"cb_callback: artifacts={list(cfg.artifacts)} need an output_dir; none are written",
                RuntimeWarning,
                stacklevel=4,
            )
        self.forward_context = forward_context
        self.warned: set[str] = set()
        #: Harness floors by input layout (:meth:`floor`), and what measuring them cost.
        self._floors: dict[tuple[object, ...], Floor | None] = {}
        self.floor_s = 0.0
        self._kept: dict[tuple[str, int], ComponentInputs] = {}  # preprocessed by the in-situ pass
        #: Seconds of the instrumented passes (FLOPs, bytes, memory observed).
        self.instrumented_s = 0.0
        #: ``{(path, batch): values}``: what the step's census counted of a component as its replay's own pass
        #: would (:attr:`cb_callback._engine.counting.census.Census.values`); metrics with ``from_census`` take their
        #: values from it, and its replay's pass observes the rest (memory).
        self.counted: dict[tuple[str, int], Mapping[str, Any]] = {}
        #: ``{(path, batch): why}``: a component the census counted, but not as its replay would.
        self.not_counted: dict[tuple[str, int], str] = {}
        #: ``{(path, batch): (call_signature, backward)}`` of each component's call in the census (and whether
        #: a gradient reached its outputs there).
        self.census_calls: dict[tuple[str, int], tuple[tuple[object, ...], bool]] = {}
        #: ``{(path, batch): its census pass}`` of a top the census observed as its own pass would
        #: (:class:`cb_callback._engine.counting.census.TopPass`).
        self.tops_seen: dict[tuple[str, int], _TopPass] = {}

    def inputs_for(
        self,
        path: str,
        module: nn.Module,
        calls: Mapping[str, ComponentInputs] | None = None,
        batch: int = 0,
        keep: bool = False,
    ) -> ComponentInputs:
        """The component's captured call of ``batch``, through every preprocessor.

        With ``keep`` (the in-situ pass) the result is kept for the component's
        replay, which takes it instead of preprocessing again: each call is
        preprocessed once per run.
        """
        kept = self._kept.get((path, batch))
        if kept is not None:  # preprocessed already (the census, the in-situ pass): each call once per run
            if not keep:
                del self._kept[(path, batch)]
            return kept
        inputs = (self.calls if calls is None else calls)[path]
        ctx = dataclasses.replace(self.prepare_ctx, path=path, module=module)
        if batch < len(self.batch_sizes):
            ctx = dataclasses.replace(ctx, batch_size=self.batch_sizes[batch])
        variants = inputs.variants
        for p in self.preprocessors:
            inputs = p.process_inputs(inputs, ctx)
        if variants:  # each kind of call is preprocessed as a call of its own
            done = []
            for v in variants:
                for p in self.preprocessors:
                    v = p.process_inputs(v, ctx)
                done.append(v)
            inputs = dataclasses.replace(inputs, variants=done)
        if keep:
            self._kept[(path, batch)] = inputs
        return inputs

    def replay(
        self, module: nn.Module, inputs: ComponentInputs, captured: ComponentInputs, accumulate: bool = False
    ) -> Replay:
        """The replay of ``module`` on its preprocessed ``inputs`` (``captured``: the call as captured)."""
        # Forward-only replays keep the caller's no_grad (profile_components under no_grad/inference_mode),
        # and a component the real step ran under no_grad (a frozen encoder) replays without grad; one
        # called in several grad modes replays each call in its own (a call set, Replay.plan).
        grad = captured.grad_enabled or any(v.grad_enabled for v in captured.variants)
        return Replay(
            module,
            inputs,
            device=self.device,
            seed=self.cfg.seed,
            forward_context=self.forward_context,
            grad_enabled=grad and (self.cfg.backward or torch.is_grad_enabled()),
            accumulate=accumulate,
        )

    def start(
        self,
        row: ComponentRow,
        module: nn.Module,
        calls: Mapping[str, ComponentInputs] | None = None,
        batch: int = 0,
        collectives: bool = False,
        warm: bool = True,
    ) -> Pending | None:
        """Replay one component once, observed; ``None`` when it failed (``row`` says why).

        ``calls`` is the batch's captured calls (default: the run's first batch).

        One instrumented forward + backward is observed by every
        :class:`InstrumentingMetric` (FLOPs, bytes, memory, collectives) and
        serves as the first warm-up. The timed runs come later, interleaved with
        the other components' (:meth:`finish` takes their samples). Collectives
        are refused (the component is deferred to the lockstep phase, or given
        up) unless ``collectives``: every rank replays it now, in lockstep (then
        ``warm=False`` leaves the rest of the warm-up to the lockstep phase).
        """
        calls = self.calls if calls is None else calls
        captured = calls[row.path]
        if captured.capture_error is not None:  # the capture hook could not copy the call
            row.status, row.error = "failed", captured.capture_error
            if captured.unknown_leaves:
                row.details["unknown_leaves"] = list(captured.unknown_leaves)
            return None
        try:
            inputs = self.inputs_for(row.path, module, calls, batch)
        except Exception as e:
            row.status, row.error = "failed", f"preprocessing inputs raised {_error_text(e)}"
            return None
        replay = self.replay(module, inputs, captured, accumulate=collectives or has_unit(module))
        ctx = MeasureContext(
            row.path, module, replay, self.cfg, self.device, {}, artifact_dir=artifact_dir(self.cfg, row.path)
        )
        given, observing = self._split_by_census(row.path, batch, captured, collectives, inputs)
        seen = self._seen_in_census(row.path, batch, observing) if given else None
        if seen is not None:  # a top: the census's pass of it was its instrumented pass
            return self._after_census(row, ctx, replay, inputs, given, seen, batch, warm)
        try:
            instruments = [p.instrument(ctx) for p in observing]
            pass0 = time.perf_counter()
            # Under DDP, on one rank: a collective would wait forever for the other ranks.
            restore = None if collectives else save_fsdp_state(module)  # a refused one leaves FSDP half way
            with contextlib.nullcontext() if collectives else refuse_collectives():
                result = instrumented_pass(replay, instruments, self.cfg.backward, path=row.path)
            pass_s = time.perf_counter() - pass0
        except CollectiveInReplay as e:
            if restore is not None:
                restore()
            self._communicates(row, module, e, batch)
            return None
        except Exception as e:
            self._pass_failed(row, module, replay, e, batch, collectives)
            return None
        found = self._values_of(row, list(zip(observing, instruments, strict=True)), given, replay.replayed_calls)
        if found is None:
            return None
        values = found
        if not given and (why := self._own_pass(row.path, batch, captured, collectives)) is not None:
            values["counted"] = f"own pass: {why}"
        census = self.census_calls.get((row.path, batch))
        if given and census is not None and census[1] != result.backward_ran:
            # The step's backward reached it and its replay's did not, or the other way round (an output
            # the capture saw reach no loss): its FLOPs and bytes are its own pass's.
            del result
            self.not_counted[(row.path, batch)] = (
                "a backward ran for it in the census and not in its replay, or the other way round"
            )
            self.counted.pop((row.path, batch), None)
            return self.start(row, module, calls, batch, collectives, warm)
        values["mutates_inputs"] = result.mutates_inputs
        del result  # holds a forward-only pass's output (and its graph)
        self.instrumented_s += pass_s
        return self._pending(row, ctx, replay, inputs, values, batch, pass_s, warm, floor=not collectives)

    def _pass_failed(
        self, row: ComponentRow, module: nn.Module, replay: Replay, e: Exception, batch: int, collectives: bool
    ) -> None:
        """Fill the row of a component whose instrumented pass raised ``e``: a collective (re-raised as
        something else) defers it; else a plain replay without the instruments says whether the component
        or the instruments raised (not in lockstep: its collectives would wait on one rank)."""
        self._after_error(e)
        wrapped = collective_in(e)
        if wrapped is not None:  # user code re-raised it as something else
            self._communicates(row, module, wrapped, batch)
            return
        if collectives:
            row.status, row.error = "failed", f"replay raised {_error_text(e)}"
            return
        try:
            with refuse_collectives():  # never a real collective on one rank
                replay.probe(self.cfg.backward)
        except Exception as plain:
            wrapped = collective_in(plain)
            if wrapped is not None:
                self._communicates(row, module, wrapped, batch)
                return
            self._after_error(plain)
            row.status, row.error = "failed", f"replay raised {_error_text(plain)}"
            return
        row.status, row.error = "failed", f"instrumented pass raised {_error_text(e)}"

    def _split_by_census(
        self, path: str, batch: int, captured: ComponentInputs, collectives: bool, inputs: ComponentInputs
    ) -> tuple[list[tuple[InstrumentingMetric, Mapping[str, Any]]], list[InstrumentingMetric]]:
        """``(given, observing)``: each observing plugin with its values from the step's census (where the
        census counted this call as its replay would, and the plugin takes them: ``from_census``), and the
        plugins left to observe the replay's pass."""
        counted = self._counted_values(path, batch, captured, collectives, inputs)
        given: list[tuple[InstrumentingMetric, Mapping[str, Any]]] = []
        observing = []
        for plugin in self.observing:
            mine = plugin.from_census(counted) if counted is not None and hasattr(plugin, "from_census") else None
            if mine is None:
                observing.append(plugin)
            else:
                given.append((plugin, mine))
        return given, observing

    def _pending(
        self,
        row: ComponentRow,
        ctx: MeasureContext,
        replay: Replay,
        inputs: ComponentInputs,
        values: dict[str, Any],
        batch: int,
        pass_s: float,
        warm: bool,
        floor: bool = True,
    ) -> Pending | None:
        """The component, its first pass done (its own, or the census's), waiting for its timed runs: the
        rest of its warm-up (``warm``; that pass was the first run), its budget and harness floor."""
        _describe_calls(row, replay)
        if inputs.unknown_leaves:
            values["unknown_leaves"] = inputs.unknown_leaves
        try:
            sampler = self.timing.sampler(ctx)
            for _ in range(max(self.cfg.warmup - 1, 0) if warm else 0):
                sampler()
            budget = self.timing.budget_s(ctx)
        except Exception as e:
            self._plugin_error(row, self.timing, e)
            return None
        # The first pass ran under counting modes (slower than a plain run): an upper estimate.
        committed = max(budget, max(self.cfg.min_repeats, 1) * pass_s)
        found = self.floor(replay) if floor else None
        return Pending(row, ctx, values, sampler, budget, committed, batch, pass_s, floor=found)

    def _values_of(
        self,
        row: ComponentRow,
        observed: Sequence[tuple[InstrumentingMetric, Instrument]],
        given: Sequence[tuple[InstrumentingMetric, Mapping[str, Any]]],
        calls: int,
    ) -> dict[str, Any] | None:
        """A row's values: each ``(plugin, instrument)`` that observed its pass (over the ``calls`` it
        replayed: per call), then each ``(plugin, values)`` from the census (one call's); ``None`` when a
        built-in's values failed the contract (the row says why)."""
        values: dict[str, Any] = {}
        for plugin, ins in observed:
            try:
                values.update(checked_values(plugin, ins.values()))
            except Exception as e:
                if self._plugin_error(row, plugin, e):
                    return None
        values = per_call(values, calls)
        for plugin, mine in given:
            try:
                values.update(checked_values(plugin, mine))
            except Exception as e:
                if self._plugin_error(row, plugin, e):
                    return None
        if given:
            values["counted"] = "census"
        return values

    def take_census(self, census: _Census) -> None:
        """Take the step's census (:class:`cb_callback._engine.counting.census.Census`, one rank): what it counted of
        each component as its replay would, why not where not, each component's call in it, and the tops
        whose census pass was their own pass."""

        def by_batch(per_batch: Sequence[Mapping[str, _V]]) -> dict[tuple[str, int], _V]:
            return {(path, b): v for b, found in enumerate(per_batch) for path, v in found.items()}

        self.counted = by_batch(census.values)
        self.not_counted = by_batch(census.inexact)
        self.census_calls = by_batch(census.signatures)
        self.tops_seen = {(top, b): seen for b, tops in census.tops_observed.items() for top, seen in tops.items()}

    def top_observers(
        self, path: str, module: nn.Module, replay: Replay
    ) -> list[tuple[InstrumentingMetric, Instrument]] | None:
        """The instruments that observe a top's census pass as its own instrumented pass (the metrics the
        census gives no values of: memory), or ``None`` (a user's instrument: its own pass observes it)."""
        probe = dict.fromkeys(COUNTED_KEYS, 0)  # which metrics would take a census's values
        rest = [p for p in self.observing if not hasattr(p, "from_census") or p.from_census(probe) is None]
        if any(not any(p is b for b in self.builtin) for p in rest):
            return None
        ctx = MeasureContext(path, module, replay, self.cfg, self.device, {}, artifact_dir=artifact_dir(self.cfg, path))
        try:
            return [(p, p.instrument(ctx)) for p in rest]
        except Exception:
            return None

    def _seen_in_census(self, path: str, batch: int, observing: Sequence[InstrumentingMetric]) -> _TopPass | None:
        """The census's pass of a top (:class:`cb_callback._engine.counting.census.TopPass`) when it observed every
        metric this row still needs observed, else ``None``."""
        seen = self.tops_seen.get((path, batch))
        if seen is None or {id(p) for p, _ in seen.instruments} != {id(p) for p in observing}:
            return None
        return seen

    def _after_census(
        self,
        row: ComponentRow,
        ctx: MeasureContext,
        replay: Replay,
        inputs: ComponentInputs,
        given: Sequence[tuple[InstrumentingMetric, Mapping[str, Any]]],
        seen: _TopPass,
        batch: int,
        warm: bool,
    ) -> Pending | None:
        """:meth:`start` of a top whose census pass was its instrumented pass: its values from the census
        (counts) and from the instruments that observed that pass (memory); no pass of its own. Its warm-up
        was the in-situ pass, which ran it whole on the same call just before."""
        values = self._values_of(row, seen.instruments, given, replay.replayed_calls)
        if values is None:
            return None
        values["observed_in"] = "census"
        values["mutates_inputs"] = seen.mutates_inputs
        replay.reuse_inputs = not seen.mutates_inputs
        return self._pending(row, ctx, replay, inputs, values, batch, seen.seconds, warm)

    def _counted_values(
        self, path: str, batch: int, captured: ComponentInputs, collectives: bool, inputs: ComponentInputs
    ) -> Mapping[str, Any] | None:
        """The step's census of ``path`` on ``batch`` (:attr:`counted`) when it is what the component's replay
        would count: a component called once in the step, replayed on one rank, on a call like its call in
        the census (``inputs``: its replay's); else ``None`` (its replay's pass counts)."""
        if collectives or captured.calls != 1 or captured.variants:
            return None
        found = self.counted.get((path, batch))
        if found is None:
            return None
        call = self.census_calls.get((path, batch))
        if call is None or call[0] != call_signature(inputs.args, inputs.kwargs):
            self.not_counted[(path, batch)] = (
                "its call in the census differs from its replay's (shapes, or what requires grad: the top "
                "replayed after the optimizer step routes otherwise, or its inputs were tiled and this one's not)"
            )
            return None
        return found

    def _own_pass(self, path: str, batch: int, captured: ComponentInputs, collectives: bool) -> str | None:
        """Why a component the census ran over counts its FLOPs and bytes in a pass of its own (``None``: the
        census's counts were taken, or no census ran)."""
        if not self.counted and not self.not_counted:
            return None
        if collectives:
            return "replayed on every rank at once"
        if captured.calls != 1 or captured.variants:
            return f"called {captured.calls} times in the step"
        return self.not_counted.get((path, batch), "not counted by the census")

    def floor(self, replay: Replay) -> Floor | None:
        """The harness's fixed cost of one run on ``replay``'s inputs (:mod:`cb_callback._engine.clocks.floor`).

        Measured once per input layout (shapes, dtypes, which carry a graph,
        grad mode, one copy reused or not); ``None`` with
        ``harness_floor=False``, a timing plugin of the user's (its clock, its
        floor), or when the identity replay raises.
        """
        if not self.cfg.harness_floor or not isinstance(self.timing, self._builtin_timing):
            return None
        leaves = [
            (_shape(t), t.dtype, t.requires_grad) if isinstance(t, torch.Tensor) else type(t).__name__
            for t in pytree.tree_leaves((replay.inputs.args, replay.inputs.kwargs))
        ]
        key = (tuple(leaves), replay.grad_enabled, replay.reuse_inputs, replay.replayed_calls)
        if key not in self._floors:
            ident = Replay(
                FloorModule(), replay.inputs, device=self.device, seed=self.cfg.seed,
                forward_context=self.forward_context, grad_enabled=replay.grad_enabled, wrappers=False,
            )  # fmt: skip
            ident.reuse_inputs = replay.reuse_inputs
            ctx = MeasureContext("", ident.module, ident, self.cfg, self.device, {})
            try:
                found: Floor | None = measure_floor(self.timing.sampler(ctx))
            except Exception:
                found = None
            self._floors[key] = found
            self.floor_s += found.spent_s if found is not None else 0.0
        return self._floors[key]

    def defer(self, row: ComponentRow, batch: int, why: str) -> None:
        """Leave the component for the lockstep phase (``row`` is filled there)."""
        row.status, row.note = "skipped", f"replayed in lockstep across ranks ({why})"
        self.deferred.append((row.path, batch, why))

    def _communicates(self, row: ComponentRow, module: nn.Module, e: CollectiveInReplay, batch: int = 0) -> None:
        """Deferred to the lockstep phase; without one (never probed), a container is estimated from
        its other children."""
        row.details["collective"] = e.op
        if self.lockstep:
            self.defer(row, batch, f"it communicates: {e.op}")
            return
        row.status = "estimated" if any(True for _ in module.children()) else "skipped"
        row.note = str(e)

    def finish(self, pending: Pending, samples: SampleSet) -> None:
        """Fill the row from its samples, then run the plugins that replay on their own."""
        row, ctx, values = pending.row, pending.ctx, pending.values
        if samples.error is not None and values.get("observed_in") == "census":
            # No pass of its own ran before (the census's was its pass): its first run is a timed one.
            self._after_error(samples.error)
            row.status, row.error = "failed", f"replay raised {_error_text(samples.error)}"
            return
        if samples.error is not None:
            self._plugin_error(row, self.timing, samples.error)
            return
        plugins: list[Any] = [self.timing, *self.replaying]
        for plugin in plugins:
            ctx.values = dict(values)
            try:
                if plugin is self.timing:
                    found = self.timing.values(samples, ctx)
                    if pending.floor is not None:
                        found = dict(checked_values(plugin, found))
                        has_bwd = self.cfg.backward and ctx.replay.no_backward is None
                        subtract_floor(found, pending.floor, has_bwd)
                        values.update(per_call(found, ctx.replay.replayed_calls))
                        continue
                else:
                    with refuse_collectives():  # a user plugin's own replays
                        found = plugin.measure(ctx)
                values.update(per_call(checked_values(plugin, found), ctx.replay.replayed_calls))
            except Exception as e:
                if self._plugin_error(row, plugin, e):
                    return
        ctx.values = dict(values)
        columns = {f for f in ComponentRow.__dataclass_fields__ if f != "details"}
        for key, value in values.items():
            if key in columns:
                setattr(row, key, value)
            else:
                plugin_details(row.details)[key] = value  # a plugin's keys are its own
        row.status = "ok"

    def record_artifacts(self, pending: Pending) -> None:
        """Run each artifact plugin in a pass of its own; record its files in ``details["artifacts"]``.

        Only for a measured (``ok``) component with an ``artifact_dir``. A plugin
        that raises, returns what is not a file it wrote, or a kind recorded
        already lands in ``details["metric_errors"]``; the row's measurements stand.
        """
        row, ctx, home = pending.row, pending.ctx, pending.ctx.artifact_dir
        if row.status != "ok" or home is None or self.cfg.output_dir is None:
            return
        for plugin in self.artifact_plugins:
            try:
                ins = plugin.artifacts(ctx)
                with refuse_collectives():
                    instrumented_pass(ctx.replay, [ins], self.cfg.backward, path=row.path)
                files = artifact_files(plugin, ins.values(), home, Path(self.cfg.output_dir))
                recorded = row.details.get("artifacts", {})
                again = sorted(set(files) & set(recorded))
                if again:
                    raise ValueError(f"artifact plugin {plugin.name!r} returned kind(s) {again}, recorded already")
                if files:
                    row.details["artifacts"] = {**recorded, **files}
            except Exception as e:
                self._plugin_error(row, plugin, e, fatal=False)

    def compile(self, row: ComponentRow, pending: Sequence[Pending], canary: Callable[[], float] | None) -> None:
        """The compile what-if of one measured component (``pending``: its measured batches).

        Fills ``row.compiled_ms`` and ``row.details["compile"]``. A compile error
        leaves the row ``ok`` (its eager numbers stand) with the error in
        ``details["compile"]["error"]``.
        """
        ctx = pending[0].ctx
        items = [WhatIfInput(p.ctx.replay, p.sampler, p.budget_s, p.batch) for p in pending]
        compiled_ms, info = EXTENSIONS.get("compile_what_if")(
            items, lambda r: self.timing.sampler(dataclasses.replace(ctx, replay=r)), config=self.cfg,
            canary=canary, report_batch=row.details.get("median_batch"),
        )  # fmt: skip
        n = ctx.replay.replayed_calls  # a call set's runs: per call, as total_ms
        row.compiled_ms = compiled_ms / n
        if n > 1:
            info = per_call(info, n, _COMPILE_MS)
            batches = info.get("batches")
            if isinstance(batches, list):
                info["batches"] = [per_call(b, n, _COMPILE_MS) if isinstance(b, Mapping) else b for b in batches]
        row.details["compile"] = info

    def _plugin_error(self, row: ComponentRow, plugin: Metric, e: BaseException, fatal: bool | None = None) -> bool:
        """Record a plugin's error; return whether the component has failed.

        ``fatal`` (default: the plugin is a built-in, or the timing plugin, a
        user's too: without it the row has no times) fails the component;
        otherwise the error lands in ``details["metric_errors"]``.
        """
        self._after_error(e)
        if fatal is None:
            fatal = plugin is self.timing or any(plugin is b for b in self.builtin)
        if fatal:
            row.status, row.error = "failed", f"{plugin.name} metric raised {_error_text(e)}"
            return True
        row.details.setdefault("metric_errors", {})[plugin.name] = _error_text(e)
        if plugin.name not in self.warned:
            self.warned.add(plugin.name)
            warnings.warn(
                f"cb_callback: metric plugin {plugin.name!r} raised on {row.path or 'root'!r}: {e}",
                RuntimeWarning,
                stacklevel=5,
            )
        return False

    def _after_error(self, e: BaseException) -> None:
        if isinstance(e, torch.cuda.OutOfMemoryError) and torch.cuda.is_available():
            torch.cuda.empty_cache()


def _shape(t: torch.Tensor) -> tuple[int, ...] | tuple[str, int, int]:
    """``t``'s shape, or for a nested tensor (which has none) ``("nested", dim, components)``."""
    return ("nested", t.dim(), t.size(0)) if t.is_nested else tuple(t.shape)
