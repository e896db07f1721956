"""cb_callback: per-component benchmarks of PyTorch models (the Component Benchmark method).

Public surface::

    from cb_callback import profile_components, Report, BenchmarkConfig
    report = profile_components(model, args=(x,))
    print(report.summary())

What a user of the Lightning callback, :func:`profile_components`, the
:class:`Report` and the ``cb`` command needs is here. Two namespaces hold the rest:

- :mod:`cb_callback.plugins`: the plugin contracts (metrics, preprocessors) and
  the registries (FLOP and byte rules, batch rules, state savers, ...);
- :mod:`cb_callback.reporters`: the reporter contract and the built-in
  reporters and renderers (they import matplotlib).

``ComponentBenchmark`` (the Lightning callback) is imported lazily, so that the
engine works without importing Lightning; so are both namespaces. It is public
(``from cb_callback import ComponentBenchmark``) but not in ``__all__``, so that
``from cb_callback import *`` stays as light as ``import cb_callback``.

The plugin names that used to be here (``cb_callback.MetricPlugin``, ...) still
resolve, for one release, with a ``DeprecationWarning`` that names their new home:
one per ``from cb_callback import ...`` of a name, one per attribute access.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import TYPE_CHECKING

from cb_callback._api import profile_components  # the engine's, writing files where output_dir says
from cb_callback._engine.capture.capture import Capture
from cb_callback._engine.run.config import BenchmarkConfig
from cb_callback._engine.run.profile import profile_captured
from cb_callback._hardware.registry import register_device_peaks
from cb_callback._report.model import COLUMNS, STATUSES, ComponentRow, Report
from cb_callback._whatif.checkpoint import CheckpointPlan, plan_checkpointing
from cb_callback._whatif.compare import Comparison, compare_components

if TYPE_CHECKING:
    from cb_callback._lightning.callback import ComponentBenchmark as ComponentBenchmark

__version__ = "0.1.0"

__all__ = [
    "COLUMNS",
    "STATUSES",
    "BenchmarkConfig",
    "Capture",
    "CheckpointPlan",
    "Comparison",
    "ComponentRow",
    "Report",
    "compare_components",
    "plan_checkpointing",
    "profile_captured",
    "profile_components",
    "register_device_peaks",
]

#: Names that moved out of the top level in 0.2 (issue 25): name -> the namespace that has them now.
#: Each still resolves here, with a DeprecationWarning, until the next release.
MOVED: dict[str, str] = {
    **dict.fromkeys(("ReportContext", "Reporter"), "cb_callback.reporters"),
    **dict.fromkeys(
        (
            "ArtifactMetric", "ComponentInputs", "FlopsMetric", "Instrument", "InstrumentingMetric", "LatencyMetric",
            "MeasureContext", "MemoryMetric", "MetricPlugin", "PassContext", "PassResult", "Phase", "PrepareContext",
            "Preprocessor", "Replay", "ReplayInputs", "ReplicateBatch", "Sample", "SampleSet", "StateGuard",
            "TimedMetric", "TrafficMetric", "collective_bytes", "register_batch_rule", "register_flop_rule",
            "register_grad_targets", "register_lockstep_module", "register_metric", "register_module_unwrapper",
            "register_output_resolver", "register_state_saver", "register_traffic_rule", "replicate_batch",
            "slice_batch", "storage_key", "unobserved",
        ),
        "cb_callback.plugins",
    ),
}  # fmt: skip


def __getattr__(name: str) -> object:
    if name == "ComponentBenchmark":
        from cb_callback._lightning.callback import ComponentBenchmark

        return ComponentBenchmark
    if name in ("plugins", "reporters"):
        return importlib.import_module(f"cb_callback.{name}")
    if name in MOVED:
        home = MOVED[name]
        if _from_import_check():
            return getattr(importlib.import_module(home), name)  # the getattr that follows warns
        warnings.warn(
            f"cb_callback.{name} has moved to {home}.{name}: import it from there "
            "(the old name goes in the next release)",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(home), name)
    raise AttributeError(f"module 'cb_callback' has no attribute {name!r}")


def _from_import_check() -> bool:
    """Whether ``__getattr__`` was called by the from-import's check whether a name is a submodule.

    ``from cb_callback import MetricPlugin`` looks the name up twice: importlib's
    ``_handle_fromlist`` (``hasattr``, a package's fromlist may name submodules), then the
    statement's own ``getattr``. Only that second one warns, so one from-import gives one
    warning under an ``"always"`` filter (pytest's), at the line that wrote it; every other
    access still warns. Without frames to look at (not CPython), both warn.
    """
    getframe = getattr(sys, "_getframe", None)
    if getframe is None:
        return False
    caller = getframe(2)  # 0: this function, 1: __getattr__, 2: who looked the name up
    code, module = caller.f_code.co_name, caller.f_globals.get("__name__")
    return bool(code == "_handle_fromlist" and module == "importlib._bootstrap")


def __dir__() -> list[str]:
    """The module's names and the lazy ones (``ComponentBenchmark``, ``plugins``, ``reporters``); not the moved ones."""
    return sorted({*globals(), "ComponentBenchmark", "plugins", "reporters"})
