"""The callback's output: report files and TensorBoard through the built-in reporters, error.txt.

Both go through the :class:`cb_callback.Reporter` contract
(:class:`~cb_callback.reporters.FileReporter`,
:class:`~cb_callback.reporters.TensorBoardReporter`) with one
:class:`cb_callback.ReportContext`; a reporter that fails is one warning that
says where the report still is, never an exception in the training run.
"""

from __future__ import annotations

import dataclasses
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cb_callback._tensorboard import TAG_PREFIX
from cb_callback.reporters import FileReporter, TensorBoardReporter

if TYPE_CHECKING:
    from cb_callback._plugins import ReportContext
    from cb_callback._report import Report

__all__ = [
    "ERROR_FILE",
    "TensorBoardTarget",
    "log_to_tensorboard",
    "open_writer",
    "report_failure",
    "write_error_file",
    "write_files",
]

#: Written into the output directory when profiling fails (in-process or in the child).
ERROR_FILE = "error.txt"


@dataclass(frozen=True)
class TensorBoardTarget:
    """A TensorBoard logger, as the reporters need it.

    Attributes:
        log_dir: its log directory (what ``tensorboard --logdir`` takes).
        writer: opens (or returns the open) ``SummaryWriter``-like writer; may raise.
    """

    log_dir: str
    writer: Callable[[], Any]


def write_error_file(directory: Path, text: str) -> Path | None:
    """Write ``text`` to :data:`ERROR_FILE` in ``directory`` (created if missing).

    Returns:
        The file, or ``None`` when it could not be written (never raises ``OSError``).
    """
    path = directory / ERROR_FILE
    try:
        directory.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError:
        return None
    return path


def report_failure(step: int, output_dir: Path | None, error: BaseException) -> None:
    """One ``RuntimeWarning`` for a profile that raised, its traceback in ``error.txt``.

    Args:
        step: the capture step.
        output_dir: where ``error.txt`` goes (``None``: not written).
        error: what the profile raised.
    """
    message = (
        f"cb_callback: profiling step {step} failed ({type(error).__name__}: {error}); training continues "
        "without a component report."
    )
    details = "".join(traceback.format_exception(error))
    error_file = None if output_dir is None else write_error_file(output_dir, f"{message}\n\n{details}")
    warnings.warn(message + (f" Details: {error_file}" if error_file else ""), RuntimeWarning, stacklevel=3)


def open_writer(target: TensorBoardTarget | None) -> Any:
    """``target``'s writer, ``None`` without a target or when it cannot be opened.

    A writer that cannot be opened is reported by :func:`log_to_tensorboard`.
    """
    if target is None:
        return None
    try:
        return target.writer()
    except Exception:
        return None


def write_files(report: Report, ctx: ReportContext) -> Path | None:
    """Write the report's files into ``ctx.output_dir`` with :class:`FileReporter`.

    Returns:
        ``ctx.output_dir`` once written; ``None`` when it is ``None`` or writing
        failed (one ``RuntimeWarning``).
    """
    if ctx.output_dir is None:
        return None
    try:
        FileReporter().write(report, ctx)
    except Exception as e:
        warnings.warn(
            f"cb_callback: could not write the report files to {ctx.output_dir} ({type(e).__name__}: {e}); "
            "the report is in ComponentBenchmark.report.",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    return ctx.output_dir


def log_to_tensorboard(
    report: Report, ctx: ReportContext, target: TensorBoardTarget | None, enabled: bool = True
) -> str | None:
    """Log ``report`` with :class:`TensorBoardReporter` at ``ctx.step``; say where it all is.

    Args:
        report: the report.
        ctx: ``output_dir`` is where the report's files were written (``None``:
            they were not); ``step`` the capture step. Its ``writer`` is replaced
            by ``target``'s.
        target: the TensorBoard logger; ``None``: there is none.
        enabled: ``False``: log nothing (``log_to_tensorboard=False``).

    Returns:
        The line that says where the report is (for the run's log); ``None`` when
        logging failed, after one ``RuntimeWarning`` saying where it still is.
    """
    where = (
        f"written to {ctx.output_dir} (report.json, components.csv, icicle_*.png)"
        if ctx.output_dir is not None
        else "not written to files"
    )
    line = f"cb_callback: component report of step {ctx.step} {where}"
    if not enabled:
        return line
    if target is None:
        return f"{line}; there is no TensorBoardLogger among trainer.loggers, so nothing was logged to TensorBoard."
    try:
        TensorBoardReporter().write(report, dataclasses.replace(ctx, writer=target.writer()))
    except Exception as e:
        warnings.warn(
            f"cb_callback: could not log the report to TensorBoard ({type(e).__name__}: {e}); it is {where}.",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    return f"{line}; logged to TensorBoard under {TAG_PREFIX}/: tensorboard --logdir {target.log_dir}"
