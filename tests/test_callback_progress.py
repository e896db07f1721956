"""The pause's progress lives with Lightning's bar: drawn through it, counting components, lines of their own.

Real Trainers with ``RichProgressBar`` and ``TQDMProgressBar`` (issue 23, item 2). The model is
``MLPModule`` without validation: 7 components (``MLP_PATHS``), profiled at step 1 with
``descend="all"`` (one level) and the default 5 timing rounds: the engine's progress total is
7 + 5 = 12 steps, of which the bars count the 7 components.
"""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from lightning.pytorch.callbacks import ProgressBar as LightningProgressBar
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar

from cb_callback import ComponentBenchmark
from cb_callback._engine.progress import ScheduleCount
from cb_callback._lightning.progress import ProgressBar, TrainerBar
from tests._callback_models import run_fit
from tests.conftest import FAST

OPTS: dict[str, Any] = {**FAST, "peak_flops": 1e11, "peak_bandwidth": 1e10, "descend": "all"}
MLP_PATHS = ["", "encoder", "head", "encoder.0", "encoder.1", "encoder.2", "encoder.3"]
ROUNDS = [f"timing round {r}/5" for r in range(1, 6)]
#: What the bar's text shows at each progress call: the component's path ("root" for ""), then the rounds.
TEXTS = [p or "root" for p in MLP_PATHS] + ROUNDS
REPORT_LINE = "cb_callback: component report of step 1"
_CSI = re.compile(r"(\x1b\[[0-9;?]*[A-Za-z])+$")  # terminal control sequences ending a text


class _Stream(io.StringIO):
    """A captured stdout/stderr that says whether it is a terminal."""

    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def _starts_a_line(output: str, text: str) -> bool:
    """Whether ``text`` is written at column 0 of a line of its own: after a newline or a carriage return
    (then, possibly, an erase-line sequence), never glued after what a bar drew."""
    before = _CSI.sub("", output[: output.index(text)])
    return before == "" or before.endswith(("\n", "\r"))


def _fit(tmp_path: Path, bar: Any, **trainer: Any) -> ComponentBenchmark:
    cb = ComponentBenchmark(capture_step=1, **OPTS)
    callbacks = [cb] if bar is None else [cb, bar]
    trainer.setdefault("enable_progress_bar", bar is not None)
    run_fit(tmp_path, callbacks, max_steps=2, logger=False, model_kwargs={"validate": False}, **trainer)
    assert cb.report is not None and [r.path for r in cb.report.rows] == MLP_PATHS
    return cb


class _HardRich(RichProgressBar):
    """Lightning's Rich bar, drawing at each ``refresh`` (no refresh thread to wait for); records its tasks then."""

    def __init__(self, file: io.StringIO) -> None:
        super().__init__(console_kwargs={"file": file, "force_terminal": True, "width": 120})
        self.seen: list[list[tuple[int, str, float | None, float]]] = []

    def refresh(self, hard: bool = False) -> None:
        if self.progress is not None:
            self.seen.append([(t.id, t.description, t.total, t.completed) for t in self.progress.tasks])
        super().refresh(hard=True)


