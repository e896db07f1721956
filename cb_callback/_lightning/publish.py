"""The callback's output: report files and TensorBoard through the built-in reporters, error.txt.

Both go through the :class:`cb_callback.reporters.Reporter` contract
(:class:`~cb_callback.reporters.FileReporter`,
:class:`~cb_callback.reporters.TensorBoardReporter`) with one
:class:`cb_callback.reporters.ReportContext`; a reporter that fails is one warning that
says where the report still is, never an exception in the training run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from cb_callback._report.files import FileReporter
from cb_callback._report.tensorboard import TAG_PREFIX, TensorBoardReporter

if TYPE_CHECKING:
    from cb_callback._report.context import ReportContext, TensorBoardWriter
    from cb_callback._report.model import Report

__all__ = [
    "ERROR_FILE",
    "FilesWritten",
    "TensorBoardTarget",
    "error_line",
    "files_problem",
    "log_to_tensorboard",
    "open_writer",
    "report_failure",
    "save_files",
    "tensorboard",
    "write_error_file",
    "write_files",
]

#: Written into the output directory when profiling fails (in-process or in the child), or the
#: fork child cannot write the report files (a full disk): the cause, then the traceback.
ERROR_FILE = "error.txt"


class TensorBoardLogger(Protocol):
    """What :func:`tensorboard` reads of Lightning's ``TensorBoardLogger`` (this module imports no Lightning)."""

    @property
    def log_dir(self) -> str: ...

    @property
    def experiment(self) -> TensorBoardWriter: ...


@dataclass(frozen=True)
class TensorBoardTarget:
    """A TensorBoard logger, as the reporters need it.

    Attributes:
        log_dir: its log directory (what ``tensorboard --logdir`` takes).
        writer: opens (or returns the open) ``SummaryWriter``-like writer; may raise.
    """

    log_dir: str
    writer: Callable[[], TensorBoardWriter]


@dataclass(frozen=True)
class FilesWritten:
    """Where a report's files went.

    Attributes:
        directory: the directory that holds a complete ``report.json`` of the
            report (and, unless ``problem`` says otherwise, the other files);
            ``None`` when no ``report.json`` was written.
        problem: why writing the files failed, one line naming the error (its
            errno's name and strerror, see :func:`error_line`) and the
            directory; ``None`` when nothing failed.
        error: the exception behind ``problem`` (for a traceback).
    """

    directory: Path | None
    problem: str | None = None
    error: BaseException | None = field(default=None, compare=False, repr=False)


def error_line(error: BaseException) -> str:
    """``error`` in one line: ``Type: message``; an ``OSError`` also says its errno's name.

    ``OSError: [Errno 28] No space left on device (ENOSPC): '/data/run/report.json'``:
    the number, the strerror, the name (``ENOSPC``), and the file when the
    error names one (a failed ``write`` does not: say the directory around it).
    A message of several lines gives its first, then `` ...``.
    """
    code = error.errno if isinstance(error, OSError) else None
    if isinstance(error, OSError) and code is not None and code in errno.errorcode and error.strerror:
        where = f": {str(error.filename)!r}" if error.filename is not None else ""
        return f"{type(error).__name__}: [Errno {code}] {error.strerror} ({errno.errorcode[code]}){where}"
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    text = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    return text + (" ..." if len(lines) > 1 else "")


def write_error_file(directory: Path, text: str) -> Path | None:
    """Write ``text`` to :data:`ERROR_FILE` in ``directory`` (created if missing).

    Returns:
        The file, or ``None`` when it could not be written (a full disk): then no
        empty or partial ``error.txt`` is left (never raises ``OSError``).
    """
    path = directory / ERROR_FILE
    try:
        directory.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        return None
    return path


def report_failure(step: int, output_dir: Path | None, error: BaseException) -> None:
    """One ``RuntimeWarning`` for a profile that raised, its traceback in ``error.txt``.

    Args:
        step: the capture step.
        output_dir: where ``error.txt`` goes (``None``: not written).
        error: what the profile raised (fork mode: what writing the snapshot or
            starting the child raised, e.g. ``OSError`` ``ENOSPC`` naming the file).
    """
    message = (
        f"cb_callback: profiling step {step} failed ({error_line(error)}); training continues "
        "without a component report."
    )
    details = "".join(traceback.format_exception(error))
    error_file = None if output_dir is None else write_error_file(output_dir, f"{message}\n\n{details}")
    if error_file is not None:
        message += f" Details: {error_file}"
    elif output_dir is not None:
        message += f" ({ERROR_FILE} could not be written in {output_dir} either.)"
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def tensorboard(
    loggers: Sequence[object], logger_type: type[TensorBoardLogger], enabled: bool
) -> TensorBoardTarget | None:
    """The first of ``loggers`` of ``logger_type`` (Lightning's ``TensorBoardLogger``, passed in: this
    module imports no Lightning) as a target; ``None`` if there is none or ``enabled`` is false."""
    logger: TensorBoardLogger | None = next((lg for lg in loggers if isinstance(lg, logger_type)), None)
    if logger is None or not enabled:
        return None
    return TensorBoardTarget(logger.log_dir, lambda: logger.experiment)


