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

Each counts the components only (:class:`cb_callback._engine.progress.ScheduleCount`),
so that the bar's ETA is the components'; its text is the current component's
path, ``timing round r/R`` or ``compile what-if d/n (PATH)``. :meth:`TrainerBar.print`
puts a line on its own line above the bars (``ProgressBar.print``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, Literal, Protocol

from cb_callback._engine.progress import ProgressEvent, ScheduleCount

__all__ = ["ProgressBar", "TrainerBar"]

#: The longest component path shown in a bar (longer ones keep their end: the component itself).
_TEXT_WIDTH = 48


def _short(text: str) -> str:
    return text if len(text) <= _TEXT_WIDTH else "…" + text[-(_TEXT_WIDTH - 1) :]


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


class _Row(Protocol):
    def show(self, count: ScheduleCount, event: ProgressEvent) -> None: ...

    def close(self) -> None: ...


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

    def __init__(self, bar: Any, rich_type: type, tqdm_type: type) -> None:
        self.bar: Any = bar if bar is not None and getattr(bar, "is_enabled", True) else None
        self.kind: Literal["rich", "tqdm", "other"] | None = None
        if self.bar is not None:
            self.kind = "rich" if isinstance(bar, rich_type) else "tqdm" if isinstance(bar, tqdm_type) else "other"

    def _tqdm_train(self) -> Any:
        """The TQDM bar's open train bar, else ``None`` (its ``print`` drops lines without one)."""
        try:
            train = self.bar.train_progress_bar
        except (TypeError, AttributeError):  # not set yet
            return None
        return None if train is None or train.disable else train

    def _rich_live(self) -> Any:
        """The Rich bar's ``progress`` when it is drawing on a terminal, else ``None``."""
        progress = getattr(self.bar, "progress", None)
        if progress is None or getattr(self.bar, "_progress_stopped", False) or not progress.live.is_started:
            return None
        return progress if progress.console.is_terminal else None

    def print(self, message: str) -> bool:
        """Print ``message`` on a line of its own through the bar (``ProgressBar.print``).

        Returns:
            Whether it was printed; ``False`` without a bar, or with a TQDM bar
            whose train bar is closed: then the caller logs it
            (``rank_zero_info``) as without a bar.
        """
        if self.bar is None or (self.kind == "tqdm" and self._tqdm_train() is None):
            return False
        self.bar.print(message)
        return True

    def row(self, step: int, count: ScheduleCount) -> _Row:
        """What draws the profile of ``step`` (see the module docstring); ``count`` has read the first call."""
        if self.kind == "rich" and (progress := self._rich_live()) is not None:
            return _RichRow(self.bar, progress, step, count.components)
        if self.kind == "tqdm" and (train := self._tqdm_train()) is not None and _isatty(sys.stdout):
            return _TqdmRow(self.bar, type(train), step, count.components)
        return _PlainLines(self._line, step, count)

    def _line(self, line: str) -> None:
        """A plain line through the bar, or to stdout where it has no open bar to print through (TQDM's closed)."""
        if not self.print(line):
            print(line, file=sys.stdout, flush=True)


def _isatty(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty()) if callable(isatty) else False


class _RichRow:
    """One task of the Rich bar's ``progress``: ``completed`` components of ``total``, the text in its description."""

    def __init__(self, bar: Any, progress: Any, step: int, total: int | None) -> None:
        from rich.markup import escape

        self._bar, self._progress, self._escape = bar, progress, escape
        style = getattr(getattr(bar, "theme", None), "description", "")
        self._label = f"[{style}]Profiling step {step}[/]" if style else f"Profiling step {step}"
        # an infinite total is Lightning's task without one (CustomProgress.add_task)
        self._task = progress.add_task(self._label, total=float("inf") if total is None else total)

    def show(self, count: ScheduleCount, event: ProgressEvent) -> None:
        description = f"{self._label} {self._escape(_short(event.text))}"
        total = float("inf") if count.components is None else count.components
        self._progress.update(self._task, completed=count.started, total=total, description=description)
        self._bar.refresh()

    def close(self) -> None:
        self._progress.remove_task(self._task)
        self._bar.refresh()


class _TqdmRow:
    """A bar of Lightning's ``Tqdm`` class and format at the position below the train bar, cleared on close."""

    def __init__(self, bar: Any, tqdm_class: type, step: int, total: int | None) -> None:
        self._bar = tqdm_class(
            desc=f"Profiling step {step}", total=total, position=2 * getattr(bar, "process_position", 0) + 1,
            leave=False, dynamic_ncols=True, file=sys.stdout, bar_format=getattr(bar, "BAR_FORMAT", None),
        )  # fmt: skip

    def show(self, count: ScheduleCount, event: ProgressEvent) -> None:
        self._bar.set_postfix_str(_short(event.text), refresh=False)
        self._bar.total = count.components  # grows by a level the failures call for
        self._bar.n = count.started  # drawn at each call, as Lightning draws its own (its _update_n)
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
