"""Blank charts for tests that read no image (a report's icicles and roofline cost it about a second)."""

from __future__ import annotations

from typing import Any


def blank_figures(monkeypatch: Any) -> None:
    """Draw the report's icicles and roofline as blank 16x9-pixel figures, in the files and in TensorBoard.

    For a test that reads no image: each report's four 1600x900 PNGs (and TensorBoard's four again) cost
    it about a second of matplotlib. The files and tags keep their names. A real ``spawn`` child draws its
    own. tests/callback/test_callback.py (the default outputs) and tests/report (the charts) draw them for real.
    """
    import matplotlib.figure

    import cb_callback._report.icicle as icicle_module
    import cb_callback._report.roofline_chart as roofline_module
    import cb_callback._report.tensorboard as tensorboard_module

    def blank(*args: Any, **kwargs: Any) -> matplotlib.figure.Figure:
        return matplotlib.figure.Figure(figsize=(0.16, 0.09), dpi=100)

    for module, name in (
        (icicle_module, "icicle_figure"),
        (roofline_module, "roofline_figure"),
        (tensorboard_module, "icicle_figure"),
        (tensorboard_module, "roofline_figure"),
    ):
        monkeypatch.setattr(module, name, blank)
