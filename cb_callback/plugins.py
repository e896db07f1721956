"""The plugin surface: the contracts a plugin implements and the registries it registers in.

What a user of the callback, ``profile_components``, the ``Report`` and the
``cb`` command needs is in :mod:`cb_callback`; what a plugin author needs is
here (reporters: :mod:`cb_callback.reporters`). docs/plugins.md is the guide::

    from cb_callback.plugins import InstrumentingMetric, register_metric

- **Metric plugins** (one replay's measurement): :class:`MetricPlugin`,
  :class:`InstrumentingMetric` (observes the one shared pass through an
  :class:`Instrument`), :class:`TimedMetric` (times the runs: replaces the
  built-in :class:`LatencyMetric`), :class:`ArtifactMetric` (a pass of its own,
  writing a file); their contexts :class:`MeasureContext`, :class:`PassContext`,
  :class:`PassResult`, :class:`Phase`, the replay :class:`Replay` and its
  :class:`ReplayInputs`, the samples :class:`Sample` / :class:`SampleSet`;
  ``load_plugins=True`` loads ``cb_callback.metrics`` entry points
  (:func:`register_metric`). The built-ins, written against the same
  contracts: :class:`LatencyMetric`, :class:`FlopsMetric`,
  :class:`TrafficMetric`, :class:`MemoryMetric`.
- **Preprocessors** (the captured inputs before replay): :class:`Preprocessor`,
  :class:`PrepareContext`, the built-in :class:`ReplicateBatch`, the inputs'
  :class:`ComponentInputs`, :func:`replicate_batch`, :func:`slice_batch`.
- **Registries** for types and ops the engine does not know:
  :func:`register_flop_rule`, :func:`register_traffic_rule`,
  :func:`register_batch_rule`, :func:`register_grad_targets`,
  :func:`register_output_resolver`, :func:`register_state_saver` (with
  :class:`StateGuard`), :func:`register_module_unwrapper`,
  :func:`register_lockstep_module`; helpers :func:`storage_key`,
  :func:`collective_bytes`, :func:`unobserved`.

Until the next release, each of these names is also importable from
:mod:`cb_callback` itself, with a ``DeprecationWarning`` that names its home here.
"""

from __future__ import annotations

from cb_callback._engine.capture.inputs import ComponentInputs, register_batch_rule, replicate_batch, slice_batch
from cb_callback._engine.capture.storage import storage_key
from cb_callback._engine.capture.tree import register_module_unwrapper
from cb_callback._engine.clocks.timing import Sample, SampleSet
from cb_callback._engine.counting.byte_rules import register_traffic_rule
from cb_callback._engine.counting.flop_rules import register_flop_rule
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
from cb_callback._metrics.flops import FlopsMetric
from cb_callback._metrics.latency import LatencyMetric
from cb_callback._metrics.memory import MemoryMetric
from cb_callback._metrics.traffic import TrafficMetric

__all__ = [
    "ArtifactMetric",
    "ComponentInputs",
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
    "Sample",
    "SampleSet",
    "StateGuard",
    "TimedMetric",
    "TrafficMetric",
    "collective_bytes",
    "register_batch_rule",
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
