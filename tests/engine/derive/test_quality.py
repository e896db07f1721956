"""Measurement quality: interleaved rounds, noise, flags, the verdict and its advice.

Timing sequences are injected (fake samplers, a fake switch counter, a fake load
average), so every assertion is exact and independent of how busy the machine is.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable

import pytest
import torch
from torch import nn

from cb_callback import BenchmarkConfig, profile_components
from cb_callback._engine.clocks.timing import Sample, SampleSet, interleave
from cb_callback._engine.derive.quality import (
    FLAGS,
    NOISY_THRESHOLD,
    SWITCHES_PER_S_THRESHOLD,
    LoadProbe,
    assess,
    quantum_ms,
)
from cb_callback._report.model import ComponentRow, Report
from cb_callback._report.table import format_summary

FAST = dict(min_run_time_s=0.0, min_repeats=3, max_repeats=50, warmup=1, rounds=3)


class Clock:
    """Advances by ``step`` seconds on every reading."""

    def __init__(self, step: float = 0.0) -> None:
        self.t = 0.0
        self.step = step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def fixed(ms: float, log: list[str] | None = None, name: str = "") -> Callable[[], Sample]:
    def run() -> Sample:
        if log is not None:
            log.append(name)
        return Sample(ms, 0.0, ms, 0.0)

    return run


# --- interleave --------------------------------------------------------------------


def test_rounds_alternate_order_and_spread_the_samples() -> None:
    log: list[str] = []
    # a: 10 ms a run, budget 0.1 s -> ceil(0.1 / 0.01) = 10 samples; b: 50 ms, budget 0.1 s -> 2,
    # raised to min_repeats=3.
    sets = interleave(
        [fixed(10.0, log, "a"), fixed(50.0, log, "b")],
        budgets_s=[0.1, 0.1],
        rounds=3,
        min_repeats=3,
        max_repeats=100,
        clock=Clock(),
        switches=lambda: 0,
    )
    assert [len(s.samples) for s in sets] == [10, 3]
    # b's run is half its budget, not long (SETTLE_NOISE): its equal runs still take min_repeats.
    assert [s.settled for s in sets] == [False, False]
    # round 1: a, b once each; round 2 (reversed): b takes ceil(2/2) = 1, a ceil(9/2) = 5 after one
    # untimed run; round 3 (forward): a its last 4 after an untimed run, b its last 1.
    assert log == ["a", "b"] + ["b"] + ["a"] * 6 + ["a"] * 5 + ["b"]
    assert [s.rounds for s in sets] == [3, 3]


def varying(fwd_ms: list[float], bwd_ms: list[float] | None = None) -> Callable[[], Sample]:
    """One run per call, the ``i``-th with the ``i``-th forward (and backward) time."""
    it = iter(zip(fwd_ms, bwd_ms or [0.0] * len(fwd_ms), strict=True))

    def run() -> Sample:
        f, b = next(it)
        return Sample(f, b, f, b)

    return run


def test_a_long_component_stops_once_two_runs_agree_and_not_before() -> None:
    def take(fwd: list[float], bwd: list[float] | None = None, budget: float = 0.01) -> tuple[int, bool]:
        (s,) = interleave(
            [varying(fwd, bwd)], budgets_s=[budget], rounds=5, min_repeats=5, max_repeats=100,
            clock=Clock(), switches=lambda: 0,
        )  # fmt: skip
        return len(s.samples), s.settled

    # 7 s and 50 ms runs against a 10 ms budget: long (one run takes the whole budget). Two runs 10 % apart
    # (50, 55): quartiles 51.25 and 53.75, IQR 2.5 over a median of 52.5 = 0.0476 <= SETTLE_NOISE (0.05):
    # the second run settles it.
    assert take([7000.0, 7000.0, 7000.0, 7000.0, 7000.0]) == (2, True)
    assert take([50.0, 55.0, 50.0, 50.0, 50.0]) == (2, True)
    # 50 and 56: IQR 3 over 53 = 0.0566 > 0.05; a third run at 50: quartiles 50 and 53, IQR 3 over
    # a median of 50 = 0.06, still apart; a fourth at 50: quartiles 50 and 51.5, 1.5 / 50 = 0.03.
    assert take([50.0, 56.0, 50.0, 50.0, 50.0]) == (4, True)
    # runs that never agree take min_repeats, which is then the most a long component takes
    assert take([50.0, 80.0, 50.0, 80.0, 50.0]) == (5, False)
    # forwards equal, backwards apart (totals 60 and 80: IQR 10 over 70 = 0.14): not settled
    assert take([50.0] * 5, [10.0, 30.0, 10.0, 30.0, 10.0]) == (5, False)
    # a re-measurement (sets extended) takes its whole target and clears settled: two agreeing runs first,
    # then min_repeats more
    first = interleave(
        [fixed(50.0)], budgets_s=[0.01], rounds=5, min_repeats=5, max_repeats=100, clock=Clock(), switches=lambda: 0
    )
    assert (len(first[0].samples), first[0].settled) == (2, True)
    again = interleave(
        [fixed(50.0)], budgets_s=[0.01], rounds=5, min_repeats=5, max_repeats=100, sets=first,
        clock=Clock(), switches=lambda: 0,
    )  # fmt: skip
    assert (len(again[0].samples), again[0].settled) == (2 + 5, False)
    # not long: a 1 ms run against a 0.1 s budget wants 100 runs, and equal runs take all 100; a
    # 50 ms run against it wants 2, raised to min_repeats; a budget of 0 asks exactly min_repeats
    for ms, budget, n in ((1.0, 0.1, 100), (50.0, 0.1, 5), (7000.0, 0.0, 5)):
        (s,) = interleave(
            [fixed(ms)], budgets_s=[budget], rounds=5, min_repeats=5, max_repeats=1000,
            clock=Clock(), switches=lambda: 0,
        )  # fmt: skip
        assert (len(s.samples), s.settled) == (n, False)


def test_max_repeats_caps_and_a_raising_sampler_stops() -> None:
    calls = []

    def boom() -> Sample:
        calls.append(1)
        raise RuntimeError("kaput")

    sets = interleave(
        [fixed(0.001), boom],
        budgets_s=[10.0, 10.0],
        rounds=4,
        min_repeats=1,
        max_repeats=7,
        clock=Clock(),
        switches=lambda: 0,
    )
    assert len(sets[0].samples) == 7  # 10 s / 1 µs would be 1e7 runs: capped at 7
    assert calls == [1] and isinstance(sets[1].error, RuntimeError) and sets[1].samples == []


def test_switches_and_timed_seconds_are_counted_per_component() -> None:
    counter = iter(range(0, 10_000, 5))  # every reading 5 more involuntary switches
    sets = interleave(
        [fixed(1.0)],
        budgets_s=[0.0],
        rounds=2,
        min_repeats=2,
        max_repeats=2,
        clock=Clock(0.5),
        switches=lambda: next(counter),
    )
    # 2 samples: round 1 takes 1, round 2 the other; each slice reads the clock twice (0.5 s apart)
    # and the counter twice (5 apart).
    assert sets[0].timed_s == 1.0 and sets[0].switches == 10
    assert sets[0].switches_per_s == 10.0


def test_noise_is_iqr_over_median_of_fwd_plus_bwd() -> None:
    s = SampleSet([Sample(f, b, f, b) for f, b in [(1, 1), (2, 2), (3, 3), (4, 4), (50, 50)]])
    # totals 2, 4, 6, 8, 100: quartiles 4 and 8 (linear interpolation), median 6
    assert s.median() == 6.0 and s.iqr() == 4.0
    assert s.noise == 4.0 / 6.0
    assert math.isnan(SampleSet().noise)


# --- quantum -------------------------------------------------------------------------


def test_quantised_excess_is_recognised() -> None:
    rng = random.Random(0)
    # runs slowed by 1-4 whole 8 ms slices, +-0.2 ms jitter
    excess = [8.0 * rng.randint(1, 4) + rng.uniform(-0.2, 0.2) for _ in range(40)]
    assert quantum_ms(excess + [0.0] * 40) == 8.0


def test_ordinary_spread_is_not_quantised() -> None:
    rng = random.Random(1)
    assert quantum_ms([rng.uniform(1.0, 60.0) for _ in range(200)]) is None
    assert quantum_ms([8.0, 16.0, 24.0]) is None  # fewer than 12 slowed runs prove nothing


# --- assess -----------------------------------------------------------------------------


def _rows(parent_ms: float = 10.0, child_ms: float = 4.0, mfu: float = 0.5) -> list[ComponentRow]:
    return [
        ComponentRow(
            path="",
            module_type="Net",
            depth=0,
            parent=None,
            status="ok",
            calls=1,
            total_ms=parent_ms,
            mfu=mfu,
            bw_util=0.1,
        ),
        ComponentRow(
            path="a",
            module_type="Linear",
            depth=1,
            parent="",
            status="ok",
            calls=2,
            total_ms=child_ms,
            mfu=0.2,
            bw_util=0.1,
        ),
    ]


def _steady(ms: float, n: int = 20, switches: int = 0) -> SampleSet:
    return SampleSet([Sample(ms, 0.0, ms, 0.0) for _ in range(n)], rounds=5, timed_s=1.0, switches=switches)


def quiet() -> LoadProbe:
    return LoadProbe(before=0.1, after=0.2, cpus=2)


def test_a_clean_run_has_no_flags_and_no_quality_section() -> None:
    rows = _rows()
    a = assess(rows, {"": _steady(10.0), "a": _steady(4.0)}, load=quiet(), threads=2)
    assert a.flags == {}
    assert a.quality["verdict"] == "clean" and a.quality["advice"] == []
    assert a.quality["flags"] == dict.fromkeys(FLAGS, 0)
    report = Report(rows, {"quality": a.quality})
    assert "quality" not in format_summary(report)


def test_a_contended_sequence_is_flagged_and_explained() -> None:
    # Root: 10 ms runs, half of them preempted for 1-3 slices of 8 ms; 300 involuntary switches
    # in 1 s of sampling on 2 threads = 150/s per thread (> the threshold).
    rng = random.Random(2)
    slow = [10.0 + 8.0 * rng.randint(1, 3) + rng.uniform(-0.1, 0.1) for _ in range(15)]
    root = SampleSet([Sample(t, 0.0, t, 0.0) for t in [10.0] * 15 + slow], timed_s=1.0, switches=300)
    rows = _rows(parent_ms=root.median())
    a = assess(rows, {"": root, "a": _steady(4.0)}, load=LoadProbe(before=3.9, after=4.1, cpus=2), threads=2)
    assert SWITCHES_PER_S_THRESHOLD < 150.0
    assert a.flags[""] == ["noisy", "contention"]
    assert root.noise > NOISY_THRESHOLD
    assert a.quality["verdict"] == "contended"
    assert a.quality["quantum_ms"] == 8.0
    text = format_summary(_with_flags(rows, a))
    assert "quality: contended (1 noisy, 1 contention)" in text
    assert "  (root): noisy, contention" in text
    # the whole run: 300 switches over 2 s of sampling (root 1 s + a 1 s) on 2 threads = 75/s
    assert a.quality["switches_per_s"] == 75.0
    assert a.quality["advice"][0].startswith(
        "the machine was busy while profiling (load average 3.9, 4.1 on 2 CPUs; "
        "75 involuntary context switches/s per thread; runs slowed by multiples of a 8 ms"
    )
    assert a.quality["advice"][0].endswith("profile on a quiet machine or fewer threads (torch.set_num_threads)")


def _with_flags(rows: list[ComponentRow], a: object) -> Report:
    for r in rows:
        r.details["flags"] = a.flags.get(r.path, [])  # type: ignore[attr-defined]
        if not r.details["flags"]:
            del r.details["flags"]
    return Report(rows, {"quality": a.quality})  # type: ignore[attr-defined]


def test_a_child_slower_than_its_parent_flags_both() -> None:
    # a runs twice per call of the root: 6 ms x 2 = 12 ms > 10 ms x 1.1
    rows = _rows(parent_ms=10.0, child_ms=6.0)
    a = assess(rows, {"": _steady(10.0), "a": _steady(6.0)}, load=quiet(), threads=1)
    assert a.flags == {"": ["slower_than_parent"], "a": ["slower_than_parent"]}
    assert a.quality["verdict"] == "inconsistent"
    # 5 ms x 2 = 10 ms is within the margin: no flag
    rows = _rows(parent_ms=10.0, child_ms=5.0)
    assert assess(rows, {"": _steady(10.0), "a": _steady(5.0)}, load=quiet(), threads=1).flags == {}


def test_over_peak_and_busy_load() -> None:
    rows = _rows(mfu=1.3)
    a = assess(rows, {"": _steady(10.0), "a": _steady(4.0)}, load=quiet(), threads=1)
    assert a.flags == {"": ["over_peak"]} and a.quality["verdict"] == "over_peak"
    assert "peak_flops=" in a.quality["advice"][0]
    # load 3.5 with our 1 thread on 2 CPUs: 2.5 other runnable threads > 0.5 per CPU
    busy = assess(_rows(), {"": _steady(10.0)}, load=LoadProbe(before=3.5, after=3.5, cpus=2), threads=1)
    assert busy.flags == {} and busy.quality["verdict"] == "contended"


# --- end to end ----------------------------------------------------------------------------


class SlowAlone(nn.Module):
    """Fast when its parent calls it, 3 ms slower when replayed alone."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.inside = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.inside:
            time.sleep(0.003)
        return self.lin(x)


