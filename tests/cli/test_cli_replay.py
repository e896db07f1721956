"""`cb replay`: finds the snapshot under a log directory; its progress counts components and rounds apart."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from cb_callback import BenchmarkConfig, Capture, Report
from cb_callback._cli import main
from cb_callback._engine.run.schedule_count import ConsoleProgress
from cb_callback._whatif.snapshot import save_snapshot
from tests._figures import blank_figures
from tests.conftest import FAST

PEAKS: dict[str, Any] = dict(peak_flops=1e11, peak_bandwidth=1e10)


@pytest.fixture(autouse=True)
def _blank_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test here reads an image: the reports' charts are drawn blank (a second each saved)."""
    blank_figures(monkeypatch)


def _snapshot(directory: Path, step: int = 3, **config: Any) -> Path:
    """A snapshot of root -> (Linear, ReLU, Sequential(Linear, ReLU)): 6 components at depths 0, 1, 2."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 2), nn.ReLU()))
    with Capture(model) as capture:
        model(torch.randn(5, 4))
    return save_snapshot(
        directory, model, capture.calls, config=BenchmarkConfig(**FAST, **PEAKS, **config), captured_batch_size=5,
        metadata={"capture_step": step, "capture_device": "cpu"},
    )  # fmt: skip


def _two_runs(root: Path) -> tuple[Path, Path]:
    """Snapshots of two captures, step 10 then step 500 (newest), as fork mode leaves them."""
    old = _snapshot(root / "version_0" / "component_benchmark" / "step_10" / "snapshot", step=10)
    new = _snapshot(root / "version_0" / "component_benchmark" / "step_500" / "snapshot", step=500)
    os.utime(old / "snapshot.pt", (1_000, 1_000))
    os.utime(new / "snapshot.pt", (2_000, 2_000))
    return old, new


def test_replay_of_a_log_directory_takes_the_newest_snapshot_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _old, new = _two_runs(tmp_path / "logs")
    assert main(["replay", str(tmp_path / "logs"), "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert err.splitlines()[0] == (
        f"cb: using {new / 'snapshot.pt'} (capture step 500, the newest of 2 snapshots under {tmp_path / 'logs'}; "
        "capture steps: 10, 500; pick one with --step N or DIR@N)"
    )
    assert Report.load(new / "replay").metadata["capture_step"] == 500  # --out defaults to the one taken


def test_replay_picks_a_snapshot_by_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old, _new = _two_runs(tmp_path / "logs")
    assert main(["replay", f"{tmp_path / 'logs'}@10", "--device", "cpu", "--out", str(tmp_path / "out")]) == 0
    assert Report.load(tmp_path / "out").metadata["capture_step"] == 10
    assert capsys.readouterr().err.splitlines()[0].startswith(f"cb: using {old / 'snapshot.pt'} (capture step 10;")
    assert main(["replay", str(tmp_path / "logs"), "--step", "11", "--device", "cpu"]) == 2
    assert capsys.readouterr().err == (
        f"cb: error: no snapshot of capture step 11 at or under {tmp_path / 'logs'}; capture steps there: 10, 500\n"
    )


def test_progress_into_a_file_is_plain_lines_counting_components_and_rounds_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 6 components in 3 depth levels (hotspots descent, descending everywhere), 2 timing rounds per level:
    # the engine's progress total is 6 + 2 x 3 = 12 steps, of which 6 are components and 6 timing rounds.
    # insitu_passes=0: no in-situ times, so hotspots goes level by level on measured shares.
    snap = _snapshot(tmp_path / "snap", rounds=2, descend="hotspots", descend_share=0.0, insitu_passes=0)
    assert main(["replay", str(snap), "--device", "cpu", "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err  # capsys's stderr is no TTY, as a file or a pipe
    assert "\r" not in err and "\x1b" not in err
    # one line when a level's rounds are done: level 1 = the root (1 component), level 2 = its 3
    # children (4), level 3 = the inner Sequential's 2 (6)
    assert [ln for ln in err.splitlines() if ln.startswith("cb: components")] == [
        "cb: components 1/6, timing rounds 2/6 (level 1 of 3)",
        "cb: components 4/6, timing rounds 4/6 (level 2 of 3)",
        "cb: components 6/6, timing rounds 6/6 (level 3 of 3)",
    ]


def test_progress_of_the_compile_what_ifs_is_counted_on_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snap = _snapshot(tmp_path / "snap", rounds=1)
    argv = ["replay", str(snap), "--device", "cpu", "--out", str(tmp_path / "out")]
    assert main([*argv, "--compile", "--compile-backend", "eager", "--compile-top", "2"]) == 0
    lines = capsys.readouterr().err.splitlines()
    # One level (the triage's plan) of 6 components and 1 round; then 2 compile what-ifs, one line when both are done
    assert lines[-2] == "cb: components 6/6, timing rounds 1/1"
    assert lines[-1].startswith("cb: compile what-if 2/2 (")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_on_a_terminal_rewrites_one_line_and_ends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    snap = _snapshot(tmp_path / "snap", rounds=1)  # the triage's plan: one level of 6 components, 1 round
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["replay", str(snap), "--device", "cpu", "--out", str(tmp_path / "out")]) == 0
    shown = terminal.getvalue()
    updates = shown.split("\r")[1:]
    assert updates[0] == "cb: components 1/6 (root)\x1b[K"
    assert updates[5] == "cb: components 6/6 (2.1)\x1b[K"  # the 6th component, no more than 6
    assert updates[6] == "cb: components 6/6, timing rounds 1/1\x1b[K\n"  # the line is ended before the summary
    assert len(updates) == 7


def test_a_total_that_does_not_add_up_is_not_shown() -> None:
    # 3 components + 1 round x 1 level = 4 steps; an engine total of 10 says the tree differs (a
    # preprocessor changed the model): components are counted without a total, not as "1/3" of a wrong one.
    stream = io.StringIO()
    progress = ConsoleProgress(stream, components=3, rounds=1, levels=1)
    progress(1, 10, "")
    progress(2, 10, "a")
    progress(3, 10, "timing round 1/1")
    progress.close()
    assert stream.getvalue() == "cb: components 2, timing rounds 1/1\n"


def test_descend_all_replays_the_complete_tree_of_a_snapshot(tmp_path: Path) -> None:
    snap = _snapshot(tmp_path / "snap", rounds=1)
    assert main(["replay", str(snap), "--device", "cpu", "--descend", "all", "--out", str(tmp_path / "out")]) == 0
    report = Report.load(tmp_path / "out")
    assert report.metadata["config"]["descend"] == "all"
    assert [r.status for r in report.rows] == ["ok"] * 6
    # The capture's own in-situ times travelled in the snapshot.
    assert report.row("0").details["insitu"]["capture_ms"] > 0
