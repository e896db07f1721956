"""The pause's progress lives with Lightning's bar: drawn through it, counting components, lines of their own.

Real Trainers with ``RichProgressBar`` and ``TQDMProgressBar`` (issue 23, item 2). The model is
``MLPModule`` without validation: 7 components (``MLP_PATHS``), profiled at step 1 with
``descend="all"`` (one level) and the default 5 timing rounds: the engine's progress total is
7 + 5 = 12 steps. The bars count the 7 components while they are started, then, from the last
one's start (the timing rounds follow it), the level's 5 rounds: ``completed`` is the rounds done,
so that the bar's rate and ETA are the rounds' pace.
"""

from __future__ import annotations

import io
import re
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import rich.progress
from lightning.pytorch.callbacks import ProgressBar as LightningProgressBar
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from rich.console import Console
from torch import nn

from cb_callback import ComponentBenchmark
from cb_callback._engine.run.schedule_count import ScheduleCount
from cb_callback._lightning.trainer_bar import ProgressBar, TrainerBar
from tests._callback_models import MLPModule, run_fit
from tests._figures import blank_figures
from tests.conftest import FAST

OPTS: dict[str, Any] = {**FAST, "peak_flops": 1e11, "peak_bandwidth": 1e10, "descend": "all"}
MLP_PATHS = ["", "encoder", "head", "encoder.0", "encoder.1", "encoder.2", "encoder.3"]
#: The bar's text and count after each of the 7 + 5 progress calls of one level: the first 6 components
#: (text: the path, "root" for ""; count: started of 7); the 7th's start begins the rounds phase (the
#: round running: 1 of 5, none done); after round r, r of 5 done and round r + 1 running (5/5 at the end).
COMPONENTS = [(p or "root", 7, i + 1) for i, p in enumerate(MLP_PATHS[:6])]
ROUNDS = [(f"timing round {min(r + 1, 5)}/5", 5, r) for r in range(0, 6)]
REPORT_LINE = "cb_callback: component report of step 1"
_CSI = re.compile(r"(\x1b\[[0-9;?]*[A-Za-z])+$")  # terminal control sequences ending a text


@pytest.fixture(autouse=True)
def _blank_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test here reads an image: the reports' charts are drawn blank (a second each saved)."""
    blank_figures(monkeypatch)


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

    def __init__(self, file: io.StringIO, width: int = 120) -> None:
        super().__init__(console_kwargs={"file": file, "force_terminal": True, "width": width})
        self.width = width
        #: per refresh, per task: id, description, total, completed, and the samples its speed (and ETA) come from
        self.seen: list[list[tuple[int, str, float | None, float, int]]] = []
        self.drawn: list[list[str]] = []  # per refresh, the rows as drawn (plain text)

    def refresh(self, hard: bool = False) -> None:
        if self.progress is not None:
            tasks = self.progress.tasks
            self.seen.append([(t.id, t.description, t.total, t.completed, len(t._progress)) for t in tasks])
            plain = Console(file=io.StringIO(), width=self.width, color_system=None, legacy_windows=False)
            with plain.capture() as captured:
                plain.print(self.progress.make_tasks_table(tasks))
            self.drawn.append(captured.get().splitlines())
        super().refresh(hard=True)

    def ours(self) -> list[tuple[str, float | None, float, int]]:
        """The profile's task at each refresh of the pause: description, total, completed, speed samples."""
        mine = [next((t for t in tasks if t[0] != self.train_progress_bar_id), None) for tasks in self.seen]
        return [t[1:] for t in mine if t is not None]


