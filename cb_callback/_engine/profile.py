"""``profile_components``: capture, replay each component in isolation, measure, estimate."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime as _dt
import math
import platform
import statistics
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any
from urllib.parse import quote

import torch
from torch import nn

from cb_callback._engine.batches import input_signature, merge_batches, merged_calls
from cb_callback._engine.capture import Capture
from cb_callback._engine.collectives import CollectiveInReplay, refuse_collectives
from cb_callback._engine.config import BenchmarkConfig, resolve_dtype
from cb_callback._engine.estimate import derive, estimate_from_children
from cb_callback._engine.inputs import (
    ComponentInputs,
    InputCopyError,
    copy_call,
    leading_batch_size,
    replicate_batch,
    to_device,
)
from cb_callback._engine.isolate import Replay, instrumented_pass
from cb_callback._engine.plugins import (
    ArtifactMetric,
    InstrumentingMetric,
    MeasureContext,
    MetricPlugin,
    PrepareContext,
    Preprocessor,
    checked_values,
    load_entry_point_plugins,
    models_restored,
    validate_plugin,
)
from cb_callback._engine.quality import LoadProbe, assess, inconsistent_pairs, is_noisy
from cb_callback._engine.state import StateGuard
from cb_callback._engine.storage import model_device, unique_storage_bytes
from cb_callback._engine.timing import (
    Sample,
    SampleSet,
    canary_best,
    cpu_canary,
    interleave,
    timed_seconds,
)
from cb_callback._engine.tree import Node, build_tree, filter_reasons
from cb_callback._hardware.devices import device_problem
from cb_callback._hardware.peaks import (
    Peaks,
    bandwidth_ceiling,
    calibration_spread,
    recalibrate_cpu_flops,
    resolve_peaks,
)
from cb_callback._metrics.artifacts import artifact_plugins
from cb_callback._metrics.builtin import builtin_metrics
from cb_callback._metrics.latency import LatencyMetric
from cb_callback._report.context import ReportContext
from cb_callback._report.model import ComponentRow, Report
from cb_callback._report.model import error_text as _error_text
from cb_callback._whatif.compile import (
    WhatIfInput,
    compile_speedup,
    compile_what_if,
    fill_children_separately,
)

__all__ = ["ReplicateBatch", "profile_captured", "profile_components"]

_MIB = 1024.0 * 1024.0


class ReplicateBatch(Preprocessor):
    """Tile captured inputs along dim 0 to ``batch_size`` samples (built-in).

    Leaves whose leading dimension is the captured batch size are tiled
    (``[x0..xk, x0..xk, …]``), which keeps the captured samples' distribution;
    types with a registered batch rule (a ``KeyedJaggedTensor``) use it.
    """

    name = "replicate_batch"

    def __init__(self, batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError(f"ReplicateBatch(batch_size={batch_size!r}): expected an integer >= 1")
        self.batch_size = batch_size

    def process_inputs(self, inputs: ComponentInputs, ctx: PrepareContext) -> ComponentInputs:
        if ctx.batch_size is None or ctx.batch_size == self.batch_size:
            return inputs
        if isinstance(ctx.module, nn.EmbeddingBag):
            bags = _replicate_bags(inputs, ctx.batch_size, self.batch_size)
            if bags is not None:
                return bags
        args, kwargs = replicate_batch((inputs.args, inputs.kwargs), ctx.batch_size, self.batch_size)
        return dataclasses.replace(inputs, args=tuple(args), kwargs=dict(kwargs))


def _replicate_bags(inputs: ComponentInputs, batch: int, n: int) -> ComponentInputs | None:
    """Tile the bags of a 1-D ``EmbeddingBag(input, offsets)`` call: bag ``j`` of the
    result is bag ``j % batch`` of the capture (with its per-sample weights).

    ``None`` when the call is not that form (2-D input: the generic rule applies).
    """
    names = ("input", "offsets", "per_sample_weights")
    given = dict(zip(names, inputs.args, strict=False)) | {k: v for k, v in inputs.kwargs.items() if k in names}
    values, offsets = given.get("input"), given.get("offsets")
    if not isinstance(values, torch.Tensor) or values.dim() != 1 or not isinstance(offsets, torch.Tensor):
        return None
    include_last = offsets.numel() == batch + 1
    if offsets.numel() not in (batch, batch + 1):
        return None
    starts = offsets[:batch]
    ends = torch.cat([offsets[1:batch], offsets.new_tensor([values.numel()])]) if not include_last else offsets[1:]
    src = torch.arange(n) % batch
    pieces = [torch.arange(int(starts[b]), int(ends[b])) for b in src.tolist()]
    index = torch.cat(pieces) if pieces else torch.empty(0, dtype=torch.long)
    lengths = (ends - starts)[src]
    new_offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    new_offsets = new_offsets if include_last else new_offsets[:-1]
    out = {"input": values[index.to(values.device)], "offsets": new_offsets.to(offsets.device)}
    psw = given.get("per_sample_weights")
    if isinstance(psw, torch.Tensor):
        out["per_sample_weights"] = psw.detach()[index.to(psw.device)].requires_grad_(psw.requires_grad)
    args = list(inputs.args)
    kwargs = dict(inputs.kwargs)
    for i, name in enumerate(names):
        if name not in out:
            continue
        if i < len(args):
            args[i] = out[name]
        elif name in kwargs:
            kwargs[name] = out[name]
    return dataclasses.replace(inputs, args=tuple(args), kwargs=kwargs)


class _ToDevice(Preprocessor):
    name = "to_device"

    def process_inputs(self, inputs: ComponentInputs, ctx: PrepareContext) -> ComponentInputs:
        args, kwargs = to_device((inputs.args, inputs.kwargs), ctx.device)
        return dataclasses.replace(inputs, args=tuple(args), kwargs=dict(kwargs))


def _device(wanted: Any, model: nn.Module) -> torch.device:
    """The device to replay on: ``wanted`` (checked to exist here), else the model's.

    Raises:
        ValueError: a device this machine lacks (CUDA on a CPU build, a GPU index
            past the visible ones, an unknown device string), with the fix.
    """
    if wanted is None:
        return model_device(model)
    problem = device_problem(wanted)
    if problem is not None:
        raise ValueError(f"device={str(wanted)!r}: {problem}; use device='cpu' or a device this machine has")
    return torch.device(wanted)


def _params_mb(module: nn.Module) -> float:
    """Parameters and buffers of ``module``'s subtree, unique storages, MiB."""
    return unique_storage_bytes([*module.parameters(), *module.buffers()]) / _MIB


