"""Base of the metric plugins that observe the engine's one instrumented pass."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cb_callback._engine.replay.isolate import Instrument, instrumented_pass
from cb_callback._engine.run.plugins import MeasureContext

__all__ = ["ObservingMetric"]


class ObservingMetric:
    """An :class:`cb_callback.plugins.InstrumentingMetric` that can also measure on its own.

    Subclasses implement ``instrument(ctx)``. Inside the engine all such plugins
    share one instrumented pass per component; ``measure`` (for use on its own,
    the :class:`cb_callback.plugins.MetricPlugin` contract) runs a pass just for it.
    """

    name = "observing"

    def instrument(self, ctx: MeasureContext) -> Instrument:
        """The observer of one pass; see :class:`cb_callback.plugins.Instrument`."""
        raise NotImplementedError

    def from_census(self, counted: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """This metric's values of a component from the step's census
        (:attr:`cb_callback._engine.counting.census.Census.values`:
        the component's work counted inside the step, as its own pass would count it), or ``None``: it
        observes the component's replay. The engine then leaves this metric out of the replay's pass."""
        return None

    def measure(self, ctx: MeasureContext) -> Mapping[str, Any]:
        """Run an instrumented pass of its own and return what it observed."""
        ins = self.instrument(ctx)
        instrumented_pass(ctx.replay, [ins], ctx.config.backward, path=ctx.path)
        return ins.values()
