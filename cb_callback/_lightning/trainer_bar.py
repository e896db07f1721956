"""The pause's progress drawn through the Trainer's own progress bar, and the callback's lines printed through it.

:class:`TrainerBar` is ``trainer.progress_bar_callback`` as the callback uses it:

- with Lightning's ``RichProgressBar`` on a terminal, the profile is one more
  task (row) of its ``progress``, in its columns and theme, removed after the
  pause (Lightning's own tasks are left as they are);
- with ``TQDMProgressBar`` on a terminal, one bar of Lightning's ``Tqdm`` class
  and format below the train bar (``position``), updated in place, cleared after;
- otherwise (another ``ProgressBar``, or no terminal: a CI log) a few plain lines
  through the bar's ``print``: the start, one per level whose timing rounds are
  done, the end; no ``\\r``.

Each counts what the pause is doing now (:class:`cb_callback._engine.run.schedule_count.ScheduleCount`'s
``phase``), so that the bar's ETA is that phase's pace:

- starting components: ``completed`` the components started, ``total`` the
  run's components; the text is the current component's path, shortened to its
  end (``…attn.out_proj``) so that the label and it take at most 3/8 of the
  terminal's width (:func:`_short`; under 80 columns Rich's label is ``Profiling:``);
- timing a level (from its last component's start, most of the pause):
  ``completed`` its timing rounds done, ``total`` its ``rounds``; the text is
  ``timing round r/R`` (the round running; ``(level l of L)`` with several levels);
- the compile what-ifs: ``completed`` those done of their number.

At each change of phase the bar's clock restarts (Rich's ``reset``, tqdm's
``start_t``/``initial``), so its rate and ETA are the new phase's; a next level
goes back to counting components. :meth:`TrainerBar.print` puts a line on its
own line above the bars (``ProgressBar.print``); with TQDM and no terminal it
writes it after a newline instead (when the train bar drew since), not after
``tqdm.write``'s ``\\r<spaces>\\r`` on the bar's line.
"""

from __future__ import annotations

import math
import shutil
import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from cb_callback._engine.run.schedule_count import ProgressEvent, ScheduleCount

if TYPE_CHECKING:
    from rich.progress import Progress
    from tqdm import tqdm

__all__ = ["ProgressBar", "TrainerBar"]

#: The shortest width a bar's text is cut to.
_MIN_TEXT_WIDTH = 12
#: The shortest on a Rich row, whose other columns do not shrink (``…ntion.0``).
_MIN_RICH_WIDTH = 8

#: What each open TQDM train bar showed when a line was last written after it without a terminal (TrainerBar.print).
_WRITTEN_AFTER: weakref.WeakKeyDictionary[Any, tuple[Any, ...]] = weakref.WeakKeyDictionary()


#: What the rest of a Rich row takes besides its description (the bar, Lightning's count, times and speed
#: columns) with a total of one digit, measured on Lightning's columns at 60 columns with the speed at its
#: widest below 1,000 it/s ("999.99it/s"); each further digit of the total takes two more (``done/total``).
_RICH_REST = 40