def _collective_in(e: BaseException) -> CollectiveInReplay | None:
    """The :class:`CollectiveInReplay` behind ``e`` (itself, its cause or context), if any."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, CollectiveInReplay):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def _artifact_dir(cfg: BenchmarkConfig, path: str) -> Path | None:
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


def _artifact_files(plugin: Any, found: Mapping[str, Any], artifact_dir: Path, report_dir: Path) -> dict[str, str]:
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


def _infer_dtype(model: nn.Module, device: torch.device, cfg: BenchmarkConfig) -> str:
    if cfg.dtype is not None:
        return resolve_dtype(cfg.dtype)[1]
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    key = resolve_dtype(dtype)[1]
    if key == "fp32" and device.type == "cuda" and torch.get_float32_matmul_precision() != "highest":
        return "tf32"
    return key


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for dist in ("cb-callback", "numpy", "lightning", "torchrec", "fbgemm-gpu-cpu", "fbgemm-gpu"):
        with contextlib.suppress(PackageNotFoundError):
            out[dist] = version(dist)
    return out


def _plugins(cfg: BenchmarkConfig) -> tuple[list[Any], list[Any], list[Any]]:
    found = load_entry_point_plugins() if cfg.load_plugins else {"metric": [], "reporter": [], "preprocessor": []}
    pre = [validate_plugin(p, "preprocessor") for p in cfg.preprocessors] + found["preprocessor"]
    met = [validate_plugin(p, "metric") for p in cfg.metrics] + found["metric"]
    rep = [validate_plugin(p, "reporter") for p in cfg.reporters] + found["reporter"]
    return pre, met, rep


@dataclass
class _Pending:
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

    @property
    def key(self) -> tuple[str, int]:
        return (self.row.path, self.batch)


class _Run:
    """One profiling run over a captured model (internal state of the loop)."""

    def __init__(
        self,
        model: nn.Module,
        calls: Mapping[str, ComponentInputs],
        cfg: BenchmarkConfig,
        device: torch.device,
        prepare_ctx: PrepareContext,
        preprocessors: Sequence[Preprocessor],
        metrics: Sequence[Any],
        forward_context: Callable[[], AbstractContextManager[Any]] | None,
        batch_sizes: Sequence[int | None] = (),
    ) -> None:
        self.model = model
        #: Each captured batch's batch size (for ``ReplicateBatch``); empty: the run's one.
        self.batch_sizes = list(batch_sizes)
        self.calls = calls
        self.cfg = cfg
        self.device = device
        self.prepare_ctx = prepare_ctx
        self.preprocessors = preprocessors
        self.builtin = builtin_metrics()
        self.latency = next(p for p in self.builtin if isinstance(p, LatencyMetric))
        self.user_metrics = list(metrics)
        plugins = [*self.builtin, *self.user_metrics]
        #: Observe the one shared pass (FLOPs, bytes, memory, and users' instruments).
        self.observing = [p for p in plugins if isinstance(p, InstrumentingMetric)]
        #: Replay on their own after the timed runs.
        self.replaying = [
            p for p in plugins
            if isinstance(p, MetricPlugin) and p not in self.observing and p is not self.latency
        ]
        #: Observe a pass of their own each, after every component's timed runs.
        self.artifact_plugins = [
            *artifact_plugins(cfg.artifacts), *(p for p in plugins if isinstance(p, ArtifactMetric))
        ]
        if cfg.artifacts and cfg.output_dir is None:
            warnings.warn(
                f"cb_callback: artifacts={list(cfg.artifacts)} need an output_dir; none are written",
                RuntimeWarning,
                stacklevel=4,
            )
        self.forward_context = forward_context
        self.warned: set[str] = set()

    def inputs_for(
        self, path: str, module: nn.Module, calls: Mapping[str, ComponentInputs] | None = None, batch: int = 0
    ) -> ComponentInputs:
        inputs = (self.calls if calls is None else calls)[path]
        ctx = dataclasses.replace(self.prepare_ctx, path=path, module=module)
        if batch < len(self.batch_sizes):
            ctx = dataclasses.replace(ctx, batch_size=self.batch_sizes[batch])
        for p in self.preprocessors:
            inputs = p.process_inputs(inputs, ctx)
        return inputs

    def start(
        self, row: ComponentRow, module: nn.Module, calls: Mapping[str, ComponentInputs] | None = None, batch: int = 0
    ) -> _Pending | None:
        """Replay one component once, observed; ``None`` when it failed (``row`` says why).

        ``calls`` is the batch's captured calls (default: the run's first batch).

        One instrumented forward + backward is observed by every
        :class:`InstrumentingMetric` (FLOPs, bytes, memory) and serves as the
        first warm-up. The timed runs come later, interleaved with the other
        components' (:meth:`finish` takes their samples).
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
        # Forward-only replays keep the caller's no_grad (profile_components under no_grad/inference_mode),
        # and a component the real step ran under no_grad (a frozen encoder) replays without grad.
        replay = Replay(
            module, inputs, device=self.device, seed=self.cfg.seed, forward_context=self.forward_context,
            grad_enabled=captured.grad_enabled and (self.cfg.backward or torch.is_grad_enabled()),
        )
        ctx = MeasureContext(
            row.path, module, replay, self.cfg, self.device, {}, artifact_dir=_artifact_dir(self.cfg, row.path)
        )
        try:
            instruments = [p.instrument(ctx) for p in self.observing]
            pass0 = time.perf_counter()
            with refuse_collectives():  # under DDP: a collective would wait forever for the other ranks
                result = instrumented_pass(replay, instruments, self.cfg.backward, path=row.path)
            pass_s = time.perf_counter() - pass0
        except CollectiveInReplay as e:
            self._communicates(row, module, e)
            return None
        except Exception as e:
            self._after_error(e)
            wrapped = _collective_in(e)
            if wrapped is not None:  # user code re-raised it as something else
                self._communicates(row, module, wrapped)
                return None
            try:
                with refuse_collectives():  # never a real collective on one rank
                    replay.probe(self.cfg.backward)
            except Exception as plain:
                wrapped = _collective_in(plain)
                if wrapped is not None:
                    self._communicates(row, module, wrapped)
                    return None
                self._after_error(plain)
                row.status, row.error = "failed", f"replay raised {_error_text(plain)}"
                return None
            row.status, row.error = "failed", f"instrumented pass raised {_error_text(e)}"
            return None
        values: dict[str, Any] = {}
        for plugin, ins in zip(self.observing, instruments, strict=True):
            try:
                values.update(checked_values(plugin, ins.values()))
            except Exception as e:
                if self._plugin_error(row, plugin, e):
                    return None
        values["mutates_inputs"] = result.mutates_inputs
        del result  # holds a forward-only pass's output (and its graph)
        if inputs.unknown_leaves:
            values["unknown_leaves"] = inputs.unknown_leaves
        try:
            sampler = self.latency.warmed_sampler(ctx)  # the instrumented pass was the first warm-up run
        except Exception as e:
            self._plugin_error(row, self.latency, e)
            return None
        budget = self.latency.budget_s(ctx)
        # The instrumented pass runs under counting modes (slower than a plain run): an upper estimate.
        committed = max(budget, max(self.cfg.min_repeats, 1) * pass_s)
        return _Pending(row, ctx, values, sampler, budget, committed, batch)

    def _communicates(self, row: ComponentRow, module: nn.Module, e: CollectiveInReplay) -> None:
        """Not replayed (and never probed): a container is estimated from its other children."""
        row.status = "estimated" if any(True for _ in module.children()) else "skipped"
        row.note = str(e)
        row.details["collective"] = e.op

    def finish(self, pending: _Pending, samples: SampleSet) -> None:
        """Fill the row from its samples, then run the plugins that replay on their own."""
        row, ctx, values = pending.row, pending.ctx, pending.values
        if samples.error is not None:
            self._plugin_error(row, self.latency, samples.error)
            return
        for plugin in [self.latency, *self.replaying]:
            ctx.values = dict(values)
            try:
                if plugin is self.latency:
                    found = self.latency.values(samples, ctx)
                else:
                    with refuse_collectives():  # a user plugin's own replays
                        found = plugin.measure(ctx)
                values.update(checked_values(plugin, found))
            except Exception as e:
                if self._plugin_error(row, plugin, e):
                    return
        ctx.values = dict(values)
        columns = {f for f in ComponentRow.__dataclass_fields__ if f != "details"}
        for key, value in values.items():
            if key in columns:
                setattr(row, key, value)
            else:
                row.details[key] = value
        row.status = "ok"

    def record_artifacts(self, pending: _Pending) -> None:
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
                files = _artifact_files(plugin, ins.values(), home, Path(self.cfg.output_dir))
                recorded = row.details.get("artifacts", {})
                again = sorted(set(files) & set(recorded))
                if again:
                    raise ValueError(f"artifact plugin {plugin.name!r} returned kind(s) {again}, recorded already")
                if files:
                    row.details["artifacts"] = {**recorded, **files}
            except Exception as e:
                self._plugin_error(row, plugin, e, fatal=False)

    def compile(self, row: ComponentRow, pending: Sequence[_Pending], canary: Callable[[], float] | None) -> None:
        """The compile what-if of one measured component (``pending``: its measured batches).

        Fills ``row.compiled_ms`` and ``row.details["compile"]``. A compile error
        leaves the row ``ok`` (its eager numbers stand) with the error in
        ``details["compile"]["error"]``.
        """
        ctx = pending[0].ctx
        items = [WhatIfInput(p.ctx.replay, p.sampler, p.budget_s, p.batch) for p in pending]
        compiled_ms, info = compile_what_if(
            items, lambda r: self.latency.sampler(dataclasses.replace(ctx, replay=r)), config=self.cfg,
            canary=canary, report_batch=row.details.get("median_batch"),
        )  # fmt: skip
        row.compiled_ms = compiled_ms
        row.details["compile"] = info

    def _plugin_error(self, row: ComponentRow, plugin: Any, e: BaseException, fatal: bool | None = None) -> bool:
        """Record a plugin's error; return whether the component has failed.

        ``fatal`` (default: the plugin is a built-in) fails the component;
        otherwise the error lands in ``details["metric_errors"]``.
        """
        self._after_error(e)
        if fatal is None:
            fatal = plugin in self.builtin
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


