"""How busy this machine is: the load average against the CPUs this process may use."""

from __future__ import annotations

import os

__all__ = [
    "LOAD_EXCESS_PER_CPU",
    "OTHERS_BUSY_FRACTION",
    "available_cpus",
    "busy_load",
    "cpu_lines",
    "load_average",
    "machine_busy",
    "others_busy",
    "own_tree",
    "tree_ticks",
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


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command's ``)`` (``[0]`` is the state, ``[1]`` the
    parent's pid, ``[11:15]`` utime, stime, cutime, cstime in clock ticks); ``None`` when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _children_files(pid: int) -> list[int] | None:
    """``pid``'s child processes from ``/proc/<pid>/task/*/children``; ``None`` where the kernel has
    no such file (built without ``CONFIG_PROC_CHILDREN``)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []  # gone meanwhile
    out: list[int] = []
    seen = False
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
            seen = True
        except OSError:  # the thread ended meanwhile, or no such file at all
            continue
    return out if seen or not tasks else None


def _by_parent() -> dict[int, list[int]]:
    """Every process's children by scanning ``/proc/*/stat`` (the fallback of :func:`own_tree`)."""
    out: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (fields := _stat(int(name))) is not None and len(fields) > 1:
            out.setdefault(int(fields[1]), []).append(int(name))
    return out


def own_tree(root: int | None = None) -> list[int]:
    """``root`` (this process by default) and its descendants alive now, root first (Linux; ``[root]``
    elsewhere). Dataloader workers, fork children and the processes they start are descendants."""
    root = os.getpid() if root is None else root
    out, todo, scanned = [root], [root], None
    while todo:
        pid = todo.pop()
        kids = _children_files(pid) if scanned is None else scanned.get(pid, [])
        if kids is None:  # no children files: one scan of /proc answers for the whole tree
            try:
                scanned = _by_parent()
            except OSError:
                return out
            kids = scanned.get(pid, [])
        fresh = [k for k in kids if k not in out]
        out += fresh
        todo += fresh
    return out


def tree_ticks(pids: list[int]) -> tuple[int, int]:
    """``(first, rest)``: CPU time in clock ticks of ``pids[0]`` (utime + stime, all its threads) and of
    the others, plus every child any of them reaped (cutime + cstime: a worker that exited meanwhile
    stays counted, in its parent's). A pid gone meanwhile counts 0."""
    first = rest = 0
    for i, pid in enumerate(pids):
        fields = _stat(pid)
        if fields is None or len(fields) < 15:
            continue
        mine, reaped = int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])
        if i == 0:
            first, rest = first + mine, rest + reaped
        else:
            rest += mine + reaped
    return first, rest


def cpu_lines(cpus: set[int] | None = None) -> tuple[int, int, int] | None:
    """``(busy, steal, total)`` clock ticks of the CPUs ``cpus`` from ``/proc/stat`` (the whole
    machine's ``cpu`` line when ``None``); busy is user + nice + system + irq + softirq (not idle,
    iowait or steal). ``None`` off Linux."""
    try:
        with open("/proc/stat") as f:
            lines = [ln.split() for ln in f if ln.startswith("cpu")]
    except OSError:
        return None
    if cpus is None:
        wanted = [ln for ln in lines if ln[0] == "cpu"]
    else:
        wanted = [ln for ln in lines if ln[0][3:].isdigit() and int(ln[0][3:]) in cpus]
    if not wanted or any(len(ln) < 9 for ln in wanted):
        return None
    busy = steal = total = 0
    for ln in wanted:
        v = [int(x) for x in ln[1:9]]  # user nice system idle iowait irq softirq steal
        busy += v[0] + v[1] + v[2] + v[5] + v[6]
        steal += v[7]
        total += sum(v)
    return busy, steal, total


def _ticks() -> tuple[int, int, int] | None:
    """``(busy, total, own)`` clock ticks: all CPUs' (steal counted busy) from ``/proc/stat``, this
    process's and its descendants' (:func:`own_tree`, :func:`tree_ticks`), both in USER_HZ; ``None``
    off Linux."""
    machine = cpu_lines()
    if machine is None:
        return None
    busy, steal, total = machine
    first, rest = tree_ticks(own_tree())
    return busy + steal, total, first + rest


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