class Holder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.child = SlowAlone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.child.inside = True
        try:
            return self.child(x)
        finally:
            self.child.inside = False


def test_a_child_made_slower_than_its_parent_is_remeasured_and_flagged() -> None:
    report = profile_components(Holder(), (torch.randn(4, 8),), backward=False, **FAST)
    child, root = report.row("child"), report.row("")
    assert child.fwd_ms > 3.0 > root.fwd_ms
    assert "slower_than_parent" in child.details["flags"]
    assert "slower_than_parent" in root.details["flags"]
    assert child.details["timing"]["remeasured"] and root.details["timing"]["remeasured"]
    assert report.metadata["quality"]["flags"]["slower_than_parent"] == 2
    assert "quality:" in report.summary()


def test_injected_contention_flags_every_timed_row(monkeypatch: pytest.MonkeyPatch) -> None:
    import cb_callback._engine.clocks.timing as timing
    import cb_callback._engine.derive.quality as quality

    counter = iter(range(0, 10**9, 1000))  # 1000 involuntary switches per reading
    monkeypatch.setattr(timing, "_involuntary_switches", lambda: next(counter))
    # No /proc and no other thread of ours alive: the switch rate is the fallback's evidence of other
    # processes (with /proc, tests/engine/clocks/test_contention.py: the rate alone never makes the run contended).
    monkeypatch.setattr(quality, "_cpu_ticks", lambda: None)
    monkeypatch.setattr(quality, "_other_threads", lambda: 0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    report = profile_components(model, (torch.randn(4, 8),), **FAST)
    for row in report:
        assert "contention" in row.details["flags"], row.path
    assert report.metadata["quality"]["verdict"] == "contended"
    assert "involuntary context switches" in report.summary()


def test_share_is_time_over_the_step_as_a_fraction_of_the_root() -> None:
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU())
    # descend="all": every row measured (the default triage may leave a row in situ under load: no share)
    report = profile_components(model, (torch.randn(4, 16),), descend="all", **FAST)
    root = report.row("")
    assert root.share == 1.0
    for row in report:
        assert row.share == row.total_ms * row.calls / root.total_ms
        assert 0 <= row.noise < math.inf


