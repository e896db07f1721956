"""The ``cb`` command: replay, report, diff."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from cb_callback import BenchmarkConfig, Capture, ComponentRow, Report
from cb_callback._cli import _default_device, main
from cb_callback._report.diff import compare_reports, format_diff
from cb_callback._whatif.snapshot import SNAPSHOT_FILE, save_snapshot
from tests.conftest import FAST

PEAKS: dict[str, Any] = dict(peak_flops=1e11, peak_bandwidth=1e10)


def _snapshot(directory: Path, device: str = "cpu") -> Path:
    """A snapshot of a small MLP; ``descend="all"``: its replay's rows do not follow the machine's load."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with Capture(model) as capture:
        model(torch.randn(5, 4))
    return save_snapshot(
        directory, model, capture.calls, config=BenchmarkConfig(**FAST, **PEAKS, descend="all"), captured_batch_size=5,
        metadata={"capture_step": 3, "capture_device": device},
    )  # fmt: skip


def test_replay_profiles_a_snapshot_and_writes_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snap = _snapshot(tmp_path / "snap")
    out = tmp_path / "out"
    assert main(["replay", str(snap), "--device", "cpu", "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    report = Report.load(out)
    assert [r.path for r in report.rows] == ["", "0", "1", "2"]
    assert [r.status for r in report.rows] == ["ok"] * 4
    assert report.metadata["capture_step"] == 3
    assert report.row("0").fwd_flops == 2 * 5 * 4 * 8  # Linear(4 -> 8) on 5 samples
    assert "only replay snapshots you trust" in stdout
    assert "cb_callback component benchmark" in stdout
    assert stdout.rstrip().endswith(
        f"cb: report written to {out} (report.json, components.csv, report.html, icicle_mfu.png, "
        "icicle_total_ms.png, icicle_peak_mem_mb.png, roofline.png)"
    )


def test_replay_defaults_to_cpu_when_the_capture_device_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snap = _snapshot(tmp_path / "snap", device="cuda:0")
    if torch.cuda.is_available():
        pytest.skip("this machine has the capture device")
    assert main(["replay", str(snap)]) == 0
    stdout = capsys.readouterr().out
    assert "cb: the snapshot was captured on cuda:0; no CUDA device here, replaying on cpu" in stdout
    assert Report.load(snap / "replay").metadata["device"] == "cpu"
    assert _default_device(None) == ("cpu", None)
    assert _default_device("cpu") == ("cpu", None)


def test_replay_of_a_broken_snapshot_fails_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / SNAPSHOT_FILE).write_bytes(b"garbage")
    assert main(["replay", str(tmp_path), "--device", "cpu"]) == 2  # could not replay (see the help)
    assert "cb: error: cannot read the snapshot" in capsys.readouterr().err
    assert main(["replay", str(tmp_path / "nowhere"), "--device", "cpu"]) == 2
    assert "cb: error: no snapshot at" in capsys.readouterr().err


def _report(total_ms: dict[str, float]) -> Report:
    rows = [ComponentRow("", "Net", 0, None, "ok", calls=1, total_ms=total_ms.get("", math.nan))]
    rows += [ComponentRow(p, "Linear", 1, "", "ok", calls=1, total_ms=v) for p, v in total_ms.items() if p != ""]
    return Report(rows, {"device_name": "cpu", "dtype": "fp32"})


def test_report_prints_the_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = _report({"": 3.0, "a": 2.0, "b": 1.0})
    report.save(tmp_path)
    assert main(["report", str(tmp_path), "--top", "1"]) == 0
    assert capsys.readouterr().out == Report.load(tmp_path).summary(top=1) + "\n"
    assert main(["report", str(tmp_path / "missing")]) == 2  # no report: could not do it
    assert capsys.readouterr().err == f"cb: error: no report.json at or under {tmp_path / 'missing'}\n"


def test_diff_prints_per_path_ratios(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _report({"": 10.0, "a": 4.0, "b": 6.0})
    b = _report({"": 5.0, "a": 4.0, "c": 1.0})
    # Issue 9 changed cb diff's output: sorted by absolute change over the step (a component in
    # one report only counts as its whole time: b -6, c +1), a summary line, changes within
    # noise marked "noise" (no row here has a noise: 5 % of the larger value bounds it); issue 23: a, 4 -> 4,
    # is "unchanged" (change 0), the ratio and sig columns print different things (0.500× faster), a legend
    # under them; numbers to 3 significant figures (numbers.sig).
    assert format_diff(compare_reports(a, b)) == [
        "whole model: A 10.0 ms -> B 5.00 ms (-50.0 %)",
        "biggest movers: b -6.00 ms (only in A), c +1.00 ms (only in B)",
        "path    type    A total_ms×calls  B total_ms×calls  change     B/A  sig",
        "------  ------  ----------------  ----------------  ------  ------  ---------",
        "b       Linear              6.00                 -   -6.00       -  only in A",
        "(root)  Net                 10.0              5.00   -5.00  0.500×  faster",
        "c       Linear                 -              1.00   +1.00       -  only in B",
        "a       Linear              4.00              4.00       0   1.00×  unchanged",
        "(B/A: B ÷ A as measured; sig: slower / faster beyond the two runs' noise (2 × the larger IQR), "
        "noise within it: not significant, unchanged: the same value in A and B)",
    ]
    a.save(tmp_path / "a")
    b.save(tmp_path / "b")
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"A: {tmp_path / 'a'}  (cpu, fp32)"
    assert out[2:] == format_diff(compare_reports(a, b))
    with pytest.raises(SystemExit):
        main(["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--metric", "nonsense"])


def test_replay_with_compile_flags_runs_the_what_if(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snap = _snapshot(tmp_path / "snap")
    out = tmp_path / "out"
    argv = ["replay", str(snap), "--device", "cpu", "--out", str(out), "--compile", "--compile-backend", "eager"]
    assert main([*argv, "--compile-top", "2"]) == 0
    report = Report.load(out)
    compiled = [r.path for r in report if "compile" in r.details]
    assert len(compiled) == 2 and "" in compiled
    assert report.metadata["config"]["compile_options"] == {"backend": "eager"}
    assert "compile what-if" in capsys.readouterr().out
