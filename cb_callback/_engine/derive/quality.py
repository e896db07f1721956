"""Measurement quality: per-row flags, the run's verdict, and what to do about it.

A measurement knows its own uncertainty and says so in words. Each timed row
gets ``details["flags"]``, a list drawn from :data:`FLAGS`; the report's
``metadata["quality"]`` counts them, records the machine's load before and
after, and gives a verdict with advice. A clean run has no flags and an empty
advice list.

The vocabulary (thresholds are module constants, recorded in the metadata):

- ``noisy``: the row's ``noise`` (IQR ÷ median of its fwd + bwd runs) exceeds
  :data:`NOISY_THRESHOLD` and its median is unsure: the boxplot notch
  ``1.57 · IQR / √runs`` is more than :data:`MEDIAN_UNCERTAINTY` of the median
  (a tiny component timed a thousand times can spread widely around a sure
  median; see :func:`is_noisy`).
- ``slower_than_parent``: a measured child's ``total_ms × calls`` per call of
  its measured parent exceeds the parent's ``total_ms`` by more than
  :data:`PARENT_MARGIN` (and :data:`PARENT_SLACK_MS`): one of them is wrong.
  Both rows are flagged.
- ``over_peak``: ``mfu`` above 1 (the FLOP/s peak is too low, or the time too
  short to be true), or ``gbps`` above the bandwidth ceiling of the row's
  working set (``details["bw_ceiling"]``: the cache level its data fit, measured
  on CPU; DRAM's when it fits none): an in-cache ReLU beating the DRAM copy is
  not over its peak. Where no levels are known (a GPU), ``bw_util`` above 1.
- ``contention``: evidence that other processes took the CPU while the row was
  timed: a signal that measures other processes says the machine was busy, and
  the row itself shows preemption (its runs slowed by whole multiples of one
  scheduling quantum, see :func:`quantum_ms`, or more than
  :data:`SWITCHES_PER_S_THRESHOLD` involuntary context switches per second per
  thread). On Linux that signal is other processes' CPU share over the profile
  (:class:`LoadProbe`: ``/proc/stat``'s busy ticks of the CPUs this process may
  use, less the CPU time of this process, every thread of it, and of its
  descendants; :data:`OTHERS_THRESHOLD` beyond the CPUs the torch threads leave
  free) or a VM's steal time above :data:`STEAL_THRESHOLD`. Not counted: the
  trainer's own threads and children (a progress bar's refresh thread, a
  logger, dataloader workers, fork children): Lightning's Rich bar wakes 100
  times a second and raises the switch rate by as much, but uses no CPU the
  compute needs. The load average (a minute behind, counting our own threads),
  the switch rate and a quantum are evidence there, not a verdict. Without
  ``/proc`` the signal is the load average above our own threads, a quantum, or
  the switch rate where no other Python thread of ours is alive to cause it (a
  baseline of the rate with the same threads alive would need a second or so of
  extra timing per profile). The run is ``contended`` on that signal, on a
  reference GEMM slower than the process's best by :data:`SLOWDOWN_THRESHOLD`,
  or on a calibration that disagreed with itself; ``metadata["quality"]``
  records ``others``, ``children``, ``own_pids`` and ``busy_by``.
- ``insitu_mismatch``: the isolated ``fwd_ms`` and the in-situ ``insitu_ms``
  of a measured row differ by more than both rows' noise allows (see
  :func:`insitu_mismatch`): the component runs differently alone than inside
  the step (caches its neighbours warm, lazy initialisation, a code path that
  depends on state the replay does not have, contention in one of the two).
- ``at_floor``: the row's raw time is within the harness floor's noise
  (``details["floor_ms"]["at_floor"]`` names the passes; see
  :mod:`cb_callback._engine.clocks.floor`), or an estimate's every child is: isolation
  cannot tell it from a replay that does nothing. Its time is ``max(raw - floor,
  0)``, possibly 0; its TFLOP/s, GB/s, MFU, ``bw_util`` and ``bound`` are left
  NaN/``None``.
- ``above_parent``: an ``estimated`` row's ``total_ms × calls`` per call of its
  measured parent exceeds the parent's ``total_ms`` by more than
  :data:`PARENT_MARGIN` plus the parent's ``noise`` (and
  :data:`PARENT_SLACK_MS`): a sum of isolated replays pays isolation's per-replay
  cost once per child, where the parent's one replay pays it once.
- Flags a row carries in ``details["own_flags"]`` (set by the engine or a
  plugin before assessment, names from :data:`FLAGS`) are merged in and
  counted: ``hash_reduced`` (times from a hash-size-reduced table),
  ``hash_collapsed`` (the id remap collapsed distinct ids), ``derived_negative``
  (a value derived by subtraction would go below zero).
"""

from __future__ import annotations

