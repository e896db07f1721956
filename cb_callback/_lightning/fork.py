"""Fork mode's lifecycle: snapshot, child process, and what it ended with.

:class:`Fork` is what the callback holds while a child profiles the captured
step: it writes the snapshot, starts the child (:class:`cb_callback._lightning.child.ChildRun`),
polls, waits or stops it, and :func:`fork_report` turns how it ended into the
report or a warning. Plain values in, no Lightning.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cb_callback._lightning.child import ChildResult, ChildRun
from cb_callback._whatif.snapshot import save_snapshot

if TYPE_CHECKING:
    from torch import nn

    from cb_callback._engine.capture.inputs import ComponentInputs
    from cb_callback._engine.run.config import BenchmarkConfig
    from cb_callback._report.model import Report

__all__ = ["SNAPSHOT_DIR", "Fork", "fork_report"]

#: Subdirectory of the work directory that holds a fork-mode snapshot.
SNAPSHOT_DIR = "snapshot"


class Fork:
    """A snapshot of one captured step, profiled by a child process.

    Build it with :meth:`start`.

    Args:
        work_dir: where the snapshot is (under :data:`SNAPSHOT_DIR`) and where the
            child writes the report files or ``error.txt``.
        child: the started child.
    """

    def __init__(self, work_dir: Path, child: ChildRun) -> None:
        self.work_dir = work_dir
        self.child = child

    @classmethod
    def start(
        cls,
        model: nn.Module,
        calls: Mapping[str, ComponentInputs] | Sequence[Mapping[str, ComponentInputs]],
        *,
        config: BenchmarkConfig,
        captured_batch_size: int | None,
        precision: str | None,
        metadata: Mapping[str, Any],
        output_dir: Path | None,
        device: str,
        step: int,
    ) -> Fork:
        """Write the snapshot and start the child that profiles it.

        Args:
            model: the model the step ran (saved as it is now).
            calls: its captured calls, by path (one mapping per batch with several).
            config: the options the child profiles with.
            captured_batch_size: the batch size the captured inputs hold.
            precision: the Lightning precision of the step (the child rebuilds its context).
            metadata: the report's extra metadata.
            output_dir: the work directory; ``None`` (not writable) for a new
                temporary directory.
            device: where the child replays.
            step: the training step the report belongs to.

        Raises:
            Exception: whatever saving the snapshot or starting the process raised.
        """
        work = output_dir if output_dir is not None else Path(tempfile.mkdtemp(prefix="cb_callback_"))
        snapshot = work / SNAPSHOT_DIR
        save_snapshot(
            snapshot,
            model,
            calls,
            config=config,
            captured_batch_size=captured_batch_size,
            precision=precision,
            metadata=dict(metadata),
        )
        child = ChildRun(snapshot, work, device, step)
        child.start()
        return cls(work, child)

    def describe(self) -> str:
        """One line for the run's log: where the snapshot is, which process profiles it."""
        return (
            f"cb_callback: snapshot of step {self.child.step} written to {self.snapshot_dir}; profiling it "
            f"in child process {self.pid} while training continues"
        )

    @property
    def snapshot_dir(self) -> Path:
        """The snapshot the child profiles (kept for ``cb replay``)."""
        return self.child.snapshot_dir

    @property
    def pid(self) -> int | None:
        """The child's process id."""
        return self.child.pid

    def poll(self) -> ChildResult | None:
        """How the child ended, ``None`` while it runs (never blocks)."""
        return self.child.poll()

    def wait(self, timeout_s: float | None) -> ChildResult:
        """Wait up to ``timeout_s`` seconds (``None``: no limit); stop the child past it."""
        return self.child.wait(timeout_s)

    def stop(self, reason: str) -> ChildResult:
        """How the child ended, stopping it first (the result names ``reason``) if it runs."""
        return self.child.poll() or self.child.stop(reason)


def fork_report(result: ChildResult, then: str = "") -> Report | None:
    """The report a child ended with; what went wrong is one ``RuntimeWarning``.

    Args:
        result: how the child ended.
        then: appended to the warning (what it means for the run).

    Returns:
        The report, or ``None`` after the warning. A child that wrote
        ``report.json`` but not every other file (a full disk) gives both: the
        report, and the warning that names the error and the directory.
    """
    if result.error is not None or result.report is None:
        warnings.warn(f"cb_callback: {result.error}{then}", RuntimeWarning, stacklevel=3)
    return result.report
