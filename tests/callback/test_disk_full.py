"""A full disk (``ENOSPC``) while the callback writes: training completes, and the user is told what is lost and why.

Both modes say it in a ``RuntimeWarning`` in the training process that names the
error (errno 28, ``ENOSPC``, "No space left on device" on Linux) and the
directory (a failed ``write()`` names no file); fork mode's child says it to the
parent through a pipe, so that even an ``error.txt`` that cannot be written
does not hide it. The failures are injected into the functions the library
really writes with (``Path.write_text``, the snapshot's file), in this process
or, for a real ``spawn`` child, through a ``sitecustomize`` on its ``PYTHONPATH``;
on a machine where root may mount a tmpfs, a real 1 MiB file system fills too.
"""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import os
import shutil
import subprocess
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import cb_callback._whatif.snapshot as snapshot_module
from cb_callback import ComponentBenchmark, Report
from cb_callback._lightning.child import RESERVE_FILE
from cb_callback._lightning.publish import error_line
from tests._callback_models import run_fit
from tests._figures import blank_figures
from tests.callback.test_callback_fork import _InlineProcess, _use
from tests.conftest import FAST

OPTS: dict[str, Any] = {**FAST, "peak_flops": 1e11, "peak_bandwidth": 1e10}
# errno 28 on Linux, its strerror and its name, as the messages spell them
ENOSPC = "OSError: [Errno 28] No space left on device (ENOSPC)"
NO_TB = "; there is no TensorBoardLogger among trainer.loggers, so nothing was logged to TensorBoard."


@pytest.fixture(autouse=True)
def _blank_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test here reads an image: the reports' charts are drawn blank (a second each saved)."""
    blank_figures(monkeypatch)


def _ours(record: Any) -> list[str]:
    return [str(w.message) for w in record if str(w.message).startswith("cb_callback")]


def _full_at(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """``Path.write_text`` of a file named one of ``names`` fails as on a full disk (no file named)."""
    real = Path.write_text

    def write_text(self: Path, *args: Any, **kwargs: Any) -> int:
        if self.name in names:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)


def _fit(tmp_path: Path, cb: ComponentBenchmark, caplog: pytest.LogCaptureFixture) -> tuple[Any, list[str], list[str]]:
    """Fit 3 steps; the trainer, our warnings, and the callback's "component report" info lines."""
    with warnings.catch_warnings(record=True) as record, caplog.at_level(logging.INFO):
        warnings.simplefilter("always")
        trainer, _, _ = run_fit(tmp_path, [cb], max_steps=3, logger=False)
    lines = [m for m in caplog.messages if m.startswith("cb_callback: component report")]
    return trainer, _ours(record), lines


def test_error_line_names_the_errno_and_keeps_one_line() -> None:
    # errno 28 is ENOSPC on Linux; an OSError built with a filename names it, a failed write() does not
    assert error_line(OSError(28, "No space left on device")) == ENOSPC
    assert error_line(OSError(28, "No space left on device", "/d/report.json")) == f"{ENOSPC}: '/d/report.json'"
    assert error_line(OSError("disk full")) == "OSError: disk full"  # no errno: as Python prints it
    assert error_line(ValueError("first\nsecond")) == "ValueError: first ..."
    assert error_line(KeyError("rows")) == "KeyError: 'rows'"


# --- pause mode -------------------------------------------------------------------------------


def test_pause_mode_a_disk_full_at_the_page_keeps_report_json_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _full_at(monkeypatch, "report.html")  # report.json and components.csv come first
    cb = ComponentBenchmark(capture_step=1, **OPTS)
    trainer, messages, lines = _fit(tmp_path, cb, caplog)
    out = tmp_path / "component_benchmark"
    problem = f"could not write the report files to {out} ({ENOSPC})"
    assert messages == [
        f"cb_callback: {problem}: report.json is complete, the other files there may be missing or incomplete; "
        "the report is in ComponentBenchmark.report."
    ]
    assert lines == [
        f"cb_callback: component report of step 1 partly written to files (report.json is complete): {problem}{NO_TB}"
    ]
    assert trainer.global_step == 3 and cb.report is not None
    assert [r.path for r in Report.load(out).rows] == [r.path for r in cb.report.rows]


