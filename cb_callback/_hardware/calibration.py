"""CPU peaks by measurement: a short GEMM, a large copy, and copies that fit each cache level.

CPUs have no datasheet figure that PyTorch reaches, so their FLOP/s and bandwidth
peaks are what PyTorch reaches here: the best ``torch.mm`` and the best ``copy_``
of a few timed calls. A peak is a property of the machine, not of the moment, so
the best figure is kept across processes (:mod:`cb_callback._hardware.cache`, per CPU
model, thread count and torch version): when the machine is busy (other
processes use the CPUs, :func:`cb_callback._hardware.load.machine_busy`) and a figure is cached,
nothing is measured and the
cached best is used; when it is quiet, the calibration runs and the cache keeps
the better of the two. In a process, a calibration that disagreed with itself is
measured again on the next profile, keeping the best. :func:`calibration_notes`
says, per figure, where it came from.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import torch

from cb_callback._hardware import cache as _peak_cache
from cb_callback._hardware.load import machine_busy

__all__ = [
    "CALIBRATION_SPREAD_LIMIT",
    "COPY_BYTES",
    "CPU_GEMM_DTYPES",
    "CacheLevel",
    "calibration_notes",
    "calibration_spread",
    "cpu_cache_levels",
    "cpu_device_name",
    "measure_cpu_bandwidth",
    "measure_cpu_cache_bandwidths",
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
#: The DRAM bandwidth calibration copies at least this many bytes (and writes as many);
#: more where the last-level cache is large (4x its size, at most 1 GiB).
COPY_BYTES = 128 * 2**20
_COPY_MAX_BYTES = 2**30
_COPY_MIN_REPEATS = 4
_COPY_BUDGET_S = 0.1
_LEVEL_BUDGET_S = 0.03
_LEVEL_CALL_BYTES = 4 * 2**20  # a timed call of a cache-level copy moves about this much
_MAX_REPEATS = 50

_FLOPS_CACHE: dict[tuple[torch.dtype, int], float] = {}
_BANDWIDTH_CACHE: dict[int, float] = {}
_LEVELS_CACHE: dict[int, tuple[CacheLevel, ...]] = {}
_BUSY: dict[int, tuple[float, bool, dict[str, Any]]] = {}
#: Per figure: how it was obtained (see :func:`calibration_notes`).
_NOTES: dict[str, dict[str, Any]] = {}
#: Per ``(dtype, threads)``: how much the calibration disagreed with itself (median
#: of the winning size's timed calls ÷ its best - 1), and how often it ran.
_FLOPS_SPREAD: dict[tuple[torch.dtype, int], float] = {}
_FLOPS_RUNS: dict[tuple[torch.dtype, int], int] = {}
_LAST_SPREAD: list[float | None] = [None]
#: A calibration whose calls disagree by more than this ran on a busy machine: it is
#: measured again on the next profile (at most ``_MAX_CALIBRATIONS`` times a process).
CALIBRATION_SPREAD_LIMIT = 0.25
_MAX_CALIBRATIONS = 3


@dataclass(frozen=True)
class CacheLevel:
    """One level of the memory hierarchy and the copy bandwidth measured in it.

    Attributes:
        name: ``"L1"``, ``"L2"``, ``"L3"`` or ``"DRAM"``.
        size_bytes: the cache's size (``None`` for DRAM: no bound).
        bandwidth: bytes/s (read + write) of a copy whose source and destination
            fit the level, with the per-call overhead of a copy taken out; ``None``
            when a copy that small is all overhead here (unmeasurable).
    """

    name: str
    size_bytes: int | None
    bandwidth: float | None


@lru_cache(maxsize=1)
def cpu_device_name() -> str:
    """The CPU's model name from ``/proc/cpuinfo``, else ``platform.processor()``."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.lower().startswith("model name") and ":" in line:
                name = line.split(":", 1)[1].strip()
                if name:
                    return name
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _parse_size(text: str) -> int | None:
    """``"48K"`` / ``"1024K"`` / ``"32M"`` (sysfs cache sizes) in bytes."""
    text = text.strip().upper()
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in "KMG" else text
    return int(digits) * scale if digits.isdigit() else None


@lru_cache(maxsize=1)
def cpu_cache_levels() -> tuple[tuple[str, int], ...]:
    """``(("L1", bytes), ("L2", bytes), ("L3", bytes))`` of CPU 0's data caches (Linux sysfs).

    Instruction caches are left out; empty where sysfs does not say.
    """
    out: dict[int, int] = {}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            kind = (index / "type").read_text().strip()
            level = int((index / "level").read_text().strip())
            size = _parse_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified") and size:
            out[level] = size
    return tuple((f"L{k}", out[k]) for k in sorted(out))