def test_rich_bar_draws_the_profile_as_a_task_of_its_own_counting_components(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    console = io.StringIO()
    monkeypatch.setattr(sys, "stdout", _Stream(tty=True))
    bar = _HardRich(console)
    _fit(tmp_path, bar)
    lightning_ids = {bar.train_progress_bar_id}
    during = [tasks for tasks in bar.seen if {t[0] for t in tasks} - lightning_ids]  # the pause's refreshes
    ours = [next(t for t in tasks if t[0] not in lightning_ids) for tasks in during]
    # one refresh per progress call: 7 components, then 5 rounds; the total is the 7 components, not 7 + 5
    assert [(desc, total, done) for _, desc, total, done in ours] == (
        [(f"Profiling step 1 {t}", 7, i + 1) for i, t in enumerate(TEXTS[:7])]
        + [(f"Profiling step 1 {t}", 7, 7) for t in ROUNDS]
    )
    # Lightning's own tasks are untouched during the pause, and the profile's task is gone after it
    assert all([t for t in tasks if t[0] in lightning_ids] == [t for t in during[0] if t[0] in lightning_ids]
               for tasks in during)  # fmt: skip
    assert bar.progress is not None and bar.progress.task_ids == [bar.train_progress_bar_id]
    shown = console.getvalue()
    assert "Profiling step 1 encoder.0" in shown and " 4/7 " in shown and "/12" not in shown
    assert _starts_a_line(shown, REPORT_LINE)  # printed above the bars, on a line of its own


_TQDM = re.compile(r"Profiling step 1:\s+\d+%\|[^|]*\| (\d+)/(\d+) \[[^<\]]*<([^,\]]*), [^,\]]*(?:, ([^\]]*))?\]")


def test_tqdm_bar_draws_one_bar_below_the_train_bar_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = _Stream(tty=True)  # stdout and stderr share the terminal
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr(sys, "stderr", terminal)
    _fit(tmp_path, TQDMProgressBar())
    shown = terminal.getvalue()
    drawn = [(int(n), int(total), eta, text) for n, total, eta, text in _TQDM.findall(shown)]
    # drawn when created (0 of 7, no ETA yet), then at each of the 12 progress calls: n counts the 7
    # components (the total: components only), the text is the path, then the timing round
    assert [(n, total, text) for n, total, _, text in drawn] == (
        [(0, 7, "")] + [(i + 1, 7, t) for i, t in enumerate(TEXTS[:7])] + [(7, 7, t) for t in ROUNDS]
    )
    assert drawn[0][2] == "?" and all(re.fullmatch(r"\d\d:\d\d", eta) for _, _, eta, _ in drawn[1:])  # an ETA
    # one bar at position 1, below the train bar: each draw moves down one line, writes, moves back up
    assert shown.count("\n\rProfiling step 1:") == len(drawn) and shown.count("\x1b[A") >= len(drawn)
    assert _starts_a_line(shown, REPORT_LINE)


@pytest.mark.parametrize("kind", ["rich", "tqdm"])
def test_without_a_terminal_a_few_plain_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    out = _Stream(tty=False)  # a CI log: stdout is no terminal
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", _Stream(tty=False))
    console = io.StringIO()
    bar = RichProgressBar(console_kwargs={"file": console, "width": 120}) if kind == "rich" else TQDMProgressBar()
    _fit(tmp_path, bar)
    shown = out.getvalue()
    # tqdm.write clears Lightning's own train bar (its \r) around each line; the lines themselves are plain
    mine = [ln for ln in re.split(r"[\r\n]", shown) if ln.startswith("cb_callback:")]
    assert mine[:2] == [
        "cb_callback: profiling step 1: 7 components, 5 timing rounds per level",  # the start
        "cb_callback: step 1: components 7/7, timing rounds 5/5",  # the (only) level's rounds done
    ]
    assert re.fullmatch(r"cb_callback: step 1 profiled in \d+\.\d s", mine[2])  # the end
    assert mine[3].startswith(REPORT_LINE) and len(mine) == 4
    assert "Profiling step" not in shown + console.getvalue()  # no bar drawn
    if kind == "rich":  # Rich draws nothing into a file until it stops: no carriage return at all
        assert "\r" not in shown and shown.count("\n") == 4


class _LineBar(LightningProgressBar):
    """Another ``ProgressBar``: the profile falls back to plain lines through its ``print``."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self._enabled = True

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    @property
    def is_enabled(self) -> bool:
        return self._enabled

    def print(self, *args: Any, **kwargs: Any) -> None:
        self.lines.append(" ".join(map(str, args)))


def test_another_progress_bar_gets_plain_lines_through_its_print(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _Stream(tty=True)
    monkeypatch.setattr(sys, "stdout", out)
    bar = _LineBar()
    _fit(tmp_path, bar)
    assert bar.lines[:2] == [
        "cb_callback: profiling step 1: 7 components, 5 timing rounds per level",
        "cb_callback: step 1: components 7/7, timing rounds 5/5",
    ]
    assert bar.lines[2].startswith("cb_callback: step 1 profiled in ") and bar.lines[3].startswith(REPORT_LINE)
    assert len(bar.lines) == 4 and "Profiling step" not in out.getvalue()


def test_no_bar_draws_nothing_and_logs_the_report_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    out = _Stream(tty=True)
    monkeypatch.setattr(sys, "stdout", out)
    with caplog.at_level("INFO"):
        _fit(tmp_path, None, enable_progress_bar=False)
    assert "Profiling" not in out.getvalue() and "cb_callback" not in out.getvalue()
    assert [m for m in caplog.messages if m.startswith(REPORT_LINE)]


def test_the_count_grows_by_a_level_the_failures_call_for() -> None:
    # 3 components + 2 rounds x 1 level = 5 steps; the engine then adds a level of 2 components a
    # failure calls for (Schedule.run_levels: total += 2 + 2): the count becomes 5 components, 2 levels.
    count = ScheduleCount(components=3, rounds=2, levels=1)
    for done, label in enumerate(["", "a", "b", "timing round 1/2", "timing round 2/2"], start=1):
        count.read(done, 5, label)
    assert count.counts(rounds=True) == "components 3/3, timing rounds 2/2"
    assert count.read(6, 9, "b.0").text == "b.0"
    count.read(7, 9, "b.1")
    assert count.read(8, 9, "timing round 1/2").milestone is False
    assert count.read(9, 9, "timing round 2/2").milestone is True
    assert count.counts(rounds=True) == "components 5/5, timing rounds 4/4 (level 2 of 2)"


def test_no_trainer_bar_gives_no_progress_callable() -> None:
    with ProgressBar(1, TrainerBar(None, RichProgressBar, TQDMProgressBar), ScheduleCount(3, 1, 1)) as progress:
        assert progress is None
