"""CPU peaks by measurement: a short GEMM and a large copy, cached per process.

CPUs have no datasheet figure that PyTorch reaches, so their FLOP/s and bandwidth
peaks are what this process measures here: the best ``torch.mm`` and the best
``copy_`` of a few timed calls. A calibration that disagreed with itself (a busy
machine) is measured again on the next profile, keeping the best.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from functools import partial

import torch

__all__ = [
    "CALIBRATION_SPREAD_LIMIT",
    "COPY_BYTES",
    "CPU_GEMM_DTYPES",
    "calibration_spread",
    "measure_cpu_bandwidth",
    "measure_cpu_flops",
    "recalibrate_cpu_flops",
]

#: The GEMM each peak key is calibrated with on CPU (``fp8`` has none: unknown).
CPU_GEMM_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "tf32": torch.float32,  # CPUs have no TF32; fp32 GEMM is what runs
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    # Measured like the others: one more ~0.3 s calibration, once per process, and
    # only for a float64 model; fp64 GEMMs run at about half the fp32 rate on CPUs,
    # so an fp32 peak would halve a float64 model's MFU.
    "fp64": torch.float64,
}

_GEMM_SIZES: tuple[int, ...] = (256, 512, 1024, 2048)
_GEMM_MIN_REPEATS = 5
_GEMM_SIZE_BUDGET_S = 0.05  # keep repeating one size until this much time was spent
_GEMM_BUDGET_S = 0.3  # do not start a size that would take the total past this
_GEMM_LONG_ENOUGH_S = 0.02  # one GEMM this long is representative; stop growing
#: The bandwidth calibration copies this many bytes (and writes as many).
COPY_BYTES = 128 * 2**20  # 128 MiB source (and as much destination)
_COPY_MIN_REPEATS = 4
_COPY_BUDGET_S = 0.1
_MAX_REPEATS = 50

_FLOPS_CACHE: dict[tuple[torch.dtype, int], float] = {}
_BANDWIDTH_CACHE: dict[int, float] = {}
#: Per ``(dtype, threads)``: how much the calibration disagreed with itself (median
#: of the winning size's timed calls ÷ its best - 1), and how often it ran.
_FLOPS_SPREAD: dict[tuple[torch.dtype, int], float] = {}
_FLOPS_RUNS: dict[tuple[torch.dtype, int], int] = {}
_LAST_SPREAD: list[float | None] = [None]
#: A calibration whose calls disagree by more than this ran on a busy machine: it is
#: measured again on the next profile (at most ``_MAX_CALIBRATIONS`` times a process).
CALIBRATION_SPREAD_LIMIT = 0.25
_MAX_CALIBRATIONS = 3


def _best_seconds(
    fn: Callable[[], object], min_repeats: int, budget_s: float
) -> tuple[float, float]:
    """Time calls of ``fn`` after one warm-up call: ``(best call, total spent)`` in seconds.

    Calls until at least ``min_repeats`` were timed and ``budget_s`` was spent (at
    most ``_MAX_REPEATS``), so a call slowed by other load is outlived by a later one.
    """
    begin = time.perf_counter()
    fn()
    best = math.inf
    times = []
    for count in range(1, _MAX_REPEATS + 1):
        start = time.perf_counter()
        fn()
        end = time.perf_counter()
        times.append(end - start)
        best = min(best, end - start)
        if count >= min_repeats and end - begin >= budget_s:
            break
    times.sort()
    _LAST_SPREAD[0] = times[len(times) // 2] / best - 1 if best > 0 else None
    return best, time.perf_counter() - begin


def measure_cpu_flops(dtype: torch.dtype) -> float:
    """Best GEMM throughput of this CPU in FLOP/s for ``dtype``, measured once per process.

    Args:
        dtype: the element type of the square ``torch.mm`` operands.

    Returns:
        The highest ``2 * n**3 / seconds`` over square sizes 256, 512, ... 2048 and
        both right-operand layouts (``b`` and ``b.t()``, nn.Linear's), each the
        fastest of several calls; the sizes stop growing once one GEMM
        takes 20 ms or the next size would take the total past about 0.3 s.

    Raises:
        RuntimeError: if ``torch.mm`` does not support ``dtype`` on CPU.

    Notes:
        The result is cached per ``(dtype, torch.get_num_threads())``: changing the
        thread count measures again. :func:`recalibrate_cpu_flops` measures again
        when the calibration disagreed with itself, keeping the best. It is what
        PyTorch's CPU GEMM reaches here, not the silicon's theoretical peak; other
        load on the machine lowers it, which the fastest-of-several only partly
        undoes.
    """
    key = (dtype, torch.get_num_threads())
    cached = _FLOPS_CACHE.get(key)
    if cached is not None:
        return cached
    return _calibrate_flops(dtype)


def _calibrate_flops(dtype: torch.dtype) -> float:
    key = (dtype, torch.get_num_threads())
    cached = _FLOPS_CACHE.get(key)
    runs = _FLOPS_RUNS.get(key, 0)
    best_rate = 0.0
    best_spread: float | None = None
    spent = 0.0
    for n in _GEMM_SIZES:
        a = torch.randn(n, n).to(dtype)
        b = torch.randn(n, n).to(dtype)
        out = torch.empty(n, n, dtype=dtype)
        best = math.inf
        size_spread: float | None = None
        # Both operand layouts: ``x @ w.t()`` is nn.Linear's, and for bf16 on some
        # CPUs the only fast one (plain bf16 ``a @ b`` ran 10x slower here).
        for rhs in (b, b.t()):
            _LAST_SPREAD[0] = None
            layout_best, size_spent = _best_seconds(
                partial(torch.mm, a, rhs, out=out), _GEMM_MIN_REPEATS, _GEMM_SIZE_BUDGET_S
            )
            if layout_best < best:
                best, size_spread = layout_best, _LAST_SPREAD[0]
            spent += size_spent
        rate = 2 * n**3 / max(best, 1e-9)
        if rate > best_rate:
            best_rate, best_spread = rate, size_spread
        # The next size does 8x the work per call: skip it if it would not fit.
        next_cost = 8 * best * (_GEMM_MIN_REPEATS + 1)
        if best >= _GEMM_LONG_ENOUGH_S or spent + next_cost > _GEMM_BUDGET_S:
            break
    # A repeated calibration keeps the best: load only ever slows a GEMM down.
    best_rate = max(best_rate, cached or 0.0)
    _FLOPS_CACHE[key] = best_rate
    _FLOPS_RUNS[key] = runs + 1
    if best_spread is not None:
        _FLOPS_SPREAD[key] = best_spread
    return best_rate


def recalibrate_cpu_flops(dtype: str) -> float | None:
    """Measure the CPU GEMM peak for the peak key ``dtype`` again if its calibration was unsure.

    When :func:`calibration_spread` exceeds :data:`CALIBRATION_SPREAD_LIMIT` (the
    calibration's calls disagreed: the machine was busy), the calibration runs
    again, at most 3 times a process and thread count; the cached peak becomes
    the best of the runs (load only ever slows a GEMM down).

    Returns:
        The (possibly raised) cached peak, or ``None`` when nothing is calibrated.
    """
    gemm = CPU_GEMM_DTYPES.get(dtype)
    if gemm is None:
        return None
    key = (gemm, torch.get_num_threads())
    spread = _FLOPS_SPREAD.get(key)
    if (
        key in _FLOPS_CACHE
        and spread is not None
        and spread > CALIBRATION_SPREAD_LIMIT
        and _FLOPS_RUNS.get(key, 0) < _MAX_CALIBRATIONS
    ):
        _calibrate_flops(gemm)
    return _FLOPS_CACHE.get(key)


def calibration_spread(dtype: str) -> float | None:
    """How much the last CPU GEMM calibration for the peak key ``dtype`` disagreed with itself.

    The median ÷ the best of the timed calls of the size that set the peak,
    minus 1 (0.1: the median call was 10 % slower than the best), for the
    current thread count; ``None`` when none ran in this process. Above
    :data:`CALIBRATION_SPREAD_LIMIT` the calibration ran on a busy machine and is
    repeated on the next profile (the peak keeps the best of the runs).
    """
    gemm = CPU_GEMM_DTYPES.get(dtype)
    return None if gemm is None else _FLOPS_SPREAD.get((gemm, torch.get_num_threads()))


def measure_cpu_bandwidth() -> float:
    """Memory bandwidth of this CPU in bytes/s, from a large copy, measured once per process.

    Returns:
        ``2 * 128 MiB / seconds`` for the fastest of several ``dst.copy_(src)`` of a
        128 MiB float32 tensor (about 0.1 s in all): bytes read plus bytes written.

    Notes:
        Cached per ``torch.get_num_threads()``. A copy is what the memory-bound ops
        of a model do, so it is a fair roof for their bandwidth utilisation; a
        STREAM triad or non-temporal stores can reach somewhat more. A last-level
        cache larger than 128 MiB would inflate the figure.
    """
    key = torch.get_num_threads()
    cached = _BANDWIDTH_CACHE.get(key)
    if cached is not None:
        return cached
    src = torch.ones(COPY_BYTES // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    best, _ = _best_seconds(lambda: dst.copy_(src), _COPY_MIN_REPEATS, _COPY_BUDGET_S)
    rate = 2 * COPY_BYTES / max(best, 1e-9)
    _BANDWIDTH_CACHE[key] = rate
    return rate


def _clear_caches() -> None:
    """Forget measured peaks (for tests)."""
    _FLOPS_CACHE.clear()
    _BANDWIDTH_CACHE.clear()
    _FLOPS_SPREAD.clear()
    _FLOPS_RUNS.clear()
