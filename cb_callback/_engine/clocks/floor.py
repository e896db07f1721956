"""The replay harness's fixed cost per run: an identity on a component's inputs, timed alike.

The floor is the cheapest replay there is: :class:`FloorModule` returns its
inputs as they are, so its forward is the harness's own Python (the module call,
the grad mode, the forward context) and nothing else. Its backward is there only
where the inputs carry a graph: ``torch.autograd.grad`` from the identity's
outputs (the fresh inputs' clones) to their leaves, the cheapest backward on the
same inputs — the engine start, the output gradients' walk, the clone nodes every
component's backward also runs through. Where no input carries a graph the
identity has no backward, and nothing comparable exists to time: the backward
floor is then 0 (a component's backward w.r.t. its parameters keeps the
engine's start-up; it errs high, never below the truth).

A pass whose raw median is within the noise of the subtraction above the floor
is *at the floor*: isolation cannot tell it from a replay that does nothing. That
noise is the identity's IQR plus the pass's own (two medians of one thing timed a
moment apart differ by about their spreads: an ``nn.Identity`` read 0.6 µs above
a floor whose IQR was 0.4 µs, its own 1 µs). :func:`subtract_floor` records it in
``values["floor_ms"]["at_floor"]``; the row is flagged ``at_floor`` and no rate
is derived from its time (:func:`is_at_floor`).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from cb_callback._engine.clocks.timing import Sample, record_timed, timed_seconds
from cb_callback._report.finite import or_zero
from cb_callback._types import UserValue

__all__ = ["Floor", "FloorModule", "is_at_floor", "measure_floor", "subtract_floor"]

_NAN = float("nan")

#: Timed runs of the identity (after :data:`_WARMUP`); the floor is their median.
RUNS = 11
_WARMUP = 3


class FloorModule(nn.Module):
    """The identity a floor is timed on: returns its arguments as they are (no op, no parameter).

    The positional arguments, or ``(args, kwargs)`` with keyword arguments: every input
    tensor that carries a graph is an output, so the backward (where there is one) is the
    cheapest on these inputs.
    """

    def forward(
        self, *args: UserValue, **kwargs: UserValue
    ) -> tuple[UserValue, ...] | tuple[tuple[UserValue, ...], dict[str, UserValue]]:
        return (args, kwargs) if kwargs else args


@dataclass
class Floor:
    """The harness's cost of one run, ms: ``fwd_ms`` around the forward, ``bwd_ms`` around the backward
    (0 where the identity has no backward: no input carries a graph).

    ``fwd_iqr_ms`` and ``bwd_iqr_ms`` are the spread (IQR) of the identity's runs: its noise.
    ``spent_s`` is what measuring it took (wall), ``timed_s`` the part inside timed regions.
    """

    fwd_ms: float
    bwd_ms: float
    spent_s: float = 0.0
    timed_s: float = 0.0
    fwd_iqr_ms: float = 0.0
    bwd_iqr_ms: float = 0.0


def _iqr(values: list[float]) -> float:
    """Inter-quartile range (inclusive quartiles); 0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q3 - q1


def measure_floor(sampler: Callable[[], Sample]) -> Floor:
    """Median and IQR of :data:`RUNS` runs of ``sampler`` (an identity replay's) after a short warm-up."""
    wall0, timed0 = time.perf_counter(), timed_seconds()
    for _ in range(_WARMUP):
        sampler()
    runs = [sampler() for _ in range(RUNS)]
    fwds = [s.fwd_ms for s in runs]
    bwds = [s.bwd_ms for s in runs if math.isfinite(s.bwd_ms)]
    bwd = statistics.median(bwds) if bwds else _NAN
    spent, timed = time.perf_counter() - wall0, timed_seconds() - timed0
    record_timed(-timed)  # the harness's own runs are not the components' timed work
    return Floor(statistics.median(fwds), bwd, spent, timed, _iqr(fwds), _iqr(bwds))


def subtract_floor(values: dict[str, Any], floor: Floor, has_backward: bool) -> None:
    """Take the floor off a timing plugin's values (``fwd_ms``, ``bwd_ms``, ``cpu_ms``, ``device_ms``).

    Each pass's time becomes ``max(raw - floor, 0)``. ``values["floor_ms"]`` records ``fwd``/``bwd``
    (the floor subtracted from each pass: the backward's only where both the component and the
    identity have one), the raw medians ``raw_fwd_ms``/``raw_bwd_ms``, the floor's noise
    ``fwd_iqr_ms``/``bwd_iqr_ms``, and ``at_floor``: the passes whose raw median is no more than the
    noise above the floor (``raw - floor <= floor IQR + the pass's own IQR``, ``values["fwd_iqr_ms"]``
    / ``["bwd_iqr_ms"]``: indistinguishable from a replay that does nothing; ``[]`` when none is).
    """
    fwd = floor.fwd_ms
    bwd = floor.bwd_ms if has_backward and math.isfinite(floor.bwd_ms) else 0.0
    raw_fwd, raw_bwd = values.get("fwd_ms", _NAN), values.get("bwd_ms", _NAN)
    at: list[str] = []
    if math.isfinite(raw_fwd):
        values["fwd_ms"] = max(raw_fwd - fwd, 0.0)
        if raw_fwd - fwd <= floor.fwd_iqr_ms + or_zero(values.get("fwd_iqr_ms")):
            at.append("fwd")
    if math.isfinite(raw_bwd) and bwd:
        values["bwd_ms"] = max(raw_bwd - bwd, 0.0)
        if raw_bwd - bwd <= floor.bwd_iqr_ms + or_zero(values.get("bwd_iqr_ms")):
            at.append("bwd")
    values["floor_ms"] = {
        "fwd": fwd, "bwd": bwd, "raw_fwd_ms": raw_fwd, "raw_bwd_ms": raw_bwd,
        "fwd_iqr_ms": floor.fwd_iqr_ms, "bwd_iqr_ms": floor.bwd_iqr_ms if bwd else 0.0, "at_floor": at,
    }  # fmt: skip
    for key in ("cpu_ms", "device_ms"):
        if math.isfinite(values.get(key, _NAN)):
            values[key] = max(values[key] - fwd - bwd, 0.0)


def is_at_floor(details: Mapping[str, Any]) -> bool:
    """Whether a row's ``details`` say a pass of it is at the harness floor (:func:`subtract_floor`)
    or, for an estimate, that every child it was summed from is (``details["floor_ms"]["at_floor"]``)."""
    floor = details.get("floor_ms")
    return isinstance(floor, Mapping) and bool(floor.get("at_floor"))
