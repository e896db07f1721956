"""Communication of the isolated forward and backward: each collective, its payload."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from cb_callback._engine.distributed.comm import CollectiveCall, CommCounter, comm_table
from cb_callback._engine.replay.isolate import PassContext, Phase
from cb_callback._engine.run.plugins import MeasureContext
from cb_callback._metrics._observing import ObservingMetric

__all__ = ["CommMetric"]


class _CommInstrument:
    def __init__(self) -> None:
        self.counter = CommCounter(wait=False)
        self.calls: list[CollectiveCall] = []

    @contextlib.contextmanager
    def observe(self, ctx: PassContext) -> Iterator[None]:
        if ctx.phase is Phase.PASS:
            yield
            return
        self.counter.phase = ctx.phase.value
        with self.counter:
            yield
        self.calls = list(self.counter.calls)

    def values(self) -> Mapping[str, Any]:
        if not self.calls:  # no collective: no payload, and no time spent in one
            return {"comm_bytes": 0.0, "comm_ms": 0.0}
        return {"comm_bytes": float(sum(c.bytes for c in self.calls)), "comm": comm_table(self.calls)}


class CommMetric(ObservingMetric):
    """``comm_bytes``: the payload of the collectives a component runs per call, forward and backward.

    Fills ``comm_bytes`` and, when there are any, ``details["comm"]``: a row per
    collective op and phase with ``count``, ``bytes`` and ``ms`` (the time is
    filled for components replayed in lockstep across ranks, from passes of
    their own: :mod:`cb_callback._engine.distributed.lockstep`). The payload is as
    nccl-tests counts it (:mod:`cb_callback._engine.distributed.comm`): all-gather the full
    gathered tensor, reduce-scatter the full tensor, all-reduce and broadcast the
    tensor, all-to-all what this rank sends.

    Notes:
        Only the collectives the component itself issues are seen: in a real step
        DDP's gradient all-reduce runs in the wrapper's hooks, outside any
        submodule, and is no component's.
    """

    name = "comm"

    def instrument(self, ctx: MeasureContext) -> _CommInstrument:
        """An observer of the engine's shared instrumented pass."""
        return _CommInstrument()

    def from_census(self, counted: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """Without a process group nothing communicates: no payload. With one, it observes the replay."""
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return None
        return {"comm_bytes": 0.0, "comm_ms": 0.0}