def profile_captured(
    model: nn.Module,
    calls: Mapping[str, ComponentInputs] | Sequence[Mapping[str, ComponentInputs]],
    *,
    config: BenchmarkConfig | None = None,
    captured_batch_size: int | None = None,
    forward_context: Callable[[], AbstractContextManager[Any]] | None = None,
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
            its row is its median batch: :func:`cb_callback._engine.batches.merge_batches`).
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
        ``config.descend="all"`` starts every component breadth-first (one
        instrumented pass each) and then times all of them in one interleaving;
        ``"hotspots"`` does the same one depth level at a time and starts a
        level's components only below those whose share of the root's time was
        at least ``config.descend_share`` (the rest become ``skipped``, the note
        naming the ancestor and its share).
    """
    cfg = config or BenchmarkConfig()
    wall0 = time.perf_counter()
    timed0 = timed_seconds()
    device = _device(cfg.device, model)
    meta: dict[str, Any] = dict(metadata or {})
    batches = [calls] if isinstance(calls, Mapping) else list(calls)
    if not batches or not all(isinstance(c, Mapping) for c in batches):
        raise ValueError("calls: expected {path: ComponentInputs}, or a non-empty list of them (one per batch)")
    multi = len(batches) > 1
    calls = batches[0] if not multi else merged_calls(batches)
    per_batch: dict[str, dict[int, ComponentRow]] = {}
    if multi:
        meta["batches"] = len(batches)
    pre_user, met_user, reporters = _plugins(cfg)
    builtins: list[Preprocessor] = [_ToDevice()]
    if cfg.batch_size is not None:
        builtins.append(ReplicateBatch(cfg.batch_size))
    prepare_ctx = PrepareContext(cfg, device, meta, captured_batch_size)
    if prepare:
        for p in pre_user:
            model = p.prepare_model(model, prepare_ctx)
    if model_device(model) != device:
        model = copy.deepcopy(model).to(device)
    dtype = _infer_dtype(model, device, cfg)
    sizes = [captured_batch_size, *(_batch_size_of(c) for c in batches[1:])] if multi else []
    run = _Run(model, calls, cfg, device, prepare_ctx, [*builtins, *pre_user], met_user, forward_context, sizes)
    nodes, modules = build_tree(model, calls, cfg.max_depth)
    rows: dict[str, ComponentRow] = {}
    by_path = {n.path: n for n in nodes}
    descendants_called = _descendants_called(nodes, calls)
    filtered = filter_reasons([n.path for n in nodes], cfg.include, cfg.exclude)
    # The guard also restores the RNG a CPU calibration draws from; every preprocessor of the run
    # (profile_components prepared them) is undone after the replays, also on error.
    with models_restored(pre_user, model, prepare_ctx), StateGuard(model):
        calibration0 = time.perf_counter()
        peaks: Peaks = resolve_peaks(
            device, dtype, peak_flops=cfg.peak_flops, peak_bandwidth=cfg.peak_bandwidth
        )
        if device.type == "cpu" and peaks.flops_source == "measured" and peaks.flops is not None:
            again = recalibrate_cpu_flops(dtype)  # only when the calibration disagreed with itself
            if again is not None and again > peaks.flops:
                peaks = dataclasses.replace(peaks, flops=again)
        budget0 = time.perf_counter()  # max_total_time_s excludes the one-off calibration
        load = LoadProbe()
        # "all": one level of every node, timed in one interleaving; "hotspots": depth by depth.
        levels = [nodes] if cfg.descend == "all" else _levels(nodes)
        total_steps = len(nodes) + cfg.rounds * len(levels)
        done = 0
        pending: list[_Pending] = []
        samples: dict[str, SampleSet] = {}
        canary_s: list[float] = []
        not_descended: dict[str, tuple[str, float]] = {}  # path -> (the ancestor not descended, its share)
        for level in levels:
            started: list[_Pending] = []
            for node in level:
                done += 1
                row = ComponentRow(
                    path=node.path,
                    module_type=node.module_type,
                    depth=node.depth,
                    parent=node.parent,
                    calls=calls[node.path].calls if node.path in calls else 0,
                    params_mb=_params_mb(modules[node.path]),
                )
                if node.aliases:
                    row.details["aliases"] = list(node.aliases)
                if node.shared_with:
                    row.details["shared_with"] = list(node.shared_with)
                rows[node.path] = row
                reason = filtered.get(node.path)
                if reason is None and node.path in not_descended and descendants_called[node.path]:
                    reason = _not_descended_note(node, *not_descended[node.path], cfg.descend_share)
                # The timed runs come later: count the budget they will take.
                spent = time.perf_counter() - budget0
                committed = sum(p.committed_s for p in started)
                elapsed = spent + committed
                if reason is not None:
                    row.status, row.note = "skipped", reason
                elif cfg.max_total_time_s is not None and elapsed >= cfg.max_total_time_s and (
                    node.path != "" or cfg.max_total_time_s == 0
                ):
                    row.status = "skipped"
                    row.note = _budget_note(cfg.max_total_time_s, spent, committed, len(started))
                elif node.path in calls and not multi:
                    begun = run.start(row, modules[node.path])
                    if begun is not None:
                        started.append(begun)
                elif node.path in calls:  # every batch it ran in, each with a row of its own
                    for b, batch_calls in enumerate(batches):
                        if node.path in batch_calls:
                            row_b = dataclasses.replace(row, calls=batch_calls[node.path].calls, details={})
                            per_batch.setdefault(node.path, {})[b] = row_b
                            begun = run.start(row_b, modules[node.path], batch_calls, b)
                            if begun is not None:
                                started.append(begun)
                elif descendants_called[node.path]:
                    row.status, row.note = "estimated", "never called itself (a container)"
                else:
                    row.status, row.note = "not_run", "neither it nor a descendant ran in the captured forward"
                if cfg.progress is not None:
                    cfg.progress(done, total_steps, node.path)
            level_samples = _time_interleaved(started, rows, cfg, done, total_steps, device, canary_s)
            done += cfg.rounds
            for p in started:
                run.finish(p, level_samples[p.key])
                if not multi:
                    samples[p.row.path] = level_samples[p.key]
            replayed = {p.key: p.ctx.replay.inputs for p in started}  # after preprocessing (batch_size)
            for node in level:
                if node.path in per_batch:
                    shapes = {
                        b: input_signature(replayed.get((node.path, b), batches[b][node.path]))
                        for b in per_batch[node.path]
                    }  # fmt: skip
                    mid = merge_batches(rows[node.path], per_batch[node.path], shapes)
                    if mid is not None and (node.path, mid) in level_samples:  # the quality checks: its batch's
                        samples[node.path] = level_samples[(node.path, mid)]
            pending += started
            if cfg.descend == "hotspots":
                not_descended.update(_below_cold(level, by_path, rows, cfg.descend_share, not_descended, per_batch))
        if cfg.compile:
            _compile_phase(run, pending, rows, cfg, budget0, device, by_path, per_batch)
        load.stop()
        cost = {n.path: _step_cost_ms(n.path, by_path, rows, per_batch) for n in nodes}  # what selections rank by
        for p in _artifact_targets(pending, cfg, rows, cost):  # after every timed run: never timed
            run.record_artifacts(p)
            if p.row is not rows[p.row.path]:  # one batch of several: the artifacts are the median batch's
                for key in ("artifacts", "metric_errors"):
                    if key in p.row.details:
                        rows[p.row.path].details[key] = p.row.details[key]
    _estimate_parents(nodes, rows)
    for row in rows.values():
        derive(row, peaks.flops, peaks.bandwidth)
        ceiling = bandwidth_ceiling(peaks, row.details.get("working_set_bytes")) if row.status == "ok" else None
        if ceiling is not None and ceiling.bandwidth is not None:
            row.details["bw_ceiling"] = {"level": ceiling.name, "gbps": ceiling.bandwidth / 1e9}
    _fill_share(rows, per_batch)
    for row in rows.values():
        row.compile_speedup = compile_speedup(row)
    if cfg.compile:
        fill_children_separately(rows, {n.path: n.children for n in nodes})
    spread = calibration_spread(dtype) if device.type == "cpu" and peaks.flops_source == "measured" else None
    best = canary_best()
    slowdown = statistics.median(canary_s) / best if canary_s and best else None
    assessment = assess(
        list(rows.values()), samples, load=load, threads=torch.get_num_threads(), config=cfg,
        calibration_spread=spread,
        slowdown=slowdown,
        peaks=peaks.to_metadata(),
        pairs=_pairs_by_batch(per_batch, len(batches)) if multi else None,
    )
    for path, row in rows.items():  # always a list: [] on a clean row
        row.details["flags"] = list(assessment.flags.get(path, []))
    meta["quality"] = assessment.quality
    wall = time.perf_counter() - wall0
    timed = timed_seconds() - timed0
    meta.update(
        device=str(device),
        device_name=peaks.device_name,
        dtype=dtype,
        peaks=peaks.to_metadata(),
        versions=_versions(),
        config=cfg.to_metadata(),
        torch_threads=torch.get_num_threads(),
        captured_batch_size=captured_batch_size,
        created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        timing={
            "wall_s": wall,
            "timed_s": timed,
            "harness_efficiency": timed / wall if wall > 0 else None,
            "calibration_s": budget0 - calibration0,
        },
    )
    report = Report([rows[n.path] for n in nodes], meta)
    ctx = report_context or ReportContext(output_dir=Path(cfg.output_dir) if cfg.output_dir else None)
    _write(report, reporters, ctx)
    return report


def _time_interleaved(
    pending: Sequence[_Pending],
    rows: Mapping[str, ComponentRow],
    cfg: BenchmarkConfig,
    done: int,
    total_steps: int,
    device: torch.device,
    canary_s: list[float],
) -> dict[tuple[str, int], SampleSet]:
    """The timed runs of the started components, interleaved in ``cfg.rounds`` rounds.

    Keyed by ``(path, batch)`` (:attr:`_Pending.key`); with several batches a
    child slower than its parent is looked for batch by batch.

    With ``descend="all"`` these are every component; with ``"hotspots"`` one
    depth level's, so a child and its parent are never in the same call and a
    child slower than its parent is not re-measured (the quality assessment
    still flags the pair ``slower_than_parent``). Components that come out
    inconsistent (``noise`` above the noisy threshold, or a child slower than
    its parent) get the same number of rounds again,
    interleaved among themselves, once; their samples are pooled. On CPU a
    reference GEMM (the canary) is timed before every round into ``canary_s``.
    """
    canary = cpu_canary() if device.type == "cpu" and pending else None
    def progress(r: int) -> None:
        if cfg.progress is not None:
            cfg.progress(done + r, total_steps, f"timing round {r}/{cfg.rounds}")

    def run(items: Sequence[_Pending], extend: list[SampleSet] | None = None) -> list[SampleSet]:
        return interleave(
            [p.sampler for p in items],
            budgets_s=[p.budget_s for p in items],
            rounds=cfg.rounds,
            min_repeats=cfg.min_repeats,
            max_repeats=cfg.max_repeats,
            sets=extend,
            on_round=progress if extend is None else None,
            canary=canary,
            canary_s=canary_s,
        )

    sets = run(pending)
    by_key = {p.key: s for p, s in zip(pending, sets, strict=True)}
    again = {key for key, s in by_key.items() if s.error is None and is_noisy(s)}
    for b in sorted({p.batch for p in pending}):
        mine = {p.row.path: p.row for p in pending if p.batch == b}
        batch_rows = {**rows, **mine}  # a parent timed in another level keeps its merged row
        medians = {
            path: by_key[(path, b)].median() for path in mine
            if by_key[(path, b)].samples and by_key[(path, b)].error is None
        }  # fmt: skip
        for child, parent in inconsistent_pairs(batch_rows, medians):
            again.update(((child, b), (parent, b)))
    redo = [i for i, p in enumerate(pending) if p.key in again]
    if redo:
        run([pending[i] for i in redo], [sets[i] for i in redo])
        for i in redo:
            sets[i].remeasured = True
    return by_key


def _row_cost(row: ComponentRow) -> float:
    """``(fwd_ms + bwd_ms) × calls``: what a measured component costs over the step."""
    return (_nan0(row.fwd_ms) + _nan0(row.bwd_ms)) * max(row.calls, 1)


def _artifact_targets(
    pending: Sequence[_Pending],
    cfg: BenchmarkConfig,
    rows: Mapping[str, ComponentRow],
    cost: Mapping[str, float | None],
) -> list[_Pending]:
    """The components artifacts are written for: all, or the ``artifacts_top`` most expensive.

    Most expensive by ``cost`` (:func:`_step_cost_ms`: over every batch, as
    ``share``) among the measured (``ok``) rows. With several batches a
    component's artifacts come from the batch its row is (its median batch).
    """
    chosen: dict[str, _Pending] = {}
    for p in pending:
        if p.row.status != "ok":
            continue
        mid = rows[p.row.path].details.get("median_batch")
        if p.row.path not in chosen or p.batch == mid:
            chosen[p.row.path] = p
    ok = list(chosen.values())
    if cfg.artifacts_top is None:
        return ok
    top = {id(p) for p in sorted(ok, key=lambda p: cost.get(p.row.path) or 0.0, reverse=True)[: cfg.artifacts_top]}
    return [p for p in ok if id(p) in top]


def _compile_phase(
    run: _Run,
    pending: Sequence[_Pending],
    rows: Mapping[str, ComponentRow],
    cfg: BenchmarkConfig,
    budget0: float,
    device: torch.device,
    nodes: Mapping[str, Node],
    per_batch: Mapping[str, Mapping[int, ComponentRow]],
) -> None:
    """The compile what-if of the measured components, most expensive first.

    Most expensive is :func:`_step_cost_ms` (``total_ms × calls`` summed over
    the batches a component ran in, as ``share`` counts it). ``compile_top`` limits it to the first ``K``; with ``max_total_time_s`` a
    component is compiled only while the budget left covers the longest what-if
    so far (the first is not bounded: a compile cannot be interrupted); the others'
    ``details["compile"]["skipped"]`` says so. Dynamo is reset after each.
    """
    batches: dict[str, list[_Pending]] = {}
    for p in pending:
        if p.row.status == "ok":
            batches.setdefault(p.row.path, []).append(p)
    over = {path: _step_cost_ms(path, nodes, rows, per_batch) or 0.0 for path in batches}
    ok = sorted((rows[path] for path in batches if rows[path].status == "ok"), key=lambda r: over[r.path], reverse=True)
    chosen = ok if cfg.compile_top is None else ok[: cfg.compile_top]
    canary = cpu_canary() if device.type == "cpu" and chosen else None
    longest = 0.0  # the longest what-if so far: what the next one is expected to take at most
    for i, row in enumerate(chosen):
        elapsed = time.perf_counter() - budget0
        if cfg.max_total_time_s is not None and elapsed + longest >= cfg.max_total_time_s:
            for r in chosen[i:]:
                r.details["compile"] = {
                    "skipped": f"max_total_time_s={cfg.max_total_time_s} spent ({elapsed:.2f} s elapsed, "
                    f"{longest:.2f} s for the longest compile what-if so far)"
                }
            return
        t0 = time.perf_counter()
        run.compile(row, batches[row.path], canary)
        longest = max(longest, time.perf_counter() - t0)
        if cfg.progress is not None:
            cfg.progress(i + 1, len(chosen), f"compile what-if {row.path or 'root'}")


def _budget_note(limit: float, spent: float, committed: float, started: int) -> str:
    """Why a component was not started within ``max_total_time_s``: what was spent, what was still owed."""
    owed = (
        f" and {committed:.2f} s more committed to the timed runs of the {started} component"
        f"{'s' if started != 1 else ''} started before it (at least their timing budget each)"
        if started
        else ""
    )
    return f"max_total_time_s={limit:g} reached: {spent:.2f} s spent profiling so far{owed}"


def _nan0(x: float) -> float:
    return x if math.isfinite(x) else 0.0


def _fill_share(rows: Mapping[str, ComponentRow], per_batch: Mapping[str, Mapping[int, ComponentRow]] | None = None) -> None:
    """``share`` = ``total_ms × calls ÷ (root total_ms × root calls)`` where both are known.

    Time over the step as a fraction of the root's time over the step: for a
    root called once (the usual step) that is ``total_ms × calls ÷ root
    total_ms``; a step that calls the model twice (a siamese step) does not
    double every share.

    With several batches (``per_batch``: each component's row per batch) a
    measured row's share is ``Σ_b total_ms_b × calls_b ÷ Σ_b root's``, over the
    batches the root was measured in and the component was not failed in (a
    batch it did not run in counts 0): a component that ran in one batch of four
    is not credited with that batch's time in all four. An estimated row's share
    is then its children's sum (what it is in one batch, too).
    """
    root = rows.get("")
    if root is None or not math.isfinite(root.total_ms) or root.total_ms <= 0:
        return
    if per_batch and "" in per_batch:
        _fill_share_by_batch(rows, per_batch)
        return
    whole = root.total_ms * max(root.calls, 1)
    for row in rows.values():
        if row.status in ("ok", "estimated") and math.isfinite(row.total_ms):
            row.share = row.total_ms * max(row.calls, 1) / whole


def _fill_share_by_batch(rows: Mapping[str, ComponentRow], per_batch: Mapping[str, Mapping[int, ComponentRow]]) -> None:
    def cost(r: ComponentRow) -> float:
        return (r.fwd_ms + _nan0(r.bwd_ms)) * max(r.calls, 1) if r.status == "ok" and math.isfinite(r.fwd_ms) else math.nan

    root = {b: cost(r) for b, r in per_batch[""].items()}
    root = {b: c for b, c in root.items() if math.isfinite(c) and c > 0}
    for path, row in rows.items():
        if row.status != "ok" or path not in per_batch:
            continue
        mine = per_batch[path]
        counted = [b for b in root if b not in mine or mine[b].status == "ok"]
        whole = sum(root[b] for b in counted)
        if whole > 0:
            row.share = sum(_nan0(cost(mine[b])) for b in counted if b in mine) / whole
    by_parent: dict[str, list[ComponentRow]] = {}
    for row in rows.values():
        if row.parent is not None:
            by_parent.setdefault(row.parent, []).append(row)
    for row in sorted(rows.values(), key=lambda r: -r.depth):  # children first
        if row.status == "estimated":
            kids = [c.share for c in by_parent.get(row.path, []) if c.status in ("ok", "estimated")]
            if kids and all(math.isfinite(k) for k in kids):
                row.share = math.fsum(kids)


def _pairs_by_batch(per_batch: Mapping[str, Mapping[int, ComponentRow]], n: int) -> list[tuple[str, str]]:
    """``(child, parent)`` pairs measured slower than the parent on the same batch, over all batches."""
    out: list[tuple[str, str]] = []
    for b in range(n):
        mine = {path: rows[b] for path, rows in per_batch.items() if b in rows}
        medians = {p: _nan0(r.fwd_ms) + _nan0(r.bwd_ms) for p, r in mine.items() if r.status == "ok" and math.isfinite(r.fwd_ms)}
        out += [pair for pair in inconsistent_pairs(mine, medians) if pair not in out]
    return out


def _batch_size_of(calls: Mapping[str, ComponentInputs]) -> int | None:
    """The leading batch size of a batch's first captured call (its capture's ``batch_size``)."""
    first = min(calls.values(), key=lambda c: c.order, default=None)
    return None if first is None else leading_batch_size((first.args, first.kwargs))


def _levels(nodes: Sequence[Node]) -> list[list[Node]]:
    """The nodes grouped by depth, shallowest first, each group in the nodes' order."""
    out: dict[int, list[Node]] = {}
    for n in nodes:
        out.setdefault(n.depth, []).append(n)
    return [out[d] for d in sorted(out)]


