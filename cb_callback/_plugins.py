"""Plugin contracts: preprocessors, metric plugins and reporters.

Each kind is a small typed contract whose methods take one context object, so
the context can grow without breaking old plugins. The built-in metrics,
preprocessors and reporters are written against exactly these contracts.

Third parties register plugins through the entry-point group
``cb_callback.plugins``: each entry point names a plugin class (instantiated
without arguments) or instance; its kind is read from the methods it has.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from torch import nn

if TYPE_CHECKING:
    from cb_callback._config import BenchmarkConfig
    from cb_callback._inputs import ComponentInputs
    from cb_callback._isolate import Replay
    from cb_callback._report import Report

__all__ = [
    "ENTRY_POINT_GROUP",
    "MeasureContext",
    "MetricPlugin",
    "PrepareContext",
    "Preprocessor",
    "ReportContext",
    "Reporter",
    "load_entry_point_plugins",
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

    Subclass and override either method; the defaults change nothing.
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
        artifact_dir: a directory for files this plugin writes, or ``None``.
    """

    path: str
    module: nn.Module
    replay: Replay
    config: BenchmarkConfig
    device: torch.device
    values: Mapping[str, Any] = field(default_factory=dict)
    artifact_dir: Path | None = None


@runtime_checkable
class MetricPlugin(Protocol):
    """Measures one component.

    ``measure`` runs once per component that could be captured, after the
    replay's probe run succeeded and before any parent is estimated. It returns a
    mapping: keys that are report columns (``fwd_ms``, ``bytes`` …) fill them;
    any other key goes to the row's ``details``. Raising marks the measurement
    failed for this component (a built-in plugin: the component becomes
    ``failed``/``estimated``; a user plugin: the error lands in
    ``details["metric_errors"]``).
    """

    name: str

    def measure(self, ctx: MeasureContext) -> Mapping[str, Any]: ...


@dataclass
class ReportContext:
    """What a reporter sees.

    Attributes:
        output_dir: where files go, or ``None`` when nothing should be written.
        step: the training step the report belongs to (0 outside training).
        writer: a TensorBoard ``SummaryWriter``-like object, when one is known.
    """

    output_dir: Path | None = None
    step: int = 0
    writer: Any = None


@runtime_checkable
class Reporter(Protocol):
    """Writes a finished :class:`Report` somewhere.

    ``write`` runs once per report, after every component is measured and
    estimated. It reads the report only; it must not assume the model exists.
    Returns the files it wrote (may be empty).
    """

    name: str

    def write(self, report: Report, ctx: ReportContext) -> list[Path]: ...


_KINDS: dict[str, tuple[str, ...]] = {
    "metric": ("measure",),
    "reporter": ("write",),
    "preprocessor": ("prepare_model", "process_inputs"),
}


def validate_plugin(plugin: Any, kind: str) -> Any:
    """Check that ``plugin`` fits the contract of ``kind``; return it.

    Raises:
        TypeError: naming the plugin and the missing or non-callable hook.
    """
    label = getattr(plugin, "name", None) or type(plugin).__name__
    if isinstance(plugin, type):
        raise TypeError(f"{kind} plugin {label!r} is a class; pass an instance ({label}())")
    for hook in _KINDS[kind]:
        fn = getattr(plugin, hook, None)
        if fn is None or not callable(fn):
            raise TypeError(f"{kind} plugin {label!r} has no callable {hook}() hook")
    if not isinstance(getattr(plugin, "name", None), str):
        raise TypeError(f"{kind} plugin {label!r} needs a string attribute 'name'")
    return plugin


def _kind_of(plugin: Any) -> str | None:
    if callable(getattr(plugin, "measure", None)):
        return "metric"
    if callable(getattr(plugin, "write", None)):
        return "reporter"
    if callable(getattr(plugin, "process_inputs", None)) or callable(getattr(plugin, "prepare_model", None)):
        return "preprocessor"
    return None


_LOADED: dict[str, list[Any]] | None = None


def load_entry_point_plugins(
    _entry_points: Callable[[], Iterable[Any]] | None = None,
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
                raise TypeError("it has none of measure(), write(), process_inputs()")
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
