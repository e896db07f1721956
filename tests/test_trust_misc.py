"""Issue 7, numbers a user can trust: include keeps ancestors, any dtype keeps its report,
the time budget excludes calibration."""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import cb_callback._engine as engine_module
from cb_callback import _hardware as hw
from cb_callback import profile_components
from cb_callback._config import resolve_dtype
from cb_callback._tree import filter_reasons
from tests.conftest import FAST

PEAKS: dict[str, Any] = dict(peak_flops=1e11, peak_bandwidth=1e10)
OPTS: dict[str, Any] = {**FAST, **PEAKS}
_MIB = 2**20


@pytest.fixture(autouse=True)
def _fresh_peak_caches() -> Iterator[None]:
    hw._clear_caches()
    yield
    hw._clear_caches()


def _nested() -> nn.Module:
    # paths in report order: "", "0", "1", "0.0", "0.1"
    return nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), nn.Linear(4, 2))


def _ours(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if str(w.message).startswith("cb_callback:")]


# --- 1. include profiles the ancestors of what it matches ------------------------------


def test_include_profiles_the_ancestors_that_lead_to_matches() -> None:
    report = profile_components(_nested(), (torch.randn(2, 4),), include=["0.*"], **OPTS)
    assert [r.path for r in report] == ["", "0", "1", "0.0", "0.1"]
    # "0.0" and "0.1" match; "0" and the root lead to them; "1" neither
    assert [r.status for r in report] == ["ok", "ok", "skipped", "ok", "ok"]
    assert report.row("1").error == "not matched by include=['0.*']"
    assert report.row("0").fwd_flops == 2 * 2 * 4 * 4  # measured whole: its Linear(4 -> 4) on 2 rows


def test_exclude_wins_over_include_and_its_matches_keep_no_ancestors() -> None:
    paths = ["", "0", "1", "0.0", "0.1"]
    assert filter_reasons(paths, ["0.*"], ["0.1"]) == {
        "0.1": "matched exclude pattern '0.1'",
        "1": "not matched by include=['0.*']",
    }
    # an excluded ancestor stays skipped; the root still leads to "0.0" and "0.1"
    assert filter_reasons(paths, ["0.*"], ["0"]) == {
        "0": "matched exclude pattern '0'",
        "1": "not matched by include=['0.*']",
    }
    # the only match is excluded: nothing is kept, not even the root
    only = filter_reasons(paths, ["0.1"], ["0.1"])
    assert sorted(only) == sorted(paths)
    assert only["0.1"] == "matched exclude pattern '0.1'"
    assert only[""] == "not matched by include=['0.1']"


def test_an_include_pattern_matching_nothing_warns_once_with_real_paths() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = profile_components(_nested(), (torch.randn(2, 4),), include=["encoder.*", "0.0"], **OPTS)
    messages = [m for m in _ours(caught) if "include pattern" in m]
    assert messages == [
        "cb_callback: include pattern(s) ['encoder.*'] match no component, so they profile "
        "nothing; component paths look like ['0', '1', '0.0', '0.1'] (fnmatch globs on the "
        "dotted path, the root is '')"
    ]
    assert [r.status for r in report] == ["ok", "ok", "skipped", "ok", "skipped"]


# --- 2. a dtype without a peak keeps its report ----------------------------------------


class _FakeClock:
    """Stands in for ``_best_seconds``: every timed call takes 1 ms."""

    def __call__(self, fn: object, min_repeats: int, budget_s: float) -> tuple[float, float]:
        return 1e-3, 1e-3 * (min_repeats + 1)


def test_a_float64_model_is_profiled_against_a_measured_fp64_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hw, "_best_seconds", _FakeClock())
    model = nn.Linear(4, 2).double()
    report = profile_components(model, (torch.randn(3, 4, dtype=torch.float64),), **FAST)
    assert report.metadata["dtype"] == "fp64"
    peaks = report.metadata["peaks"]
    # 1 ms per GEMM: all sizes fit the budget and the largest wins, as for fp32
    assert peaks["flops"] == 2 * 2048**3 / 1e-3
    assert peaks["flops_source"] == "measured"
    assert "torch.float64" in peaks["reference"]
    assert peaks["bandwidth"] == 2 * 128 * _MIB / 1e-3  # read + write of the 128 MiB copy
    row = report.row("")
    assert row.status == "ok"
    assert row.fwd_flops == 2 * 3 * 4 * 2  # 48
    flops_per_s = (row.fwd_flops + row.bwd_flops) / (row.total_ms / 1e3)
    assert row.mfu == pytest.approx(flops_per_s / (2 * 2048**3 / 1e-3), rel=1e-9)


