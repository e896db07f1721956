"""What the layers above the engine install into it: the built-in metrics, the artifact plugins, the compile what-if.

The engine may not import the metric plugins (``cb_callback._metrics``, written
against its contracts) or the what-ifs (``cb_callback._whatif``, which drive
it): the arrows run one way, up to down. It names what it calls as fields of
:data:`EXTENSIONS`; :mod:`cb_callback._api`, which the package's ``__init__``
imports, sets them. Any import of a module of the package runs that
``__init__`` first, so they are set whenever the engine runs; one left unset
raises a :class:`RuntimeError` that names it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, overload

if TYPE_CHECKING:
    from cb_callback._engine.clocks.timing import Sample
    from cb_callback._engine.replay.isolate import Replay
    from cb_callback._engine.run.plugins import ArtifactMetric
    from cb_callback._report.model import ComponentRow

__all__ = ["EXTENSIONS", "Extensions", "WhatIfInput"]


@dataclass
class WhatIfInput:
    """One batch of a component for the compile what-if (:attr:`Extensions.compile_what_if`).

    Attributes:
        replay: the component's eager replay on that batch (inputs, flags, backward targets).
        eager: the sampler of its eager runs.
        budget_s: timed seconds to aim for per set (the eager timing's).
        batch: the batch's index (for ``details["batches"]``).
    """

    replay: Replay
    eager: Callable[[], Sample]
    budget_s: float
    batch: int = 0


#: ``compile_what_if(items, sampler, *, config, canary, report_batch) -> (compiled_ms, details)``.
CompileWhatIf = Callable[..., "tuple[float, dict[str, Any]]"]


@dataclass
class Extensions:
    """The engine's calls into the layers above it; ``None`` until :mod:`cb_callback._api` sets them.

    Attributes:
        builtin_metrics: a fresh list of the built-in metric plugins, in the order they run;
            exactly one of them is a ``TimedMetric`` (the latency metric).
        artifact_plugins: the built-in artifact plugins for ``BenchmarkConfig.artifacts``' kinds.
        compile_what_if: one component compiled alone and timed against its eager runs.
        compile_speedup: a row's ``total_ms / compiled_ms`` (NaN unless both are known).
        fill_children_separately: every compiled parent's children-compiled-separately figure.
    """

    builtin_metrics: Callable[[], Sequence[object]] | None = None
    artifact_plugins: Callable[[Sequence[str]], Sequence[ArtifactMetric]] | None = None
    compile_what_if: CompileWhatIf | None = None
    compile_speedup: Callable[[ComponentRow], float] | None = None
    fill_children_separately: Callable[[Mapping[str, ComponentRow], Mapping[str, Sequence[str]]], None] | None = None

    @overload
    def get(self, name: Literal["builtin_metrics"]) -> Callable[[], Sequence[object]]: ...
    @overload
    def get(self, name: Literal["artifact_plugins"]) -> Callable[[Sequence[str]], Sequence[ArtifactMetric]]: ...
    @overload
    def get(self, name: Literal["compile_what_if"]) -> CompileWhatIf: ...
    @overload
    def get(self, name: Literal["compile_speedup"]) -> Callable[[ComponentRow], float]: ...
    @overload
    def get(
        self, name: Literal["fill_children_separately"]
    ) -> Callable[[Mapping[str, ComponentRow], Mapping[str, Sequence[str]]], None]: ...
    def get(self, name: str) -> object:
        """The extension ``name``, or a ``RuntimeError`` when nothing has set it."""
        value = getattr(self, name)
        if value is None:
            raise RuntimeError(
                f"cb_callback: the engine's extension {name!r} is not set; import cb_callback (its __init__ sets it)"
            )
        return value


#: The engine's extensions (set by :mod:`cb_callback._api`).
EXTENSIONS = Extensions()
