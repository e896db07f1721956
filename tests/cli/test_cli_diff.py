"""`cb diff` says what changed, within noise or not; `cb report` finds, filters and renders."""

from __future__ import annotations

import errno
import math
import re
from pathlib import Path
from typing import Any

import pytest

from cb_callback import ComponentRow, Report
from cb_callback._cli import main
from cb_callback._report.diff import compare_reports, format_diff


def _report(values: dict[str, tuple[float, float]], calls: dict[str, int] | None = None) -> Report:
    """Rows by path: (total_ms, noise); the root is ""."""
    calls = calls or {}
    rows = []
    for path, (total, noise) in values.items():
        parent = None if path == "" else (path.rsplit(".", 1)[0] if "." in path else "")
        rows.append(
            ComponentRow(
                path,
                "Net" if path == "" else "Linear",
                path.count(".") + (path != ""),
                parent,
                "ok",
                calls=calls.get(path, 1),
                total_ms=total,
                noise=noise,
            )
        )
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
    assert lines[0] == "whole model: A 10.0 ms -> B 8.00 ms (-20.0 %)"  # 3 significant figures (numbers.sig)
    assert lines[1] == "biggest movers: b -3.00 ms, a +1.00 ms"
    assert [ln.split()[0] for ln in lines[4:-1]] == ["b", "(root)", "a", "c"]  # by absolute change
    assert lines[-2].split()[-2:] == ["1.40×", "noise"]  # c: the measured ratio 1.4 / 1, marked not significant
    assert _line(lines, "a")[-2:] == ["1.50×", "slower"]  # 3 / 2 beyond the noise
    assert _line(lines, "b")[-2:] == ["0.500×", "faster"]  # 3 / 6
    assert lines[-1].startswith("(B/A: B ÷ A as measured; sig: slower / faster beyond the two runs'")


def test_two_runs_of_the_same_model_are_not_78x_apart(tmp_path: Path) -> None:
    # A tiny ReLU read 0.01 ms in one run and 0.78 ms in the other (noise 1.2): within noise.
    a = _report({"": (5.0, 0.05), "r": (0.01, 1.2)})
    b = _report({"": (5.1, 0.05), "r": (0.78, 1.2)})
    line = next(ln for ln in format_diff(compare_reports(a, b)) if ln.startswith("r "))
    # the measured ratio shows (0.78 / 0.01 = 78.0; it was hidden as "≈1×"), but the sig column says noise:
    # it is never presented as "78× slower"
    assert line.split()[-2:] == ["78.0×", "noise"]
    assert "slower" not in line


