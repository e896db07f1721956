"""The profile's progress as a tqdm bar: components done of total, current path."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["ProgressBar"]


class ProgressBar:
    """``progress(done, total, path)`` drawn as a tqdm bar (created on the first call).

    A context manager: ``with ProgressBar(step, show) as progress`` gives the bar,
    or ``None`` when ``show`` is false, and removes the bar on exit.

    Args:
        step: the training step being profiled (in the bar's label).
        show: whether to draw it at all.
    """

    def __init__(self, step: int, show: bool = True) -> None:
        self._step = step
        self._show = show
        self._bar: Any = None

    def __enter__(self) -> ProgressBar | None:
        return self if self._show else None

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __call__(self, done: int, total: int, path: str) -> None:
        if self._bar is None:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total, desc=f"component benchmark (step {self._step})", unit="component",
                leave=False, dynamic_ncols=True, file=sys.stdout,
            )  # fmt: skip
        self._bar.set_postfix_str(path or "(root)", refresh=False)
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        """Remove the bar (a no-op when it was never drawn)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
