"""CPU peaks that do not depend on the load, and bandwidth ceilings that match the working set."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from cb_callback import profile_components
from cb_callback._engine.derive.quality import LoadProbe, assess
from cb_callback._hardware import cache as _peak_cache
from cb_callback._hardware import calibration as cal
from cb_callback._hardware import peaks as hw
from cb_callback._hardware.peaks import CacheLevel, Peaks, bandwidth_ceiling
from cb_callback._report.model import ComponentRow
from tests.conftest import FAST

BEST_GEMM = 2 * 2048**3  # FLOPs of the largest calibration GEMM: all four sizes fit when each call takes <= 1 ms


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    hw._clear_caches()
    yield
    hw._clear_caches()


class Clock:
    """Stands in for ``_best_seconds``: every timed call takes ``best`` seconds."""

    def __init__(self, best: float) -> None:
        self.best = best
        self.calls = 0

    def __call__(self, fn: object, min_repeats: int, budget_s: float) -> tuple[float, float]:
        self.calls += 1
        return self.best, self.best * (min_repeats + 1)


def _machine(monkeypatch: pytest.MonkeyPatch, busy: bool) -> None:
    monkeypatch.setattr(cal, "machine_busy", lambda threads: (busy, {"others": 0.9 if busy else 0.0, "load": None}))
    cal._BUSY.clear()


def _kept() -> dict[str, Any]:
    return json.loads(_peak_cache.cache_file().read_text())


def test_a_busy_machine_uses_the_best_kept_calibration_without_measuring(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(1e-3)
    monkeypatch.setattr(cal, "_best_seconds", clock)
    _machine(monkeypatch, busy=False)
    quiet = cal.measure_cpu_flops(torch.float32)
    assert quiet == BEST_GEMM / 1e-3 and clock.calls == 8  # 4 sizes x 2 layouts
    (entry,) = _kept().values()
    assert entry["value"] == quiet and entry["runs"] == 1
    # A new process (this one's figures forgotten) under load: every GEMM would take 10x as long.
    hw._clear_caches()
    clock.best = 1e-2
    _machine(monkeypatch, busy=True)
    assert cal.measure_cpu_flops(torch.float32) == quiet  # the kept best, not 1/10 of it
    assert clock.calls == 8  # nothing measured
    note = cal.calibration_notes()["gemm float32"]
    assert (note["used"], note["measured"], note["machine"]) == ("cache", None, "busy")
    peaks = hw.resolve_peaks("cpu", "fp32", peak_bandwidth=1.0)
    assert peaks.flops == quiet
    assert "the best kept for this machine, 1 runs" in peaks.reference and "busy: not measured" in peaks.reference
    assert peaks.to_metadata()["calibration"]["gemm float32"]["used"] == "cache"


def test_a_quiet_rerun_keeps_the_better_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(1e-3)
    monkeypatch.setattr(cal, "_best_seconds", clock)
    _machine(monkeypatch, busy=False)
    first = cal.measure_cpu_flops(torch.float32)
    hw._clear_caches()
    _machine(monkeypatch, busy=False)
    clock.best = 2e-3  # slower now (4 sizes still fit: 2 ms per call)
    assert cal.measure_cpu_flops(torch.float32) == first  # the kept best wins
    assert cal.calibration_notes()["gemm float32"]["measured"] == BEST_GEMM / 2e-3
    (entry,) = _kept().values()
    assert (entry["value"], entry["runs"]) == (first, 2)
    hw._clear_caches()
    _machine(monkeypatch, busy=False)
    clock.best = 5e-4  # faster: the kept figure rises
    assert cal.measure_cpu_flops(torch.float32) == BEST_GEMM / 5e-4
    assert next(iter(_kept().values()))["value"] == BEST_GEMM / 5e-4


def test_a_busy_first_calibration_is_used_not_kept_and_the_report_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cal, "_best_seconds", Clock(1e-3))
    _machine(monkeypatch, busy=True)
    assert cal.measure_cpu_flops(torch.float32) == BEST_GEMM / 1e-3
    assert not _peak_cache.cache_file().exists()  # a busy figure could only be too low: never kept
    report = profile_components(nn.Linear(8, 8), (torch.randn(4, 8),), peak_bandwidth=1e10, **FAST)
    advice = report.metadata["quality"]["advice"]
    assert any("calibrated on a busy machine with no better figure kept" in a for a in advice), advice


def test_the_persistent_cache_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cal, "_best_seconds", Clock(1e-3))
    monkeypatch.setenv("CB_PEAK_CACHE", "0")
    _machine(monkeypatch, busy=False)
    cal.measure_cpu_flops(torch.float32)
    assert not _peak_cache.cache_file().exists()


def test_cache_levels_take_out_the_call_overhead_and_never_fall_below_a_larger_level(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _machine(monkeypatch, busy=False)
    monkeypatch.setattr(cal, "cpu_cache_levels", lambda: (("L1", 48 << 10), ("L2", 1 << 20), ("L3", 32 << 20)))
    readings = {48 << 10: None, 1 << 20: 5e10, 32 << 20: 1e11}
    monkeypatch.setattr(cal, "_level_bandwidth", lambda size: readings[size])
    monkeypatch.setattr(cal, "_best_seconds", Clock(1e-2))  # the DRAM copy: 2 * 128 MiB / 10 ms
    levels = cal.measure_cpu_cache_bandwidths()
    dram = 2 * (128 << 20) / 1e-2  # 2.68e10 (128 MiB = 4 x the 32 MiB L3)
    # L2 read 5e10 but L3 1e11: data that fit L2 fit L3, so L2's ceiling is 1e11; L1 too small to time.
    assert levels == (
        CacheLevel("L1", 48 << 10, None),
        CacheLevel("L2", 1 << 20, 1e11),
        CacheLevel("L3", 32 << 20, 1e11),
        CacheLevel("DRAM", None, dram),
    )


def test_a_level_copy_is_net_of_its_overhead(monkeypatch: pytest.MonkeyPatch) -> None:
    def clock(fn: Callable[[], object], min_repeats: int, budget_s: float) -> tuple[float, float]:
        return (3e-3 if fn.__name__ == "copies" else 1e-3), 0.0  # type: ignore[attr-defined]

    monkeypatch.setattr(cal, "_best_seconds", clock)
    # 1 MiB L2: a 256 KiB source, 4 MiB / 256 KiB = 16 copies a call; net 3 - 1 = 2 ms:
    # 2 * 256 KiB * 16 / 2e-3 = 4.194304e9 bytes/s
    assert cal._level_bandwidth(1 << 20) == 2 * (256 << 10) * 16 / 2e-3
    # overhead three quarters of the call or more: not a bandwidth
    monkeypatch.setattr(cal, "_best_seconds", lambda fn, m, b: ((1.3e-3 if fn.__name__ == "copies" else 1e-3), 0.0))
    assert cal._level_bandwidth(1 << 20) is None


LEVELS = (
    CacheLevel("L1", 48 << 10, None),
    CacheLevel("L2", 1 << 20, 1.3e11),
    CacheLevel("L3", 32 << 20, 1.0e11),
    CacheLevel("DRAM", None, 3.4e10),
)
PEAKS = Peaks("cpu", "fp32", 1e12, 3.4e10, "measured", "measured", "r", levels=LEVELS)


def test_the_ceiling_is_the_smallest_measured_level_the_working_set_fits() -> None:
    assert bandwidth_ceiling(PEAKS, 65536).name == "L2"  # type: ignore[union-attr]  # > nothing in L1 (untimed)
    assert bandwidth_ceiling(PEAKS, 2 << 20).name == "L3"  # type: ignore[union-attr]
    assert bandwidth_ceiling(PEAKS, 40 << 20).name == "DRAM"  # type: ignore[union-attr]
    assert bandwidth_ceiling(PEAKS, None).name == "DRAM"  # type: ignore[union-attr]
    assert bandwidth_ceiling(Peaks("gpu", "bf16", 1e15, 4.8e12, "datasheet", "datasheet", "r"), 65536) is None


def _row(path: str, gbps: float, ceiling: float | None) -> ComponentRow:
    row = ComponentRow(path=path, module_type="ReLU", depth=1, parent="", status="ok", calls=1, total_ms=1.0)
    row.gbps, row.bw_util, row.mfu = gbps, gbps / 34.0, 0.01
    if ceiling is not None:
        row.details["bw_ceiling"] = {"level": "L2", "gbps": ceiling}
    return row


def test_over_peak_is_judged_against_the_working_sets_ceiling() -> None:
    rows = [
        _row("in_cache", 84.0, 130.0),  # 247 % of DRAM's 34 GB/s, under its L2 ceiling: fine
        _row("too_fast", 150.0, 130.0),  # above its own level's ceiling
        _row("no_levels", 40.0, None),  # a GPU row: bw_util 40 / 34 > 1
    ]
    out = assess(rows, {}, load=LoadProbe(before=None), threads=1)
    assert "in_cache" not in out.flags  # before: over_peak (bw_util 2.47 > 1)
    assert out.flags["too_fast"] == ["over_peak"] and out.flags["no_levels"] == ["over_peak"]
    assert any("bandwidth ceiling (the memory level their data fit" in a for a in out.quality["advice"])


def test_a_relus_working_set_is_its_four_tensors() -> None:
    x = torch.randn(64, 64, requires_grad=True)
    report = profile_components(nn.ReLU(), (x,), peak_flops=1e12, **FAST)
    row = report.row("")
    # forward: relu reads x, writes y; backward: threshold_backward reads grad_y and y, writes
    # grad_x: 4 distinct [64, 64] float32 storages of 16 KiB
    assert row.details["working_set_bytes"] == 4 * 64 * 64 * 4
    level = row.details["bw_ceiling"]["level"]
    assert level == bandwidth_ceiling(hw.resolve_peaks("cpu", "fp32", peak_flops=1e12), 65536).name  # type: ignore[union-attr]
    assert math.isfinite(row.details["bw_ceiling"]["gbps"])


def test_cache_file_location(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CB_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert _peak_cache.cache_file() == tmp_path / "cb_callback" / "peaks.json"
    monkeypatch.setenv("CB_CACHE_DIR", str(tmp_path / "x"))
    assert _peak_cache.cache_file() == tmp_path / "x" / "peaks.json"