import math
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cb_callback._engine.clocks.floor import is_at_floor
from cb_callback._engine.clocks.timing import SampleSet
from cb_callback._engine.derive.advice import (
    count,
    figure,
    insitu_advice,
    method_advice,
    noisy_advice,
    parent_advice,
    peak_advice,
)
from cb_callback._engine.run.config import BenchmarkConfig
from cb_callback._hardware.load import (
    LOAD_EXCESS_PER_CPU,
    available_cpus,
    cpu_lines,
    load_average,
    own_tree,
    tree_ticks,
)
from cb_callback._hardware.peaks import CALIBRATION_SPREAD_LIMIT
from cb_callback._report.model import ComponentRow
from cb_callback._report.schema import RowDetails

__all__ = [
    "FLAGS",
    "NOISY_THRESHOLD",
    "OTHERS_THRESHOLD",
    "OWN_FLAGS",
    "PARENT_MARGIN",
    "SWITCHES_PER_S_THRESHOLD",
    "Assessment",
    "CpuTicks",
    "LoadProbe",
    "above_parent",
    "assess",
    "inconsistent_pairs",
    "insitu_mismatch",
    "is_noisy",
    "quantum_ms",
]

#: Flags no check here computes: a row carries them in ``details["own_flags"]`` (the engine or a plugin sets
#: them before assessment) and :func:`assess` merges and counts them.
OWN_FLAGS: tuple[str, ...] = ("hash_reduced", "hash_collapsed", "derived_negative")

#: Every flag a row can carry, in the order they are listed.
FLAGS: tuple[str, ...] = (
    "noisy", "slower_than_parent", "over_peak", "contention", "insitu_mismatch", "at_floor", "above_parent",
    *OWN_FLAGS,
)  # fmt: skip

#: ``noise`` above this is ``noisy`` (IQR ÷ median; 0.2 ≈ a standard deviation of
#: 15 % of the median for normally distributed runs).
NOISY_THRESHOLD = 0.20

#: ... and its median uncertain by more than this fraction (boxplot notch ÷ median).
MEDIAN_UNCERTAINTY = 0.05

#: A child more than this fraction slower than its parent is ``slower_than_parent``.
PARENT_MARGIN = 0.10

#: ... and slower by at least this many ms (sub-clock-resolution differences are not news).
PARENT_SLACK_MS = 0.02

#: Involuntary context switches per second of sampling and per torch thread above
#: which a row shows preemption (flagged ``contention`` when other processes were busy);
#: without ``/proc`` and with no other thread of ours alive, the whole run's rate above it
#: is the busy machine's evidence. Measured on the 2-vCPU development VM
#: (docs/quality.md): quiet, a whole profile sees 10-30 per second per thread (a
#: tiny component's runs up to 80: kernel threads preempt the spinning OpenMP
#: workers, cheaply); with Lightning's Rich progress bar alive, 70-130 (its thread
#: wakes 100 times a second); with two other busy processes, 120-135.
SWITCHES_PER_S_THRESHOLD = 60.0

#: ``insitu_mismatch`` needs the larger of ``fwd_ms`` and ``insitu_ms`` to exceed the smaller by this
#: fraction plus twice both rows' noise (the isolated row's ``noise``, the in-situ spread over its passes) …
#: The two are timed minutes apart: on the shared 2-vCPU VM a 10 ms GEMM read 1.3× apart between such
#: windows with each window's own runs agreeing (docs/quality.md), so half again is the bar.
INSITU_MARGIN = 0.5

#: ... and by at least this many ms, or the harness floor's forward when larger (that subtraction's error).
INSITU_SLACK_MS = 0.05

#: Candidate scheduling quanta searched by :func:`quantum_ms`, in ms.
_QUANTA_MS = tuple(q / 4 for q in range(8, 81))  # 2.0, 2.25, ... 20.0 ms
_QUANTUM_SCORE = 0.8
_QUANTUM_MIN_VALUES = 12

#: Steal time (a VM's CPUs given to other guests) above this fraction counts as a busy machine.
STEAL_THRESHOLD = 0.05

#: Other processes' CPU time (:attr:`LoadProbe.others`, in CPUs' worth) beyond the CPUs the torch
#: threads leave free, as a fraction of the CPUs those threads need, above which the machine counts as
#: busy: on 2 CPUs with 2 threads, others above 20 % of the CPU time (0.4 CPU). One spinning process
#: there takes a third of the CPU time (3 runnable threads on 2 CPUs), two take half.
OTHERS_THRESHOLD = 0.2

#: Clock ticks per CPU that :attr:`LoadProbe.others` may be off by (``/proc/stat`` counts a CPU's
#: ticks whole, twice: at the start and at the end); judged beyond them.
_TICK_SLACK = 2

#: A reference GEMM this much slower (median of the run ÷ fastest seen in the process)
#: counts as a busy machine.
SLOWDOWN_THRESHOLD = 1.25