def test_cb_diff_filters_depth_and_writes_a_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _report({"": (10.0, 0.02), "a": (2.0, 0.05), "a.x": (1.0, 0.05)}).save(tmp_path / "a")
    _report({"": (12.0, 0.02), "a": (5.0, 0.05), "a.x": (3.0, 0.05)}).save(tmp_path / "b")
    assert (
        main(["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--depth", "1", "--html", str(tmp_path / "diff.html")])
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    table = [ln.split()[0] for ln in out[out.index(next(x for x in out if x.startswith("path"))) + 2 : -2]]
    assert table == ["a", "(root)"]  # a +3 ms before the root +2 ms; a.x is deeper than 1
    page = (tmp_path / "diff.html").read_text()
    assert '"diff":{"metric":"total_ms","label":' in page and '"change":3.0' in page
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--filter", "a.*", "--sort", "path"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in out if ln.startswith("a.")] == ["a.x"]


def test_cb_diff_html_it_cannot_write_exits_2_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # 2, could not do it: never 1, which a CI job reads as "the gate failed"; and no traceback
    _report({"": (10.0, 0.02)}).save(tmp_path / "a", html=False)
    _report({"": (10.0, 0.02)}).save(tmp_path / "b", html=False)
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    (tmp_path / "afile").write_text("")
    cases = [
        (tmp_path, f"cannot write {tmp_path}: it is a directory (--html takes a file: {tmp_path / 'diff.html'}, say)"),
        # the parent is a file: the error names the parent, the file mkdir could not make a directory of
        (tmp_path / "afile" / "d.html", f"cannot write {tmp_path / 'afile' / 'd.html'}: [Errno 17] File exists: "),
    ]
    for target, expected in cases:
        for gate in ([], ["--fail-over", "10"]):  # the gate passed: the page it could not write decides
            assert main(["diff", a, b, "--html", str(target), *gate]) == 2
            err = capsys.readouterr().err
            assert err.startswith(f"cb: error: --html: {expected}") and err.count("\n") == 1, err
    real = Path.write_text

    def denied(self: Path, *args: Any, **kwargs: Any) -> int:
        if self.suffix == ".html":
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", denied)
    assert main(["diff", a, b, "--html", str(tmp_path / "x.html")]) == 2
    assert capsys.readouterr().err == f"cb: error: --html: cannot write {tmp_path / 'x.html'}: Permission denied\n"
    # cb report --html: the same, 2 (cb report has no 1)
    assert main(["report", a, "--html"]) == 2
    assert capsys.readouterr().err == f"cb: error: cannot write {tmp_path / 'a' / 'report.html'}: Permission denied\n"
    monkeypatch.undo()
    (tmp_path / "b" / "report.html").mkdir()
    assert main(["report", b, "--html"]) == 2
    assert capsys.readouterr().err == f"cb: error: cannot write {tmp_path / 'b' / 'report.html'}: it is a directory\n"


def test_cb_report_finds_the_report_under_a_lightning_log_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = tmp_path / "lightning_logs"
    _report({"": (3.0, 0.1), "a": (2.0, 0.1)}).save(logs / "version_0" / "component_benchmark")
    assert main(["report", str(logs / "version_0"), "--html", "--filter", "a"]) == 0
    captured = capsys.readouterr()
    assert f"cb: using {logs / 'version_0' / 'component_benchmark' / 'report.json'}" in captured.err
    # the one listing: "a" matches the path a (and its type, Linear), not the root (Net)
    assert "\ncomponents (1 of 2; filter 'a' (path or type); in the report's order):\n" in captured.out
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
    assert lines[0] == "whole model: A 25.0 % -> B 50.0 % (+100 %)"  # numbers.percent
    header = next(ln for ln in lines if ln.startswith("path"))
    assert header.split()[2:6] == ["A", "mfu", "B", "mfu"]  # the unit is in the cells
    assert _line(lines, "a")[2:5] == ["10.0 %", "10.0 %", "0"]


def _tree(root: str, children: dict[str, str], **values: dict[str, float]) -> Report:
    """A root of type ``root`` (path "") and ``children`` {path: type}; ``values`` {column: {path: value}}.

    Every row is timed with noise 0.1 (a 20 % timing spread: 2 x 0.1 x value bounds "within noise"),
    called once unless ``values["calls"]`` says otherwise.
    """
    rows = [ComponentRow("", root, 0, None, "ok", calls=1, total_ms=1.0, noise=0.1)]
    for path, kind in children.items():
        parent = path.rsplit(".", 1)[0] if "." in path else ""
        rows.append(ComponentRow(path, kind, path.count(".") + 1, parent, "ok", calls=1, total_ms=1.0, noise=0.1))
    for column, by_path in values.items():
        for row in rows:
            if row.path in by_path:
                setattr(row, column, int(by_path[row.path]) if column == "calls" else by_path[row.path])
    return Report(rows, {"device_name": "cpu", "dtype": "fp32"})


def _line(lines: list[str], path: str) -> list[str]:
    """A table line's cells: columns are 2 spaces apart, a cell (``25.0 %``, ``1.10 TB``) holds at most 1."""
    return re.split(r" {2,}", next(ln for ln in lines if ln.split()[0] == (path or "(root)")).strip())


def test_flops_and_bytes_are_exact_counts_not_judged_by_the_timing_noise() -> None:
    a = _tree(
        "Net",
        {"relu": "ReLU", "fc": "Linear"},
        fwd_flops={"": 1e9, "relu": 0.0, "fc": 1e9},
        bytes={"": 2.0**40, "relu": 2.0**40, "fc": 0.0},
    )
    b = _tree(
        "Net",
        {"relu": "ReLU", "fc": "Linear"},
        fwd_flops={"": 1.2e9, "relu": 0.0, "fc": 1.2e9},
        bytes={"": 2.0**40 + 1, "relu": 2.0**40, "fc": 0.0},
    )
    lines = format_diff(compare_reports(a, b, "fwd_flops"))
    # 1e9 -> 1.2e9 FLOPs: +2e8, B/A = 1.2 exactly a change (the timing bound 2 x 0.1 x 1.2e9 = 2.4e8 would
    # have called it noise; a FLOP count has none); 0 -> 0 for the ReLU: unchanged (B/A undefined: "-").
    assert lines[0] == "whole model: A 1.00 GFLOP -> B 1.20 GFLOP (+20.0 %)"  # numbers.si
    assert lines[1] == "biggest movers: fc +200 MFLOP"
    assert _line(lines, "fc")[2:] == ["1.00 GFLOP", "1.20 GFLOP", "+200 MFLOP", "1.20×", "higher"]
    assert _line(lines, "relu")[2:] == ["0 FLOP", "0 FLOP", "0", "-", "unchanged"]
    assert lines[-1].startswith("(fwd_flops is a count or a size, not a time: any difference is a change")
    # bytes 2**40 -> 2**40 + 1: differ by one, counts compare exactly -> a change of +1 B (shown whole),
    # +100 / 2**40 = +9.09e-11 % (a change never reads "+0.0 %"); 2**40 B = 1.0995e12: 1.10 TB; the ReLU's
    # 2**40 in both: unchanged, change 0, B/A = 1.00×.
    lines = format_diff(compare_reports(a, b, "bytes"))
    assert lines[0] == "whole model: A 1.10 TB -> B 1.10 TB (+9.09e-11 %)"
    assert _line(lines, "")[4:] == ["+1 B", "1.00×", "higher"]
    assert _line(lines, "relu")[4:] == ["0", "1.00×", "unchanged"]
    # 0 -> 0 over the whole model reads "unchanged", never "within noise".
    zero = _tree("Net", {}, bwd_flops={"": 0.0})
    assert format_diff(compare_reports(zero, zero, "bwd_flops"))[0] == "whole model: A 0 FLOP -> B 0 FLOP (unchanged)"


def test_sizes_and_peaks_are_per_call_what_adds_up_over_the_step_is_times_calls() -> None:
    a = _tree(
        "Net",
        {"fc": "Linear"},
        calls={"fc": 3},
        params_mb={"": 2.0, "fc": 2.0},
        peak_mem_mb={"": 5.0, "fc": 5.0},
        activation_mb={"": 6.0, "fc": 1.5},
    )
    b = _tree(
        "Net",
        {"fc": "Linear"},
        calls={"fc": 4},
        params_mb={"": 2.0, "fc": 2.0},
        peak_mem_mb={"": 5.0, "fc": float("nan")},
        activation_mb={"": 6.0, "fc": 1.5},
    )
    params = format_diff(compare_reports(a, b, "params_mb"))
    # fc's 2 MiB of parameters are the same 2 MiB however often it is called (3 then 4 times):
    # 2.00 -> 2.00, B/A 1.00, unchanged (was 6 -> 8, 1.33 x); the header says no "×calls".
    assert _line(params, "fc")[2:] == ["2.00", "2.00", "0", "1.00×", "unchanged"]
    assert next(ln for ln in params if ln.startswith("path")).split()[2:4] == ["A", "params_mb"]
    peaks = format_diff(compare_reports(a, b, "peak_mem_mb"))
    # the root's peak of one call: 5 -> 5 unchanged (not 5 x calls); fc's peak unknown in B: nothing
    # to judge, so no "noise" (which would claim "within noise") and no ratio.
    assert _line(peaks, "")[2:] == ["5.00", "5.00", "0", "1.00×", "unchanged"]
    assert _line(peaks, "fc")[2:] == ["5.00", "-", "-", "-"]
    # activations are saved by every call until the backward: 1.5 MiB x 3 = 4.5 -> 1.5 x 4 = 6.0, +1.5,
    # B/A 6 / 4.5 = 1.333: a change (an exact size, no noise).
    acts = format_diff(compare_reports(a, b, "activation_mb"))
    assert _line(acts, "fc")[2:] == ["4.50", "6.00", "+1.50", "1.33×", "higher"]


def test_unrelated_models_are_diffed_under_a_warning() -> None:
    a = _tree("DLRM", {"sparse": "EmbeddingBagCollection", "dense": "MLP", "dense.0": "Linear"})
    b = _tree("GPT", {"wte": "Embedding", "h": "ModuleList"})
    lines = format_diff(compare_reports(a, b))
    # roots DLRM vs GPT; no path is in both (even "" differs in type): 0 of B's 3 (the smaller) match.
    assert lines[0] == (
        "warning: A and B look like different models: root DLRM vs GPT; 0 of 3 components "
        "match by path and type (A has 4, B 3); the changes below pair unrelated components"
    )
    assert lines[1].startswith("whole model:")
    # Same root type, different tree: B's "", "0", "1", "2" vs A's "", "0" Linear, "1" ReLU, "2" Linear;
    # only "" matches by path and type: 1 of 4, fewer than half -> warned, without a root part.
    seq_a = _tree("Sequential", {"0": "Linear", "1": "ReLU", "2": "Linear"})
    seq_b = _tree("Sequential", {"0": "Conv2d", "1": "BatchNorm2d", "2": "Conv2d"})
    assert format_diff(compare_reports(seq_a, seq_b))[0] == (
        "warning: A and B look like different models: 1 of 4 components match by path and type (A has 4, B 4); "
        "the changes below pair unrelated components"
    )
    # The same model profiled deeper (A's 3 rows all in B's 5), or with half its components re-authored
    # ("", "0" match; "1", "2" changed type: 2 of 4, not fewer than half): no warning.
    deeper = _tree("Sequential", {"0": "Linear", "1": "ReLU", "2": "Linear", "0.x": "Dropout", "2.x": "Dropout"})
    shallow = _tree("Sequential", {"0": "Linear", "1": "ReLU"})
    assert format_diff(compare_reports(shallow, deeper))[0].startswith("whole model:")
    half = _tree("Sequential", {"0": "Linear", "1": "GELU", "2": "FusedLinear"})
    assert format_diff(compare_reports(seq_a, half))[0].startswith("whole model:")


def test_cb_diff_prints_both_quality_verdicts_and_the_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _tree("Net", {"fc": "Linear"})
    b = _tree("Net", {"fc": "Linear"})
    a.metadata["quality"] = {"verdict": "clean", "advice": []}
    b.metadata["quality"] = {"verdict": "contended", "advice": ["re-run on a quiet machine", "pin the threads"]}
    a.save(tmp_path / "a")
    b.save(tmp_path / "b")
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out.splitlines()
    # after the A:/B: lines, the two verdicts (B's advice under it, as the html page shows), then the model
    assert out[2:6] == [
        "quality: A clean, B contended (a timed change may be the machine's, not the model's)",
        "  B: re-run on a quiet machine",
        "  B: pin the threads",
        "whole model: A 1.00 ms -> B 1.00 ms (unchanged)",  # equal: not "within noise"
    ]
    # a report written before quality was measured says so; a FLOP diff needs no timing caveat.
    Report(b.rows, {"device_name": "cpu", "dtype": "fp32"}).save(tmp_path / "old")
    for row in b.rows:
        row.fwd_flops = 10.0
    Report(b.rows, {**b.metadata, "quality": {"verdict": "noisy", "advice": []}}).save(tmp_path / "b2")
    assert main(["diff", str(tmp_path / "old"), str(tmp_path / "b2"), "--metric", "fwd_flops"]) == 0
    assert capsys.readouterr().out.splitlines()[2] == "quality: A not measured, B noisy"
    # unrelated models: the warning is the first line after A:/B:, before the verdicts
    _tree("Other", {"x": "Conv2d"}).save(tmp_path / "other")
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "other")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2].startswith("warning: A and B look like different models: root Net vs Other; 0 of 2 components")
    assert out[3] == "quality: A clean, B not measured"


def test_a_column_that_cannot_be_compared_is_named() -> None:
    a = _tree("Net", {})
    with pytest.raises(ValueError, match="metric='status' cannot be compared"):
        compare_reports(a, a, "status")