def test_a_dtype_without_any_peak_leaves_mfu_empty_with_one_warning() -> None:
    x = torch.randn(3, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = profile_components(nn.Linear(4, 2), (x,), dtype=torch.int8, peak_bandwidth=1e10, **FAST)
        profile_components(nn.Linear(4, 2), (x,), dtype=torch.int8, peak_bandwidth=1e10, **FAST)
    assert [m for m in _ours(caught) if "peak FLOP/s" in m] == [
        "cb_callback: no peak FLOP/s is known for torch.int8 (peaks exist for ('fp32', 'tf32', "
        "'bf16', 'fp16', 'fp8', 'fp64')), so MFU is left empty; pass peak_flops= (FLOP/s) to set it."
    ]
    assert first.metadata["dtype"] == "torch.int8"
    assert first.metadata["peaks"]["flops"] is None
    assert first.metadata["peaks"]["flops_source"] == "unknown"
    row = first.row("")
    assert row.status == "ok"
    assert math.isnan(row.mfu)
    assert row.bw_util == pytest.approx(row.bytes / (row.total_ms / 1e3) / 1e10, rel=1e-9)


def test_fp64_on_a_gpu_is_unknown_but_its_bandwidth_known(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hw, "_cuda_device_name", lambda device: "NVIDIA H100 80GB HBM3")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        peaks = hw.resolve_peaks("cuda", "fp64")
        hw.resolve_peaks("cuda", "fp64")
    assert _ours(caught) == [
        "cb_callback: the H100 SXM datasheet has no fp64 peak (the table records no FP64 rates), "
        "so MFU is left empty; pass peak_flops= (FLOP/s) to set it."
    ]
    assert (peaks.flops, peaks.flops_source) == (None, "unknown")
    assert (peaks.bandwidth, peaks.bandwidth_source) == (3.35e12, "datasheet")


def test_dtype_keys_and_the_typo_guard() -> None:
    assert resolve_dtype(torch.float64) == (torch.float64, "fp64")
    assert resolve_dtype("float64") == (torch.float64, "fp64")
    assert resolve_dtype("double") == (torch.float64, "fp64")
    assert resolve_dtype(torch.float8_e4m3fn) == (torch.float8_e4m3fn, "fp8")
    assert resolve_dtype(torch.int8) == (torch.int8, "torch.int8")
    for typo in ("float64", "int8", "torch.nothing"):
        with pytest.raises(ValueError, match="is not a peak key"):
            hw.resolve_peaks("cpu", typo, **PEAKS)


def test_lightning_64_true_keeps_its_report(tmp_path: Path) -> None:
    from cb_callback import ComponentBenchmark
    from cb_callback._callback import _precision_dtype
    from tests._callback_models import run_fit

    assert (_precision_dtype("64-true"), _precision_dtype("64")) == ("fp64", "fp64")
    cb = ComponentBenchmark(capture_step=1, **OPTS)
    run_fit(tmp_path, [cb], max_steps=2, logger=False, precision="64-true")
    assert cb.report is not None
    assert cb.report.metadata["dtype"] == "fp64"
    assert cb.report.metadata["precision"] == "64-true"
    assert {r.status for r in cb.report} == {"ok"}


# --- 3. the time budget starts after the calibration -----------------------------------


def test_the_calibration_is_outside_the_budget_and_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    real = engine_module.resolve_peaks

    def slow_calibration(*args: Any, **kwargs: Any) -> hw.Peaks:
        time.sleep(0.35)  # a calibration longer than the whole budget
        return real(*args, **kwargs)

    monkeypatch.setattr(engine_module, "resolve_peaks", slow_calibration)
    report = profile_components(_nested(), (torch.randn(2, 4),), max_total_time_s=0.3, **OPTS)
    assert report.row("").status == "ok"
    assert report.metadata["timing"]["calibration_s"] >= 0.35


def test_any_positive_budget_measures_the_root() -> None:
    report = profile_components(_nested(), (torch.randn(2, 4),), max_total_time_s=1e-9, **OPTS)
    assert [r.status for r in report] == ["ok", "skipped", "skipped", "skipped", "skipped"]
    assert "max_total_time_s=1e-09 spent" in (report.row("1").error or "")
