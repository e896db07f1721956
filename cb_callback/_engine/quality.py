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
- ``contention``: evidence that the machine was busy while the row was timed:
  the row's runs are slowed by whole multiples of one scheduling quantum (see
  :func:`quantum_ms`), or the run as a whole shows a busy machine (more than
  :data:`SWITCHES_PER_S_THRESHOLD` involuntary context switches per second
  per thread, a load average above our own threads, a calibration that
  disagreed with itself, a VM's steal time above :data:`STEAL_THRESHOLD`, a
  reference GEMM slower than the process's best by :data:`SLOWDOWN_THRESHOLD`) and
  the scheduler took the CPU away from this row
  more often than that threshold too.
- ``insitu_mismatch``: the isolated ``fwd_ms`` and the in-situ ``insitu_ms``
  of a measured row differ by more than both rows' noise allows (see
  :func:`insitu_mismatch`): the component runs differently alone than inside
  the step (caches its neighbours warm, lazy initialisation, a code path that
  depends on state the replay does not have, contention in one of the two).
- ``at_floor``: the row's raw time is within the harness floor's noise
  (``details["floor_ms"]["at_floor"]`` names the passes; see
  :mod:`cb_callback._engine.floor`), or an estimate's every child is: isolation
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
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cb_callback._engine.floor import is_at_floor
from cb_callback._engine.timing import SampleSet
from cb_callback._hardware.load import LOAD_EXCESS_PER_CPU, available_cpus, load_average
from cb_callback._hardware.peaks import CALIBRATION_SPREAD_LIMIT
from cb_callback._report.model import ComponentRow