def insitu_mismatch(row: ComponentRow, machine: float = 0.0) -> bool:
    """Whether a measured row's isolated forward disagrees with its in-situ forward.

    ``|fwd_ms - insitu_ms| > max(INSITU_SLACK_MS, floor fwd)`` and
    ``max / min > 1 + INSITU_MARGIN + 2 · (noise + insitu spread) + machine``,
    where ``machine`` is how much slower than its best the machine ran during
    the run (the reference GEMM's ``slowdown - 1``, timed around the in-situ
    pass and before every round): the two are timed minutes apart, and a
    shared CPU drifts by that much between them. A row taken from a
    representative (``details["as"]``) is not checked: its ``fwd_ms`` is
    another member's.
    """
    if row.status != "ok" or row.details.get("as") == "representative":
        return False
    iso, ins = row.fwd_ms, row.insitu_ms
    if not (math.isfinite(iso) and math.isfinite(ins)):
        return False
    spread = (row.details.get("insitu") or {}).get("spread")
    spread = spread if isinstance(spread, float) and math.isfinite(spread) else 0.0  # NaN: one in-situ pass
    noise = (row.noise if math.isfinite(row.noise) else 0.0) + spread
    floor = (row.details.get("floor_ms") or {}).get("fwd") or 0.0
    if abs(iso - ins) <= max(INSITU_SLACK_MS, floor):
        return False
    return max(iso, ins) > (1.0 + INSITU_MARGIN + 2.0 * noise + max(machine, 0.0)) * min(iso, ins)


def quantum_ms(excess_ms: Sequence[float]) -> float | None:
    """The scheduling quantum that runs were slowed by, if they look quantised.

    Args:
        excess_ms: per timed run, its time minus the fastest run of the same
            component, ms.

    Returns:
        The candidate quantum ``q`` (2 to 20 ms, in 0.25 ms steps) at whose
        whole multiples the excesses of at least 1 ms sit best: the highest
        mean of ``cos(2π·e/q)``, if it is at least 0.8 over at least 12 of
        them; else ``None``.

    Notes:
        A run preempted by another process waits whole time slices, so on a
        contended machine the slow runs of every component sit at
        ``fastest + n·q``; ordinary variation spreads them out and scores near 0.
        Jitter lowers the score of ``q``'s divisors more than ``q``'s own, so the
        best score is the fundamental.
    """
    values = [e for e in excess_ms if e >= 1.0 and math.isfinite(e)]
    if len(values) < _QUANTUM_MIN_VALUES:
        return None
    best: tuple[float, float] | None = None
    for q in _QUANTA_MS:
        near = [e for e in values if e >= q / 2]
        if len(near) < _QUANTUM_MIN_VALUES:
            continue
        score = sum(math.cos(2 * math.pi * e / q) for e in near) / len(near)
        if score >= _QUANTUM_SCORE and (best is None or (score, q) > best):
            best = (score, q)
    return None if best is None else best[1]


def is_noisy(samples: SampleSet) -> bool:
    """Whether a row's runs spread too much for its median to be trusted.

    ``noise > NOISY_THRESHOLD`` and ``1.57 · noise / √runs > MEDIAN_UNCERTAINTY``:
    the spread is large *and* there are too few runs to pin the median down
    (1.57·IQR/√n is the half-width of a boxplot's notch, a ~95 % interval of
    the median).
    """
    noise, n = samples.noise, len(samples.samples)
    if not math.isfinite(noise) or n == 0:
        return False
    return noise > NOISY_THRESHOLD and 1.57 * noise / math.sqrt(n) > MEDIAN_UNCERTAINTY


@dataclass(frozen=True)
class CpuTicks:
    """One reading of CPU time in clock ticks (USER_HZ), which two of make a :class:`LoadProbe`'s window.

    Attributes:
        busy: the CPUs this process may run on, their user + nice + system + irq + softirq ticks
            (``/proc/stat``; not idle, iowait or steal).
        steal: their steal ticks (a hypervisor running other guests).
        total: all their ticks.
        own: this process's utime + stime (every thread: a progress bar's, a logger's too).
        children: its descendants' (alive: utime + stime + cutime + cstime) and every child it
            reaped (its cutime + cstime): dataloader workers, fork children.
        pids: this process, then the descendants alive at the reading.
    """

    busy: int
    steal: int
    total: int
    own: int
    children: int
    pids: tuple[int, ...]


def _cpu_ticks() -> CpuTicks | None:
    """A :class:`CpuTicks` reading (Linux), else ``None``. The seam tests replace to inject a machine."""
    try:
        cpus: set[int] | None = set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = None
    machine = cpu_lines(cpus)
    if machine is None:
        return None
    pids = own_tree()
    own, children = tree_ticks(pids)
    return CpuTicks(*machine, own, children, tuple(pids))


def _other_threads() -> int:
    """This process's live Python threads besides the calling one (a progress bar's refresh, a logger)."""
    return sum(t.is_alive() for t in threading.enumerate()) - 1