def _step_cost_ms(
    path: str,
    nodes: Mapping[str, Node],
    rows: Mapping[str, ComponentRow],
    per_batch: Mapping[str, Mapping[int, ComponentRow]] | None = None,
) -> float | None:
    """``(fwd_ms + bwd_ms) × calls`` of a component over the step, as far as known now.

    The one figure every selection ranks by (descent, ``artifacts_top``,
    ``compile_top``), as ``share`` counts it: with several batches (``per_batch``)
    the sum over the batches it was measured in, not its median batch's. A
    measured (``ok``) row has its own; a row without one of its own (a
    container, a failed replay) is the sum of its children's known costs (as
    it will be estimated); a component that never ran costs 0; ``None`` when
    nothing is known (skipped, or no child profiled yet).
    """
    row = rows.get(path)
    if row is None:
        return None
    if row.status == "ok" and math.isfinite(row.fwd_ms):
        mine = (per_batch or {}).get(path)
        if mine:
            return math.fsum(_row_cost(r) for r in mine.values() if r.status == "ok" and math.isfinite(r.fwd_ms))
        return _row_cost(row)
    if row.status == "not_run":
        return 0.0
    if row.status not in ("estimated", "failed"):
        return None
    parts = [_step_cost_ms(c, nodes, rows, per_batch) for c in nodes[path].children]
    known = [x for x in parts if x is not None]
    return sum(known) if known else None