__all__ = [
    "FLAGS",
    "NOISY_THRESHOLD",
    "OWN_FLAGS",
    "PARENT_MARGIN",
    "SWITCHES_PER_S_THRESHOLD",
    "Assessment",
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
#: which the whole run counts as timed under ``contention`` (and a row with such a
#: rate is flagged when the run is). Measured on the 2-vCPU development VM
#: (docs/quality.md): quiet, a whole profile sees 20-30 per second per thread (a
#: tiny component's runs up to 80: kernel threads preempt the spinning OpenMP
#: workers, cheaply); with a second busy process on the machine, 120-130.
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


def _cpu_ticks() -> tuple[int, int] | None:
    """``(steal, total)`` jiffies of all CPUs from ``/proc/stat`` (Linux), else ``None``."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    values = [int(v) for v in fields[1:]]
    return values[7], sum(values[:8])


@dataclass
class LoadProbe:
    """The machine's 1-minute load average before and after profiling.

    Attributes:
        before: load average when profiling started (``None`` where unknown).
        after: when it ended.
        cpus: CPUs this process may run on.
        steal: fraction of the machine's CPU time the hypervisor gave to other
            guests meanwhile (``/proc/stat``'s steal column; ``None`` where unknown).
    """

    before: float | None = field(default_factory=load_average)
    after: float | None = None
    cpus: int = field(default_factory=available_cpus)
    steal: float | None = None
    _ticks: tuple[int, int] | None = field(default_factory=lambda: _cpu_ticks(), repr=False)

    def stop(self) -> None:
        """Read the load average and the steal time again."""
        self.after = load_average()
        now = _cpu_ticks()
        if now is not None and self._ticks is not None and now[1] > self._ticks[1]:
            self.steal = (now[0] - self._ticks[0]) / (now[1] - self._ticks[1])


@dataclass
class Assessment:
    """Flags per row path and the run's quality summary (``metadata["quality"]``); ``details``: what a flag
    adds to its row's ``details`` (``above_parent``: the parent, the ratio and why)."""

    flags: dict[str, list[str]]
    quality: dict[str, Any]
    details: dict[str, dict[str, Any]] = field(default_factory=dict)


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
    config: Any = None,
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
        ``quantum_ms``, ``calibration_spread``, ``insitu_mismatch`` (paths),
        ``at_floor`` (paths), ``above_parent`` (``{path, parent, ratio}`` each),
        ``thresholds``, ``verdict`` (``"clean"``, ``"noisy"``, ``"inconsistent"``,
        ``"over_peak"`` or ``"contended"``; ``at_floor``, ``above_parent`` and the
        rows' own flags leave it as it is: they are what the method can resolve,
        not how the machine ran) and ``advice`` (sentences; empty when clean).
    """
    by_path = {r.path: r for r in rows}
    flags: dict[str, list[str]] = {}

    def add(path: str, flag: str) -> None:
        have = flags.setdefault(path, [])
        if flag not in have:
            have.append(flag)

    timed = {p: s for p, s in samples.items() if s.samples and p in by_path and by_path[p].status == "ok"}
    for path, s in timed.items():
        if is_noisy(s):
            add(path, "noisy")
    medians = {p: by_path[p].total_ms for p in timed if math.isfinite(by_path[p].total_ms)}
    for child, parent in inconsistent_pairs(by_path, medians) if pairs is None else pairs:
        add(child, "slower_than_parent")
        add(parent, "slower_than_parent")
    over_flops = []
    for r in rows:
        if r.status == "ok" and (_over_flops(r) or _over_bandwidth(r)):
            add(r.path, "over_peak")
            if _over_flops(r):
                over_flops.append(r)

    drift = slowdown - 1.0 if slowdown is not None and math.isfinite(slowdown) else 0.0
    mismatched = [r.path for r in rows if insitu_mismatch(r, drift)]
    for path in mismatched:
        add(path, "insitu_mismatch")
    at_floor, above = _method_flags(rows, by_path, add)

    machine = _machine(timed, load, threads, calibration_spread, slowdown)
    per_thread = max(threads, 1)
    for path, s in timed.items():
        rate = s.switches_per_s / per_thread
        preempted = machine.busy and math.isfinite(rate) and rate > SWITCHES_PER_S_THRESHOLD
        if preempted or (machine.quantum is not None and _row_quantised(s, machine.quantum)):
            add(path, "contention")

    counts = {f: sum(f in v for v in flags.values()) for f in FLAGS}
    contended = counts["contention"] > 0 or machine.busy
    advice = _advice(
        counts, contended, load, machine.run_rate, machine.quantum, threads, config, machine.busy_load,
        calibration_spread, slowdown,
    )  # fmt: skip
    advice += _peak_advice(over_flops, peaks or {}, counts["over_peak"] - len(over_flops))
    if mismatched:
        named = ", ".join(p or "root" for p in mismatched[:8]) + (" …" if len(mismatched) > 8 else "")
        advice.append(
            f"{len(mismatched)} components run differently alone than in the step (insitu_mismatch: {named}): "
            "their isolated fwd_ms and in-situ insitu_ms disagree beyond both rows' noise; isolation misses "
            "what their neighbours leave (caches, lazy initialisation) or the replay takes another path"
        )
    advice += _method_advice(at_floor, above, {f: [p for p, v in flags.items() if f in v] for f in OWN_FLAGS})
    quality = {
        "verdict": _verdict(counts, contended),
        "flags": counts,
        "flagged_rows": len(flags),
        "insitu_mismatch": mismatched,
        "at_floor": at_floor,
        "above_parent": [{"path": p, "parent": q, "ratio": x} for p, q, x in above],
        "load_before": load.before,
        "load_after": load.after,
        "cpus": load.cpus,
        "threads": threads,
        "switches_per_s": machine.run_rate,
        "quantum_ms": machine.quantum,
        "calibration_spread": calibration_spread,
        "steal": load.steal,
        "slowdown": slowdown,
        "thresholds": _thresholds(),
        "advice": advice,
    }
    why = (
        "the children's isolated replays, summed, each pay isolation's per-replay cost (the replay's Python, "
        "the backward's start, caches left cold) that the parent's one replay pays once"
    )
    details = {p: {"above_parent": {"parent": q, "ratio": x, "why": why}} for p, q, x in above}
    return Assessment({p: [f for f in FLAGS if f in v] for p, v in flags.items()}, quality, details)


def _thresholds() -> dict[str, float]:
    """The module's thresholds, as ``metadata["quality"]["thresholds"]`` records them."""
    return {
        "noisy": NOISY_THRESHOLD,
        "median_uncertainty": MEDIAN_UNCERTAINTY,
        "slower_than_parent": PARENT_MARGIN,
        "switches_per_s_per_thread": SWITCHES_PER_S_THRESHOLD,
        "load_excess_per_cpu": LOAD_EXCESS_PER_CPU,
        "steal": STEAL_THRESHOLD,
        "slowdown": SLOWDOWN_THRESHOLD,
        "insitu_margin": INSITU_MARGIN,
        "insitu_slack_ms": INSITU_SLACK_MS,
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
    """What the run as a whole says about the machine (see :func:`assess`)."""

    busy: bool
    busy_load: bool
    run_rate: float
    quantum: float | None


def _machine(
    timed: Mapping[str, SampleSet],
    load: LoadProbe,
    threads: int,
    calibration_spread: float | None,
    slowdown: float | None,
) -> _Machine:
    """Whether the machine was busy: the load average, steal, a slowed canary, the runs' context
    switches per second and thread, a scheduling quantum in the runs, an unsure calibration."""
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
    busy = (
        busy_load
        or (load.steal is not None and load.steal > STEAL_THRESHOLD)
        or (slowdown is not None and slowdown > SLOWDOWN_THRESHOLD)
        or (math.isfinite(run_rate) and run_rate > SWITCHES_PER_S_THRESHOLD)
        or quantum is not None
        or (calibration_spread is not None and calibration_spread > CALIBRATION_SPREAD_LIMIT)
    )
    return _Machine(busy, busy_load, run_rate, quantum)


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


def _advice(
    counts: Mapping[str, int],
    contended: bool,
    load: LoadProbe,
    run_rate: float,
    quantum: float | None,
    threads: int,
    config: Any,
    busy_load: bool,
    calibration_spread: float | None,
    slowdown: float | None,
) -> list[str]:
    out = []
    if contended:
        evidence = []
        if busy_load:
            shown = ", ".join(f"{x:.1f}" for x in (load.before, load.after) if x is not None)
            evidence.append(f"load average {shown} on {load.cpus} CPUs")
        if math.isfinite(run_rate) and run_rate > SWITCHES_PER_S_THRESHOLD:
            evidence.append(f"{run_rate:.0f} involuntary context switches/s per thread")
        if quantum is not None:
            evidence.append(f"runs slowed by multiples of a {quantum:g} ms scheduling quantum")
        if slowdown is not None and slowdown > SLOWDOWN_THRESHOLD:
            evidence.append(f"a reference GEMM ran {slowdown - 1:.0%} slower than the fastest seen in this process")
        if load.steal is not None and load.steal > STEAL_THRESHOLD:
            evidence.append(f"the hypervisor took {load.steal:.0%} of the CPU time (steal)")
        if calibration_spread is not None and calibration_spread > CALIBRATION_SPREAD_LIMIT:
            evidence.append(f"the peak calibration disagreed with itself by {calibration_spread:.0%}")
        if counts["contention"] and not evidence:
            evidence.append(f"{counts['contention']} rows timed while the CPU was taken away")
        fewer = " or fewer threads (torch.set_num_threads)" if threads > 1 else ""
        out.append(
            "the machine was busy while profiling (" + "; ".join(evidence) + "): times, MFU and the "
            f"hotspot ranking may be off; profile on a quiet machine{fewer}"
        )
    if counts["noisy"]:
        min_run = getattr(config, "min_run_time_s", None)
        rounds = getattr(config, "rounds", None)
        now = f" (now {min_run:g} s and {rounds})" if min_run is not None and rounds is not None else ""
        out.append(
            f"{counts['noisy']} components vary by more than {NOISY_THRESHOLD:.0%} between runs, too "
            f"much for their few runs: raise min_run_time_s or rounds{now}"
        )
    if counts["slower_than_parent"]:
        out.append(
            f"{counts['slower_than_parent']} rows are a child measured slower than its parent (or that "
            "parent): noise or isolation overhead; treat those times as uncertain"
        )
    return out


def _named(paths: Sequence[str], most: int = 8) -> str:
    return ", ".join(p or "root" for p in paths[:most]) + (" …" if len(paths) > most else "")


#: What a row's own flag means, for the advice (:data:`OWN_FLAGS`).
_OWN_ADVICE = {
    "hash_reduced": "are timed on a hash-size-reduced table: their times come from the shrunk table "
    "(the row's details say which columns are the real table's)",
    "hash_collapsed": "had distinct ids collapsed onto one row by the hash-size remap: their lookups touch "
    "fewer rows than the real step's",
    "derived_negative": "have a value derived by subtraction that would go below zero (two separately "
    "measured times): it is not a measurement of either; read the row's details",
}


def _method_advice(
    at_floor: Sequence[str], above: Sequence[tuple[str, str, float]], own: Mapping[str, Sequence[str]]
) -> list[str]:
    """Advice on what the method (not the machine) limits: rows at the floor, estimates above their
    parent, and the flags rows carried themselves."""
    out = []
    if at_floor:
        out.append(
            f"{len(at_floor)} components run within the harness floor's noise (at_floor: {_named(at_floor)}): "
            "isolation cannot tell their time from a replay that does nothing, so it is at most the floor's "
            "spread (details['floor_ms']) and no TFLOP/s, GB/s, MFU or bound is derived from it"
        )
    if above:
        shown = [f"{p or 'root'} {x:.2f}× {q or 'root'}" for p, q, x in above]
        out.append(
            f"{len(above)} estimated components exceed their measured parent (above_parent: {_named(shown)}): "
            "an estimate sums its children's isolated replays, each paying isolation's per-replay cost that "
            "the parent's one replay pays once; read the parent's time, the estimate is no lower bound here"
        )
    for name, paths in own.items():
        if paths:
            out.append(f"{len(paths)} components {_OWN_ADVICE[name]} ({name}: {_named(paths)})")
    return out


def _over_flops(r: ComponentRow) -> bool:
    return math.isfinite(r.mfu) and r.mfu > 1.0 + 1e-9


def _over_bandwidth(r: ComponentRow) -> bool:
    """``gbps`` above the row's working-set ceiling; without one, ``bw_util`` above 1."""
    ceiling = r.details.get("bw_ceiling")
    if isinstance(ceiling, Mapping) and isinstance(ceiling.get("gbps"), (int, float)):
        return math.isfinite(r.gbps) and r.gbps > ceiling["gbps"] * (1.0 + 1e-9)
    return math.isfinite(r.bw_util) and r.bw_util > 1.0 + 1e-9


def _peak_advice(over_flops: Sequence[ComponentRow], peaks: Mapping[str, Any], over_bandwidth: int) -> list[str]:
    """What to do about rows above a peak, and about a CPU peak calibrated on a busy machine."""
    out = []
    measured = peaks.get("flops_source") == "measured"
    notes = peaks.get("calibration") or {}
    flops_note: Mapping[str, Any] = next((v for k, v in notes.items() if k.startswith("gemm")), {})
    if over_flops:
        worst = max(over_flops, key=lambda r: r.mfu)
        if measured:
            busy = " (the machine was busy while it calibrated)" if flops_note.get("machine") == "busy" else ""
            out.append(
                f"{len(over_flops)} components run above the measured CPU peak ({worst.path or 'root'} at "
                f"{worst.mfu:.0%} MFU): the GEMM calibration read low{busy}; the best figure is kept per "
                "machine, so a run on a quiet machine raises it (CB_CACHE_DIR), or pass peak_flops="
            )
        else:
            out.append(
                f"{len(over_flops)} components run above the device's FLOP/s peak ({worst.path or 'root'} at "
                f"{worst.mfu:.0%}): the peak is too low for this dtype (see metadata['peaks']); pass peak_flops="
            )
    elif measured and flops_note.get("machine") == "busy" and flops_note.get("used") == "measured":
        out.append(
            "the CPU FLOP/s peak was calibrated on a busy machine with no better figure kept for it: MFU may read "
            "too high; profile once on a quiet machine (the best calibration is kept) or pass peak_flops="
        )
    if over_bandwidth:
        out.append(
            f"{over_bandwidth} components move bytes faster than the ceiling of the memory level their data fit "
            "(details['bw_ceiling']): the ceiling is too low or the time too short to be true; pass peak_bandwidth="
        )
    return out
