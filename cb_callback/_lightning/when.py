"""When the callback captures: one step, a list of steps, or every N steps, each a window of steps.

From plain values (no Trainer), so each rule is testable on its own.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from cb_callback._lightning.step import StepCaptures, unreachable

__all__ = ["CaptureSchedule"]


class CaptureSchedule:
    """The captures of a run: each starts at a scheduled step and takes ``batches`` steps from there.

    The scheduled starts are ``steps`` (``capture_steps``), else ``first``,
    ``first + every``, ``first + 2 * every`` … (``capture_every``; no end), else
    ``first`` alone. A capture opens at the first step the run reaches at or
    after its start and after the previous capture's last step (a run resumed
    past a start, or a capture held back while a fork child still profiles the
    previous one, takes the next steps it has), and is known by the first step
    it took. A start that passed while the previous capture was still open or
    held back is not captured twice: the next one opened is the first start
    after the last step taken.

    Args:
        first: ``capture_step``.
        batches: ``capture_batches``: steps per capture.
        every: ``capture_every``, or ``None``.
        steps: ``capture_steps``, or ``None``.
    """

    def __init__(self, first: int, batches: int, every: int | None = None, steps: Sequence[int] | None = None) -> None:
        self.batches, self.every = batches, every
        self.steps = sorted(set(steps)) if steps else None
        self.first = self.steps[0] if self.steps else first
        #: The first step of every capture finished (profiled, forked, or failed), in order.
        self.done: list[int] = []
        self._last_taken: int | None = None
        self._window: StepCaptures | None = None
        #: The first and last ``global_step`` the run was seen at (``None``: none yet).
        self.seen: tuple[int, int] | None = None

    def saw(self, step: int) -> int:
        """Note that the run reached ``step`` (for the end-of-run warning); return it."""
        self.seen = (step, step) if self.seen is None else (self.seen[0], step)
        return step

    @property
    def planned(self) -> int | None:
        """How many captures are scheduled (``None``: no end, ``capture_every``)."""
        if self.every is not None:
            return None
        return len(self.steps) if self.steps else 1

    @property
    def series(self) -> bool:
        """Whether the run captures more than once: each capture is then its own ``step_<N>/`` report."""
        return self.planned is None or self.planned > 1

    def _starts(self) -> Iterator[int]:
        if self.steps:
            return iter(self.steps)
        if self.every is not None:
            return itertools.count(self.first, self.every)
        return iter([self.first])

    def _next_start(self) -> int | None:
        after = self._last_taken if self._last_taken is not None else (max(self.done) if self.done else None)
        return next((s for s in self._starts() if after is None or s > after), None)

    @property
    def finished(self) -> bool:
        """Whether every scheduled capture is done (never, with ``capture_every``)."""
        return self._window is None and self._next_start() is None

    @property
    def open_window(self) -> StepCaptures | None:
        """The capture being filled, if one has taken a step."""
        return self._window if self._window is not None and self._window.taken else None

    def window(self) -> StepCaptures | None:
        """The capture being filled, else the next one to open; ``None`` when none is left."""
        if self._window is None:
            start = self._next_start()
            if start is not None:
                self._window = StepCaptures(start, self.batches)
        return self._window

    def close(self) -> int:
        """End the open capture (all its steps taken, or the run ended inside it); return its first step."""
        window = self._window
        if window is None:
            raise RuntimeError("no capture is open")
        first = window.steps[0] if window.steps else window.first_step
        self.done.append(first)
        self._last_taken = window.steps[-1] if window.steps else self._last_taken
        self._window = None
        return first

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the captures done (``captured`` as before several captures existed)."""
        return {"captured": bool(self.done), "capture_step": self.first, "captured_steps": list(self.done)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict` (or a checkpoint of one capture, which has only ``captured``)."""
        done = state.get("captured_steps")
        self.restore(done if done is not None else [self.first] * bool(state.get("captured")))

    def restore(self, done: Sequence[int]) -> None:
        """Resume: the captures done before (their first steps) are not repeated."""
        self.done = sorted(int(s) for s in done)
        self._last_taken, self._window = None, None

    def output_dir(self, base: Path | None, step: int) -> Path | None:
        """Where the capture that began at ``step`` writes: ``base``, or ``base/step_<step>`` in a series."""
        if base is None or not self.series:
            return base
        return base / f"step_{step}"

    def unreachable_warning(self, max_steps: int | None) -> str | None:
        """The warning for the first scheduled capture ``Trainer(max_steps=...)`` never completes, else ``None``."""
        starts = self.unreachable(max_steps)
        if not starts:
            return None
        message = unreachable(starts[0], max_steps, self.batches)
        later = len(starts) - 1
        return message if message is None or not later else f"{message} ({later} later capture_steps neither)"

    def unreachable(self, max_steps: int | None) -> list[int]:
        """The scheduled starts ``Trainer(max_steps=...)`` stops before (their last step unreached).

        For ``capture_every`` only the first start is checked (the later ones end with the run).
        """
        if max_steps is None or max_steps < 0:
            return []
        starts = self.steps if self.steps else [self.first]
        return [s for s in starts if s + self.batches - 1 > max_steps - 1]
