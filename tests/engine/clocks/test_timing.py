"""Timing logic with a fake clock: repeats, budget, median and IQR."""

from __future__ import annotations

import torch

from cb_callback._engine.clocks.timing import time_fn


class FakeClock:
    """Advances by ``step`` seconds on every reading."""

    def __init__(self, step: float) -> None:
        self.t = 0.0
        self.step = step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def test_repeats_stop_when_the_budget_is_spent() -> None:
    calls: list[int] = []
    clock = FakeClock(0.25)  # binary-exact steps
    timing = time_fn(
        calls.append,
        setup=lambda: 1,
        device=torch.device("cpu"),
        warmup=2,
        min_run_time_s=1.0,
        min_repeats=1,
        max_repeats=100,
        clock=clock,
    )
    # Readings: start .25; run 1 reads .5 and .75 (250 ms), budget check 1.0 - .25 = .75 < 1;
    # run 2 reads 1.25 and 1.5, check 1.75 - .25 = 1.5 >= 1: stop after 2 runs.
    assert timing.device_ms == [250.0, 250.0]
    assert timing.host_ms == [250.0, 250.0]
    assert calls == [1] * (2 + 2)  # 2 warm-ups (untimed) + 2 timed runs, each on setup()
    assert timing.median == 250.0 and timing.iqr == 0.0


def test_min_and_max_repeats() -> None:
    t = time_fn(
        lambda _: None,
        device=torch.device("cpu"),
        warmup=0,
        min_run_time_s=0.0,
        min_repeats=5,
        max_repeats=100,
        clock=FakeClock(1.0),
    )
    assert t.repeats == 5  # the budget is spent at once, the minimum still runs
    t = time_fn(
        lambda _: None,
        device=torch.device("cpu"),
        warmup=0,
        min_run_time_s=1e9,
        min_repeats=1,
        max_repeats=7,
        clock=FakeClock(1e-3),
    )
    assert t.repeats == 7


def test_median_and_iqr_of_known_samples() -> None:
    from cb_callback._engine.clocks.timing import Timing

    t = Timing(device_ms=[1.0, 2.0, 3.0, 4.0, 100.0], host_ms=[1.0] * 5)
    assert t.median == 3.0
    assert t.iqr == 4.0 - 2.0  # quartiles by linear interpolation: 2.0 and 4.0


class _Sleeps(torch.nn.Module):
    """A forward that sleeps ``ms`` after a Linear: its runs agree within sleep's overshoot."""

    def __init__(self, ms: float) -> None:
        super().__init__()
        self.ms = ms
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import time

        time.sleep(self.ms / 1e3)
        return self.lin(x)


def test_a_component_longer_than_its_budget_stops_at_two_agreeing_runs_not_min_repeats() -> None:
    from cb_callback import profile_components

    opts = dict(max_depth=0, insitu_passes=0, min_run_time_s=0.1, min_repeats=5, rounds=5, warmup=1)
    # 250 ms a forward against a budget of 2 × 0.1 s (forward and backward): one run takes the whole
    # budget. Two sleeps of 250 ms are a few ms apart at most (well under SETTLE_NOISE's 10 % for two
    # runs), so the second run settles it: 2 timed runs, not min_repeats=5.
    (root,) = profile_components(_Sleeps(250.0), torch.randn(2, 4), **opts).rows
    assert root.status == "ok" and root.details["fwd_repeats"] == 2 and root.details["timing"]["settled"] is True
    assert root.fwd_ms >= 250.0
    # 1 ms a forward: the budget asks about 0.2 / 0.001 runs, far above min_repeats, and none settles early.
    (short,) = profile_components(_Sleeps(1.0), torch.randn(2, 4), **opts).rows
    assert short.details["fwd_repeats"] >= 5 and short.details["timing"]["settled"] is False
