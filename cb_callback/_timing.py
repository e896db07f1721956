"""Adaptive timing of one callable: warm-up, repeats within a budget, median and IQR."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Timing", "time_fn", "timed_seconds"]

_TIMED = [0.0]  # seconds spent inside timed regions in this process


def timed_seconds() -> float:
    """Total seconds spent inside timed regions so far (for harness efficiency)."""
    return _TIMED[0]


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass
class Timing:
    """Samples of one timed callable, in milliseconds.

    Attributes:
        device_ms: per run, device time (CUDA events) on CUDA, else wall time.
        host_ms: per run, host time until the call returned (on CUDA: launch
            time, without waiting for the device; on CPU equal to ``device_ms``).
        last_arg: what ``setup()`` returned for the last run (with ``keep_last``).
        last_out: what the last run returned (with ``keep_last``).
    """

    device_ms: list[float] = field(default_factory=list)
    host_ms: list[float] = field(default_factory=list)
    last_arg: Any = field(default=None, repr=False)
    last_out: Any = field(default=None, repr=False)

    @property
    def median(self) -> float:
        """Median device time, ms (NaN without samples)."""
        return statistics.median(self.device_ms) if self.device_ms else float("nan")

    @property
    def host_median(self) -> float:
        """Median host time, ms."""
        return statistics.median(self.host_ms) if self.host_ms else float("nan")

    @property
    def iqr(self) -> float:
        """Inter-quartile range of device time, ms."""
        s = sorted(self.device_ms)
        return _quantile(s, 0.75) - _quantile(s, 0.25)

    @property
    def repeats(self) -> int:
        """Number of timed runs."""
        return len(self.device_ms)


def time_fn(
    fn: Callable[[Any], Any],
    *,
    setup: Callable[[], Any] | None = None,
    device: torch.device,
    warmup: int = 2,
    min_run_time_s: float = 0.1,
    min_repeats: int = 3,
    max_repeats: int = 1000,
    clock: Callable[[], float] = time.perf_counter,
    keep_last: bool = False,
) -> Timing:
    """Time ``fn(setup())`` repeatedly; ``setup`` runs untimed before each run.

    Repeats continue until ``min_run_time_s`` of wall time has passed and at
    least ``min_repeats`` runs were timed, or ``max_repeats`` is reached. On CUDA
    the device is synchronised before each run, and each run is bracketed by CUDA
    events; the thread count is left as the caller set it. With ``keep_last`` the
    last run's argument and result are kept (e.g. a forward's graph, to time its
    backward without another forward).

    Notes:
        Each run is timed on its own (not a loop of runs divided by its count),
        so fresh inputs can be made outside the timed region. Clock resolution
        (~0.1 µs) limits sub-10 µs components.
    """
    cuda = device.type == "cuda"
    prepare = setup if setup is not None else (lambda: None)
    for _ in range(warmup):
        fn(prepare())
    if cuda:
        torch.cuda.synchronize(device)
    out = Timing()
    start_wall = clock()
    while True:
        out.last_arg = out.last_out = None  # free the previous run's result before the next run
        arg = prepare()
        if cuda:
            torch.cuda.synchronize(device)
            ev0 = torch.cuda.Event(enable_timing=True)
            ev1 = torch.cuda.Event(enable_timing=True)
            t0 = clock()
            ev0.record()
            result = fn(arg)
            ev1.record()
            t1 = clock()
            ev1.synchronize()
            t2 = clock()
            out.device_ms.append(ev0.elapsed_time(ev1))
            out.host_ms.append((t1 - t0) * 1e3)
            _TIMED[0] += t2 - t0
        else:
            t0 = clock()
            result = fn(arg)
            t1 = clock()
            out.device_ms.append((t1 - t0) * 1e3)
            out.host_ms.append((t1 - t0) * 1e3)
            _TIMED[0] += t1 - t0
        n = len(out.device_ms)
        if keep_last:
            out.last_arg, out.last_out = arg, result
        del result
        if n >= max_repeats or (n >= min_repeats and clock() - start_wall >= min_run_time_s):
            break
    return out
