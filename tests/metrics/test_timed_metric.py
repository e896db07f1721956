"""The timing plugin contract (TimedMetric): the built-in latency is one; a user's replaces it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch
from torch import nn

from cb_callback import profile_components
from cb_callback._engine.clocks.timing import Sample, SampleSet
from cb_callback._engine.run.plugins import TimedMetric, validate_plugin
from cb_callback.plugins import LatencyMetric, MeasureContext


class FixedClock:
    """Every run takes 1 ms forward and 2 ms backward; counts the runs per component."""

    name = "fixed_clock"

    def __init__(self) -> None:
        self.runs: dict[str, int] = {}

    def sampler(self, ctx: MeasureContext) -> Callable[[], Sample]:
        def run() -> Sample:
            self.runs[ctx.path] = self.runs.get(ctx.path, 0) + 1
            return Sample(1.0, 2.0, 1.0, 2.0)

        return run

    def budget_s(self, ctx: MeasureContext) -> float:
        return 0.0

    def values(self, samples: SampleSet, ctx: MeasureContext) -> Mapping[str, Any]:
        return {
            "fwd_ms": samples.median("fwd_ms"),
            "bwd_ms": samples.median("bwd_ms"),
            "clock_runs": len(samples.samples),
        }


def test_the_built_in_latency_is_a_timed_metric() -> None:
    assert isinstance(LatencyMetric(), TimedMetric)


def test_a_users_timed_metric_replaces_the_latency_and_is_scheduled_like_it() -> None:
    clock = FixedClock()
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    report = profile_components(
        model, torch.randn(2, 4), metrics=[clock], warmup=3, rounds=2, min_repeats=4, max_repeats=4,
        min_run_time_s=0.0, load_plugins=False,
    )  # fmt: skip
    for row in report.rows:
        assert (row.fwd_ms, row.bwd_ms, row.total_ms) == (1.0, 2.0, 3.0), row.path
        assert row.details["clock_runs"] == 4  # min_repeats = max_repeats = 4 timed runs over 2 rounds
        assert "fwd_iqr_ms" not in row.details  # the built-in latency did not run
    # warmup=3: the instrumented pass was the first warm-up run, the engine made the other 2 with
    # the plugin's sampler; then round 1 times 1 run, round 2 the other 3 after one untimed run
    # (a slice of two or more starts with one): 2 + 1 + 1 + 3 = 7. Constant times: not noisy, a
    # child never slower than its parent, so no second look.
    assert clock.runs == {"": 7, "0": 7, "1": 7}


def test_a_timing_plugin_needs_all_three_hooks() -> None:
    class Half:
        name = "half"

        def sampler(self, ctx: MeasureContext) -> Callable[[], Sample]:
            raise NotImplementedError

    with pytest.raises(TypeError, match=r"timing plugin 'half' has sampler\(\) but no callable budget_s\(\) hook"):
        validate_plugin(Half(), "metric")


class Broken(FixedClock):
    name = "broken_clock"

    def sampler(self, ctx: MeasureContext) -> Callable[[], Sample]:
        raise RuntimeError("no clock here")


def test_a_users_timing_plugin_that_raises_fails_the_row_and_says_why() -> None:
    report = profile_components(nn.Linear(4, 4), torch.randn(2, 4), metrics=[Broken()], load_plugins=False)
    row = report.row("")
    # before: the row kept status not_run with no values, the error hidden in metric_errors
    assert (row.status, row.error) == ("failed", "broken_clock metric raised RuntimeError: no clock here")


def test_two_timing_plugins_are_refused() -> None:
    with pytest.raises(ValueError, match=r"metrics=\['fixed_clock', 'broken_clock'\]: one timing plugin"):
        profile_components(nn.Linear(4, 4), torch.randn(2, 4), metrics=[FixedClock(), Broken()], load_plugins=False)