def test_an_unsure_calibration_is_repeated_and_keeps_the_best(monkeypatch: pytest.MonkeyPatch) -> None:
    import cb_callback._hardware.calibration as cal
    import cb_callback._hardware.peaks as hw

    hw._clear_caches()
    state = {"best": 2e-3, "spread": 0.5, "calls": 0}

    def fake(fn: object, min_repeats: int, budget_s: float) -> tuple[float, float]:
        state["calls"] += 1
        cal._LAST_SPREAD[0] = state["spread"]
        return state["best"], 1.0  # 1 s spent: only the first size (256) fits the budget

    monkeypatch.setattr(cal, "_best_seconds", fake)
    monkeypatch.setenv("CB_PEAK_CACHE", "0")  # this process's calibrations only
    try:
        first = hw.measure_cpu_flops(torch.float32)
        assert first == 2 * 256**3 / 2e-3 and state["calls"] == 2  # b and b.t()
        assert hw.calibration_spread("fp32") == 0.5
        # the median call was 50 % slower than the best (> 25 %): measured again, now faster
        state.update(best=1e-3, spread=0.05)
        assert hw.recalibrate_cpu_flops("fp32") == 2 * 256**3 / 1e-3
        assert hw.calibration_spread("fp32") == 0.05 and state["calls"] == 4
        # a sure calibration is not repeated; a slower rerun would never lower the peak
        state.update(best=4e-3, spread=0.9)
        assert hw.recalibrate_cpu_flops("fp32") == 2 * 256**3 / 1e-3 and state["calls"] == 4
    finally:
        hw._clear_caches()


