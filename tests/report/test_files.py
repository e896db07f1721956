"""Tests of the file reporter: report.json, components.csv and icicle PNGs."""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from cb_callback._report.context import ReportContext, Reporter
from cb_callback._report.files import FileReporter
from cb_callback._report.model import COLUMNS, ComponentRow, Report

NAN = math.nan


def _report() -> Report:
    rows = [
        ComponentRow(
            "", "Net", 0, None, "estimated", error="too large", calls=1, fwd_ms=4.0,
            bwd_ms=6.0, total_ms=10.0, fwd_flops=2e9, bwd_flops=4e9, tflops=0.6, mfu=0.125,
            peak_mem_mb=12.5, bytes=1e6, gbps=0.1, bound="memory", details={"note": "x"},
        ),
        ComponentRow("a", "Linear", 1, "", "ok", calls=2, fwd_ms=1.0, total_ms=1.0),
        ComponentRow("b", "ReLU", 1, "", "failed", error="RuntimeError: boom"),
    ]  # fmt: skip
    return Report(rows, {"device_name": "cpu", "peaks": {"flops": 1e12, "flops_source": "calibrated"}})


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x):
        return math.isnan(y)
    return bool(x == y) and type(x) is type(y)


def test_writes_every_file(tmp_path: Path) -> None:
    out = tmp_path / "run"
    reporter = FileReporter()
    assert isinstance(reporter, Reporter) and reporter.name == "files"
    paths = reporter.write(_report(), ReportContext(output_dir=out))
    names = [
        "report.json",
        "components.csv",
        "report.html",  # issue 9: the interactive report, with every report
        "icicle_mfu.png",
        "icicle_total_ms.png",
        "icicle_peak_mem_mb.png",
        "roofline.png",  # issue 26: every measured pass under the device's ceilings
    ]
    assert paths == [out / n for n in names]
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths)
    assert sorted(p.name for p in out.iterdir()) == sorted(names)
    csv = pd.read_csv(out / "components.csv")
    assert list(csv.columns) == list(COLUMNS)
    assert len(csv) == 3


def test_load_round_trip(tmp_path: Path) -> None:
    report = _report()
    FileReporter(icicle_metrics=()).write(report, ReportContext(output_dir=tmp_path))
    loaded = Report.load(tmp_path)
    assert loaded.metadata == report.metadata
    assert len(loaded) == len(report)
    for got, want in zip(loaded, report, strict=True):
        got_d, want_d = asdict(got), asdict(want)
        assert got_d.keys() == want_d.keys()
        for key, value in want_d.items():
            assert _same(got_d[key], value), (want.path, key, got_d[key], value)
    assert math.isnan(loaded.row("b").total_ms)


def test_no_output_dir_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert FileReporter().write(_report(), ReportContext(output_dir=None)) == []
    assert list(tmp_path.iterdir()) == []


def test_unknown_icicle_metric_fails_at_construction() -> None:
    with pytest.raises(ValueError, match="not supported"):
        FileReporter(icicle_metrics=("flops",))
