"""cb_callback: per-component benchmarks of PyTorch models (the Component Benchmark method).

Public surface::

    from cb_callback import profile_components, Report, BenchmarkConfig
    report = profile_components(model, args=(x,))
    print(report.summary())

``ComponentBenchmark`` (the Lightning callback) is imported lazily, so that the
engine works without importing Lightning; so is :mod:`cb_callback.reporters`
(the built-in reporters and renderers, which import matplotlib). It is public
(``from cb_callback import ComponentBenchmark``) but not in ``__all__``, so that
``from cb_callback import *`` stays as light as ``import cb_callback``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cb_callback._api import profile_components  # the engine's, writing files where output_dir says
from cb_callback._engine.capture.capture import Capture
from cb_callback._engine.capture.inputs import (
    ComponentInputs,
    register_batch_rule,
    replicate_batch,
    slice_batch,
)
from cb_callback._engine.capture.storage import storage_key
from cb_callback._engine.capture.tree import register_module_unwrapper
from cb_callback._engine.clocks.timing import Sample, SampleSet
from cb_callback._engine.distributed.collectives import register_lockstep_module
from cb_callback._engine.distributed.comm import collective_bytes
from cb_callback._engine.replay.isolate import (
    Instrument,
    PassContext,
    PassResult,
    Phase,
    Replay,
    ReplayInputs,
    register_grad_targets,
    register_output_resolver,
    unobserved,
)
from cb_callback._engine.replay.preprocessors import ReplicateBatch
from cb_callback._engine.replay.state import StateGuard, register_state_saver
from cb_callback._engine.run.config import BenchmarkConfig
from cb_callback._engine.run.plugins import (
    ArtifactMetric,
    InstrumentingMetric,
    MeasureContext,
    MetricPlugin,
    PrepareContext,
    Preprocessor,
    TimedMetric,
    register_metric,
)
from cb_callback._engine.run.profile import profile_captured
from cb_callback._hardware.registry import register_device_peaks
from cb_callback._metrics.flops import FlopsMetric, register_flop_rule
from cb_callback._metrics.latency import LatencyMetric
from cb_callback._metrics.memory import MemoryMetric
from cb_callback._metrics.traffic import TrafficMetric, register_traffic_rule
from cb_callback._report.context import ReportContext, Reporter
from cb_callback._report.model import COLUMNS, STATUSES, ComponentRow, Report
from cb_callback._whatif.compare import Comparison, compare_components

if TYPE_CHECKING:
    from cb_callback._lightning.callback import ComponentBenchmark as ComponentBenchmark

__version__ = "0.1.0"

__all__ = [
    "COLUMNS",
    "STATUSES",
    "ArtifactMetric",
    "BenchmarkConfig",
    "Capture",
    "Comparison",
    "ComponentInputs",
    "ComponentRow",
    "FlopsMetric",
    "Instrument",
    "InstrumentingMetric",
    "LatencyMetric",
    "MeasureContext",
    "MemoryMetric",
    "MetricPlugin",
    "PassContext",
    "PassResult",
    "Phase",
    "PrepareContext",
    "Preprocessor",
    "Replay",
    "ReplayInputs",
    "ReplicateBatch",
    "Report",
    "ReportContext",
    "Reporter",
    "Sample",
    "SampleSet",
    "StateGuard",
    "TimedMetric",
    "TrafficMetric",
    "collective_bytes",
    "compare_components",
    "profile_captured",
    "profile_components",
    "register_batch_rule",
    "register_device_peaks",
    "register_flop_rule",
    "register_grad_targets",
    "register_lockstep_module",
    "register_metric",
    "register_module_unwrapper",
    "register_output_resolver",
    "register_state_saver",
    "register_traffic_rule",
    "replicate_batch",
    "slice_batch",
    "storage_key",
    "unobserved",
]


def __getattr__(name: str) -> Any:
    if name == "ComponentBenchmark":
        from cb_callback._lightning.callback import ComponentBenchmark

        return ComponentBenchmark
    if name == "reporters":
        import importlib

        return importlib.import_module("cb_callback.reporters")
    raise AttributeError(f"module 'cb_callback' has no attribute {name!r}")
