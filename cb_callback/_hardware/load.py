"""How busy this machine is: the load average against the CPUs this process may use."""

from __future__ import annotations

import os

__all__ = [
    "LOAD_EXCESS_PER_CPU",
    "OTHERS_BUSY_FRACTION",
    "available_cpus",
    "busy_load",
    "load_average",
    "machine_busy",
    "others_busy",
]

#: Load-average excess (above our own threads) per CPU that counts as a busy machine.
LOAD_EXCESS_PER_CPU = 0.5


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_average() -> float | None:
    """The 1-minute load average, ``None`` where the platform has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def busy_load(load: float | None, own_threads: int, cpus: int | None = None) -> bool:
    """Whether ``load`` shows other work: more than :data:`LOAD_EXCESS_PER_CPU` per CPU
    above our own ``own_threads`` (at most ``cpus`` of them count). ``False`` when unknown."""
    cpus = available_cpus() if cpus is None else cpus
    if load is None:
        return False
    return load - min(max(own_threads, 1), cpus) > LOAD_EXCESS_PER_CPU * cpus


#: Other processes using more than this fraction of the machine's CPUs make it busy
#: for a calibration (one busy thread of another process on 2 CPUs is 0.5).
OTHERS_BUSY_FRACTION = 0.2


def _ticks() -> tuple[int, int, int] | None:
    """``(busy, total, own)`` clock ticks: all CPUs' from ``/proc/stat``, this process's
    ``utime + stime`` from ``/proc/self/stat`` (both in USER_HZ); ``None`` off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        with open("/proc/self/stat") as f:
            own = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    values = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    idle = values[3] + values[4]
    total = sum(values)
    # After the ")" of the command: state is field 3, utime and stime fields 14 and 15.
    return total - idle, total, int(own[11]) + int(own[12])


def others_busy(window_s: float = 0.1) -> float | None:
    """The fraction of the machine's CPU time other processes used over ``window_s``.

    Samples ``/proc/stat`` and this process's own CPU time around a sleep: while
    this process waits, whatever keeps the CPUs busy is someone else. ``None``
    where ``/proc`` is missing (then :func:`busy_load` is the fallback).
    """
    import time

    first = _ticks()
    if first is None:
        return None
    time.sleep(window_s)
    second = _ticks()
    if second is None or second[1] <= first[1]:
        return None
    busy = (second[0] - first[0]) - (second[2] - first[2])
    return max(0.0, busy / (second[1] - first[1]))


def machine_busy(own_threads: int) -> tuple[bool, dict[str, float | None]]:
    """Whether other work is running now, and the evidence (``others`` fraction, ``load``).

    Busy when other processes used more than :data:`OTHERS_BUSY_FRACTION` of the CPUs
    in a short window (:func:`others_busy`), or, where that cannot be read, when the
    load average is above our own threads (:func:`busy_load`).
    """
    others = others_busy()
    load = load_average()
    if others is not None:
        return others > OTHERS_BUSY_FRACTION, {"others": others, "load": load}
    return busy_load(load, own_threads), {"others": None, "load": load}
