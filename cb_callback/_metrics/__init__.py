"""Built-in metric plugins, written against :class:`cb_callback.MetricPlugin`."""

from cb_callback._metrics.flops import FlopsMetric, register_flop_rule
from cb_callback._metrics.latency import LatencyMetric
from cb_callback._metrics.memory import MemoryMetric
from cb_callback._metrics.traffic import TrafficMetric, register_traffic_rule

__all__ = [
    "FlopsMetric",
    "LatencyMetric",
    "MemoryMetric",
    "TrafficMetric",
    "register_flop_rule",
    "register_traffic_rule",
]


def builtin_metrics() -> list[object]:
    """The built-in plugins, in the order they run."""
    return [LatencyMetric(), FlopsMetric(), TrafficMetric(), MemoryMetric()]
