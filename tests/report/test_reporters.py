"""The public ``cb_callback.reporters`` and the callback's publishing through them (no Trainer)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from matplotlib.figure import Figure

import cb_callback
import cb_callback._report.tensorboard as tensorboard_module
import cb_callback.reporters as reporters
from cb_callback._lightning.publish import (
    ERROR_FILE,
    FilesWritten,
    TensorBoardTarget,
    log_to_tensorboard,
    open_writer,
    report_failure,
    write_files,
)
from cb_callback._report.model import ComponentRow, Report
from cb_callback._report.table import markdown_table
from cb_callback.reporters import ReportContext, Reporter


def _report() -> Report:
    return Report(
        [
            ComponentRow("", "Net", 0, None, "ok", calls=1, fwd_ms=1.0, bwd_ms=2.0, total_ms=3.0),
            ComponentRow("a", "Linear", 1, "", "ok", calls=1, fwd_ms=0.5, total_ms=0.5),
        ],
        {"device_name": "cpu"},
    )


class _Writer:
    """A SummaryWriter-like object that records what it is given."""

    def __init__(self) -> None:
        self.tags: list[tuple[str, int]] = []
        self.flushed = 0

    def add_scalar(self, tag: str, value: float, global_step: int) -> None:
        self.tags.append((tag, global_step))

    def add_text(self, tag: str, text: str, global_step: int) -> None:
        self.tags.append((tag, global_step))

    def add_figure(self, tag: str, figure: Any, global_step: int, close: bool) -> None:
        self.tags.append((tag, global_step))

    def flush(self) -> None:
        self.flushed += 1


@pytest.fixture
def no_icicles(monkeypatch: pytest.MonkeyPatch) -> None:
    """The icicles are tested elsewhere: draw an empty figure instead."""
    monkeypatch.setattr(tensorboard_module, "icicle_figure", lambda report, metric: Figure((1, 1)))


def _ours(record: Any) -> list[str]:
    return [str(w.message) for w in record if str(w.message).startswith("cb_callback")]


# --- the public module ---------------------------------------------------------------------


def test_the_public_names() -> None:
    assert reporters.__all__ == [
        "FileReporter", "ReportContext", "Reporter", "TensorBoardReporter", "format_summary", "format_table"
    ]  # fmt: skip
    assert reporters.Reporter is Reporter and reporters.ReportContext is ReportContext  # the contract, beside them
    for cls in (reporters.FileReporter, reporters.TensorBoardReporter):
        assert isinstance(cls(), Reporter)
    assert reporters.format_table is markdown_table  # the old name still works
    assert cb_callback.reporters is reporters  # also as an attribute of the package (loaded lazily)
    report = _report()
    assert reporters.format_summary(report) == report.summary()
    # a header, the separator, one line per row
    assert len(reporters.format_table(report).split("\n")) == 2 + 2


def test_file_reporter_writes_what_the_readme_says(tmp_path: Path) -> None:
    written = reporters.FileReporter().write(_report(), ReportContext(output_dir=tmp_path))
    assert [p.name for p in written] == [
        "report.json", "components.csv", "report.html", "icicle_mfu.png", "icicle_total_ms.png",
        "icicle_peak_mem_mb.png", "roofline.png",
    ]  # fmt: skip


# --- what the callback publishes through them ----------------------------------------------


def test_write_files_returns_the_directory_or_warns(tmp_path: Path) -> None:
    ctx = ReportContext(output_dir=tmp_path / "out", step=2)
    assert write_files(_report(), ctx) == FilesWritten(tmp_path / "out")
    assert (tmp_path / "out" / "report.json").is_file()
    assert write_files(_report(), ReportContext(output_dir=None)) == FilesWritten(None)
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = blocker / "out"
    with pytest.warns(RuntimeWarning) as record:
        files = write_files(_report(), ReportContext(output_dir=out))
    # mkdir under a file: errno 20, ENOTDIR, and the error names the directory
    problem = (
        f"could not write the report files to {out} (NotADirectoryError: [Errno 20] Not a directory (ENOTDIR): '{out}')"
    )
    assert files == FilesWritten(None, problem)
    assert _ours(record) == [
        f"cb_callback: {problem}: no report.json was written, the files there may be missing or incomplete; "
        "the report is in ComponentBenchmark.report."
    ]


def test_log_to_tensorboard_uses_the_targets_writer_at_the_step(no_icicles: None, tmp_path: Path) -> None:
    writer = _Writer()
    target = TensorBoardTarget("/logs/v0", lambda: writer)
    line = log_to_tensorboard(_report(), ReportContext(output_dir=tmp_path, step=4), target)
    assert line == (
        f"cb_callback: component report of step 4 written to {tmp_path} (report.json, components.csv, "
        "report.html, icicle_*.png, roofline.png); logged to TensorBoard under component_benchmark/: "
        "tensorboard --logdir /logs/v0"
    )
    tags = {tag for tag, _ in writer.tags}
    assert {"component_benchmark/table", "component_benchmark/summary", "component_benchmark/total_ms/root",
            "component_benchmark/fwd_ms/root", "component_benchmark/icicle/mfu"} <= tags  # fmt: skip
    assert "component_benchmark/fwd_ms/a" not in tags  # the run's only capture: the root's scalars alone
    assert {step for _, step in writer.tags} == {4}
    assert writer.flushed == 1


def test_log_to_tensorboard_without_a_logger_or_when_off() -> None:
    ctx = ReportContext(output_dir=None, step=1)
    head = "cb_callback: component report of step 1 not written to files"
    assert log_to_tensorboard(_report(), ctx, None) == (
        f"{head}; there is no TensorBoardLogger among trainer.loggers, so nothing was logged to TensorBoard."
    )
    never = TensorBoardTarget("/logs", lambda: pytest.fail("the writer must not be opened"))
    assert log_to_tensorboard(_report(), ctx, never, enabled=False) == head
    assert log_to_tensorboard(_report(), ctx, None, enabled=False) == head


def test_a_writer_that_cannot_open_is_one_warning(tmp_path: Path) -> None:
    def broken() -> Any:
        raise OSError("read-only file system")

    target = TensorBoardTarget("/logs", broken)
    assert open_writer(target) is None and open_writer(None) is None  # before profiling: quietly none
    with pytest.warns(RuntimeWarning) as record:
        assert log_to_tensorboard(_report(), ReportContext(output_dir=tmp_path, step=0), target) is None
    assert _ours(record) == [
        "cb_callback: could not log the report to TensorBoard (OSError: read-only file system); it is "
        f"written to {tmp_path} (report.json, components.csv, report.html, icicle_*.png, roofline.png)."
    ]


def test_report_failure_warns_and_writes_the_traceback(tmp_path: Path) -> None:
    try:
        raise MemoryError("out of memory")
    except MemoryError as e:
        with pytest.warns(RuntimeWarning) as record:
            report_failure(3, tmp_path, e)
    message = (
        "cb_callback: profiling step 3 failed (MemoryError: out of memory); "
        "training continues without a component report."
    )
    assert _ours(record) == [f"{message} Details: {tmp_path / ERROR_FILE}"]
    text = (tmp_path / ERROR_FILE).read_text()
    assert text.startswith(f"{message}\n\nTraceback (most recent call last):")
    assert text.rstrip().endswith("MemoryError: out of memory")
    with pytest.warns(RuntimeWarning) as record:
        report_failure(3, None, ValueError("x"))
    assert _ours(record) == [
        "cb_callback: profiling step 3 failed (ValueError: x); training continues without a component report."
    ]