@dataclass
class LoadProbe:
    """What the machine did while profiling: the load average, steal time, other processes' CPU.

    :meth:`stop` compares two :func:`_cpu_ticks` readings (``/proc``): the CPU time the CPUs
    this process may use spent busy, less what this process (all its threads) and its
    descendants (dataloader workers, fork children, whatever they started) used, is
    what other processes used. The trainer's own threads and children are never counted.

    Attributes:
        before: load average when profiling started (``None`` where unknown).
        after: when it ended.
        cpus: CPUs this process may run on.
        steal: fraction of those CPUs' time the hypervisor gave to other guests meanwhile
            (``/proc/stat``'s steal column; ``None`` where unknown).
        others: fraction of those CPUs' time other processes used meanwhile (``None`` without
            ``/proc``): 0.5 on 2 CPUs is one CPU's worth.
        children: fraction this process's descendants used (counted as its own, not in ``others``).
        own_pids: the processes counted as this one's own: itself first, then every descendant seen
            at the start or the end.
        span: the window's ticks over those CPUs (USER_HZ × seconds × CPUs): ``others`` is uncertain
            by about two ticks per CPU in it.
        other_threads: this process's Python threads besides the profiling one, alive at the start.
    """

    before: float | None = field(default_factory=load_average)
    after: float | None = None
    cpus: int = field(default_factory=available_cpus)
    steal: float | None = None
    others: float | None = None
    children: float | None = None
    own_pids: list[int] = field(default_factory=list)
    span: int = 0
    other_threads: int = field(default_factory=lambda: _other_threads())
    _ticks: CpuTicks | None = field(default_factory=lambda: _cpu_ticks(), repr=False)

    def stop(self) -> None:
        """Read the load average and the CPU ticks again: ``steal``, ``others``, ``children``, ``own_pids``."""
        self.after = load_average()
        now, then = _cpu_ticks(), self._ticks
        if now is None or then is None or now.total <= then.total:
            return
        span = self.span = now.total - then.total
        self.steal = (now.steal - then.steal) / span
        own = (now.own - then.own) + (now.children - then.children)
        self.others = max(now.busy - then.busy - own, 0) / span
        self.children = max(now.children - then.children, 0) / span
        seen = dict.fromkeys([*then.pids, *now.pids])  # ordered: this process first
        self.own_pids = list(seen)


@dataclass
class Assessment:
    """Flags per row path and the run's quality summary (``metadata["quality"]``); ``details``: what a flag
    adds to its row's ``details`` (``above_parent``: the parent, the ratio and why)."""

    flags: dict[str, list[str]]
    quality: dict[str, Any]
    details: dict[str, RowDetails] = field(default_factory=dict)


def inconsistent_pairs(rows: Mapping[str, ComponentRow], medians: Mapping[str, float]) -> list[tuple[str, str]]:
    """``(child, parent)`` paths whose timed medians say the child is slower than its parent.

    Args:
        rows: the rows by path (for parents and calls).
        medians: ``total_ms`` medians of the timed rows by path.
    """
    out = []
    for path, t in medians.items():
        row = rows[path]
        parent = row.parent
        if parent is None or parent not in medians:
            continue
        per_parent_call = t * max(row.calls, 1) / max(rows[parent].calls, 1)
        limit = medians[parent] * (1 + PARENT_MARGIN)
        if per_parent_call > limit and per_parent_call - medians[parent] > PARENT_SLACK_MS:
            out.append((path, parent))
    return out


def above_parent(rows: Mapping[str, ComponentRow]) -> list[tuple[str, str, float]]:
    """``(estimate, parent, ratio)`` for each ``estimated`` row above its measured (``ok``) parent.

    ``ratio`` is the estimate's ``total_ms × calls`` per call of the parent over the parent's
    ``total_ms``; it is reported above ``1 + PARENT_MARGIN + parent noise`` where the excess is
    also more than :data:`PARENT_SLACK_MS`. An estimate sums its children's isolated replays, each
    paying isolation's per-replay cost (the replay's Python, the backward's start, caches left
    cold) that the parent's one replay pays once; above the parent it is not the lower bound an
    estimate otherwise is.
    """
    out = []
    for path, row in rows.items():
        parent = rows.get(row.parent) if row.parent is not None else None
        if row.status != "estimated" or parent is None or parent.status != "ok":
            continue
        mine, theirs = row.total_ms, parent.total_ms
        if not (math.isfinite(mine) and math.isfinite(theirs) and theirs > 0):
            continue
        per_parent_call = mine * max(row.calls, 1) / max(parent.calls, 1)
        noise = parent.noise if math.isfinite(parent.noise) else 0.0
        if per_parent_call > theirs * (1 + PARENT_MARGIN + noise) and per_parent_call - theirs > PARENT_SLACK_MS:
            out.append((path, parent.path, per_parent_call / theirs))
    return out


def _own_flags(rows: Sequence[ComponentRow]) -> dict[str, list[str]]:
    """Each row's ``details["own_flags"]`` that :data:`FLAGS` knows (one warning per unknown name)."""
    out: dict[str, list[str]] = {}
    unknown: set[str] = set()
    for r in rows:
        names = r.details.get("own_flags") or []
        if isinstance(names, str):
            names = [names]
        for name in names:
            if name in FLAGS:
                out.setdefault(r.path, []).append(name)
            else:
                unknown.add(str(name))
    if unknown:
        warnings.warn(
            f"cb_callback: details['own_flags'] names {sorted(unknown)}, not flags (known: {list(FLAGS)}); dropped",
            RuntimeWarning,
            stacklevel=3,
        )
    return out


