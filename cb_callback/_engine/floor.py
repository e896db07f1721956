"""The replay harness's fixed cost per run: an identity component on a component's inputs, timed alike."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from cb_callback._engine.timing import Sample, record_timed, timed_seconds

__all__ = ["Floor", "FloorModule", "measure_floor", "subtract_floor"]

_NAN = float("nan")

#: Timed runs of the identity (after :data:`_WARMUP`); the floor is their median.
RUNS = 11
_WARMUP = 3


class FloorModule(nn.Module):
    """The identity a floor is timed on: returns the inputs that carry a graph, and a view of one
    parameter (so there is always a backward, as a component with parameters has)."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.p = nn.Parameter(torch.zeros((), device=device))

    def forward(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        # The top-level arguments only: walking nested containers would cost more than most modules'
        # own Python (a nested input's clone backward is then not in the floor: it errs low).
        out = [self.p.view_as(self.p)]
        for t in (*args, *kwargs.values()):
            if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                out.append(t)
        return tuple(out)


@dataclass
class Floor:
    """The harness's cost of one run, ms: ``fwd_ms`` around the forward, ``bwd_ms`` around the backward.

    ``spent_s`` is what measuring it took (wall), ``timed_s`` the part inside timed regions.
    """

    fwd_ms: float
    bwd_ms: float
    spent_s: float = 0.0
    timed_s: float = 0.0


def measure_floor(sampler: Callable[[], Sample]) -> Floor:
    """Median of :data:`RUNS` runs of ``sampler`` (an identity replay's) after a short warm-up."""
    wall0, timed0 = time.perf_counter(), timed_seconds()
    for _ in range(_WARMUP):
        sampler()
    runs = [sampler() for _ in range(RUNS)]
    fwd = statistics.median(s.fwd_ms for s in runs)
    bwds = [s.bwd_ms for s in runs if math.isfinite(s.bwd_ms)]
    bwd = statistics.median(bwds) if bwds else _NAN
    spent, timed = time.perf_counter() - wall0, timed_seconds() - timed0
    record_timed(-timed)  # the harness's own runs are not the components' timed work
    return Floor(fwd, bwd, spent, timed)


def subtract_floor(values: dict[str, Any], floor: Floor, has_backward: bool) -> None:
    """Take the floor off a timing plugin's values (``fwd_ms``, ``bwd_ms``, ``cpu_ms``, ``device_ms``),
    each clamped at 0, and record it with the raw times in ``values["floor_ms"]``."""
    fwd = floor.fwd_ms
    bwd = floor.bwd_ms if has_backward and math.isfinite(floor.bwd_ms) else 0.0
    raw_fwd, raw_bwd = values.get("fwd_ms", _NAN), values.get("bwd_ms", _NAN)
    values["floor_ms"] = {"fwd": fwd, "bwd": bwd, "raw_fwd_ms": raw_fwd, "raw_bwd_ms": raw_bwd}
    if math.isfinite(raw_fwd):
        values["fwd_ms"] = max(raw_fwd - fwd, 0.0)
    if math.isfinite(raw_bwd) and bwd:
        values["bwd_ms"] = max(raw_bwd - bwd, 0.0)
    for key in ("cpu_ms", "device_ms"):
        if math.isfinite(values.get(key, _NAN)):
            values[key] = max(values[key] - fwd - bwd, 0.0)
