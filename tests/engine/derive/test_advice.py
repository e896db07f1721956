"""The quality advice (issue 23 §3): every sentence names its rows and the option to set, with a value or unit.

Rows and sample sets are crafted (no timing), so every sentence is asserted exactly.
"""

from __future__ import annotations

import re
from typing import Any

from cb_callback import BenchmarkConfig
from cb_callback._engine.clocks.timing import Sample, SampleSet
from cb_callback._engine.derive.advice import (
    at_least,
    count,
    figure,
    insitu_advice,
    label,
    method_advice,
    named,
    noisy_advice,
    parent_advice,
    peak_advice,
    times,
)
from cb_callback._engine.derive.quality import NOISY_THRESHOLD, LoadProbe, assess
from cb_callback._report.model import ComponentRow

CONFIG = BenchmarkConfig()  # min_run_time_s 0.1, min_repeats 5, max_repeats 1000, rounds 5


def _row(path: str, parent: str | None = "", **values: Any) -> ComponentRow:
    details = values.pop("details", {})
    values = {"status": "ok", "calls": 1} | values
    row = ComponentRow(path=path, module_type="M", depth=0 if parent is None else 1, parent=parent, **values)
    row.details.update(details)
    return row


def _runs(*totals: float) -> SampleSet:
    return SampleSet([Sample(t, 0.0, t, 0.0) for t in totals], rounds=5, timed_s=1.0)


#: Totals 1..5 ms: quartiles 2 and 4, median 3: noise 2 / 3 = 67 %; the notch 1.57 · 0.667 / √5 = 0.47 > 0.05.
NOISY = _runs(1.0, 2.0, 3.0, 4.0, 5.0)
STEADY = _runs(*[1.0] * 20)


# --- the helpers -------------------------------------------------------------------------------------------


def test_counts_have_the_right_plural_and_names_end_in_and_n_more() -> None:
    assert (count(1, "component"), count(2, "component"), count(0, "run")) == ("1 component", "2 components", "0 runs")
    assert (count(1, "child", "children"), count(3, "child", "children")) == ("1 child", "3 children")
    assert label("") == "root" and label("enc.0") == "enc.0"
    assert named(["a"]) == "a" and named(["a", "b", "c"]) == "a, b, c"
    assert named(["a", "b", "c", "d", "e"]) == "a, b, c and 2 more"  # the first 3, never "…"


def test_ratios_read_as_ratios_and_figures_to_three_significant_digits() -> None:
    assert (times(1.2), times(2.0), times(48.37), times(4837.0)) == ("1.20×", "2.00×", "48.4×", "4837×")
    assert (figure(0.04123), figure(1.2), figure(34.12), figure(1234.5)) == ("0.0412", "1.20", "34.1", "1234")
    # rounded up, so that "at least" holds for the figure it was taken from: 34.11e9 -> 3.42e10
    assert at_least(34.11e9) == ("3.42e10", 3.42e10) and at_least(34.1e9)[0] == "3.41e10"
    assert at_least(9.991e9) == ("1.00e10", 1e10)  # 999.1 rounds up into the next decade
    assert at_least(34.16e9, up=False)[0] == "3.42e10" and at_least(34.14e9, up=False)[0] == "3.41e10"


# --- each sentence -----------------------------------------------------------------------------------------


def test_one_noisy_component_is_named_with_its_spread_and_the_runs_it_needs() -> None:
    # (1.57 · 0.667 / 0.05)² = 438.2: 439 runs make the notch at most 5 % of the median
    assert noisy_advice({"": NOISY}, NOISY_THRESHOLD, CONFIG) == [
        "1 component varies by more than 20% between runs, too much for its few runs (noisy: root 67% over 5 runs): "
        "raise min_repeats to 439 (now 5), the runs a sure median needs at root's 67% spread, or min_run_time_s "
        "(now 0.1 s) or rounds (now 5)"
    ]


def test_several_noisy_components_most_spread_first_and_a_cap_that_is_too_low() -> None:
    wider = _runs(1.0, 1.0, 3.0, 5.0, 5.0)  # quartiles 1 and 5, median 3: noise 4 / 3 = 133 %
    sets = {"a": NOISY, "b": NOISY, "c": wider, "d": NOISY, "e": NOISY}
    config = BenchmarkConfig(max_repeats=100)
    # (1.57 · 1.333 / 0.05)² = 1752.9 runs for c, above max_repeats=100: both options are named
    assert noisy_advice(sets, NOISY_THRESHOLD, config) == [
        "5 components vary by more than 20% between runs, too much for their few runs (noisy: c 133% over 5 runs, "
        "a 67% over 5 runs, b 67% over 5 runs and 2 more): raise min_repeats (now 5) and max_repeats (now 100) to "
        "1753, the runs a sure median needs at c's 133% spread, or min_run_time_s (now 0.1 s) or rounds (now 5)"
    ]


