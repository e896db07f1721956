"""Write a :class:`~cb_callback._report.model.Report` to files: JSON, CSV, the page, icicle and roofline PNGs."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from cb_callback._report.html import write_html
from cb_callback._report.icicle import resolve_metric, save_icicles
from cb_callback._report.roofline_chart import save_roofline

if TYPE_CHECKING:
    from cb_callback._report.context import ReportContext
    from cb_callback._report.model import Report

__all__ = ["FileReporter"]


class FileReporter:
    """A reporter that writes ``report.json``, ``components.csv``, ``report.html``, icicle PNGs and ``roofline.png``.

    Args:
        icicle_metrics: one ``icicle_<metric>.png`` per metric (see
            :func:`cb_callback._report.icicle.save_icicles`); empty for none.
        html: also write ``report.html``, the interactive report (about 5 MB:
            plotly.js is inlined so it opens offline).
        roofline: also write ``roofline.png``
            (:func:`cb_callback._report.roofline_chart.save_roofline`: every measured pass under the
            device's ceilings, docs/columns.md "The roofline chart").

    Raises:
        ValueError: for an icicle metric that is not supported.
    """

    name = "files"

    def __init__(
        self,
        icicle_metrics: Iterable[str] = ("mfu", "total_ms", "peak_mem_mb"),
        html: bool = True,
        roofline: bool = True,
    ) -> None:
        self.icicle_metrics = tuple(resolve_metric(m) for m in icicle_metrics)
        self.html = html
        self.roofline = roofline

    def write(self, report: Report, ctx: ReportContext) -> list[Path]:
        """Write the files into ``ctx.output_dir`` (created if missing).

        Returns:
            The written files: ``report.json``, ``components.csv``, ``report.html``,
            then the icicle PNGs and ``roofline.png``; ``[]`` when ``ctx.output_dir`` is ``None``.
        """
        if ctx.output_dir is None:
            return []
        out = report.save(ctx.output_dir, html=False)  # the page below, so its path is known
        page = [write_html(report, out)] if self.html else []
        return [
            out / report.REPORT_FILE,
            out / report.CSV_FILE,
            *page,
            *save_icicles(report, out, self.icicle_metrics),
            *([save_roofline(report, out)] if self.roofline else []),
        ]
