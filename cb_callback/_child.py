"""Profile a snapshot in a child process started with ``multiprocessing``'s ``spawn``."""

from __future__ import annotations

import multiprocessing
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cb_callback._files import FileReporter
from cb_callback._plugins import ReportContext
from cb_callback._publish import ERROR_FILE, write_error_file
from cb_callback._report import Report
from cb_callback._snapshot import load_snapshot

__all__ = ["ERROR_FILE", "ChildResult", "ChildRun", "run_child", "spawn_context"]

_GUARD_HINT = (
    "The 'spawn' start method re-imports the training script (`__main__`) in the child: "
    'a script needs an `if __name__ == "__main__":` guard around its training code, and the '
    "LightningModule class must be defined where the child can import it (at the top level "
    "of the script or of a module, not in a notebook or a `python -c` string)."
)


def run_child(snapshot_dir: str, output_dir: str, device: str | None, step: int) -> None:
    """The child's entry point: load the snapshot, profile it, write the report files.

    Args:
        snapshot_dir: the snapshot to profile.
        output_dir: where ``report.json``, ``components.csv`` and the icicles go;
            on failure, :data:`ERROR_FILE` with the traceback.
        device: where to replay, ``None`` for where the model was saved from.
        step: the training step the report belongs to.

    Raises:
        SystemExit: with code 1 after writing :data:`ERROR_FILE`, when anything fails.
    """
    out = Path(output_dir)
    try:
        snapshot = load_snapshot(snapshot_dir, map_location=device)
        report = snapshot.profile(device=device, output_dir=out)
        FileReporter().write(report, ReportContext(output_dir=out, step=step))
    except BaseException as e:
        write_error_file(
            out,
            f"cb_callback: profiling the snapshot {snapshot_dir} failed in the child process:\n"
            f"{type(e).__name__}: {e}\n\n{traceback.format_exc()}",
        )
        raise SystemExit(1) from e


def spawn_context() -> Any:
    """The ``multiprocessing`` context children are started with (``spawn``; a test seam)."""
    return multiprocessing.get_context("spawn")


@dataclass
class ChildResult:
    """How a child ended.

    Attributes:
        report: the report it wrote, ``None`` when it failed.
        error: why it failed (a message for a warning), ``None`` when it did not.
        error_file: the file with the details, when there is one.
    """

    report: Report | None
    error: str | None = None
    error_file: Path | None = None


class ChildRun:
    """One child process profiling one snapshot.

    Args:
        snapshot_dir: the snapshot (written by :func:`cb_callback._snapshot.save_snapshot`).
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
        self._proc: Any = None

    def start(self) -> None:
        """Start the child (removing an error file a previous run left)."""
        (self.output_dir / ERROR_FILE).unlink(missing_ok=True)
        proc = spawn_context().Process(
            target=run_child,
            args=(str(self.snapshot_dir), str(self.output_dir), self.device, self.step),
            name="cb_callback-profile",
            daemon=True,
        )
        proc.start()
        self._proc = proc
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
        message = (
            f"the profiling child process was stopped: {reason}. The snapshot is kept; profile it "
            f"offline with `cb replay {self.snapshot_dir}` (raise fork_timeout_s to wait longer)."
        )
        return ChildResult(None, message, self._write_error(message))

    def _write_error(self, message: str) -> Path | None:
        return write_error_file(self.output_dir, f"cb_callback: {message}\n")

    def _result(self, exitcode: int | None) -> ChildResult:
        error_file = self.output_dir / ERROR_FILE
        if exitcode == 0:
            try:
                return ChildResult(Report.load(self.output_dir))
            except (OSError, ValueError, KeyError, TypeError) as e:
                message = f"the profiling child ended but its report could not be read: {e}"
                return ChildResult(None, message, self._write_error(message))
        if error_file.is_file():
            lines = [ln for ln in error_file.read_text(errors="replace").splitlines() if ln.strip()]
            # The second line is "<Exception>: <message>" (see run_child).
            cause = lines[1] if len(lines) > 1 else (lines[0] if lines else "unknown error")
            hint = f" {_GUARD_HINT}" if ("import" in cause.lower() or "SnapshotError" in cause) else ""
            message = (
                f"profiling failed in the child process (exit code {exitcode}): {cause}.{hint} "
                f"Details: {error_file}"
            )
            return ChildResult(None, message, error_file)
        message = (
            f"the profiling child process exited with code {exitcode} before writing a report "
            f"(killed, out of memory, or it failed while starting). {_GUARD_HINT} The snapshot is "
            f"kept: profile it with `cb replay {self.snapshot_dir}` to see the error."
        )
        return ChildResult(None, message, self._write_error(message))