def test_a_component_above_a_measured_peak_is_flagged_never_made_the_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    import cb_callback._hardware.calibration as cal
    import cb_callback._hardware.peaks as hw

    hw._clear_caches()
    # A calibration that read 1 FLOP/s (as under heavy load): every component runs above it.
    monkeypatch.setattr(cal, "_FLOPS_CACHE", {(torch.float32, torch.get_num_threads()): 1.0})
    try:
        # 2 * 256 * 512 * 512 = 134 MFLOP forward: milliseconds on one thread. No harness floor: under
        # heavy load one floor run can be descheduled for longer than the layer takes, and a row "at the
        # floor" has no MFU; the floor is not what this test is about.
        report = profile_components(nn.Linear(512, 512), (torch.randn(256, 512),), **{**FAST, "harness_floor": False})
        row = report.row("")
        # The peak stays what was measured (before, it was raised to this very row's rate and
        # its MFU read exactly 100 % by construction): MFU = achieved FLOP/s / 1 FLOP/s.
        assert report.metadata["peaks"]["flops"] == 1.0
        assert row.mfu == pytest.approx(row.tflops * 1e12, rel=1e-12)
        assert "over_peak" in row.details["flags"]
        advice = report.metadata["quality"]["advice"]
        assert any("runs above the measured CPU peak (root at" in a and "peak_flops=<" in a for a in advice), advice
    finally:
        hw._clear_caches()