def test_without_a_config_the_options_come_with_their_units() -> None:
    [text] = noisy_advice({"a": NOISY}, NOISY_THRESHOLD, None)
    assert text.endswith(
        "raise min_repeats to 439, the runs a sure median needs at a's 67% spread, or "
        "min_run_time_s=<s> or rounds=<count>"
    )


def test_children_slower_than_their_parents_are_named_as_ratios() -> None:
    rows = {r.path: r for r in [_row("", None, total_ms=10.0), _row("a", total_ms=6.0, calls=2), _row("b")]}
    # a: 6 ms × 2 calls per call of the root = 12 ms over 10 ms: 1.20×; b has no time: only "b > root"
    assert parent_advice([("b", ""), ("a", "")], rows, CONFIG) == [
        "2 children measured slower than their parents (slower_than_parent: a 1.20× root, b > root): noise or "
        "isolation overhead; treat both rows' times as uncertain; if it is noise, raising min_run_time_s (now 0.1 s) "
        "or rounds (now 5) settles it"
    ]
    assert parent_advice([("a", "")], rows, None)[0].startswith(
        "1 child measured slower than its parent (slower_than_parent: a 1.20× root)"
    )


def test_the_row_over_its_cache_ceiling_is_named_with_its_gbps_and_the_option_in_bytes_per_s() -> None:
    relu = _row("relu", gbps=34.1, bw_util=2.0, details={"bw_ceiling": {"level": "L2", "gbps": 20.3}})
    # BenchmarkConfig.peak_bandwidth is in bytes/s: 34.1 GB/s is 3.41e10
    assert peak_advice([], [relu], {}) == [
        "1 component moves bytes faster than its bandwidth ceiling (the memory level its data fit, "
        "details['bw_ceiling'], else the device's peak): relu at 34.1 GB/s over L2's 20.3 GB/s; the ceiling is too "
        "low or the time too short to be true; pass peak_bandwidth=<bytes/s, at least 3.41e10, i.e. 34.1 GB/s> "
        "(it replaces every row's per-level ceiling measured on this CPU)"
    ]


def test_rows_over_the_devices_bandwidth_peak_most_over_first() -> None:
    # no levels (a GPU): the ceiling is gbps / bw_util = 3000 GB/s for each
    rows = [
        _row(p, gbps=g, bw_util=g / 3000.0) for p, g in [("a", 3100.0), ("b", 3500.0), ("c", 3050.0), ("d", 3200.0)]
    ]
    assert peak_advice([], rows, {}) == [
        "4 components move bytes faster than their bandwidth ceiling (the memory level their data fit, "
        "details['bw_ceiling'], else the device's peak): b at 3500 GB/s over the device's 3000 GB/s peak, d at 3200 "
        "GB/s over the device's 3000 GB/s peak, a at 3100 GB/s over the device's 3000 GB/s peak and 1 more; the "
        "ceiling is too low or the time too short to be true; pass peak_bandwidth=<bytes/s, at least 3.50e12, "
        "i.e. 3500 GB/s>"
    ]


def test_rows_over_the_flops_peak_name_the_figure_that_would_fit() -> None:
    rows = [_row("", None, mfu=1.3, tflops=0.13), _row("fc", mfu=2.5, tflops=0.25)]
    # fc runs at 0.25 TFLOP/s = 2.5e11 FLOP/s, the highest MFU first
    assert peak_advice(rows, [], {"flops": 1e11, "flops_source": "measured"}) == [
        "2 components run above the measured CPU peak (fc at 250% MFU, root at 130% MFU): the GEMM calibration read "
        "low; the best figure is kept per machine, so a run on a quiet machine raises it (CB_CACHE_DIR), or pass "
        "peak_flops=<FLOP/s, at least 2.50e11>"
    ]
    # a datasheet peak; a row whose TFLOP/s is unknown is priced at the peak × its MFU: 1e15 × 1.3
    assert peak_advice([_row("", None, mfu=1.3)], [], {"flops": 1e15, "flops_source": "datasheet"}) == [
        "1 component runs above the device's FLOP/s peak (root at 130% MFU): the peak is too low for this dtype "
        "(see metadata['peaks']); pass peak_flops=<FLOP/s, at least 1.30e15>"
    ]
    assert peak_advice([_row("", None, mfu=1.3)], [], {})[0].endswith("pass peak_flops=<FLOP/s>")


def test_a_peak_calibrated_on_a_busy_machine_names_the_option_with_its_unit() -> None:
    note = {"machine": "busy", "used": "measured"}  # measured now, on a busy machine, nothing better kept
    peaks = {"flops": 1.234e11, "flops_source": "measured", "calibration": {"gemm float32": note}}
    assert peak_advice([], [], peaks) == [
        "the CPU FLOP/s peak was calibrated on a busy machine with no better figure kept for it: MFU may read too "
        "high; profile once on a quiet machine (the best calibration is kept) or pass peak_flops=<FLOP/s> "
        "(measured: 1.23e11)"
    ]