def test_pause_mode_a_disk_full_at_report_json_says_no_report_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "component_benchmark"
    out.mkdir()
    (out / "report.json").write_text('{"rows": [], "metadata": {"old": true}}')  # an older run's
    _full_at(monkeypatch, "report.json")
    cb = ComponentBenchmark(capture_step=1, **OPTS)
    trainer, messages, lines = _fit(tmp_path, cb, caplog)
    problem = f"could not write the report files to {out} ({ENOSPC})"
    assert messages == [
        f"cb_callback: {problem}: no report.json was written, the files there may be missing or incomplete; "
        "the report is in ComponentBenchmark.report."
    ]
    assert lines == [f"cb_callback: component report of step 1 not written to files: {problem}{NO_TB}"]
    assert trainer.global_step == 3 and cb.report is not None
    assert not (out / "report.json").exists()  # the older report is not taken for this one


# --- fork mode, the child run in this process -------------------------------------------------


def test_fork_mode_a_disk_full_at_the_page_keeps_the_report_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _use(monkeypatch, _InlineProcess)
    _full_at(monkeypatch, "report.html")
    cb = ComponentBenchmark(capture_step=1, mode="fork", **OPTS)
    trainer, messages, lines = _fit(tmp_path, cb, caplog)
    out = tmp_path / "component_benchmark"
    problem = f"could not write the report files to {out} ({ENOSPC})"
    assert messages == [
        f"cb_callback: the profiling child process wrote report.json to {out}, but it {problem}: the other "
        f"report files may be missing or incomplete. Details: {out / 'error.txt'} Training is not affected."
    ]
    assert lines == [
        f"cb_callback: component report of step 1 partly written to files (report.json is complete): {problem}{NO_TB}"
    ]
    assert trainer.global_step == 3 and cb.report is not None
    text = (out / "error.txt").read_text().splitlines()
    assert text[:2] == ["cb_callback: the child process wrote report.json but not every report file:", problem]
    assert "Traceback (most recent call last):" in text
    assert not (out / RESERVE_FILE).exists()


def test_fork_mode_a_disk_full_at_report_json_says_the_report_is_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _use(monkeypatch, _InlineProcess)
    _full_at(monkeypatch, "report.json")
    cb = ComponentBenchmark(capture_step=1, mode="fork", **OPTS)
    with pytest.warns(RuntimeWarning) as record:
        trainer, _, _ = run_fit(tmp_path, [cb], max_steps=3, logger=False)
    out = tmp_path / "component_benchmark"
    cause = (
        f"the profile ran, but it could not write the report files to {out} ({ENOSPC}); no report.json was "
        f"written, so the report is lost: the snapshot is kept, replay it with `cb replay {out / 'snapshot'} "
        "--out DIR` on a disk with room"
    )
    assert _ours(record) == [
        f"cb_callback: profiling failed in the child process (exit code 1): {cause}. Details: {out / 'error.txt'} "
        "Training is not affected."
    ]
    assert trainer.global_step == 3 and cb.report is None
    assert (out / "error.txt").read_text().splitlines()[:2] == [
        "cb_callback: the child process could not write the report:",
        cause,
    ]


def test_fork_mode_says_why_even_when_error_txt_cannot_be_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _use(monkeypatch, _InlineProcess)
    _full_at(monkeypatch, "report.json", "error.txt")  # the reason reaches the parent through the pipe
    cb = ComponentBenchmark(capture_step=1, mode="fork", **OPTS)
    with pytest.warns(RuntimeWarning) as record:
        trainer, _, _ = run_fit(tmp_path, [cb], max_steps=3, logger=False)
    out = tmp_path / "component_benchmark"
    (message,) = _ours(record)
    assert message.startswith(
        f"cb_callback: profiling failed in the child process (exit code 1): the profile ran, but it could not "
        f"write the report files to {out} ({ENOSPC}); no report.json was written, so the report is lost"
    )
    assert message.endswith(
        f"on a disk with room. (error.txt could not be written in {out} either.) Training is not affected."
    )
    assert trainer.global_step == 3 and not (out / "error.txt").exists()  # no empty error.txt left


class _FullFile(io.FileIO):
    """A file on a disk with ``room`` bytes left: a write past it fails with ``ENOSPC``."""

    room = 4096

    def write(self, b: Any) -> int:
        if self.tell() + len(b) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(b)


