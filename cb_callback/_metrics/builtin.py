"""The built-in metric plugins, in the order they run."""

from __future__ import annotations

from cb_callback._metrics.comm import CommMetric
from cb_callback._metrics.flops import FlopsMetric
from cb_callback._metrics.latency import LatencyMetric
from cb_callback._metrics.memory import MemoryMetric
from cb_callback._metrics.traffic import TrafficMetric

__all__ = ["builtin_metrics"]


def builtin_metrics() -> list[object]:
    """The built-in plugins, in the order they run."""
    return [LatencyMetric(), FlopsMetric(), TrafficMetric(), MemoryMetric(), CommMetric()]