def _best_seconds(fn: Callable[[], object], min_repeats: int, budget_s: float) -> tuple[float, float]:
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


def _cache_key(kind: str, threads: int) -> str:
    return f"{cpu_device_name()} | {threads} threads | torch {torch.__version__} | {kind}"


def _kept_best(kind: str, threads: int, measure: Callable[[], float | None]) -> float | None:
    """``measure()`` unless the machine is busy and a best figure is cached; the best of both.

    Records how the figure was obtained in :data:`_NOTES` under ``kind``.
    """
    key = _cache_key(kind, threads)
    cached = _peak_cache.lookup(key)
    busy, evidence = _busy(threads)
    note: dict[str, Any] = {**evidence, "machine": "busy" if busy else "quiet"}
    if cached is not None:
        note.update(cached_best=cached["value"], cached_runs=cached.get("runs"), cached_last=cached.get("last"))
    if cached is not None and busy:
        note.update(measured=None, used="cache")
        _NOTES[kind] = note
        return float(cached["value"])
    measured = measure()
    note["measured"] = measured
    if measured is None:
        note["used"] = "cache" if cached is not None else "none"
        _NOTES[kind] = note
        return None if cached is None else float(cached["value"])
    if not busy:  # a busy machine's figure never enters the cache (it could only be lower)
        _peak_cache.record(key, measured)
    best = max(measured, float(cached["value"]) if cached is not None else 0.0)
    note["used"] = "measured" if best == measured else "cache"
    _NOTES[kind] = note
    return best


def _busy(threads: int) -> tuple[bool, dict[str, Any]]:
    """:func:`cb_callback._hardware.load.machine_busy`, looked at once per second at most."""
    now = time.monotonic()
    seen = _BUSY.get(threads)
    if seen is None or now - seen[0] > 1.0:
        seen = (now, *machine_busy(threads))
        _BUSY[threads] = seen
    return seen[1], dict(seen[2])


def measure_cpu_flops(dtype: torch.dtype) -> float:
    """Best GEMM throughput of this CPU in FLOP/s for ``dtype``, measured once per process.

    Args:
        dtype: the element type of the square ``torch.mm`` operands.

    Returns:
        The highest ``2 * n**3 / seconds`` over square sizes 256, 512, ... 2048 and
        both right-operand layouts (``b`` and ``b.t()``, nn.Linear's), each the
        fastest of several calls; the sizes stop growing once one GEMM
        takes 20 ms or the next size would take the total past about 0.3 s.
        The best of that and the best figure kept for this machine
        (:mod:`cb_callback._hardware.cache`); on a busy machine with a kept figure,
        that figure, unmeasured.

    Raises:
        RuntimeError: if ``torch.mm`` does not support ``dtype`` on CPU.

    Notes:
        Cached per ``(dtype, torch.get_num_threads())``: changing the thread count
        measures again. :func:`recalibrate_cpu_flops` measures again when the
        calibration disagreed with itself, keeping the best. It is what PyTorch's
        CPU GEMM reaches here, not the silicon's theoretical peak.
    """
    key = (dtype, torch.get_num_threads())
    cached = _FLOPS_CACHE.get(key)
    if cached is not None:
        return cached
    kind = f"gemm {str(dtype).removeprefix('torch.')}"
    best = _kept_best(kind, key[1], lambda: _calibrate_flops(dtype))
    assert best is not None  # _calibrate_flops always returns a figure (or raises)
    _FLOPS_CACHE[key] = best
    return best


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
        again = _calibrate_flops(gemm)
        _FLOPS_CACHE[key] = max(_FLOPS_CACHE[key], again)
        if not _busy(key[1])[0]:
            _peak_cache.record(_cache_key(f"gemm {str(gemm).removeprefix('torch.')}", key[1]), again)
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


def _dram_copy_bytes() -> int:
    """The DRAM copy's source size: 128 MiB, or 4x the last-level cache when that is larger."""
    levels = cpu_cache_levels()
    largest = max((size for _, size in levels), default=0)
    return min(max(COPY_BYTES, 4 * largest), _COPY_MAX_BYTES)