def _below_cold(
    level: Sequence[Node],
    nodes: Mapping[str, Node],
    rows: Mapping[str, ComponentRow],
    descend_share: float,
    not_descended: Mapping[str, tuple[str, float]],
    per_batch: Mapping[str, Mapping[int, ComponentRow]] | None = None,
) -> dict[str, tuple[str, float]]:
    """The children of ``level`` not to profile: ``{child: (ancestor not descended, its share)}``.

    A node's ``share`` is :func:`_step_cost_ms` over the root's (as
    :func:`_fill_share` computes it). Below a node with a known
    share under ``descend_share`` nothing is profiled; a node whose share is not
    known yet (a container, before its children ran; or no root time) is
    descended into; a node that was not descended into passes its reason on.
    """
    ref = _step_cost_ms("", nodes, rows, per_batch)  # the root's time over the step, as _fill_share divides by
    out: dict[str, tuple[str, float]] = {}
    for node in level:
        if node.path in not_descended:
            why = not_descended[node.path]
        else:
            cost = _step_cost_ms(node.path, nodes, rows, per_batch)
            if ref is None or ref <= 0 or cost is None or rows[node.path].status != "ok":
                continue
            share = cost / ref
            if share >= descend_share:
                continue
            why = (node.path, share)
        out.update(dict.fromkeys(node.children, why))
    return out