def test_fork_mode_a_snapshot_that_fills_the_disk_names_errno_and_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _use(monkeypatch, _InlineProcess)
    monkeypatch.setattr(snapshot_module, "open", lambda path, mode: _FullFile(path, mode), raising=False)
    cb = ComponentBenchmark(capture_step=1, mode="fork", **OPTS)
    with pytest.warns(RuntimeWarning) as record:
        trainer, _, _ = run_fit(tmp_path, [cb], max_steps=3, logger=False)
    out = tmp_path / "component_benchmark"
    tmp = out / "snapshot" / "snapshot.pt.tmp"
    assert _ours(record) == [
        f"cb_callback: profiling step 1 failed ({ENOSPC}: '{tmp}'); training continues without a component "
        f"report. Details: {out / 'error.txt'}"
    ]
    assert trainer.global_step == 3 and cb.report is None and _InlineProcess.started == []
    assert not tmp.exists()  # the partial snapshot is removed


# --- fork mode, a real spawned child ----------------------------------------------------------

_SITECUSTOMIZE = """
import errno, os, pathlib

_real = pathlib.Path.write_text


def _write_text(self, *args, **kwargs):
    if self.name in ("report.json", "error.txt"):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return _real(self, *args, **kwargs)


pathlib.Path.write_text = _write_text
"""


def test_a_real_child_on_a_full_disk_tells_the_parent_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(_SITECUSTOMIZE))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    cb = ComponentBenchmark(capture_step=1, mode="fork", **OPTS)
    with pytest.warns(RuntimeWarning) as record:
        trainer, _, _ = run_fit(tmp_path / "run", [cb], max_steps=3, logger=False)
    out = tmp_path / "run" / "component_benchmark"
    (message,) = _ours(record)
    assert message.startswith(
        f"cb_callback: profiling failed in the child process (exit code 1): the profile ran, but it could not "
        f"write the report files to {out} ({ENOSPC}); no report.json was written, so the report is lost"
    )
    assert message.endswith(f"(error.txt could not be written in {out} either.) Training is not affected.")
    assert trainer.global_step == 3 and cb.report is None
    assert not (out / RESERVE_FILE).exists()


# --- a real full file system (root, a 1 MiB tmpfs) --------------------------------------------


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs: the snapshot (~20 KiB), report.json and components.csv fit, report.html (~5 MB) does not."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield disk
    finally:
        with contextlib.suppress(OSError):
            subprocess.run(["umount", str(disk)], check=False)


def test_a_real_full_disk_in_both_modes(tiny_disk: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    problem = f"could not write the report files to {tiny_disk / 'pause'} ({ENOSPC})"
    cb = ComponentBenchmark(capture_step=1, output_dir=str(tiny_disk / "pause"), **OPTS)
    trainer, messages, _ = _fit(tmp_path / "a", cb, caplog)
    assert messages == [
        f"cb_callback: {problem}: report.json is complete, the other files there may be missing or incomplete; "
        "the report is in ComponentBenchmark.report."
    ]
    assert trainer.global_step == 3 and cb.report is not None
    shutil.rmtree(tiny_disk / "pause")

    out = tiny_disk / "fork"
    cb = ComponentBenchmark(capture_step=1, mode="fork", output_dir=str(out), **OPTS)
    trainer, messages, _ = _fit(tmp_path / "b", cb, caplog)
    assert messages == [
        f"cb_callback: the profiling child process wrote report.json to {out}, but it could not write the report "
        f"files to {out} ({ENOSPC}): the other report files may be missing or incomplete. Details: "
        f"{out / 'error.txt'} Training is not affected."
    ]
    assert trainer.global_step == 3 and cb.report is not None
    assert (out / "error.txt").read_text().splitlines()[1] == f"could not write the report files to {out} ({ENOSPC})"

    shutil.rmtree(out)
    (tiny_disk / "fill").write_bytes(b"")
    with contextlib.suppress(OSError), (tiny_disk / "fill").open("wb") as f:
        while True:
            f.write(b"\0" * 65536)
    cb = ComponentBenchmark(capture_step=1, mode="fork", output_dir=str(out), **OPTS)
    trainer, messages, _ = _fit(tmp_path / "c", cb, caplog)
    assert messages == [
        f"cb_callback: profiling step 1 failed ({ENOSPC}: '{out / 'snapshot' / 'snapshot.pt.tmp'}'); training "
        f"continues without a component report. (error.txt could not be written in {out} either.)"
    ]
    assert trainer.global_step == 3 and cb.report is None