def _rich_budget(columns: int, total: float | None) -> int:
    """The columns a Rich row's description (label and text) may take: 3/8 of the terminal's, or what the rest
    of the row leaves (:data:`_RICH_REST`) where that is less (a narrow terminal)."""
    digits = len(str(int(total))) if total is not None and math.isfinite(total) else 1
    return min(columns * 3 // 8, columns - _RICH_REST - 2 * (digits - 1))


def _short(text: str, columns: int, label: str, budget: int | None = None, least: int = _MIN_TEXT_WIDTH) -> str:
    """``text`` cut so that ``label`` and it take at most 3/8 of the terminal's ``columns`` (the text at least
    ``_MIN_TEXT_WIDTH``): the rest of the row (the bar, the count, the times, the speed) and Lightning's own
    rows, which share the columns, keep their width.

    A longer path keeps its end after ``…``: its last whole components (``…attn.out_proj``) when they fill at
    least half the width, else its last characters (``…attention.0``). ``budget`` replaces the 3/8 and
    ``least`` the shortest width.
    """
    width = max(least, (columns * 3 // 8 if budget is None else budget) - len(label))
    if len(text) <= width:
        return text
    tail = text[-(width - 1) :]
    whole = tail.split(".", 1)[1] if "." in tail[1:] and text[-width] != "." else tail
    return "…" + (whole if 2 * len(whole) >= width else tail)


@dataclass(frozen=True)
class _Shown:
    """What a bar shows for a progress call.

    Attributes:
        phase: which phase it is in (a change restarts the bar's clock): the phase's
            name and what tells its instances apart (the level).
        text: the bar's text (not yet shortened).
        path: whether it is a component's path (shortened to fit: :func:`_short`); a round's text is not.
        completed: done in this phase (components started over the run, a level's rounds, what-ifs).
        total: of how many (``None``: not known).
    """

    phase: tuple[str, int]
    text: str
    path: bool
    completed: int
    total: int | None


def _shown(count: ScheduleCount, event: ProgressEvent) -> _Shown:
    """What the bar shows after ``event`` (see the module docstring)."""
    if count.phase == "rounds":
        done, of = count.phase_done, count.phase_total
        text = f"timing round {min(done + 1, of)}/{of}"  # the round running (the last one once done)
        if count.levels > 1:
            text += f" (level {count.levels_done + (done < of)} of {count.levels})"
        return _Shown(("rounds", count.started), text, False, done, of)  # a level's rounds: its components started
    if count.phase == "compile":
        return _Shown(("compile", 0), event.text, True, count.phase_done, count.phase_total)
    return _Shown(("components", count.levels_done), event.text, True, count.started, count.components)


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


class _Row(Protocol):
    def show(self, count: ScheduleCount, event: ProgressEvent) -> None: ...

    def close(self) -> None: ...


class _Bar(Protocol):
    """What the callback uses of any of Lightning's ``ProgressBar`` kinds: its ``print`` (the rest it reads
    with ``getattr``, where one kind has an attribute another lacks)."""

    def print(self, message: str, /) -> None: ...


class _RichBar(_Bar, Protocol):
    """What the callback uses of Lightning's ``RichProgressBar`` beyond a bar's: ``refresh``."""

    def refresh(self) -> None: ...


class _TqdmBar(_Bar, Protocol):
    """What the callback uses of Lightning's ``TQDMProgressBar`` beyond a bar's: its train bar (a
    ``TypeError`` before Lightning has set it)."""

    @property
    def train_progress_bar(self) -> tqdm: ...


class TrainerBar:
    """The Trainer's progress bar as the callback draws and prints through it.

    Args:
        bar: ``trainer.progress_bar_callback`` on rank zero; ``None`` (another
            rank, ``enable_progress_bar=False``): nothing is drawn, and
            :meth:`print` leaves the line to the caller. A bar that is not
            enabled (``refresh_rate=0``) counts as none.
        rich_type: Lightning's ``RichProgressBar`` (passed in: only the callback
            module imports Lightning).
        tqdm_type: Lightning's ``TQDMProgressBar``.

    Attributes:
        kind: ``"rich"``, ``"tqdm"``, ``"other"`` (another ``ProgressBar``), or ``None`` (no bar).
    """

    def __init__(self, bar: _Bar | None, rich_type: type[_RichBar], tqdm_type: type[_TqdmBar]) -> None:
        self.bar = bar if bar is not None and getattr(bar, "is_enabled", True) else None
        self.kind: Literal["rich", "tqdm", "other"] | None = None
        self._rich = self.bar if isinstance(self.bar, rich_type) else None
        self._tqdm = self.bar if isinstance(self.bar, tqdm_type) and self._rich is None else None
        if self.bar is not None:
            self.kind = "rich" if self._rich is not None else "tqdm" if self._tqdm is not None else "other"

    def _tqdm_train(self) -> tqdm | None:
        """The TQDM bar's open train bar, else ``None`` (its ``print`` drops lines without one)."""
        if self._tqdm is None:
            return None
        try:
            train = self._tqdm.train_progress_bar
        except (TypeError, AttributeError):  # not set yet
            return None
        return None if train is None or train.disable else train

    def _rich_live(self) -> Progress | None:
        """The Rich bar's ``progress`` when it is drawing on a terminal, else ``None``."""
        progress = getattr(self.bar, "progress", None)
        if progress is None or getattr(self.bar, "_progress_stopped", False) or not progress.live.is_started:
            return None
        return progress if progress.console.is_terminal else None

    def say(self, line: str, log: Callable[[str], Any]) -> None:
        """``line`` on a line of its own above the bar when one is drawn (:meth:`print`), else ``log(line)``."""
        if not self.print(line):
            log(line)

    def print(self, message: str) -> bool:
        """Print ``message`` on a line of its own through the bar (``ProgressBar.print``).

        Returns:
            Whether it was printed; ``False`` without a bar, or with a TQDM bar
            whose train bar is closed: then the caller logs it
            (``rank_zero_info``) as without a bar.
        """
        if self.bar is None or (self.kind == "tqdm" and (train := self._tqdm_train()) is None):
            return False
        if self.kind == "tqdm" and not _isatty(sys.stdout):
            _write_after(train, message)
        else:
            self.bar.print(message)
        return True

    def row(self, step: int, count: ScheduleCount) -> _Row:
        """What draws the profile of ``step`` (see the module docstring); ``count`` has read the first call."""
        if self._rich is not None and (progress := self._rich_live()) is not None:
            return _RichRow(self._rich, progress, step, count.components)
        if self.kind == "tqdm" and (train := self._tqdm_train()) is not None and _isatty(sys.stdout):
            return _TqdmRow(self.bar, type(train), step, count.components)
        return _PlainLines(self._line, step, count)

    def _line(self, line: str) -> None:
        """A plain line through the bar, or to stdout where it has no open bar to print through (TQDM's closed)."""
        if not self.print(line):
            print(line, file=sys.stdout, flush=True)


def _isatty(stream: object) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty()) if callable(isatty) else False


def _write_after(train: tqdm, message: str) -> None:
    """``message`` on a line of its own in stdout, which is no terminal, below TQDM's open ``train`` bar.

    ``tqdm.write`` would clear the bar's line (``\\r<spaces>\\r``) and write
    there, leaving the line after the bar's text in a log file; this starts a new
    line instead when the bar drew since a line was last written after it (its
    count, text or postfix changed: Lightning draws it at each change).
    """
    drawn = (train.n, train.total, train.desc, train.postfix)
    prefix = "" if _WRITTEN_AFTER.get(train) == drawn else "\n"
    sys.stdout.write(f"{prefix}{message}\n")
    sys.stdout.flush()
    _WRITTEN_AFTER[train] = drawn


class _RichRow:
    """One task of the Rich bar's ``progress``: ``completed`` components of ``total``, the text in its description."""

    def __init__(self, bar: _RichBar, progress: Progress, step: int, total: int | None) -> None:
        from rich.markup import escape

        self._bar, self._progress, self._escape = bar, progress, escape
        style = getattr(getattr(bar, "theme", None), "description", "")
        self._plain = f"Profiling step {step}: "  # the label as shown
        self._label = f"[{style}]{self._plain[:-1]}[/]" if style else self._plain[:-1]
        self._narrow = f"[{style}]Profiling:[/]" if style else "Profiling:"
        # an infinite total is Lightning's task without one (CustomProgress.add_task)
        self._task = progress.add_task(self._label, total=float("inf") if total is None else total)
        self._phase = ("components", 0)

    def show(self, count: ScheduleCount, event: ProgressEvent) -> None:
        shown = _shown(count, event)
        columns = self._progress.console.width
        budget = _rich_budget(columns, shown.total)
        # on a narrow terminal (under 80 columns) the label drops the step: the path keeps its room
        label = self._label if len(self._plain) + _MIN_TEXT_WIDTH <= budget else self._narrow
        narrow = label is self._narrow
        if shown.path:
            text = _short(shown.text, columns, "Profiling: " if narrow else self._plain, budget, _MIN_RICH_WIDTH)
        else:  # a round: "round 2/5" when narrow
            text = shown.text.removeprefix("timing ") if narrow else shown.text
        description = f"{label} {self._escape(text)}"
        total = float("inf") if shown.total is None else shown.total
        if shown.phase != self._phase:  # a new phase: its own clock, so that the speed and ETA are its pace
            self._phase = shown.phase
            self._progress.reset(self._task, total=total, completed=shown.completed, description=description)
        else:
            self._progress.update(self._task, completed=shown.completed, total=total, description=description)
        self._bar.refresh()

    def close(self) -> None:
        self._progress.remove_task(self._task)
        self._bar.refresh()


class _TqdmRow:
    """A bar of Lightning's ``Tqdm`` class and format at the position below the train bar, cleared on close."""

    def __init__(self, bar: object, tqdm_class: type, step: int, total: int | None) -> None:
        self._bar = tqdm_class(
            desc=f"Profiling step {step}", total=total, position=2 * getattr(bar, "process_position", 0) + 1,
            leave=False, dynamic_ncols=True, file=sys.stdout, bar_format=getattr(bar, "BAR_FORMAT", None),
        )  # fmt: skip
        self._phase = ("components", 0)

    def show(self, count: ScheduleCount, event: ProgressEvent) -> None:
        shown = _shown(count, event)
        if shown.phase != self._phase:  # a new phase: its rate (hence ETA) from now and this count on
            self._phase = shown.phase
            self._bar.start_t, self._bar.initial = self._bar._time(), shown.completed
        columns = self._bar.ncols or shutil.get_terminal_size().columns
        text = _short(shown.text, columns, self._bar.desc + ": ") if shown.path else shown.text
        self._bar.set_postfix_str(text, refresh=False)
        self._bar.total = shown.total  # the phase's (the components grow by a level the failures call for)
        self._bar.n = shown.completed  # drawn at each call, as Lightning draws its own (its _update_n)
        self._bar.refresh()

    def close(self) -> None:
        self._bar.close()


class _PlainLines:
    """A few plain lines through ``say``: the start, one per level (or the compile what-ifs) done, the end."""

    def __init__(self, say: Callable[[str], None], step: int, count: ScheduleCount) -> None:
        self._say, self._step, self._t0 = say, step, time.perf_counter()
        total = _plural(count.components, "component") if count.components is not None else "its components"
        self._say(f"cb_callback: profiling step {step}: {total}, {_plural(count.rounds, 'timing round')} per level")

    def show(self, count: ScheduleCount, event: ProgressEvent) -> None:
        if event.milestone:
            done = event.text if event.kind == "compile" else count.counts(rounds=True)
            self._say(f"cb_callback: step {self._step}: {done}")

    def close(self) -> None:
        self._say(f"cb_callback: step {self._step} profiled in {time.perf_counter() - self._t0:.1f} s")


class ProgressBar:
    """The engine's ``progress(done, total, label)`` during the pause, drawn through the Trainer's bar.

    A context manager: ``with ProgressBar(step, bar, count) as progress`` gives
    the callable, or ``None`` when the Trainer has no bar (nothing drawn); on
    exit what was drawn is removed (or the plain lines end).

    Args:
        step: the training step being profiled (in the bar's label).
        bar: the Trainer's bar (:class:`TrainerBar`).
        count: the run's count (:meth:`ScheduleCount.for_run`): the components are the bar's total.
    """

    def __init__(self, step: int, bar: TrainerBar, count: ScheduleCount) -> None:
        self._step, self._trainer_bar, self.count = step, bar, count
        self._row: _Row | None = None

    def __enter__(self) -> ProgressBar | None:
        return self if self._trainer_bar.bar is not None else None

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __call__(self, done: int, total: int, label: str) -> None:
        event = self.count.read(done, total, label)
        if self._row is None:  # created after the first call: its total is checked
            self._row = self._trainer_bar.row(self._step, self.count)
        self._row.show(self.count, event)

    def close(self) -> None:
        """Remove what was drawn (a no-op when nothing was)."""
        if self._row is not None:
            row, self._row = self._row, None
            row.close()