def measure_cpu_bandwidth() -> float:
    """Memory (DRAM) bandwidth of this CPU in bytes/s, from a large copy, once per process.

    Returns:
        ``2 * N / seconds`` for the fastest of several ``dst.copy_(src)`` of an
        ``N``-byte float32 tensor: bytes read plus bytes written. ``N`` is 128 MiB,
        or 4x the last-level cache where that is larger (at most 1 GiB), so the
        copy streams from memory. The best of that and the best figure kept for
        this machine, as for :func:`measure_cpu_flops`.

    Notes:
        Cached per ``torch.get_num_threads()``. A copy is what the memory-bound ops
        of a model do, so it is a fair roof for their bandwidth utilisation; a
        STREAM triad or non-temporal stores can reach somewhat more. Components
        whose data fit a cache run faster than this:
        :func:`measure_cpu_cache_bandwidths` gives those ceilings.
    """
    threads = torch.get_num_threads()
    cached = _BANDWIDTH_CACHE.get(threads)
    if cached is not None:
        return cached
    nbytes = _dram_copy_bytes()

    def measure() -> float:
        src = torch.ones(nbytes // 4, dtype=torch.float32)
        dst = torch.empty_like(src)
        best, _ = _best_seconds(lambda: dst.copy_(src), _COPY_MIN_REPEATS, _COPY_BUDGET_S)
        return 2 * nbytes / max(best, 1e-9)

    rate = _kept_best("copy DRAM", threads, measure)
    assert rate is not None
    _BANDWIDTH_CACHE[threads] = rate
    return rate


def _level_bandwidth(size_bytes: int) -> float | None:
    """Copy bandwidth (read + write) of a copy whose source and destination fill half a cache
    of ``size_bytes``, net of the per-call overhead; ``None`` when overhead is most of it."""
    nbytes = max(size_bytes // 4, 1024)
    reps = max(1, _LEVEL_CALL_BYTES // nbytes)
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    one, one_dst = torch.ones(1), torch.empty(1)

    def copies() -> None:
        for _ in range(reps):
            dst.copy_(src)

    def overhead() -> None:
        for _ in range(reps):
            one_dst.copy_(one)

    full, _ = _best_seconds(copies, _COPY_MIN_REPEATS, _LEVEL_BUDGET_S)
    empty, _ = _best_seconds(overhead, _COPY_MIN_REPEATS, _LEVEL_BUDGET_S)
    net = full - empty
    if not net > 0.25 * full:  # three quarters or more is the call's own overhead: not a bandwidth
        return None
    return 2 * nbytes * reps / net


def measure_cpu_cache_bandwidths() -> tuple[CacheLevel, ...]:
    """The bandwidth ceiling of each cache level and of DRAM, smallest level first.

    Each cache level's is a copy sized to fill half the level (source plus
    destination), repeated, with the per-call overhead of a 1-element copy taken
    out (:func:`_level_bandwidth`); DRAM's is :func:`measure_cpu_bandwidth`. A
    level's ceiling is never below a larger level's (data that fit L2 fit L3
    too: a lower L2 reading is the measurement's noise).
    Levels come from sysfs (:func:`cpu_cache_levels`); where it says nothing,
    only DRAM. Cached per thread count in the process and, as the other peaks,
    kept across processes.

    Notes:
        A component whose working set fits a cache level is bounded by that
        level's ceiling, not DRAM's: in-cache elementwise ops legitimately beat the
        DRAM copy. A level too small to time (each copy all overhead) has
        ``bandwidth`` ``None``; a component that fits it is judged by the next
        level that has one.
    """
    threads = torch.get_num_threads()
    cached = _LEVELS_CACHE.get(threads)
    if cached is not None:
        return cached
    measured = [
        (name, size, _kept_best(f"copy {name}", threads, partial(_level_bandwidth, size)))
        for name, size in cpu_cache_levels()
    ]
    levels = [CacheLevel("DRAM", None, measure_cpu_bandwidth())]
    for name, size, rate in reversed(measured):  # data that fit a level fit the larger ones too
        floor = levels[0].bandwidth
        levels.insert(0, CacheLevel(name, size, None if rate is None else max(rate, floor or 0.0)))
    _LEVELS_CACHE[threads] = tuple(levels)
    return _LEVELS_CACHE[threads]


def calibration_notes() -> dict[str, dict[str, Any]]:
    """How each CPU figure of this process was obtained, by kind (``"gemm float32"``, ``"copy DRAM"``).

    Each note has ``used`` (``"measured"``: this process's measurement is the
    best; ``"cache"``: the best kept for this machine is higher, or the machine
    was busy and nothing was measured), ``measured`` (this process's figure,
    ``None`` if it measured nothing), ``cached_best`` / ``cached_runs`` /
    ``cached_last`` (the kept figure before this process, when there was one),
    ``machine`` (``"quiet"`` or ``"busy"``: :func:`cb_callback._hardware.load.machine_busy`),
    ``others`` (the fraction of the CPUs other processes used just before) and
    ``load`` (the load average).
    """
    return {k: dict(v) for k, v in _NOTES.items()}


def _clear_caches() -> None:
    """Forget this process's measured peaks (the kept figures on disk stay)."""
    _FLOPS_CACHE.clear()
    _BANDWIDTH_CACHE.clear()
    _LEVELS_CACHE.clear()
    _NOTES.clear()
    _BUSY.clear()
    _FLOPS_SPREAD.clear()
    _FLOPS_RUNS.clear()
