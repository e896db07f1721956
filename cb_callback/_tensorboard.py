"""Write a :class:`~cb_callback._report.Report` to TensorBoard: scalars, tables, icicles."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg

from cb_callback._icicle import icicle_figure
from cb_callback._table import format_summary, format_table

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from cb_callback._plugins import ReportContext
    from cb_callback._report import Report

__all__ = [
    "ICICLE_IMAGE_METRICS",
    "SCALAR_METRICS",
    "TAG_PREFIX",
    "TensorBoardReporter",
    "log_report",
    "scalar_tag",
]

#: The prefix of every tag written (a contract: dashboards filter on it).
TAG_PREFIX = "component_benchmark"

#: Row columns logged as scalars, one series per component.
SCALAR_METRICS: tuple[str, ...] = (
    "total_ms", "fwd_ms", "bwd_ms", "mfu", "tflops", "peak_mem_mb", "gbps", "bw_util",
)  # fmt: skip

#: Metrics with an icicle image, under ``component_benchmark/icicle/<metric>``.
ICICLE_IMAGE_METRICS: tuple[str, ...] = ("mfu", "total_ms", "peak_mem_mb")

_ROOT_TAG = "root"


def scalar_tag(metric: str, path: str) -> str:
    """``component_benchmark/<metric>/<path>``, with ``root`` for the root path ``""``."""
    return f"{TAG_PREFIX}/{metric}/{path or _ROOT_TAG}"


def _summary_markdown(report: Report) -> str:
    """:func:`format_summary` and the metadata as fenced code blocks (TensorBoard markdown)."""
    metadata = json.dumps(report.metadata, indent=1, sort_keys=True, default=str)
    return f"```\n{format_summary(report)}\n```\n\nmetadata:\n\n```\n{metadata}\n```"


def _figure_to_hwc(fig: Figure) -> np.ndarray:
    """Render ``fig`` with Agg to an ``(H, W, 3)`` uint8 array."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[:, :, :3].copy()


def _add_text(writer: Any, tag: str, text: str, step: int) -> None:
    """A text summary stored under exactly ``tag``.

    ``SummaryWriter.add_text`` stores ``<tag>/text_summary``; the text dashboard
    shows any tensor with the text plugin's metadata, so the summary is written
    with the tag itself (writers without a file writer get ``add_text``).
    """
    file_writer = getattr(writer, "_get_file_writer", None)
    if not callable(file_writer):
        writer.add_text(tag, text, global_step=step)
        return
    from torch.utils.tensorboard.summary import text as text_summary

    summary = text_summary(tag, text)
    summary.value[0].tag = tag
    file_writer().add_summary(summary, step)


def log_report(writer: Any, report: Report, step: int = 0) -> None:
    """Log ``report`` to a TensorBoard ``SummaryWriter``-like ``writer`` at ``step``.

    Writes, for every row and every metric of :data:`SCALAR_METRICS` with a
    finite value, the scalar :func:`scalar_tag` ``(metric, path)``; the texts
    ``component_benchmark/table`` (:func:`format_table`) and
    ``component_benchmark/summary`` (:func:`format_summary` and the metadata);
    and the images ``component_benchmark/icicle/<metric>`` for
    :data:`ICICLE_IMAGE_METRICS`, through ``add_figure`` when the writer has it,
    else ``add_image`` (HWC, uint8).

    Args:
        writer: has ``add_scalar``, ``add_text`` and ``add_figure`` or ``add_image``.
        report: the report to log.
        step: the global step the values are logged at.
    """
    for row in report.rows:
        for metric in SCALAR_METRICS:
            value = float(getattr(row, metric))
            if math.isfinite(value):
                writer.add_scalar(scalar_tag(metric, row.path), value, global_step=step)
    _add_text(writer, f"{TAG_PREFIX}/table", format_table(report), step)
    _add_text(writer, f"{TAG_PREFIX}/summary", _summary_markdown(report), step)
    for metric in ICICLE_IMAGE_METRICS:
        tag = f"{TAG_PREFIX}/icicle/{metric}"
        fig = icicle_figure(report, metric)
        if callable(getattr(writer, "add_figure", None)):
            writer.add_figure(tag, fig, global_step=step, close=True)
        else:
            writer.add_image(tag, _figure_to_hwc(fig), global_step=step, dataformats="HWC")


class TensorBoardReporter:
    """A reporter that logs the report to TensorBoard (see :func:`log_report`).

    Uses ``ctx.writer`` when there is one (flushed, left open); otherwise, when
    ``ctx.output_dir`` is set, a ``torch.utils.tensorboard.SummaryWriter`` on it,
    closed afterwards. With neither it writes nothing.
    """

    name = "tensorboard"

    def write(self, report: Report, ctx: ReportContext) -> list[Path]:
        """Log ``report`` at ``ctx.step``.

        Returns:
            ``[]``: the event files belong to the writer.
        """
        writer = ctx.writer
        if writer is not None:
            log_report(writer, report, ctx.step)
            if callable(getattr(writer, "flush", None)):
                writer.flush()
            return []
        if ctx.output_dir is None:
            return []
        from torch.utils.tensorboard import SummaryWriter

        own = SummaryWriter(str(ctx.output_dir))
        try:
            log_report(own, report, ctx.step)
        finally:
            own.close()
        return []
