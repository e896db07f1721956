"""`cb diff` says what changed, within noise or not; `cb report` finds, filters and renders."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from cb_callback import ComponentRow, Report
from cb_callback._cli import main
from cb_callback._diff import compare_reports, format_diff


def _report(values: dict[str, tuple[float, float]], calls: dict[str, int] | None = None) -> Report:
    """Rows by path: (total_ms, noise); the root is ""."""
    calls = calls or {}
    rows = []
    for path, (total, noise) in values.items():
        parent = None if path == "" else (path.rsplit(".", 1)[0] if "." in path else "")
        rows.append(ComponentRow(path, "Net" if path == "" else "Linear", path.count(".") + (path != ""), parent,
                                 "ok", calls=calls.get(path, 1), total_ms=total, noise=noise))
    return Report(rows, {"device_name": "cpu", "dtype": "fp32"})


def test_changes_are_over_the_step_sorted_by_size_and_noise_aware() -> None:
    a = _report({"": (10.0, 0.02), "a": (2.0, 0.05), "b": (6.0, 0.01), "c": (1.0, 0.5)})
    # a: 2 ms -> 1.5 ms per call but called twice: 2 -> 3 ms over the step (+1, noise bound
    #    2 x max(0.05 x 2, 0.05 x 3) = 0.3: significant); b: 6 -> 3 (-3, bound 2 x 0.06 = 0.12);
    # c: 1 -> 1.4 (+0.4 within its noise: 2 x max(0.5, 0.7) = 1.4); the root 10 -> 8.
    b = _report({"": (8.0, 0.02), "a": (1.5, 0.05), "b": (3.0, 0.01), "c": (1.4, 0.5)}, calls={"a": 2})
    d = compare_reports(a, b)
    by = {c.path: c for c in d.changes}
    assert by["a"].change == 1.0 and by["a"].significant
    assert by["b"].change == -3.0 and by["b"].significant
    assert math.isclose(by["c"].change, 0.4) and not by["c"].significant
    lines = format_diff(d)
    assert lines[0] == "whole model: A 10.000 ms -> B 8.000 ms (-20.0 %)"
    assert lines[1] == "biggest movers: b -3.000 ms, a +1.000 ms"
    assert [ln.split()[0] for ln in lines[4:-1]] == ["b", "(root)", "a", "c"]  # by absolute change
    assert lines[-2].split()[-2:] == ["~", "~"]  # c: ratio not printed, marked not significant
    assert lines[-1].startswith("(~: the change is within the two runs' noise")


def test_two_runs_of_the_same_model_are_not_78x_apart(tmp_path: Path) -> None:
    # A tiny ReLU read 0.01 ms in one run and 0.78 ms in the other (noise 1.2): within noise.
    a = _report({"": (5.0, 0.05), "r": (0.01, 1.2)})
    b = _report({"": (5.1, 0.05), "r": (0.78, 1.2)})
    line = next(ln for ln in format_diff(compare_reports(a, b)) if ln.startswith("r "))
    assert line.split()[-2:] == ["~", "~"]
    assert "78" not in line.split()[-2]


def test_cb_diff_filters_depth_and_writes_a_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _report({"": (10.0, 0.02), "a": (2.0, 0.05), "a.x": (1.0, 0.05)}).save(tmp_path / "a")
    _report({"": (12.0, 0.02), "a": (5.0, 0.05), "a.x": (3.0, 0.05)}).save(tmp_path / "b")
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--depth", "1",
                 "--html", str(tmp_path / "diff.html")]) == 0
    out = capsys.readouterr().out.splitlines()
    table = [ln.split()[0] for ln in out[out.index(next(x for x in out if x.startswith("path"))) + 2:-2]]
    assert table == ["a", "(root)"]  # a +3 ms before the root +2 ms; a.x is deeper than 1
    page = (tmp_path / "diff.html").read_text()
    assert '"diff":{"metric":"total_ms"}' in page and '"change":3.0' in page
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--filter", "a.*", "--sort", "path"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in out if ln.startswith("a.")] == ["a.x"]


def test_cb_report_finds_the_report_under_a_lightning_log_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    logs = tmp_path / "lightning_logs"
    _report({"": (3.0, 0.1), "a": (2.0, 0.1)}).save(logs / "version_0" / "component_benchmark")
    assert main(["report", str(logs / "version_0"), "--html", "--filter", "a"]) == 0
    captured = capsys.readouterr()
    assert f"cb: using {logs / 'version_0' / 'component_benchmark' / 'report.json'}" in captured.err
    assert "components (1 of 2):" in captured.out
    assert (logs / "version_0" / "component_benchmark" / "report.html").is_file()
    assert main(["report", str(tmp_path / "empty")]) == 2  # no report: could not do it (cb report --help)
    assert "no report.json at or under" in capsys.readouterr().err


def test_rates_are_compared_per_call_and_fractions_in_percent() -> None:
    a = _report({"": (10.0, 0.02), "a": (2.0, 0.05)}, calls={"a": 4})
    b = _report({"": (10.0, 0.02), "a": (2.0, 0.05)}, calls={"a": 4})
    a.row("").mfu, b.row("").mfu = 0.25, 0.5
    a.row("a").mfu, b.row("a").mfu = 0.1, 0.1
    lines = format_diff(compare_reports(a, b, "mfu"))
    # MFU 25 % -> 50 % for the root; a's MFU is per call: 10 %, not 4 x 0.1
    assert lines[0] == "whole model: A 25.000 % -> B 50.000 % (+100.0 %)"
    header = next(ln for ln in lines if ln.startswith("path"))
    assert header.split()[2:5] == ["A", "mfu", "%"]
    row_a = next(ln for ln in lines if ln.startswith("a "))
    assert row_a.split()[2:4] == ["10.000", "10.000"]
