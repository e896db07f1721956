"""Adaptive timing of one callable: warm-up, repeats within a budget, median and IQR."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from cb_callback._report.finite import is_nan
from cb_callback._types import UserValue

__all__ = [
    "Sample",
    "SampleSet",
    "Timing",
    "canary_best",
    "cpu_canary",
    "interleave",
    "record_timed",
    "runs_settled",
    "time_fn",
    "timed_seconds",
]

_TIMED = [0.0]  # seconds spent inside timed regions in this process


def timed_seconds() -> float:
    """Total seconds spent inside timed regions so far (for harness efficiency)."""
    return _TIMED[0]


def record_timed(seconds: float) -> None:
    """Add ``seconds`` spent inside a timed region (samplers call it)."""
    _TIMED[0] += seconds


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
    last_arg: UserValue = field(default=None, repr=False)
    last_out: UserValue = field(default=None, repr=False)

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
    fn: Callable[[UserValue], UserValue],
    *,
    setup: Callable[[], UserValue] | None = None,
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


# --- interleaved sampling of many components ----------------------------------------


@dataclass(frozen=True)
class Sample:
    """One timed run of a component: a forward and the backward of its graph, in ms.

    Attributes:
        fwd_ms: device time of the forward (CUDA events; wall time on CPU).
        bwd_ms: device time of the backward; ``0.0`` when the component has no
            backward, NaN when the backward is not measured (``backward=False``).
        fwd_host_ms: host time of the forward (launch time on CUDA).
        bwd_host_ms: host time of the backward.
    """

    fwd_ms: float
    bwd_ms: float
    fwd_host_ms: float
    bwd_host_ms: float

    @property
    def total_ms(self) -> float:
        """``fwd_ms + bwd_ms`` (a NaN backward counts 0)."""
        return self.fwd_ms + (0.0 if is_nan(self.bwd_ms) else self.bwd_ms)


@dataclass
class SampleSet:
    """Every sample of one component, with what the machine did meanwhile.

    Attributes:
        samples: the timed runs, in the order they ran.
        rounds: in how many rounds the component was sampled.
        timed_s: wall seconds spent inside this component's sampling slices.
        switches: involuntary context switches of this process during those
            slices (``getrusage``), the scheduler taking the CPU away.
        remeasured: whether extra rounds were given because the first looked
            inconsistent (noisy, or slower than its parent).
        settled: whether sampling stopped before ``min_repeats`` because the
            component is long and its runs already agreed (:data:`SETTLE_NOISE`).
        error: what the sampler raised; it is not sampled again.
    """

    samples: list[Sample] = field(default_factory=list)
    rounds: int = 0
    timed_s: float = 0.0
    switches: int = 0
    remeasured: bool = False
    settled: bool = False
    error: BaseException | None = None

    def _col(self, name: str) -> list[float]:
        return sorted(getattr(s, name) for s in self.samples)

    def median(self, name: str = "total_ms") -> float:
        """Median of one field of the samples (``fwd_ms``, ``bwd_ms``, ``total_ms`` …)."""
        values = self._col(name)
        return _quantile(values, 0.5)

    def iqr(self, name: str = "total_ms") -> float:
        """Inter-quartile range of one field, ms."""
        values = self._col(name)
        return _quantile(values, 0.75) - _quantile(values, 0.25)

    @property
    def noise(self) -> float:
        """Relative spread of the runs: IQR ÷ median of ``total_ms`` (NaN without samples)."""
        med = self.median()
        return self.iqr() / med if self.samples and med > 0 else float("nan")

    @property
    def switches_per_s(self) -> float:
        """Involuntary context switches per second of sampling (NaN if nothing was timed)."""
        return self.switches / self.timed_s if self.timed_s > 0 else float("nan")


#: A long component (one run takes its whole budget, a budget above 0) stops sampling once
#: it has two runs or more whose relative spread, IQR ÷ median of the forward and of the whole
#: run, is at most this: a quarter of the noisy threshold (``quality.NOISY_THRESHOLD``, 0.20).
#: Two runs 10 % apart have an IQR of 5 % of their median (the quartiles of two values sit a
#: quarter of the way in from each end), so their median is within 5 % of either run. Like
#: ``torch.utils.benchmark``'s ``adaptive_autorange``: a 7 s step that agrees with itself twice
#: does not need five more.
SETTLE_NOISE = 0.05


def runs_settled(samples: list[Sample]) -> bool:
    """Whether ``samples`` (two or more) agree within :data:`SETTLE_NOISE` in forward and in total."""
    if len(samples) < 2:
        return False
    for name in ("fwd_ms", "total_ms"):
        values = sorted(getattr(s, name) for s in samples)
        med = _quantile(values, 0.5)
        if not (med > 0 and math.isfinite(med)):
            return False
        if (_quantile(values, 0.75) - _quantile(values, 0.25)) / med > SETTLE_NOISE:
            return False
    return True


_CANARY_BEST: dict[int, float] = {}


def cpu_canary(size: int = 256, repeats: int = 7) -> Callable[[], float]:
    """A reference CPU workload: the best of ``repeats`` ``size``² fp32 GEMMs, in seconds.

    Seven (about 3.5 ms on 2 vCPUs): with three, one render of a progress bar's refresh
    thread (a few ms preempting one of the GEMM's threads) could slow every repeat of a
    call, and a quiet machine read 1.4-2.3× "slower" in 2 of 17 Lightning runs.

    The fastest time ever seen in this process (per thread count) is kept in
    :func:`canary_best`, so a run can tell that the machine is slower now than
    it was (another job, a throttled or shared CPU) even when its own runs
    agree with each other.
    """
    a = torch.randn(size, size)
    b = torch.randn(size, size)
    out = torch.empty(size, size)

    def run() -> float:
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.mm(a, b, out=out)
            best = min(best, time.perf_counter() - t0)
        key = torch.get_num_threads()
        _CANARY_BEST[key] = min(_CANARY_BEST.get(key, math.inf), best)
        return best

    return run


def canary_best() -> float | None:
    """The fastest canary time seen in this process at the current thread count."""
    return _CANARY_BEST.get(torch.get_num_threads())


def _involuntary_switches() -> int:
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw)
    except (ImportError, OSError):  # not on every platform
        return 0


def interleave(
    samplers: list[Callable[[], Sample]],
    *,
    budgets_s: list[float],
    rounds: int,
    min_repeats: int,
    max_repeats: int,
    sets: list[SampleSet] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    switches: Callable[[], int] | None = None,
    on_round: Callable[[int], None] | None = None,
    canary: Callable[[], float] | None = None,
    canary_s: list[float] | None = None,
) -> list[SampleSet]:
    """Sample many components in interleaved rounds; returns one :class:`SampleSet` each.

    Round 1 takes one sample of every component, in order; it estimates each
    one's run time. From it each component gets a number of samples
    ``clamp(ceil(budget / estimate), min_repeats, max_repeats)``, spread evenly
    over ``rounds`` rounds (round 1 included). A long component, one whose
    first run took its whole budget (a budget above 0; ``0`` asks for exactly
    ``min_repeats``), stops as soon as its runs of this call agree
    (:data:`SETTLE_NOISE`; ``SampleSet.settled``): ``min_repeats`` is the most
    such a component takes, not the least, so the root of a model whose step
    takes seconds costs two steps when two agree, not five. A call that
    extends ``sets`` (a re-measurement) never stops early and clears
    ``settled``. A component whose time alternates between two modes can
    settle on one when its first runs fall in the same mode; its noise cannot
    show that either. Rounds alternate the order
    (forward, then reversed), so that neither the first nor the last component
    always runs right after a slow phase. A slice of two or more runs starts
    with one untimed run, so every timed run finds the caches as the
    component's own previous run left them (as a loop of runs does), not as
    the component before it did. A sampler that raises is not called again;
    its set keeps the exception in ``error``.

    Args:
        samplers: each times one run of one component and returns it.
        budgets_s: per component, the timed seconds to aim for.
        rounds: number of rounds (>= 1).
        min_repeats: samples per component, at least (also past the budget).
        max_repeats: samples per component, at most.
        sets: sample sets to extend (extra rounds for a re-measurement); new ones
            by default.
        clock: seconds (a seam for tests).
        switches: the process's involuntary context switch count (a seam; default
            ``getrusage``).
        on_round: called with the round's number (1-based) after each round.
        canary: a fixed reference workload, timed (its seconds returned) once
            before every round; its times are appended to ``canary_s``. The same
            work taking longer in one round than another is the machine, not
            the components.
        canary_s: where the canary's times go.

    Notes:
        Interleaving is what makes a measurement resist a busy machine: a burst of
        other load (another job, a compaction, the scheduler) lands on many
        components a little instead of on one component entirely, and the median
        over rounds discards it. It cannot undo load that lasts the whole run;
        that is what the ``contention`` flag reports.
    """
    if len(samplers) != len(budgets_s):
        raise ValueError("one budget per sampler is needed")
    run = _Interleaving(
        samplers, budgets_s, max(rounds, 1), min_repeats, max_repeats, sets, clock,
        switches if switches is not None else _involuntary_switches, on_round, canary, canary_s,
    )  # fmt: skip
    for r in range(run.rounds):
        run.round(r)
    return run.out


@dataclass
class _Interleaving:
    """One :func:`interleave` call: its options (as there) and, per component, its sample set (``out``),
    the samples it takes in this call (``target``, set in round 1), whether it is long (one run takes its
    whole budget) and how many samples its set held before the call (``start``)."""

    samplers: list[Callable[[], Sample]]
    budgets_s: list[float]
    rounds: int
    min_repeats: int
    max_repeats: int
    sets: list[SampleSet] | None
    clock: Callable[[], float]
    count: Callable[[], int]
    on_round: Callable[[int], None] | None
    canary: Callable[[], float] | None
    canary_s: list[float] | None
    out: list[SampleSet] = field(init=False)
    target: list[int] = field(init=False)
    long: list[bool] = field(init=False)
    start: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.out = self.sets if self.sets is not None else [SampleSet() for _ in self.samplers]
        for s in self.out:  # a re-measurement takes its whole target: its first samples looked inconsistent
            s.settled = False
        self.target = [0] * len(self.samplers)
        self.long = [False] * len(self.samplers)
        self.start = [len(s.samples) for s in self.out]

    def round(self, r: int) -> None:
        """Round ``r`` (0-based): the canary first, then every component's slice, in order on even rounds
        and reversed on odd ones; then ``on_round(r + 1)``."""
        if self.canary is not None and self.canary_s is not None:
            self.canary_s.append(self.canary())
        order = list(range(len(self.samplers)))
        for i in order if r % 2 == 0 else order[::-1]:
            if r == 0:
                self._first(i)
            else:
                self._slice(i, r)
        if self.on_round is not None:
            self.on_round(r + 1)

    def _first(self, i: int) -> None:
        """Round 1 of component ``i``: one run, which sets its target and whether it is long."""
        self._take(i, 1)
        if self.out[i].error is not None:
            return
        est = self.out[i].samples[-1].total_ms / 1e3
        need = math.ceil(self.budgets_s[i] / est) if est > 0 else self.max_repeats
        self.target[i] = min(max(need, self.min_repeats, 1), self.max_repeats)
        self.long[i] = self.budgets_s[i] > 0 and need <= 1 and self.sets is None

    def _slice(self, i: int, r: int) -> None:
        """A later round's slice of component ``i``: its remaining samples spread evenly over the remaining
        rounds; none once a long component's runs of this call agree (``settled``)."""
        s, start = self.out[i], self.start[i]
        done = len(s.samples) - start
        if self.long[i] and done < self.target[i] and runs_settled(s.samples[start:]):
            self.target[i] = done
            s.settled = True
        want = math.ceil((self.target[i] - done) / (self.rounds - r)) if self.target[i] > done else 0
        if want > 0:
            self._take(i, want)

    def _take(self, i: int, n: int) -> None:
        """``n`` timed runs of component ``i`` into its set (after one untimed run when ``n >= 2``), with
        their seconds and context switches; a run that raises ends it (``error``)."""
        s = self.out[i]
        if s.error is not None:
            return
        try:
            if n >= 2:  # one untimed run first: the component before it left the caches cold
                self.samplers[i]()
        except Exception as e:
            s.error = e
            return
        c0, t0 = self.count(), self.clock()
        try:
            for _ in range(n):
                s.samples.append(self.samplers[i]())
        except Exception as e:  # the caller decides what a failed component becomes
            s.error = e
        t1 = self.clock()
        s.timed_s += t1 - t0
        s.switches += self.count() - c0
        s.rounds += 1