def open_writer(target: TensorBoardTarget | None) -> TensorBoardWriter | None:
    """``target``'s writer, ``None`` without a target or when it cannot be opened.

    A writer that cannot be opened is reported by :func:`log_to_tensorboard`.
    """
    if target is None:
        return None
    try:
        return target.writer()
    except Exception:
        return None


def files_problem(directory: Path, error: BaseException) -> str:
    """Why the report's files in ``directory`` could not be written, in one line."""
    return f"could not write the report files to {directory} ({error_line(error)})"


def _holds_report(directory: Path) -> bool:
    """Whether ``directory`` has a ``report.json`` that reads back whole."""
    from cb_callback._report.model import Report

    try:
        Report.load(directory / Report.REPORT_FILE)  # this one file, never a report found below
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    return True


def save_files(report: Report, ctx: ReportContext) -> FilesWritten:
    """Write the report's files into ``ctx.output_dir`` with :class:`FileReporter`; never raises.

    An older ``report.json`` there is removed first, so that after a failure
    (a full disk) a ``report.json`` that reads back is this report's; one that
    does not is removed too, so that no reader takes a truncated report.

    Returns:
        ``FilesWritten(output_dir)`` when all were written;
        ``FilesWritten(output_dir, problem)`` when ``report.json`` was but a
        later file was not; ``FilesWritten(None, problem)`` when ``report.json``
        was not; ``FilesWritten(None)`` when ``ctx.output_dir`` is ``None``.
    """
    out = ctx.output_dir
    if out is None:
        return FilesWritten(None)
    report_json = out / report.REPORT_FILE
    with contextlib.suppress(OSError):
        report_json.unlink(missing_ok=True)
    try:
        FileReporter().write(report, ctx)
    except Exception as e:
        if _holds_report(out):
            return FilesWritten(out, files_problem(out, e), e)
        with contextlib.suppress(OSError):
            report_json.unlink(missing_ok=True)
        return FilesWritten(None, files_problem(out, e), e)
    return FilesWritten(out)


def write_files(report: Report, ctx: ReportContext) -> FilesWritten:
    """:func:`save_files`, and one ``RuntimeWarning`` when writing failed.

    The warning names the error (``ENOSPC``, its strerror), the directory, and
    whether ``report.json`` is complete; the files there may be missing or
    incomplete, and the report is in memory (``ComponentBenchmark.report``).
    """
    files = save_files(report, ctx)
    if files.problem is not None:
        kept = (
            "report.json is complete, the other files" if files.directory else "no report.json was written, the files"
        )
        warnings.warn(
            f"cb_callback: {files.problem}: {kept} there may be missing or incomplete; "
            "the report is in ComponentBenchmark.report.",
            RuntimeWarning,
            stacklevel=3,
        )
    return files


def log_to_tensorboard(
    report: Report,
    ctx: ReportContext,
    target: TensorBoardTarget | None,
    enabled: bool = True,
    files_problem: str | None = None,
) -> str | None:
    """Log ``report`` with :class:`TensorBoardReporter` at ``ctx.step``; say where it all is.

    Args:
        report: the report.
        ctx: ``output_dir`` is where the report's files were written (``None``:
            they were not); ``step`` the capture step. Its ``writer`` is replaced
            by ``target``'s.
        target: the TensorBoard logger; ``None``: there is none.
        enabled: ``False``: log nothing (``log_to_tensorboard=False``).
        files_problem: why the files were not (all) written
            (:attr:`FilesWritten.problem`); said in the line.

    Returns:
        The line that says where the report is (for the run's log); ``None`` when
        logging failed, after one ``RuntimeWarning`` saying where it still is.
    """
    if files_problem is not None:
        kept = "partly written to files (report.json is complete)" if ctx.output_dir else "not written to files"
        where = f"{kept}: {files_problem}"
    elif ctx.output_dir is not None:
        where = f"written to {ctx.output_dir} (report.json, components.csv, report.html, icicle_*.png, roofline.png)"
    else:
        where = "not written to files"
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