def _not_descended_note(node: Node, ancestor: str, share: float, descend_share: float) -> str:
    """The ``note`` of a component below one whose share was under ``descend_share``."""
    who = "parent" if node.parent == ancestor else "ancestor"
    return f"not descended: {who} {ancestor or 'root'} has share {share:.3g} < descend_share {descend_share:g}"


def _descendants_called(nodes: list[Node], calls: Mapping[str, ComponentInputs]) -> dict[str, bool]:
    out = {n.path: n.path in calls for n in nodes}
    by_path = {n.path: n for n in nodes}
    for n in sorted(nodes, key=lambda n: -n.depth):
        if out[n.path] and n.parent is not None and n.parent in by_path:
            out[n.parent] = True
    return out


def _estimate_parents(nodes: list[Node], rows: dict[str, ComponentRow]) -> None:
    """Bottom-up: a failed or container row takes its children's sums."""
    for node in sorted(nodes, key=lambda n: -n.depth):
        row = rows[node.path]
        if row.status not in ("failed", "estimated"):
            continue
        children = [rows[c] for c in node.children if c in rows]
        if not children:
            row.status = "failed"
            row.error = row.error or "no child was profiled to estimate it from"
            continue
        estimate_from_children(row, children)


def _write(report: Report, reporters: Sequence[Any], ctx: ReportContext) -> None:
    for reporter in reporters:
        try:
            reporter.write(report, ctx)
        except Exception as e:
            warnings.warn(f"cb_callback: reporter {reporter.name!r} failed: {e}", RuntimeWarning, stacklevel=3)