def _row_quantised(s: SampleSet, q: float) -> bool:
    """Whether at least a quarter of the row's runs (and 2) sit one or more quanta above its fastest."""
    totals = [x.total_ms for x in s.samples]
    if not totals:
        return False
    fastest = min(totals)
    hits = 0
    for t in totals:
        e = t - fastest
        n = round(e / q)
        if n >= 1 and abs(e - n * q) <= 0.15 * q:
            hits += 1
    return hits >= 2 and hits >= len(totals) / 4


def assess(
    rows: Sequence[ComponentRow],
    samples: Mapping[str, SampleSet],
    *,
    load: LoadProbe,
    threads: int,
    config: BenchmarkConfig | None = None,
    calibration_spread: float | None = None,
    slowdown: float | None = None,
    pairs: Iterable[tuple[str, str]] | None = None,
    peaks: Mapping[str, Any] | None = None,
) -> Assessment:
    """Flag the rows and judge the run.

    Args:
        rows: every row, after estimation and derived metrics.
        samples: the sample sets of the timed rows, by path.
        load: the load average before and after.
        threads: torch's intra-op threads during timing.
        config: the run's :class:`~cb_callback.BenchmarkConfig` (for the advice).
        calibration_spread: how much a CPU peak calibration disagreed with itself
            (median ÷ best - 1 of its runs), when one ran.
        slowdown: the run's median time of a fixed reference GEMM (timed
            before every round) over the fastest this process has seen: above
            :data:`SLOWDOWN_THRESHOLD` the whole machine was slower than it can
            be, although the components' own runs may agree with each other.
        pairs: the ``(child, parent)`` pairs to flag ``slower_than_parent``;
            ``None``: :func:`inconsistent_pairs` of the rows' ``total_ms`` (with
            several batches the engine compares child and parent batch by batch).
        peaks: the report's ``metadata["peaks"]``, for the advice on a measured
            peak that a component exceeded or that was calibrated on a busy machine.

    Returns:
        The flags of each flagged row and the ``quality`` metadata: ``flags``
        (count per flag), ``flagged_rows``, ``load_before``, ``load_after``,
        ``cpus``, ``threads``, ``switches_per_s`` (whole run, per thread),
        ``others``, ``children``, ``own_pids``, ``other_threads`` (:class:`LoadProbe`),
        ``busy_by`` (what made the machine busy: ``others``, ``steal``; without ``/proc``
        ``load``, ``switches``, ``quantum``; and ``slowdown``, ``calibration``),
        ``quantum_ms``, ``calibration_spread``, ``insitu_mismatch`` (paths),
        ``at_floor`` (paths), ``above_parent`` (``{path, parent, ratio}`` each),
        ``thresholds``, ``verdict`` (``"clean"``, ``"noisy"``, ``"inconsistent"``,
        ``"over_peak"`` or ``"contended"``; ``at_floor``, ``above_parent`` and the
        rows' own flags leave it as it is: they are what the method can resolve,
        not how the machine ran) and ``advice`` (sentences; empty when clean).
    """
    by_path = {r.path: r for r in rows}
    timed = {p: s for p, s in samples.items() if s.samples and p in by_path and by_path[p].status == "ok"}
    found = _flag_rows(rows, by_path, timed, pairs, slowdown)
    machine = _machine(timed, load, threads, calibration_spread, slowdown)
    _flag_contention(found, timed, machine, threads)
    counts = {f: sum(f in v for v in found.flags.values()) for f in FLAGS}
    contended = counts["contention"] > 0 or machine.busy
    advice = _advice(counts, contended, load, machine, threads, calibration_spread, slowdown)
    advice += _children_advice(load, threads)
    advice += _rows_advice(found, timed, by_path, config, peaks or {})
    quality = _quality(found, counts, contended, load, machine, threads, calibration_spread, slowdown, advice)
    details = _above_parent_details(found.above)
    return Assessment({p: [f for f in FLAGS if f in v] for p, v in found.flags.items()}, quality, details)


@dataclass
class _Found:
    """What :func:`assess` found in the rows: each row's flags and the rows behind each piece of advice.

    Attributes:
        flags: each flagged row's flags, in the order found (:func:`assess` sorts them as :data:`FLAGS`).
        slow: the ``(child, parent)`` pairs flagged ``slower_than_parent``.
        over_flops: the rows over the FLOP peak.
        over_bandwidth: the rows over the bandwidth peak.
        mismatched: the paths flagged ``insitu_mismatch``.
        at_floor: the paths flagged ``at_floor``.
        above: ``(path, parent, ratio)`` of each row flagged ``above_parent``.
    """

    flags: dict[str, list[str]] = field(default_factory=dict)
    slow: list[tuple[str, str]] = field(default_factory=list)
    over_flops: list[ComponentRow] = field(default_factory=list)
    over_bandwidth: list[ComponentRow] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    at_floor: list[str] = field(default_factory=list)
    above: list[tuple[str, str, float]] = field(default_factory=list)

    def add(self, path: str, flag: str) -> None:
        """Flag ``path`` with ``flag`` (once)."""
        have = self.flags.setdefault(path, [])
        if flag not in have:
            have.append(flag)


