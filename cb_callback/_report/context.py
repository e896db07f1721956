"""The reporter contract: what a reporter gets (:class:`ReportContext`) and does (:class:`Reporter`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from cb_callback._report.model import Report

__all__ = ["ReportContext", "Reporter"]


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
    writer: Any = None


@runtime_checkable
class Reporter(Protocol):
    """Writes a finished :class:`Report` somewhere.

    ``write`` runs once per report, after every component is measured and
    estimated. It reads the report only; it must not assume the model exists.
    Returns the files it wrote (may be empty).
    """

    name: str

    def write(self, report: Report, ctx: ReportContext) -> list[Path]: ...