def profile_components(
    model: nn.Module,
    args: Any = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    batches: Sequence[Any] | None = None,
    config: BenchmarkConfig | None = None,
    **options: Any,
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
            not ``(args, kwargs)``.

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
    cfg = (config or BenchmarkConfig()).replace(**options) if options else (config or BenchmarkConfig())
    if not isinstance(model, nn.Module):
        raise ValueError(f"model={type(model).__name__!r} is not an nn.Module")
    inference = torch.is_inference_mode_enabled()
    grad_note = _grad_mode_note(inference)
    if grad_note is not None and cfg.backward:
        warnings.warn(f"cb_callback: {grad_note}", RuntimeWarning, stacklevel=3)
        cfg = cfg.replace(backward=False)
    inputs = _batch_inputs(args, kwargs, batches)
    device = _device(cfg.device, model)
    pre_user, _, _ = _plugins(cfg)
    meta: dict[str, Any] = {} if grad_note is None else {"grad_mode": grad_note}
    batch = leading_batch_size(inputs[0])
    prepare_ctx = PrepareContext(cfg, device, meta, batch)
    for p in pre_user:
        model = p.prepare_model(model, prepare_ctx)
    if model_device(model) != device:
        model = copy.deepcopy(model).to(device)
    own = _input_copier(model)
    captures = []
    for i, (b_args, b_kwargs) in enumerate(inputs):
        b_args, b_kwargs = to_device((tuple(b_args), b_kwargs), device)
        with contextlib.suppress(InputCopyError):  # uncopyable: the capture's row names it
            # The capture forward is a real forward: it runs on a copy, so that a cache object the
            # caller passed (a KV cache appended to) or an input changed in place stays as it was.
            b_args, b_kwargs = copy_call(tuple(b_args), dict(b_kwargs), own)
        capture = Capture(model)
        captures.append(capture)
        with StateGuard(model):
            try:
                with capture:
                    model(*b_args, **b_kwargs)
            except Exception as e:
                which = "" if len(inputs) == 1 else f" of batch {i}"
                meta.setdefault("capture_error", _error_text(e) + which)
                warnings.warn(
                    f"cb_callback: the capture forward{which} raised {_error_text(e)}; profiling what was captured",
                    RuntimeWarning,
                    stacklevel=3,
                )
    calls = captures[0].calls if len(captures) == 1 else [c.calls for c in captures]
    with contextlib.ExitStack() as mode:
        if inference:  # the captured copies are normal tensors: replay them outside it, without grad
            mode.enter_context(torch.inference_mode(False))
            mode.enter_context(torch.no_grad())
        return profile_captured(
            model, calls, config=cfg, captured_batch_size=captures[0].batch_size, metadata=meta, prepare=False
        )


def _input_copier(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """How the capture forward's copy of the inputs copies a tensor.

    The model's own parameters and buffers are kept (an argument may be one, or
    a dict keyed by one); any other tensor is cloned with its ``requires_grad``,
    and one that was not a leaf stays a non-leaf (``ReLU(inplace=True)`` on an
    upstream output works on the copy as on the original).
    """
    own = {id(t) for t in (*model.parameters(), *model.buffers())}

    def copy(t: torch.Tensor) -> torch.Tensor:
        if id(t) in own:
            return t
        out = t.detach().clone()
        if not t.requires_grad:
            return out
        out.requires_grad_(True)
        return out if t.is_leaf else out.clone()

    return copy


def _batch_inputs(
    args: Any, kwargs: Mapping[str, Any] | None, batches: Sequence[Any] | None
) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """``[(args, kwargs), …]``: the one call given, or each of ``batches``."""

    def as_args(a: Any) -> tuple[Any, ...]:
        return (a,) if isinstance(a, (torch.Tensor, dict)) or not isinstance(a, (tuple, list)) else tuple(a)

    if batches is None:
        return [(as_args(args), dict(kwargs or {}))]
    given = not (isinstance(args, (tuple, list)) and len(args) == 0) or bool(kwargs)
    if given:
        raise ValueError("profile_components: pass either args/kwargs or batches=[(args, kwargs), ...], not both")
    if isinstance(batches, (torch.Tensor, str)) or not isinstance(batches, Sequence) or not batches:
        raise ValueError(f"batches={type(batches).__name__}: expected a non-empty list of (args, kwargs)")
    out: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
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