def _flag_rows(
    rows: Sequence[ComponentRow],
    by_path: Mapping[str, ComponentRow],
    timed: Mapping[str, SampleSet],
    pairs: Iterable[tuple[str, str]] | None,
    slowdown: float | None,
) -> _Found:
    """The flags each row earns on its own numbers, in this order: ``noisy``, ``slower_than_parent``,
    ``over_peak``, ``insitu_mismatch``, then what the method limits (:func:`_method_flags`)."""
    found = _Found()
    for path, s in timed.items():
        if is_noisy(s):
            found.add(path, "noisy")
    medians = {p: by_path[p].total_ms for p in timed if math.isfinite(by_path[p].total_ms)}
    found.slow = list(inconsistent_pairs(by_path, medians) if pairs is None else pairs)
    for child, parent in found.slow:
        found.add(child, "slower_than_parent")
        found.add(parent, "slower_than_parent")
    for r in rows:
        if r.status == "ok" and (_over_flops(r) or _over_bandwidth(r)):
            found.add(r.path, "over_peak")
            if _over_flops(r):
                found.over_flops.append(r)
            if _over_bandwidth(r):
                found.over_bandwidth.append(r)
    drift = slowdown - 1.0 if slowdown is not None and math.isfinite(slowdown) else 0.0
    found.mismatched = [r.path for r in rows if insitu_mismatch(r, drift)]
    for path in found.mismatched:
        found.add(path, "insitu_mismatch")
    found.at_floor, found.above = _method_flags(rows, by_path, found.add)
    return found


def _flag_contention(found: _Found, timed: Mapping[str, SampleSet], machine: _Machine, threads: int) -> None:
    """``contention`` on a timed row only where other processes were busy and the row itself shows it:
    context switches above :data:`SWITCHES_PER_S_THRESHOLD` per thread, or runs one quantum apart."""
    per_thread = max(threads, 1)
    for path, s in timed.items():
        rate = s.switches_per_s / per_thread
        preempted = math.isfinite(rate) and rate > SWITCHES_PER_S_THRESHOLD
        quantised = machine.quantum is not None and _row_quantised(s, machine.quantum)
        if machine.others and (preempted or quantised):
            found.add(path, "contention")


def _rows_advice(
    found: _Found,
    timed: Mapping[str, SampleSet],
    by_path: Mapping[str, ComponentRow],
    config: BenchmarkConfig | None,
    peaks: Mapping[str, Any],
) -> list[str]:
    """The advice on the flagged rows: noisy, slower than their parent, over a peak, unlike in situ, and
    what the method limits."""
    flags = found.flags
    advice = noisy_advice({p: s for p, s in timed.items() if "noisy" in flags.get(p, ())}, NOISY_THRESHOLD, config)
    advice += parent_advice(found.slow, by_path, config)
    advice += peak_advice(found.over_flops, found.over_bandwidth, peaks)
    advice += insitu_advice([by_path[p] for p in found.mismatched])
    own = {f: [p for p, v in flags.items() if f in v] for f in OWN_FLAGS}
    advice += method_advice(found.at_floor, found.above, own)
    return advice


def _quality(
    found: _Found,
    counts: dict[str, int],
    contended: bool,
    load: LoadProbe,
    machine: _Machine,
    threads: int,
    calibration_spread: float | None,
    slowdown: float | None,
    advice: list[str],
) -> dict[str, Any]:
    """``metadata["quality"]`` (its keys: :func:`assess`'s Returns)."""
    return {
        "verdict": _verdict(counts, contended),
        "flags": counts,
        "flagged_rows": len(found.flags),
        "insitu_mismatch": found.mismatched,
        "at_floor": found.at_floor,
        "above_parent": [{"path": p, "parent": q, "ratio": x} for p, q, x in found.above],
        "load_before": load.before,
        "load_after": load.after,
        "cpus": load.cpus,
        "threads": threads,
        "switches_per_s": machine.run_rate,
        "quantum_ms": machine.quantum,
        "calibration_spread": calibration_spread,
        "steal": load.steal,
        "others": load.others,
        "children": load.children,
        "own_pids": load.own_pids,
        "other_threads": load.other_threads,
        "busy_by": machine.signals,
        "slowdown": slowdown,
        "thresholds": _thresholds(),
        "advice": advice,
    }


def _above_parent_details(above: Sequence[tuple[str, str, float]]) -> dict[str, RowDetails]:
    """Each ``above_parent`` row's ``details["above_parent"]``: its parent, the ratio, and why."""
    why = (
        "the children's isolated replays, summed, each pay isolation's per-replay cost (the replay's Python, "
        "the backward's start, caches left cold) that the parent's one replay pays once"
    )
    return {p: {"above_parent": {"parent": q, "ratio": x, "why": why}} for p, q, x in above}