def test_rich_bar_draws_the_profile_as_a_task_of_its_own_counting_components(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    console = io.StringIO()
    monkeypatch.setattr(sys, "stdout", _Stream(tty=True))
    bar = _HardRich(console)
    _fit(tmp_path, bar)
    lightning_ids = {bar.train_progress_bar_id}
    during = [tasks for tasks in bar.seen if {t[0] for t in tasks} - lightning_ids]  # the pause's refreshes
    # one refresh per progress call: 6 components counted of the 7 (not of 7 + 5), then the rounds of 5.
    # Speed samples: one per advance; the rounds phase starts its own clock (reset: none), so the ETA
    # is the rounds' pace and not the components' (which were started within a second).
    assert bar.ours() == [(f"Profiling step 1: {t}", total, done, done) for t, total, done in COMPONENTS + ROUNDS]
    # Lightning's own tasks are untouched during the pause, and the profile's task is gone after it
    assert all([t for t in tasks if t[0] in lightning_ids] == [t for t in during[0] if t[0] in lightning_ids]
               for tasks in during)  # fmt: skip
    assert bar.progress is not None and bar.progress.task_ids == [bar.train_progress_bar_id]
    shown = console.getvalue()
    assert "Profiling step 1: encoder.0" in shown and " 4/7 " in shown and " 3/5 " in shown and "/12" not in shown
    assert _starts_a_line(shown, REPORT_LINE)  # printed above the bars, on a line of its own


_TQDM = re.compile(r"Profiling step 1:\s+\d+%\|[^|]*\| (\d+)/(\d+) \[[^<\]]*<([^,\]]*), [^,\]]*(?:, ([^\]]*))?\]")


def test_tqdm_bar_draws_one_bar_below_the_train_bar_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = _Stream(tty=True)  # stdout and stderr share the terminal
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr(sys, "stderr", terminal)
    _fit(tmp_path, TQDMProgressBar())
    shown = terminal.getvalue()
    drawn = [(int(n), int(total), eta, text) for n, total, eta, text in _TQDM.findall(shown)]
    # drawn when created (0 of 7, no ETA yet), then at each of the 12 progress calls: n counts the first 6
    # components of 7 (text: the path), then the level's rounds done of 5 (text: the round running)
    assert [(text, total, n) for n, total, _, text in drawn] == [("", 7, 0), *COMPONENTS, *ROUNDS]
    # no ETA without a rate: when created, and when the rounds phase restarts the clock (0 rounds done);
    # else one from this phase's pace
    etas = [eta for _, _, eta, _ in drawn]
    assert etas[0] == etas[7] == "?" and all(re.fullmatch(r"\d\d:\d\d", e) for e in etas[1:7] + etas[8:])
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
    # Lightning's train bar still draws with \r (tqdm's way in a file); our lines are plain, each at the
    # start of a line: after a newline, not after tqdm.write's \r<spaces>\r on the bar's line
    assert [shown[i - 1] for i in (m.start() for m in re.finditer("cb_callback:", shown))] == ["\n"] * 4
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


def test_rich_bar_counts_rounds_per_level_and_back_to_components_with_hotspots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdout", _Stream(tty=True))
    bar = _HardRich(io.StringIO())
    cb = ComponentBenchmark(capture_step=1, **{**OPTS, "descend": "hotspots", "insitu_passes": 0})
    run_fit(tmp_path, [cb, bar], max_steps=2, logger=False, model_kwargs={"validate": False}, enable_progress_bar=True)

    # insitu_passes=0: one level per depth, [root], [encoder, head], [encoder.0..3]: 7 components + 3 x 5 rounds.
    # Each level's last component begins its rounds phase (0 of 5, clock reset: no speed samples); the next
    # level's first component goes back to the components, started of 7 (a reset too: no samples yet).
    def rounds(level: int) -> list[tuple[str, float, int, int]]:
        return [(f"Profiling step 1: {t} (level {level} of 3)", 5, r, r) for t, _, r in ROUNDS]

    level2 = [("Profiling step 1: encoder", 7, 2, 0)]
    level3 = [(f"Profiling step 1: encoder.{i}", 7, 4 + i, i) for i in range(3)]
    assert bar.ours() == [*rounds(1), *level2, *rounds(2), *level3, *rounds(3)]


class _LongPathModule(MLPModule):
    """``MLPModule`` whose encoder sits two containers deeper: ``encoder.transformer_layers.self_attention.0`` (43
    characters) to ``.3``; 9 components."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        inner = nn.Sequential(OrderedDict(self_attention=self.encoder))
        self.encoder = nn.Sequential(OrderedDict(transformer_layers=inner))


#: The first 8 paths of _LongPathModule as shown at 60 columns: max(12, 60 * 3 // 8 - 18) = 12 characters at most
#: by tqdm (after "Profiling step 1: "); Rich's row: max(12, 60 * 3 // 8 - len("Profiling: ")).
NARROW = ["root", "encoder", "head", "…rmer_layers", "…f_attention"] + [f"…attention.{i}" for i in range(3)]
#: Rich's row at 60 columns: the rest of the row (bar, count of 9, times, "999.99it/s") takes 40 columns, so
#: label and path get min(60 * 3 // 8, 60 - 40) = 20: the path max(8, 20 - len("Profiling: ")) = 9.
NARROW_RICH = ["root", "encoder", "head", "…r_layers", "…ttention"] + [f"…ention.{i}" for i in range(3)]


def test_narrow_rich_console_keeps_the_counts_visible(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdout", _Stream(tty=True))
    # the speed as wide as Rich shows below 1,000 it/s ("999.99it/s"): tiny components run at hundreds a
    # second, and a row that fits only "99.99it/s" lost its "/s" on a fast machine
    speed = rich.progress.Task.speed
    monkeypatch.setattr(rich.progress.Task, "speed", property(lambda t: None if speed.fget(t) is None else 999.99))
    bar = _HardRich(io.StringIO(), width=60)
    cb = ComponentBenchmark(capture_step=1, **OPTS)
    run_fit(tmp_path, [cb, bar], _LongPathModule, max_steps=2, logger=False, model_kwargs={"validate": False},
            enable_progress_bar=True)  # fmt: skip
    # under 80 columns the label is "Profiling: " (11); it and the path within 20 (NARROW_RICH): the path's
    # last 9 - 1 characters after "…" (whole components, "…0", would fill less than half of them)
    texts = [desc.removeprefix("Profiling: ") for desc, _, _, _ in bar.ours()]
    assert texts[:8] == NARROW_RICH
    # each refresh of the pause draws our count (started of 9, then rounds of 5), times and speed whole (no "…"
    # after the path), and the Epoch row's 1/2 whole
    during = [(rows, tasks) for rows, tasks in zip(bar.drawn, bar.seen, strict=True) if len(tasks) > 1]
    assert len(during) == 9 + 5
    for (rows, tasks), text in zip(during, texts, strict=True):
        _, _, total, completed, _ = next(t for t in tasks if t[0] != bar.train_progress_bar_id)
        ours = next(i for i, row in enumerate(rows) if row.startswith(f"Profiling: {text} "))
        rest = rows[ours].removeprefix(f"Profiling: {text} ")
        assert re.search(rf" {int(completed)}/{int(total)} \d:\d\d:\d\d •? +\d+\.\d\dit/s", rest), rows
        assert re.fullmatch(r"Epoch 0/-2 .* 1/2 \d:\d\d:\d\d •? +\d+\.\d\dit/s *", rows[0]), rows
        assert "…" not in rest + "".join(rows[:ours] + rows[ours + 1 :]), rows


def test_narrow_tqdm_terminal_shortens_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = _Stream(tty=True)
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setenv("COLUMNS", "60")  # the terminal's width (shutil.get_terminal_size): a StringIO has none
    cb = ComponentBenchmark(capture_step=1, **OPTS)
    run_fit(tmp_path, [cb, TQDMProgressBar()], _LongPathModule, max_steps=2, logger=False,
            model_kwargs={"validate": False}, enable_progress_bar=True)  # fmt: skip
    texts = [text for *_, text in _TQDM.findall(terminal.getvalue())]
    # drawn when created (no text), then the 8 components before the rounds, cut as in Rich's row (desc
    # "Profiling step 1" and tqdm's ": ", 18 characters)
    assert texts[1:9] == NARROW
