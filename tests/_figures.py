"""Blank charts for tests that read no image (a report's icicles and roofline cost it about a second)."""

from __future__ import annotations

import multiprocessing
import os
from typing import Any

#: Set by :func:`blank_figures` for the test's real ``spawn`` children (fork mode), which inherit it: a child
#: imports ``tests._callback_models`` (its model's module) to load the snapshot, and that import blanks its charts.
CHILD_ENV = "CB_TEST_BLANK_FIGURES"


def blank_figures(monkeypatch: Any, tensorboard: bool = True) -> None:
    """Draw the report's icicles and roofline as blank 16x9-pixel figures, in the files and in TensorBoard,
    here and in the test's fork-mode children.

    For a test that reads no image: each report's four 1600x900 PNGs (and TensorBoard's four again) cost
    it about a second of matplotlib. The files and tags keep their names. The default outputs' tests
    (tests/callback/test_callback.py, bit-identical and without TensorBoard) and tests/report (the charts)
    draw them for real.

    Args:
        tensorboard: ``False``: TensorBoard's images are drawn for real (a test that reads them).
    """
    monkeypatch.setenv(CHILD_ENV, "1")
    _blank(monkeypatch.setattr, tensorboard)


def blank_here() -> None:
    """In a 2-rank script whose test reads no image (the tags only): blank charts in this process and in the
    ranks it forks (Lightning's launcher starts the script again, which calls this again). The variable is set
    too, for a ``spawn`` child that imports ``tests._callback_models`` (:func:`blank_in_a_child`); the scripts'
    runs start none today (DDP's profile in pause mode, FSDP2's fork mode falling back to pause)."""
    os.environ[CHILD_ENV] = "1"
    _blank(setattr)


def blank_in_a_child() -> None:
    """In a ``spawn`` child of a test that called :func:`blank_figures`: its charts blank too (for good: the
    process is the test's own)."""
    if os.environ.get(CHILD_ENV) == "1" and multiprocessing.parent_process() is not None:
        _blank(setattr)


def _blank(set_attribute: Any, tensorboard: bool = True) -> None:
    import matplotlib.figure

    import cb_callback._report.icicle as icicle_module
    import cb_callback._report.roofline_chart as roofline_module
    import cb_callback._report.tensorboard as tensorboard_module

    def blank(*args: Any, **kwargs: Any) -> matplotlib.figure.Figure:
        return matplotlib.figure.Figure(figsize=(0.16, 0.09), dpi=100)

    targets = [(icicle_module, "icicle_figure"), (roofline_module, "roofline_figure")]
    if tensorboard:
        targets += [(tensorboard_module, "icicle_figure"), (tensorboard_module, "roofline_figure")]
    for module, name in targets:
        set_attribute(module, name, blank)