def _thresholds() -> dict[str, float]:
    """The module's thresholds, as ``metadata["quality"]["thresholds"]`` records them."""
    return {
        "noisy": NOISY_THRESHOLD,
        "median_uncertainty": MEDIAN_UNCERTAINTY,
        "slower_than_parent": PARENT_MARGIN,
        "switches_per_s_per_thread": SWITCHES_PER_S_THRESHOLD,
        "load_excess_per_cpu": LOAD_EXCESS_PER_CPU,
        "steal": STEAL_THRESHOLD,
        "others": OTHERS_THRESHOLD,
        "slowdown": SLOWDOWN_THRESHOLD,
        "insitu_margin": INSITU_MARGIN,
        "insitu_slack_ms": INSITU_SLACK_MS,
        "children": CHILDREN_THRESHOLD,
        "above_parent": PARENT_MARGIN,
    }


def _method_flags(
    rows: Sequence[ComponentRow], by_path: Mapping[str, ComponentRow], add: Callable[[str, str], None]
) -> tuple[list[str], list[tuple[str, str, float]]]:
    """Flag what the method limits: ``at_floor``, ``above_parent``, and each row's ``details["own_flags"]``;
    return the ``at_floor`` paths and the :func:`above_parent` triples."""
    at_floor = [r.path for r in rows if r.status in ("ok", "estimated") and is_at_floor(r.details)]
    for path in at_floor:
        add(path, "at_floor")
    above = above_parent(by_path)
    for path, _, _ in above:
        add(path, "above_parent")
    for path, names in _own_flags(rows).items():
        for name in names:
            add(path, name)
    return at_floor, above


@dataclass
class _Machine:
    """What the run as a whole says about the machine (see :func:`assess`).

    ``others``: a signal that measures other processes says the machine was busy (rows may then be
    flagged ``contention``); ``busy``: that, or the machine ran slower than it can (a slowed
    reference GEMM, an unsure calibration): the verdict is ``contended``. ``others_share``: the
    ``/proc`` share crossed :data:`OTHERS_THRESHOLD`; ``rate_counts``: the switch rate counted
    (no ``/proc``, and no other thread of ours alive to cause it); ``signals``: the names of what
    made it busy (``metadata["quality"]["busy_by"]``).
    """

    busy: bool
    others: bool
    busy_load: bool
    run_rate: float
    quantum: float | None
    others_share: bool = False
    rate_counts: bool = False
    signals: list[str] = field(default_factory=list)


def _others_busy(load: LoadProbe, threads: int) -> bool:
    """Whether other processes took CPU time the torch threads needed (``load.others``; ``False`` unknown).

    Their CPUs' worth (``others × cpus``), less the CPUs the ``threads`` leave free and less the
    ticks' rounding (:data:`_TICK_SLACK` per CPU over the window), above :data:`OTHERS_THRESHOLD` of
    the CPUs those threads need.
    """
    if load.others is None or load.span <= 0:
        return False
    needed = min(max(threads, 1), load.cpus)
    slack = _TICK_SLACK * load.cpus / load.span
    return (load.others - slack) * load.cpus - (load.cpus - needed) > OTHERS_THRESHOLD * needed


def _machine(
    timed: Mapping[str, SampleSet],
    load: LoadProbe,
    threads: int,
    calibration_spread: float | None,
    slowdown: float | None,
) -> _Machine:
    """Whether the machine was busy.

    Where ``/proc`` measured other processes' CPU (:attr:`LoadProbe.others`), that share and the
    steal time are what say so: the load average (a minute behind, and counting our own threads),
    the switch rate (a progress bar's refresh preempts the compute threads too) and a scheduling
    quantum in the runs (our own busy dataloader workers can cause one) are evidence only. Without
    ``/proc``: the load average above our threads, a quantum, and the runs' context switches per
    second and thread where no other Python thread of ours is alive to cause them. Either way a
    slowed reference GEMM or an unsure calibration makes the machine busy (it ran slower than it can).
    """
    per_thread = max(threads, 1)
    excess = []
    for s in timed.values():
        totals = [x.total_ms for x in s.samples]
        excess += [t - min(totals) for t in totals]
    quantum = quantum_ms(excess)
    total_s = sum(s.timed_s for s in timed.values())
    run_rate = sum(s.switches for s in timed.values()) / total_s / per_thread if total_s > 0 else math.nan
    loads = [x for x in (load.before, load.after) if x is not None]
    busy_load = bool(loads) and max(loads) - min(per_thread, load.cpus) > LOAD_EXCESS_PER_CPU * load.cpus
    share = _others_busy(load, threads)
    steal = load.steal is not None and load.steal > STEAL_THRESHOLD
    high_rate = math.isfinite(run_rate) and run_rate > SWITCHES_PER_S_THRESHOLD
    rate_counts = load.others is None and load.other_threads <= 0 and high_rate
    if load.others is not None:
        candidates = {"others": share, "steal": steal}
    else:
        candidates = {"load": busy_load, "steal": steal, "switches": rate_counts, "quantum": quantum is not None}
    signals = [name for name, on in candidates.items() if on]
    others = bool(signals)
    if slowdown is not None and slowdown > SLOWDOWN_THRESHOLD:
        signals.append("slowdown")
    if calibration_spread is not None and calibration_spread > CALIBRATION_SPREAD_LIMIT:
        signals.append("calibration")
    return _Machine(bool(signals), others, busy_load, run_rate, quantum, share, rate_counts, signals)


