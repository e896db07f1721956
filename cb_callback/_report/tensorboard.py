"""Write a :class:`~cb_callback._report.model.Report` to TensorBoard: scalars, tables, icicles.

Tags (a contract): ``component_benchmark/<metric>/<path>`` (the root as ``root``)
for the root and the ``log_scalars`` components that cost the most time;
``component_benchmark/table`` and ``component_benchmark/summary`` (texts);
``component_benchmark/icicle/<metric>`` (images); ``cb/roofline`` (the roofline image,
:data:`ROOFLINE_TAG`); and the run's Custom Scalars
layout (``custom_scalars__config__``), which groups the scalars time first.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from cb_callback._report.icicle import icicle_figure
from cb_callback._report.pixels import rendered
from cb_callback._report.roofline_chart import roofline_figure
from cb_callback._report.table import format_summary, format_text_table

if TYPE_CHECKING:
    from collections.abc import Callable

    from matplotlib.figure import Figure

    from cb_callback._report.context import FigureWriter, ReportContext, TensorBoardWriter
    from cb_callback._report.model import ComponentRow, Report

__all__ = [
    "ICICLE_IMAGE_METRICS",
    "ROOFLINE_TAG",
    "SCALAR_METRICS",
    "SERIES_LOG_SCALARS",
    "TAG_PREFIX",
    "TensorBoardReporter",
    "log_report",
    "scalar_layout",
    "scalar_rows",
    "scalar_tag",
]

#: The prefix of every tag written (a contract: dashboards filter on it).
TAG_PREFIX = "component_benchmark"

#: Row columns logged as scalars, one series per component, in the order they are
#: written (time first). Units as in :class:`~cb_callback.ComponentRow`: ``mfu`` and
#: ``bw_util`` are fractions of the peak (0.25 = 25 %), as in the data.
SCALAR_METRICS: tuple[str, ...] = (
    "total_ms", "fwd_ms", "bwd_ms", "mfu", "tflops", "peak_mem_mb", "gbps", "bw_util",
)  # fmt: skip

#: Components with scalars besides the root when the config leaves it to the report
#: (``log_scalars=None``) and the report is one capture of a series (curves); the
#: run's only capture gets the root's alone (one dot per chart is no chart).
SERIES_LOG_SCALARS = 10

#: The Custom Scalars dashboard's categories: title -> ((chart title, metric), ...).
_LAYOUT: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("component_benchmark: time (ms per call)", (
        ("total_ms (forward + backward)", "total_ms"), ("fwd_ms", "fwd_ms"), ("bwd_ms", "bwd_ms"),
    )),
    ("component_benchmark: compute (mfu: fraction of the peak)", (
        ("mfu (fraction, 0.25 = 25 %)", "mfu"), ("tflops (TFLOP/s)", "tflops"),
    )),
    ("component_benchmark: memory (MiB per call, GB/s; bw_util: fraction of the peak)", (
        ("peak_mem_mb", "peak_mem_mb"), ("gbps", "gbps"), ("bw_util (fraction, 0.25 = 25 %)", "bw_util"),
    )),
)  # fmt: skip

#: Metrics with an icicle image, under ``component_benchmark/icicle/<metric>``.
ICICLE_IMAGE_METRICS: tuple[str, ...] = ("mfu", "total_ms", "peak_mem_mb")

#: The roofline image's tag (docs/columns.md, "The roofline chart"), beside the icicles.
ROOFLINE_TAG = "cb/roofline"

_ROOT_TAG = "root"


def scalar_tag(metric: str, path: str) -> str:
    """``component_benchmark/<metric>/<path>``, with ``root`` for the root path ``""``."""
    return f"{TAG_PREFIX}/{metric}/{path or _ROOT_TAG}"


def _step_time(row: ComponentRow) -> float:
    """Time over the step (``total_ms * max(calls, 1)``); NaN when it is not positive and finite."""
    t = float(row.total_ms) * max(row.calls, 1)
    return t if math.isfinite(t) and t > 0 else math.nan


def _check_log_scalars(value: object) -> int | str:
    if (isinstance(value, str) and value in ("all", "root")) or (
        isinstance(value, int) and not isinstance(value, bool) and value >= 0
    ):
        return value
    raise ValueError(f"log_scalars={value!r} is invalid: expected an integer >= 0 or 'all'")


def _configured_log_scalars(report: Report) -> int | str:
    """``report.metadata["config"]["log_scalars"]``; when it is ``None``, absent or invalid: the root's
    alone (``"root"``), or :data:`SERIES_LOG_SCALARS` more for a capture of a series
    (``metadata["capture_series"]``)."""
    config = report.metadata.get("config")
    value = config.get("log_scalars") if isinstance(config, dict) else None
    try:
        if value is not None:
            return _check_log_scalars(value)
    except ValueError:
        pass
    return SERIES_LOG_SCALARS if report.metadata.get("capture_series") else "root"


def scalar_rows(report: Report, log_scalars: int | str = SERIES_LOG_SCALARS) -> list[ComponentRow]:
    """The rows :func:`log_report` writes scalars for, in the order it writes them.

    Args:
        report: the report.
        log_scalars: ``n``: the root(s) and the ``n`` other measured components
            (status ``ok`` or ``estimated``, at any depth: a container and its
            children may both be chosen) with the largest time over the step,
            ``total_ms * max(calls, 1)``, largest first, ties in report order;
            ``"all"``: every row, in report order; ``"root"``: the root(s) alone;
            ``0``: none (not even the root).

    Returns:
        The rows. A root is a row with no parent in the report (normally just
        the row of path ``""``); it is always first when ``log_scalars != 0``,
        whatever its status.

    Raises:
        ValueError: ``log_scalars`` is neither an integer >= 0 nor ``"all"``.
    """
    limit = _check_log_scalars(log_scalars)
    if limit == "all":
        return list(report.rows)
    if limit == 0:
        return []
    paths = {r.path for r in report.rows}
    roots = [r for r in report.rows if r.parent is None or r.parent not in paths]
    if limit == "root":
        return roots
    root_paths = {r.path for r in roots}
    measured = [
        r for r in report.rows
        if r.path not in root_paths and r.status in ("ok", "estimated") and math.isfinite(_step_time(r))
    ]  # fmt: skip
    ranked = sorted(measured, key=lambda r: -_step_time(r))  # stable: ties keep report order
    return roots + ranked[: int(limit)]


def scalar_layout() -> dict[str, dict[str, list[Any]]]:
    """The Custom Scalars layout :func:`log_report` writes: time first, then compute, then memory.

    Each chart is one metric of :data:`SCALAR_METRICS` with every logged
    component as a line (the regex ``component_benchmark/<metric>/.*``).
    """
    return {
        category: {title: ["Multiline", [f"{TAG_PREFIX}/{metric}/.*"]] for title, metric in charts}
        for category, charts in _LAYOUT
    }


def _fenced(text: str) -> str:
    """``text`` as a fenced code block (markdown's ``<pre><code>``, which TensorBoard's sanitizer keeps):
    shown as it is, one line per line, never wrapped. The fence is three backticks, or one more than
    the longest run of backticks that starts a line of ``text`` (which would close a shorter one)."""
    runs = [len(m.group()) for m in re.finditer(r"^`+", text, flags=re.MULTILINE)]
    fence = "`" * max([3, *(n + 1 for n in runs)])
    return f"{fence}\n{text}\n{fence}"


def _summary_markdown(report: Report) -> str:
    """:func:`format_summary` and the metadata as fenced code blocks (TensorBoard markdown)."""
    metadata = json.dumps(report.metadata, indent=1, sort_keys=True, default=str)
    return f"{_fenced(format_summary(report))}\n\nmetadata:\n\n{_fenced(metadata)}"


def _table_markdown(report: Report) -> str:
    """:func:`~cb_callback._report.table.format_text_table` as a fenced code block: TensorBoard's Text tab
    wraps a markdown table inside its cells (``136.0`` over ``29``); a ``<pre>`` block keeps each row on
    one line and scrolls sideways."""
    return _fenced(format_text_table(report))


def _add_text(writer: TensorBoardWriter, tag: str, text: str, step: int) -> None:
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


def log_report(
    writer: TensorBoardWriter, report: Report, step: int = 0, log_scalars: int | str | None = None, layout: bool = True
) -> None:
    """Log ``report`` to a TensorBoard ``SummaryWriter``-like ``writer`` at ``step``.

    Writes, for the rows of :func:`scalar_rows` and every metric of
    :data:`SCALAR_METRICS` with a finite value, the scalar :func:`scalar_tag`
    ``(metric, path)``, metric by metric in that order (time first); the
    Custom Scalars layout :func:`scalar_layout` (when ``layout`` and the writer
    has ``add_custom_scalars``); the texts ``component_benchmark/table``
    (:func:`~cb_callback._report.table.format_text_table`: the columns of
    :func:`~cb_callback._report.table.format_table`, aligned, in a fenced code
    block) and ``component_benchmark/summary`` (:func:`format_summary` and the
    metadata, fenced too: TensorBoard shows both as ``<pre>`` blocks, unwrapped); and the images
    ``component_benchmark/icicle/<metric>`` for :data:`ICICLE_IMAGE_METRICS`
    (:func:`~cb_callback._report.icicle.icicle_figure`, 1600x900 px) and :data:`ROOFLINE_TAG`
    (:func:`~cb_callback._report.roofline_chart.roofline_figure`, 1600x900 px), through
    ``add_image`` (HWC, uint8 RGB) when the writer has it, else ``add_figure``. The pixels are those of
    the PNG files beside ``report.json``: :func:`~cb_callback._report.pixels.rendered` draws each image
    once per report content, so logging after writing the files draws nothing again.

    Args:
        writer: has ``add_scalar``, ``add_text`` and ``add_image`` or ``add_figure``.
        report: the report to log.
        step: the global step the values are logged at.
        log_scalars: which components get scalars (see :func:`scalar_rows`);
            ``None``: the report's ``metadata["config"]["log_scalars"]``; when that
            is ``None`` too, the root alone, or :data:`SERIES_LOG_SCALARS` more for a
            capture of a series.
        layout: also write the Custom Scalars layout. A run has one layout:
            pass ``False`` when the run writes its own.

    Notes:
        The Scalars dashboard sorts tags alphabetically (``bw_util`` before
        ``total_ms``) whatever the write order; the Custom Scalars tab shows the
        layout's order: time (``total_ms``, ``fwd_ms``, ``bwd_ms``), then
        compute (``mfu``, ``tflops``), then memory (``peak_mem_mb``, ``gbps``,
        ``bw_util``), one chart per metric with a line per component. ``mfu``
        and ``bw_util`` are logged as fractions (the data's unit); the table
        and the images show percents.

    Raises:
        ValueError: an invalid ``log_scalars``.
    """
    limit = _configured_log_scalars(report) if log_scalars is None else _check_log_scalars(log_scalars)
    rows = scalar_rows(report, limit)
    for metric in SCALAR_METRICS:
        for row in rows:
            value = float(getattr(row, metric))
            if math.isfinite(value):
                writer.add_scalar(scalar_tag(metric, row.path), value, global_step=step)
    add_layout = getattr(writer, "add_custom_scalars", None) if rows and layout else None
    if callable(add_layout):
        add_layout(scalar_layout())
    _add_text(writer, f"{TAG_PREFIX}/table", _table_markdown(report), step)
    _add_text(writer, f"{TAG_PREFIX}/summary", _summary_markdown(report), step)
    images: list[tuple[str, Callable[..., Figure], tuple[str, ...]]] = [
        (f"{TAG_PREFIX}/icicle/{m}", icicle_figure, (m,)) for m in ICICLE_IMAGE_METRICS
    ]
    for tag, draw, args in [*images, (ROOFLINE_TAG, roofline_figure, ())]:
        add_image = getattr(writer, "add_image", None)
        if callable(add_image):  # the PNG files' pixels, drawn once per report
            add_image(tag, rendered(report, draw, *args)[:, :, :3], global_step=step, dataformats="HWC")
        else:  # a writer with neither raises AttributeError here, as the contract says (TensorBoardWriter)
            cast("FigureWriter", writer).add_figure(tag, draw(report, *args), global_step=step, close=True)


class TensorBoardReporter:
    """A reporter that logs the report to TensorBoard (see :func:`log_report`).

    Uses ``ctx.writer`` when there is one (flushed, left open); otherwise, when
    ``ctx.output_dir`` is set, a ``torch.utils.tensorboard.SummaryWriter`` on it,
    closed afterwards. With neither it writes nothing.

    Args:
        log_scalars: which components get scalars (:func:`scalar_rows`);
            ``None`` (default): the report's ``metadata["config"]["log_scalars"]``
            (:class:`cb_callback.BenchmarkConfig`); when that is ``None`` too, the root
            alone, or :data:`SERIES_LOG_SCALARS` more for a capture of a series.
        layout: also write the Custom Scalars layout (``False``: the run has its own).

    Raises:
        ValueError: an invalid ``log_scalars``.
    """

    name = "tensorboard"

    def __init__(self, log_scalars: int | str | None = None, layout: bool = True) -> None:
        self.log_scalars = None if log_scalars is None else _check_log_scalars(log_scalars)
        self.layout = layout

    def write(self, report: Report, ctx: ReportContext) -> list[Path]:
        """Log ``report`` at ``ctx.step``.

        Returns:
            ``[]``: the event files belong to the writer.
        """
        writer = ctx.writer
        if writer is not None:
            log_report(writer, report, ctx.step, self.log_scalars, self.layout)
            flush = getattr(writer, "flush", None)
            if callable(flush):
                flush()
            return []
        if ctx.output_dir is None:
            return []
        from torch.utils.tensorboard import SummaryWriter

        own = SummaryWriter(str(ctx.output_dir))
        try:
            log_report(own, report, ctx.step, self.log_scalars, self.layout)
        finally:
            own.close()
        return []
