"""Profile a snapshot in a child process started with ``multiprocessing``'s ``spawn``.

The parent learns how the child ended from three things: its exit code (0: a
complete ``report.json`` was written), one line the child sends through a pipe
when something failed (the cause, e.g. ``OSError ... (ENOSPC)``; a pipe, so a
full disk cannot hide it), and ``error.txt`` for the user. While it runs the
child keeps 64 KiB of the output directory's disk in a reserve file, removed
just before it writes ``error.txt``, so that even a disk the report filled
holds the reason.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnContext
from multiprocessing.process import BaseProcess
from pathlib import Path

from cb_callback._lightning.publish import (
    ERROR_FILE,
    FilesWritten,
    error_line,
    save_files,
    write_error_file,
)
from cb_callback._report.context import ReportContext
from cb_callback._report.model import Report
from cb_callback._whatif.snapshot import load_snapshot

__all__ = ["ERROR_FILE", "RESERVE_FILE", "ChildResult", "ChildRun", "run_child", "spawn_context"]

_GUARD_HINT = (
    "The 'spawn' start method re-imports the training script (`__main__`) in the child: "
    'a script needs an `if __name__ == "__main__":` guard around its training code, and the '
    "LightningModule class must be defined where the child can import it (at the top level "
    "of the script or of a module, not in a notebook or a `python -c` string)."
)

#: The child's reserve of disk space for ``error.txt`` in the output directory (removed when it ends).
RESERVE_FILE = ".cb_error_reserve"
_RESERVE_BYTES = 64 * 1024
_MAX_SENT_CHARS = 4000  # one line through the pipe, far below its buffer: sending never blocks


def _reserve(directory: Path) -> Path | None:
    """Keep :data:`_RESERVE_BYTES` of ``directory``'s disk in :data:`RESERVE_FILE` (random bytes, so a
    compressing file system keeps them too); ``None`` when there is no room."""
    path = directory / RESERVE_FILE
    try:
        directory.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(_RESERVE_BYTES))
    except OSError:
        _remove(path)
        return None
    return path


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


def _fail(out: Path, outcome: Connection | None, header: str, cause: str, error: BaseException) -> None:
    """Say ``cause`` to the parent (the pipe) and in ``error.txt``, with ``error``'s traceback."""
    if outcome is not None:
        with contextlib.suppress(OSError, ValueError):
            outcome.send(cause[:_MAX_SENT_CHARS])
    _remove(out / RESERVE_FILE)  # the room error.txt is written into
    text = f"cb_callback: {header}:\n{cause}\n\n{''.join(traceback.format_exception(error))}"
    write_error_file(out, text.encode()[: _RESERVE_BYTES - 1024].decode(errors="ignore"))


def run_child(
    snapshot_dir: str, output_dir: str, device: str | None, step: int, outcome: Connection | None = None
) -> None:
    """The child's entry point: load the snapshot, profile it, write the report files.

    Args:
        snapshot_dir: the snapshot to profile.
        output_dir: where ``report.json``, ``components.csv`` and the icicles go;
            on failure, :data:`ERROR_FILE` with the cause and the traceback.
        device: where to replay, ``None`` for where the model was saved from.
        step: the training step the report belongs to.
        outcome: the sending end of a pipe to the parent: one line, the cause,
            when anything failed (nothing when all went well).

    Raises:
        SystemExit: with code 1 when there is no complete ``report.json``
            (profiling failed, or writing it did). When ``report.json`` was
            written but a later file was not (a full disk), the child ends with
            code 0 after sending the cause.
    """
    out = Path(output_dir)
    _reserve(out)
    try:
        try:
            snapshot = load_snapshot(snapshot_dir, map_location=device)
            report = snapshot.profile(device=device, output_dir=out)
        except BaseException as e:
            header = f"profiling the snapshot {snapshot_dir} failed in the child process"
            _fail(out, outcome, header, error_line(e), e)
            raise SystemExit(1) from e
        files = save_files(report, ReportContext(output_dir=out, step=step))
        if files.problem is None or files.error is None:
            return
        if files.directory is not None:  # the parent reads report.json; the line says what else is missing
            header = "the child process wrote report.json but not every report file"
            _fail(out, outcome, header, files.problem, files.error)
            return
        cause = (
            f"the profile ran, but it {files.problem}; no report.json was written, so the report is lost: "
            f"the snapshot is kept, replay it with `cb replay {snapshot_dir} --out DIR` on a disk with room"
        )
        _fail(out, outcome, "the child process could not write the report", cause, files.error)
        raise SystemExit(1) from files.error
    finally:
        _remove(out / RESERVE_FILE)
        if outcome is not None:
            outcome.close()


def spawn_context() -> SpawnContext:
    """The ``multiprocessing`` context children are started with (``spawn``; a test seam)."""
    return multiprocessing.get_context("spawn")


@dataclass
class ChildResult:
    """How a child ended.

    Attributes:
        report: the report it wrote, ``None`` when it failed.
        error: what went wrong (a message for a warning), ``None`` when nothing
            did; with a ``report`` too when ``report.json`` was written but a
            later file was not.
        error_file: the file with the details, when there is one.
        files: where the report's files are, and why not all, when not.
    """

    report: Report | None
    error: str | None = None
    error_file: Path | None = None
    files: FilesWritten = field(default_factory=lambda: FilesWritten(None))


