"""The reporter contract: what a reporter gets (:class:`ReportContext`) and does (:class:`Reporter`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from cb_callback._report.model import Report

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["ReportContext", "Reporter"]


class TensorBoardWriter(Protocol):
    """What :func:`~cb_callback._report.tensorboard.log_report` calls on a ``SummaryWriter``-like writer.

    ``add_scalar`` and ``add_text`` always; ``add_image``, or else ``add_figure``
    (:class:`FigureWriter`), for the charts. The optional ``add_image``, ``add_custom_scalars``,
    ``flush`` and ``_get_file_writer`` are looked up with ``getattr`` and called only when present.
    """

    def add_scalar(self, tag: str, scalar_value: float, global_step: int) -> object: ...

    def add_text(self, tag: str, text_string: str, global_step: int) -> object: ...


class FigureWriter(TensorBoardWriter, Protocol):
    """A writer without ``add_image``: its charts go through ``add_figure`` (a matplotlib figure)."""

    def add_figure(self, tag: str, figure: Figure, global_step: int, close: bool) -> object: ...


@dataclass
class ReportContext:
    """What a reporter sees.

    Attributes:
        output_dir: where files go, or ``None`` when nothing should be written.
        step: the training step the report belongs to (0 outside training).
        writer: a TensorBoard ``SummaryWriter``-like object, when one is known.
    """

    output_dir: Path | None = None
    step: int = 0
    writer: TensorBoardWriter | None = None


@runtime_checkable
class Reporter(Protocol):
    """Writes a finished :class:`Report` somewhere.

    ``write`` runs once per report, after every component is measured and
    estimated. It reads the report only; it must not assume the model exists.
    Returns the files it wrote (may be empty).
    """

    name: str

    def write(self, report: Report, ctx: ReportContext) -> list[Path]: ...