def _verdict(counts: Mapping[str, int], contended: bool) -> str:
    """The last that applies of ``over_peak``, ``noisy``, ``inconsistent``, ``contended``; else ``clean``."""
    verdict = "clean"
    if counts["over_peak"]:
        verdict = "over_peak"
    if counts["noisy"]:
        verdict = "noisy"
    if counts["slower_than_parent"]:
        verdict = "inconsistent"
    if contended:
        verdict = "contended"
    return verdict


#: The trainer's own child processes (dataloader workers) using more than this fraction of the CPUs the torch
#: threads need, beyond the CPUs those threads leave free, get an advice line (never the ``contended`` verdict).
CHILDREN_THRESHOLD = 0.1


def _children_advice(load: LoadProbe, threads: int) -> list[str]:
    """A line when this process's own descendants (dataloader workers prefetching, a logger's process) used CPU
    the replays needed while profiling: not contention (they are the trainer's, and run in the real step too),
    but the isolated times then share the CPUs with them and the in-situ times may not."""
    if load.children is None or load.span <= 0:
        return []
    needed = min(max(threads, 1), load.cpus)
    slack = _TICK_SLACK * load.cpus / load.span
    if (load.children - slack) * load.cpus - (load.cpus - needed) <= CHILDREN_THRESHOLD * needed:
        return []
    pids = len(load.own_pids) - 1
    return [
        f"this process's own child processes ({count(pids, 'process', 'processes')}: dataloader workers and the "
        f"like) used {figure(100 * load.children)} % of the {count(load.cpus, 'CPU')} while profiling: not counted as "
        "contention, but they take CPU time from the replays (read times as upper bounds); profile with idle "
        "workers (a smaller prefetch_factor=<batches>, or num_workers=0 for the profiled step)"
    ]


def _advice(
    counts: Mapping[str, int],
    contended: bool,
    load: LoadProbe,
    machine: _Machine,
    threads: int,
    calibration_spread: float | None,
    slowdown: float | None,
) -> list[str]:
    """The ``contended`` verdict's sentence, naming its evidence: other processes' share of the CPUs
    first, slowdowns as ratios (``49×``), fractions as percentages."""
    if not contended:
        return []
    evidence = []
    if machine.others_share and load.others is not None:
        evidence.append(f"other processes used {load.others:.0%} of the {count(load.cpus, 'CPU')}")
    if machine.busy_load and load.others is None:  # where /proc measured others, the lagging average is not evidence
        shown = ", ".join(f"{x:.1f}" for x in (load.before, load.after) if x is not None)
        evidence.append(f"load average {shown} on {count(load.cpus, 'CPU')}")
    if machine.others and math.isfinite(machine.run_rate) and machine.run_rate > SWITCHES_PER_S_THRESHOLD:
        evidence.append(f"{machine.run_rate:.0f} involuntary context switches/s per thread")
    if machine.quantum is not None:
        evidence.append(f"runs slowed by multiples of a {machine.quantum:g} ms scheduling quantum")
    if slowdown is not None and slowdown > SLOWDOWN_THRESHOLD:
        evidence.append(f"a reference GEMM ran {slowdown:.3g}× slower than the fastest seen in this process")
    if load.steal is not None and load.steal > STEAL_THRESHOLD:
        evidence.append(f"the hypervisor took {load.steal:.0%} of the CPU time (steal)")
    if calibration_spread is not None and calibration_spread > CALIBRATION_SPREAD_LIMIT:
        evidence.append(f"the peak calibration disagreed with itself by {calibration_spread:.0%}")
    if counts["contention"] and not evidence:
        n = counts["contention"]
        evidence.append(f"{count(n, 'row')} timed while the CPU was taken away")
    fewer = " or fewer threads (torch.set_num_threads)" if threads > 1 else ""
    return [
        "the machine was busy while profiling (" + "; ".join(evidence) + "): times, MFU and the "
        f"hotspot ranking may be off; profile on a quiet machine{fewer}"
    ]  # the rows' own advice (noisy, slower_than_parent, ...): cb_callback._engine.derive.advice


def _over_flops(r: ComponentRow) -> bool:
    return math.isfinite(r.mfu) and r.mfu > 1.0 + 1e-9


def _over_bandwidth(r: ComponentRow) -> bool:
    """``gbps`` above the row's working-set ceiling; without one, ``bw_util`` above 1."""
    ceiling = r.details.get("bw_ceiling")
    if isinstance(ceiling, Mapping) and isinstance(ceiling.get("gbps"), (int, float)):
        return math.isfinite(r.gbps) and r.gbps > ceiling["gbps"] * (1.0 + 1e-9)
    return math.isfinite(r.bw_util) and r.bw_util > 1.0 + 1e-9