def test_insitu_mismatches_are_named_farthest_apart_first() -> None:
    rows = [_row("a", fwd_ms=1.0, insitu_ms=2.0), _row("", None, fwd_ms=0.5, insitu_ms=3.0)]
    # the root 6×, a 2×
    assert insitu_advice(rows) == [
        "2 components run differently alone than in the step (insitu_mismatch: root 0.500 ms alone vs 3.00 ms in the "
        "step, a 1.00 ms alone vs 2.00 ms in the step): their isolated fwd_ms and in-situ insitu_ms disagree beyond "
        "both rows' noise; isolation misses what their neighbours leave (caches, lazy initialisation) or the replay "
        "takes another path"
    ]
    assert insitu_advice(rows[:1])[0].startswith("1 component runs differently alone than in the step (insitu_")


def test_the_methods_limits_name_their_rows_with_the_right_verbs() -> None:
    assert method_advice(["", "a", "b", "c"], [], {}) == [
        "4 components run within the harness floor's noise (at_floor: root, a, b and 1 more): isolation cannot tell "
        "their time from a replay that does nothing, so it is at most the floor's spread (details['floor_ms']) and no "
        "TFLOP/s, GB/s, MFU or bound is derived from it"
    ]
    assert method_advice([], [("layers", "", 2.0)], {}) == [
        "1 estimated component exceeds its measured parent (above_parent: layers 2.00× root): an estimate sums its "
        "children's isolated replays, each paying isolation's per-replay cost that the parent's one replay pays "
        "once; read the parent's time, the estimate is no lower bound here"
    ]
    own = {"hash_reduced": ["emb"], "hash_collapsed": [], "derived_negative": ["x", "y"]}
    assert method_advice([], [], own) == [
        "1 component (hash_reduced: emb) is timed on a hash-size-reduced table: its times come from the shrunk "
        "table (the row's details say which columns are the real table's)",
        "2 components (derived_negative: x, y) have a value derived by subtraction that would go below zero (two "
        "separately measured times): it is not a measurement of either; read the row's details",
    ]


# --- every sentence through assess -------------------------------------------------------------------------


def _every_kind() -> tuple[list[ComponentRow], dict[str, SampleSet]]:
    """Rows that trigger each advice: noisy, slower_than_parent, over the FLOP/s peak and over a bandwidth
    ceiling, insitu_mismatch, at_floor, above_parent and an own flag."""
    rows = [
        _row("", None, total_ms=10.0, fwd_ms=10.0, mfu=0.5),
        _row("noisy", total_ms=3.0, mfu=0.1),
        _row("slow", total_ms=12.0, mfu=0.1),  # 12 ms > 10 ms × 1.1: it and the root
        _row("gemm", total_ms=1.0, mfu=1.3, tflops=0.13),
        _row("relu", total_ms=1.0, mfu=0.01, gbps=34.1, details={"bw_ceiling": {"level": "L2", "gbps": 20.3}}),
        _row("solo", total_ms=1.0, fwd_ms=0.5, insitu_ms=3.0, mfu=0.1),  # 6× apart, no noise
        _row("tiny", total_ms=0.0, details={"floor_ms": {"at_floor": ["fwd"]}}),
        _row("emb", total_ms=1.0, details={"own_flags": ["hash_reduced"]}),
        _row("layers", status="estimated", total_ms=30.0),  # 3× its measured parent
    ]
    samples = {r.path: STEADY for r in rows if r.status == "ok"} | {"noisy": NOISY}
    return rows, samples


def test_every_advice_names_a_flagged_row_and_no_option_is_left_bare() -> None:
    rows, samples = _every_kind()
    # a load average of 3.9 on 2 CPUs with 1 thread: the machine's own sentence too
    a = assess(rows, samples, load=LoadProbe(before=3.9, after=3.9, cpus=2), threads=1, config=CONFIG, peaks={})
    advice = a.quality["advice"]
    assert a.quality["verdict"] == "contended" and len(advice) == 9, advice  # the machine + 8 kinds of row
    for text in advice:
        assert not text.rstrip().endswith("="), text
        assert not re.search(r"=(?!<|\w)", text), text  # every option is followed by its value or <unit>
        assert not re.search(r"\b1 (components|rows|children|runs)\b", text), text
        assert "…" not in text, text
    machine, *row_advice = advice
    assert machine.startswith("the machine was busy while profiling")  # about the machine, not a row
    flagged = {label(p) for p in a.flags}
    for text in row_advice:
        assert any(re.search(rf"(?<![\w.]){re.escape(p)}(?![\w.])", text) for p in flagged), text
    # and each names the very row it is about
    expected = ["noisy", "slow", "gemm", "relu", "solo", "tiny", "layers", "emb"]
    assert [next(p for p in expected if re.search(rf"\b{p}\b", t)) for t in row_advice] == expected
