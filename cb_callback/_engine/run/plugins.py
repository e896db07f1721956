"""Plugin contracts: preprocessors, metric plugins and reporters.

Each kind is a small typed contract whose methods take one context object, so
the context can grow without breaking old plugins. The built-in metrics,
preprocessors and reporters are written against exactly these contracts.

Third parties register plugins through the entry-point group
``cb_callback.plugins``: each entry point names a plugin class (instantiated
without arguments) or instance; its kind is read from the methods it has.

When each metric hook runs, per component (see docs/plugins.md):

1. :meth:`InstrumentingMetric.instrument` before the component's first run;
   the :class:`~cb_callback.plugins.Instrument` observes the one pass that all of them
   share (it is also the first warm-up);
2. the timed runs of every component, interleaved in rounds: the runs a
   :class:`TimedMetric` times (the built-in ``LatencyMetric``, or a user's),
   then :meth:`TimedMetric.values` from each component's samples;
3. :meth:`MetricPlugin.measure` of the plugins that replay on their own;
4. :meth:`ArtifactMetric.artifacts` when ``output_dir`` is set: each in a pass
   of its own, after every component's timed runs and ``measure``.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias, overload, runtime_checkable

import torch
from torch import nn

from cb_callback._report.model import COLUMNS

if TYPE_CHECKING:
    from cb_callback._engine.capture.inputs import ComponentInputs
    from cb_callback._engine.clocks.timing import Sample, SampleSet
    from cb_callback._engine.replay.isolate import Instrument, Replay
    from cb_callback._engine.run.config import BenchmarkConfig
    from cb_callback._report.context import Reporter

__all__ = [
    "COUNTED_KEYS",
    "ENTRY_POINT_GROUP",
    "MEASURED_COLUMNS",
    "RESERVED_KEYS",
    "ArtifactMetric",
    "InstrumentingMetric",
    "MeasureContext",
    "MetricPlugin",
    "PrepareContext",
    "Preprocessor",
    "TimedMetric",
    "checked_values",
    "load_entry_point_plugins",
    "models_restored",
    "register_metric",
    "registered_metrics",
    "validate_plugin",
]

ENTRY_POINT_GROUP = "cb_callback.plugins"


@dataclass
class PrepareContext:
    """What a preprocessor sees.

    Attributes:
        config: the run's options.
        device: the device components are replayed on.
        metadata: the report's metadata; a preprocessor may add what it changed
            (e.g. reduced embedding tables), under a key of its own.
        batch_size: the batch size the inputs were captured with (leading
            dimension of the root's first tensor input), if known.
        path: in ``process_inputs``, the component's dotted path.
        module: in ``process_inputs``, the component.
    """

    config: BenchmarkConfig
    device: torch.device
    metadata: dict[str, Any]
    batch_size: int | None = None
    path: str | None = None
    module: nn.Module | None = None


class Preprocessor:
    """Transforms the model before capture and/or each component's inputs.

    Subclass and override any method; the defaults change nothing. What
    ``prepare_model`` installs (hooks, caches) is taken off in ``restore_model``,
    which the engine runs once per run after the last replay, also when
    profiling raised.
    """

    name: str = "preprocessor"

    def prepare_model(self, model: nn.Module, ctx: PrepareContext) -> nn.Module:
        """Called once per run, on the model to profile.

        :func:`profile_components` calls it before its capture forward;
        :func:`profile_captured` (the Lightning callback, ``cb replay``) after the
        capture, on the captured model, before any replay. Returns the model to
        profile: ``model`` itself, or a new module whose ``named_modules()`` paths
        match the captured ones. It must not change the model a training run
        goes on with (return a copy that shares the weights instead).
        """
        return model

    def process_inputs(self, inputs: ComponentInputs, ctx: PrepareContext) -> ComponentInputs:
        """Called once per component, before its replay, with its captured inputs."""
        return inputs

    def restore_model(self, model: nn.Module, ctx: PrepareContext) -> None:
        """Called once per run, after the last replay: undo what :meth:`prepare_model` installed.

        ``model`` is the model that was profiled (what the preprocessors'
        ``prepare_model`` returned, moved to the profiling device). It runs in a
        ``finally``: also when a replay, a plugin or the user's interrupt raised
        out of the run, in the reverse order of ``prepare_model``. It is not
        called when a ``prepare_model`` raised (the run never started). What it
        raises becomes a warning naming the preprocessor; the report stands.
        Preprocessors written before this hook existed (without the method)
        are simply not called.
        """


@contextlib.contextmanager
def models_restored(preprocessors: Sequence[object], model: nn.Module, ctx: PrepareContext) -> Iterator[None]:
    """Run every preprocessor's :meth:`Preprocessor.restore_model` on exit, last one first, also on error."""
    try:
        yield
    finally:
        for p in reversed(preprocessors):
            restore = getattr(p, "restore_model", None)  # optional: older preprocessors lack it
            if not callable(restore):
                continue
            try:
                restore(model, ctx)
            except Exception as e:
                warnings.warn(
                    f"cb_callback: preprocessor {getattr(p, 'name', type(p).__name__)!r} raised in "
                    f"restore_model: {type(e).__name__}: {e}",
                    RuntimeWarning,
                    stacklevel=3,
                )


@dataclass
class MeasureContext:
    """What a metric plugin sees when it measures one component.

    Attributes:
        path: the component's dotted path (``""`` for the root).
        module: the component.
        replay: runs the component in isolation (fresh inputs, forward, backward).
        config: the run's options.
        device: where it runs.
        values: what earlier plugins measured for this component (read it, don't
            change it).
        artifact_dir: where this component's files go,
            ``<output_dir>/artifacts/<path or "root">/``; ``None`` when
            ``config.output_dir`` is ``None`` (nothing may be written). It is not
            created until a plugin asks for a file in it (:meth:`artifact_path`).
    """

    path: str
    module: nn.Module
    replay: Replay
    config: BenchmarkConfig
    device: torch.device
    values: Mapping[str, Any] = field(default_factory=dict)
    artifact_dir: Path | None = None

    def artifact_path(self, name: str) -> Path:
        """``artifact_dir / name``, its directory created: where to write one file.

        Raises:
            RuntimeError: when ``artifact_dir`` is ``None`` (no ``output_dir``).
        """
        if self.artifact_dir is None:
            raise RuntimeError(f"no artifact directory for {self.path or 'root'!r}: config.output_dir is None")
        out = self.artifact_dir / name
        out.parent.mkdir(parents=True, exist_ok=True)
        return out


#: The row columns a metric plugin may fill; the engine fills every other column.
MEASURED_COLUMNS: tuple[str, ...] = (
    "fwd_ms", "bwd_ms", "cpu_ms", "device_ms", "fwd_flops", "bwd_flops",
    "activation_mb", "peak_mem_mb", "bytes", "noise", "comm_bytes", "comm_ms",
)  # fmt: skip

#: Keys a metric plugin may not return: the columns the engine fills (``path``,
#: ``status``, ``error``, ``note``, ``calls``, ``params_mb``, ``share``, the derived
#: ``total_ms``/``tflops``/``mfu``/``gbps``/``bw_util``/``intensity``/``bound``)
#: and the ``details`` keys it owns.
RESERVED_KEYS: frozenset[str] = frozenset(
    {c for c in COLUMNS if c not in MEASURED_COLUMNS}
    | {"details", "artifacts", "metric_errors", "flags", "floor_ms", "insitu", "group", "as", "from"}
)


#: The values of a row the step's census gives (:attr:`cb_callback._engine.counting.census.Census.values`), what an
#: :class:`InstrumentingMetric`'s optional ``from_census(counted)`` reads (docs/plugins.md).
COUNTED_KEYS = (
    "fwd_flops", "bwd_flops", "uncounted_ops", "bytes", "fwd_bytes", "bwd_bytes", "top_bytes_ops", "working_set_bytes",
)  # fmt: skip


def checked_values(plugin: object, values: Mapping[str, Any]) -> Mapping[str, Any]:
    """``values``, unless a key is one the engine owns (:data:`RESERVED_KEYS`) or a column's value is no
    number (or ``None``); a one-element tensor or a numpy scalar (what tensor arithmetic gives) becomes its
    Python number, in a column or a details value alike, so report.json holds a number and loads again.

    Raises:
        ValueError: naming the plugin and the key (and the value's type).
    """
    label = getattr(plugin, "name", None) or type(plugin).__name__
    clash = sorted(k for k in values if k in RESERVED_KEYS)
    if clash:
        raise ValueError(
            f"metric plugin {label!r} returned {', '.join(map(repr, clash))}, which the engine owns "
            f"(a plugin may fill {', '.join(MEASURED_COLUMNS)} and any details key): rename it"
        )
    out = {k: _as_number(v) for k, v in values.items()}
    for key in MEASURED_COLUMNS:
        value = out.get(key)
        if key in out and value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(
                f"metric plugin {label!r} returned {key}={value!r} ({type(value).__name__}): a column takes a "
                "number (int or float; a one-element tensor or numpy scalar is converted)"
            )
    return out


def _as_number(value: object) -> object:
    """A one-element tensor or a numpy scalar as its Python number (``.item()``), anything else as it is."""
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value
    item = getattr(value, "item", None)
    if type(value).__module__ == "numpy" and callable(item) and getattr(value, "shape", None) == ():
        return item()
    return value


@runtime_checkable
class MetricPlugin(Protocol):
    """Measures one component by replaying it on its own.

    ``measure`` runs once per component whose shared instrumented pass
    succeeded, after the timed runs of every component (so it never disturbs
    them), in the order the plugins are given; ``ctx.values`` holds what the
    built-ins measured (``fwd_ms``, ``fwd_flops`` …). It returns a mapping: keys
    that are :data:`MEASURED_COLUMNS` fill those columns; any other key goes to
    the row's ``details``; a key in :data:`RESERVED_KEYS` is rejected. Raising
    (or a rejected key) marks the measurement failed for this component (a
    built-in plugin: the component becomes ``failed``/``estimated``; a user
    plugin: the error lands in ``details["metric_errors"]``).
    """

    name: str

    def measure(self, ctx: MeasureContext) -> Mapping[str, Any]: ...


@runtime_checkable
class InstrumentingMetric(Protocol):
    """Measures one component by observing the pass that all such plugins share.

    ``instrument`` runs once per component, before its first run; the
    :class:`~cb_callback.plugins.Instrument` it returns is entered around that one
    forward + backward (:class:`~cb_callback.plugins.Phase`), which is also the first
    warm-up run; its ``values()`` are read right after, under the same rules as
    :meth:`MetricPlugin.measure`'s. A plugin that has both methods is only
    instrumented. The built-in FLOPs, bytes and memory metrics are of this kind.
    """

    name: str

    def instrument(self, ctx: MeasureContext) -> Instrument: ...


@runtime_checkable
class ArtifactMetric(Protocol):
    """Writes files about one component (a trace, an op table) from a pass of its own.

    ``artifacts`` runs once per measured (``ok``) component when
    ``config.output_dir`` is set, after the timed runs of every component and
    every :meth:`MetricPlugin.measure`, so its overhead is never timed. The
    :class:`~cb_callback.plugins.Instrument` it returns observes one forward + backward
    run just for it; its ``values()`` map an artifact kind (``"trace"``) to a
    file it wrote under ``ctx.artifact_dir`` (a path relative to that
    directory, or absolute inside it; :meth:`MeasureContext.artifact_path`
    gives one). The row records them in ``details["artifacts"]`` as ``{kind:
    path relative to the report's directory}``. A kind recorded already, a file
    that does not exist or lies outside ``artifact_dir``, or a raising plugin
    lands in ``details["metric_errors"]``; the row's measurements stand.
    """

    name: str

    def artifacts(self, ctx: MeasureContext) -> Instrument: ...


@runtime_checkable
class TimedMetric(Protocol):
    """Times one component's runs; the engine schedules them with every other component's.

    ``sampler(ctx)`` runs once per component whose shared instrumented pass
    succeeded, right after it: the callable it returns times one run (a
    forward on fresh inputs and the backward of that forward's graph) and
    returns a :class:`cb_callback._engine.clocks.timing.Sample`. The engine calls it
    ``config.warmup - 1`` times untimed (the instrumented pass was the first
    warm-up), then in ``config.rounds`` interleaved rounds across all
    components, each component's runs in a round adding up to its share of
    ``budget_s(ctx)`` (at least ``config.min_repeats`` runs in all); a
    component that comes out noisy or slower than its parent gets as many
    rounds again. ``values(samples, ctx)`` then turns the component's
    :class:`~cb_callback._engine.clocks.timing.SampleSet` into row values (under
    :meth:`MetricPlugin.measure`'s rules). The compile what-if calls
    ``sampler`` again with the compiled replay (``ctx.replay`` swapped).

    One timing plugin runs: the built-in ``LatencyMetric``, unless a user
    metric plugin implements this contract, which then replaces it.
    """

    name: str

    def sampler(self, ctx: MeasureContext) -> Callable[[], Sample]: ...

    def budget_s(self, ctx: MeasureContext) -> float: ...

    def values(self, samples: SampleSet, ctx: MeasureContext) -> Mapping[str, Any]: ...


#: A metric plugin: it fits one or more of the metric contracts (:func:`validate_plugin` checks it has one's hooks).
Metric: TypeAlias = "MetricPlugin | InstrumentingMetric | ArtifactMetric | TimedMetric"


#: Each kind's hooks: a metric plugin needs one of its hooks, the other kinds all of theirs.
_KINDS: dict[str, tuple[str, ...]] = {
    "metric": ("measure", "instrument", "artifacts", "sampler"),
    "reporter": ("write",),
    "preprocessor": ("prepare_model", "process_inputs"),
}


@overload
def validate_plugin(plugin: object, kind: Literal["metric"]) -> Metric: ...
@overload
def validate_plugin(plugin: object, kind: Literal["reporter"]) -> Reporter: ...
@overload
def validate_plugin(plugin: object, kind: Literal["preprocessor"]) -> Preprocessor: ...
@overload
def validate_plugin(plugin: object, kind: str) -> object: ...
def validate_plugin(plugin: object, kind: str) -> object:
    """Check that ``plugin`` fits the contract of ``kind``; return it.

    Raises:
        TypeError: naming the plugin and the missing or non-callable hook.
    """
    label = getattr(plugin, "name", None) or type(plugin).__name__
    if isinstance(plugin, type):
        raise TypeError(f"{kind} plugin {label!r} is a class; pass an instance ({label}())")
    if kind == "metric" and not any(callable(getattr(plugin, h, None)) for h in _KINDS[kind]):
        raise TypeError(
            f"metric plugin {label!r} has no callable measure() hook (nor instrument(), artifacts(), sampler())"
        )
    if kind == "metric" and callable(getattr(plugin, "sampler", None)):  # a TimedMetric needs all three
        for hook in ("budget_s", "values"):
            if not callable(getattr(plugin, hook, None)):
                raise TypeError(f"timing plugin {label!r} has sampler() but no callable {hook}() hook")
    for hook in _KINDS[kind] if kind != "metric" else ():  # a metric plugin needs one of its hooks
        fn = getattr(plugin, hook, None)
        if fn is None or not callable(fn):
            raise TypeError(f"{kind} plugin {label!r} has no callable {hook}() hook")
    if not isinstance(getattr(plugin, "name", None), str):
        raise TypeError(f"{kind} plugin {label!r} needs a string attribute 'name'")
    return plugin


def _kind_of(plugin: object) -> str | None:
    if any(callable(getattr(plugin, h, None)) for h in _KINDS["metric"]):
        return "metric"
    if callable(getattr(plugin, "write", None)):
        return "reporter"
    if callable(getattr(plugin, "process_inputs", None)) or callable(getattr(plugin, "prepare_model", None)):
        return "preprocessor"
    return None


_LOADED: dict[str, list[Any]] | None = None
_REGISTERED_METRICS: dict[str, Metric] = {}


def register_metric(plugin: object) -> None:
    """Have every profile of this process use the metric plugin ``plugin``.

    For integrations (the torchrec one registers its sharded-embedding metric on
    import): a registered plugin runs after the built-in ones and before those
    of ``metrics=`` and the entry points, in the order registered, as a user
    plugin (a raising one lands in ``details["metric_errors"]``). Registering a
    plugin under a ``name`` taken replaces the one registered before.

    Raises:
        TypeError: ``plugin`` fits no metric contract (:func:`validate_plugin`).
    """
    plugin = validate_plugin(plugin, "metric")
    _REGISTERED_METRICS.pop(plugin.name, None)
    _REGISTERED_METRICS[plugin.name] = plugin


def registered_metrics() -> list[Metric]:
    """The plugins :func:`register_metric` registered, in order."""
    return list(_REGISTERED_METRICS.values())


def load_entry_point_plugins(
    _entry_points: Callable[[], Iterable[EntryPoint]] | None = None,
) -> dict[str, list[Any]]:
    """Plugins registered under ``cb_callback.plugins``, by kind (cached).

    A plugin that fails to load or fits no contract is skipped with one warning
    naming the entry point.
    """
    global _LOADED
    if _LOADED is not None and _entry_points is None:
        return _LOADED
    found: dict[str, list[Any]] = {"metric": [], "reporter": [], "preprocessor": []}
    eps = _entry_points() if _entry_points is not None else entry_points(group=ENTRY_POINT_GROUP)
    for ep in eps:
        try:
            obj = ep.load()
            plugin = obj() if isinstance(obj, type) else obj
            kind = _kind_of(plugin)
            if kind is None:
                raise TypeError("it has none of measure(), instrument(), artifacts(), write(), process_inputs()")
            found[kind].append(validate_plugin(plugin, kind))
        except Exception as e:
            warnings.warn(
                f"cb_callback: skipping plugin entry point {ep.name!r} ({ep.value}): {e}",
                RuntimeWarning,
                stacklevel=2,
            )
    if _entry_points is None:
        _LOADED = found
    return found