def test_a_wide_spread_with_many_runs_has_a_sure_median() -> None:
    from cb_callback._engine.derive.quality import is_noisy

    # totals alternate 1 and 2 ms: quartiles 1 and 2, median 1.5 -> noise 0.667 > 0.2
    wide = [Sample(t, 0.0, t, 0.0) for t in [1.0, 2.0] * 500]
    many = SampleSet(wide)
    assert many.noise == pytest.approx(1 / 1.5)
    # 1000 runs: notch 1.57 * 0.667 / sqrt(1000) = 0.033 <= 0.05 -> the median is sure
    assert not is_noisy(many)
    # 10 runs of the same spread: 1.57 * 0.667 / sqrt(10) = 0.33 > 0.05 -> noisy
    assert is_noisy(SampleSet(wide[:10]))
    assert not is_noisy(SampleSet([Sample(1.0, 0.0, 1.0, 0.0)] * 5))  # no spread at all


def test_steal_time_counts_as_a_busy_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    import cb_callback._engine.derive.quality as quality

    # 300 of 2000 jiffies stolen: 15 %; nothing else busy
    ticks = iter([quality.CpuTicks(0, 100, 10_000, 0, 0, (1,)), quality.CpuTicks(0, 400, 12_000, 0, 0, (1,))])
    monkeypatch.setattr(quality, "_cpu_ticks", lambda: next(ticks))
    load = LoadProbe(before=0.1, cpus=2)
    load.stop()
    assert load.steal == 0.15
    a = assess(_rows(), {"": _steady(10.0), "a": _steady(4.0)}, load=load, threads=1)
    assert a.quality["verdict"] == "contended" and a.quality["steal"] == 0.15
    assert "the hypervisor took 15% of the CPU time (steal)" in a.quality["advice"][0]


def test_a_machine_slower_than_it_was_is_contended_though_runs_agree() -> None:
    # every row's runs agree (noise 0), but the reference GEMM ran 1.6x its best
    a = assess(_rows(), {"": _steady(10.0), "a": _steady(4.0)}, load=quiet(), threads=1, slowdown=1.6)
    assert a.flags == {} and a.quality["verdict"] == "contended" and a.quality["slowdown"] == 1.6
    assert "a reference GEMM ran 1.6× slower than the fastest seen in this process" in a.quality["advice"][0]
    # 1.2x is within the threshold
    assert assess(_rows(), {"": _steady(10.0)}, load=quiet(), threads=1, slowdown=1.2).quality["verdict"] == "clean"


def test_the_canary_runs_before_every_round() -> None:
    log: list[str] = []

    def canary() -> float:
        log.append("canary")
        return 1e-3

    times: list[float] = []
    interleave(
        [fixed(1.0, log, "a")],
        budgets_s=[0.0],
        rounds=3,
        min_repeats=3,
        max_repeats=3,
        clock=Clock(),
        switches=lambda: 0,
        canary=canary,
        canary_s=times,
    )
    assert log == ["canary", "a", "canary", "a", "canary", "a"] and times == [1e-3] * 3


def test_share_of_a_root_called_twice_is_still_a_fraction_of_the_step() -> None:
    from cb_callback import Capture, profile_captured

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.GELU())
    with Capture(model) as cap:
        model(torch.randn(4, 16))
        model(torch.randn(4, 16))  # a siamese step: the root runs twice, so does every child
    report = profile_captured(model, cap.calls, config=BenchmarkConfig(**FAST))
    root = report.row("")
    assert root.calls == 2 and root.share == 1.0  # not 2.0
    for row in report:  # total_ms x calls / (root total_ms x root calls)
        assert row.share == row.total_ms * row.calls / (root.total_ms * 2)