class ChildRun:
    """One child process profiling one snapshot.

    Args:
        snapshot_dir: the snapshot (written by :func:`cb_callback._whatif.snapshot.save_snapshot`).
        output_dir: where the child writes the report files.
        device: where the child replays; ``None`` for where the model was saved from.
        step: the training step the report belongs to.

    Notes:
        The child is a daemon: it ends with the parent. It competes with training
        for the device (and the CPU cores) while it runs; pass ``device=`` to put it
        elsewhere.
    """

    def __init__(self, snapshot_dir: Path, output_dir: Path, device: str | None, step: int) -> None:
        self.snapshot_dir = snapshot_dir
        self.output_dir = output_dir
        self.device = device
        self.step = step
        self.started_at: float | None = None
        self._proc: BaseProcess | None = None
        self._outcome: Connection | None = None  # the pipe's reading end until read
        self._sent: str | None = None  # the line the child sent

    def start(self) -> None:
        """Start the child (removing an error file a previous run left)."""
        (self.output_dir / ERROR_FILE).unlink(missing_ok=True)
        reader, writer = multiprocessing.Pipe(duplex=False)
        proc = spawn_context().Process(
            target=run_child,
            args=(str(self.snapshot_dir), str(self.output_dir), self.device, self.step, writer),
            name="cb_callback-profile",
            daemon=True,
        )
        try:
            proc.start()
        except BaseException:
            reader.close()
            raise
        finally:
            writer.close()  # the child holds its own end: a child that dies unheard reads as EOF
        self._proc, self._outcome = proc, reader
        self.started_at = time.monotonic()

    @property
    def pid(self) -> int | None:
        """The child's process id, once started."""
        return None if self._proc is None else self._proc.pid

    def poll(self) -> ChildResult | None:
        """The result if the child has ended, ``None`` while it runs (never blocks)."""
        if self._proc is None or self._proc.is_alive():
            return None
        return self._result(self._proc.exitcode)

    def wait(self, timeout_s: float | None) -> ChildResult:
        """Wait up to ``timeout_s`` seconds (``None``: no limit); stop the child past it."""
        if self._proc is None:
            return ChildResult(None, "the profiling child was never started")
        self._proc.join(timeout_s)
        if self._proc.is_alive():
            return self.stop(f"it did not finish within fork_timeout_s={timeout_s}")
        return self._result(self._proc.exitcode)

    def stop(self, reason: str) -> ChildResult:
        """Terminate the child if it still runs; the result names ``reason``."""
        if self._proc is not None and self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5.0)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(5.0)
        self._received()
        _remove(self.output_dir / RESERVE_FILE)
        message = (
            f"the profiling child process was stopped: {reason}. The snapshot is kept; profile it "
            f"offline with `cb replay {self.snapshot_dir}` (raise fork_timeout_s to wait longer)."
        )
        return ChildResult(None, message, self._write_error(message))

    def _write_error(self, message: str) -> Path | None:
        return write_error_file(self.output_dir, f"cb_callback: {message}\n")

    def _received(self) -> str | None:
        """The line the child sent through the pipe (read once, then the pipe is closed), if any."""
        reader, self._outcome = self._outcome, None
        if reader is not None:
            try:
                got = reader.recv() if reader.poll() else None
                self._sent = got if isinstance(got, str) else None
            except (EOFError, OSError):
                pass
            finally:
                reader.close()
        return self._sent

    def _details(self) -> str:
        error_file = self.output_dir / ERROR_FILE
        if error_file.is_file():
            return f" Details: {error_file}"
        return f" ({ERROR_FILE} could not be written in {self.output_dir} either.)"

    def _result(self, exitcode: int | None) -> ChildResult:
        error_file = self.output_dir / ERROR_FILE
        _remove(self.output_dir / RESERVE_FILE)  # left by a child that was killed
        sent = self._received()
        if exitcode == 0:
            try:
                report = Report.load(self.output_dir / Report.REPORT_FILE)  # the child's own, not one below
            except (OSError, ValueError, KeyError, TypeError) as e:
                message = f"the profiling child ended but its report could not be read: {e}"
                return ChildResult(None, message, self._write_error(message))
            if sent is None:
                return ChildResult(report, files=FilesWritten(self.output_dir))
            message = (
                f"the profiling child process wrote report.json to {self.output_dir}, but it {sent}: the other "
                f"report files may be missing or incomplete.{self._details()}"
            )
            kept = error_file if error_file.is_file() else None
            return ChildResult(report, message, kept, FilesWritten(self.output_dir, sent))
        cause = sent
        if cause is None and error_file.is_file():
            lines = [ln for ln in error_file.read_text(errors="replace").splitlines() if ln.strip()]
            # The second line is the cause (see run_child).
            cause = lines[1] if len(lines) > 1 else (lines[0] if lines else None)
        if cause is not None:
            hint = f" {_GUARD_HINT}" if ("import" in cause.lower() or "SnapshotError" in cause) else ""
            message = f"profiling failed in the child process (exit code {exitcode}): {cause}.{hint}{self._details()}"
            return ChildResult(None, message, error_file if error_file.is_file() else None)
        message = (
            f"the profiling child process exited with code {exitcode} before writing a report "
            f"(killed, out of memory, or it failed while starting). {_GUARD_HINT} The snapshot is "
            f"kept: profile it with `cb replay {self.snapshot_dir}` to see the error."
        )
        return ChildResult(None, message, self._write_error(message))
