"""Issue 23 §5: one discovery. ``Report.load`` accepts what ``cb report`` accepts, with the same messages.

A report file, a report directory, a run directory (the newest report under it) and ``DIR@N`` (the
report of capture step ``N``); a malformed ``@N`` says that ``N`` must be a capture step number and
lists the steps there. Both doors call :func:`cb_callback._report.discover.resolve_report_dir`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cb_callback import ComponentRow, Report
from cb_callback._cli import main
from cb_callback._report.discover import InvalidStepError, StepNotFoundError

#: (step, mtime): step 10 is written last, so the newest is neither the last by name
#: ("step_10" < "step_500") nor the largest step.
CAPTURES = ((500, 1_000), (10, 2_000))


def _save(directory: Path, total_ms: float, step: int | None = None, mtime: float | None = None) -> Path:
    """A one-row report whose root total_ms says which was read; ``report.json`` dated ``mtime``."""
    rows = [ComponentRow("", "Net", 0, None, "ok", calls=1, total_ms=total_ms)]
    Report(rows, {} if step is None else {"capture_step": step}).save(directory, html=False)
    if mtime is not None:
        os.utime(directory / "report.json", (mtime, mtime))
    return directory


def _run(root: Path) -> Path:
    """``root/cb/step_<N>/report.json`` for each capture; root total_ms = N (step 500: 500.0 ms)."""
    run = root / "cb"
    for step, mtime in CAPTURES:
        _save(run / f"step_{step}", float(step), step, mtime)
    return run


def test_a_run_directory_loads_its_newest_report(tmp_path: Path) -> None:
    run = _run(tmp_path)
    report = Report.load(run)  # was: FileNotFoundError: no report.json at cb/report.json
    assert report.row("").total_ms == 10.0  # step 10: written at 2000 > 1000
    assert report.source_dir == (run / "step_10").absolute()
    assert Report.load(tmp_path).row("").total_ms == 10.0  # any directory above, as `cb report`
    assert Report.load(str(run)).row("").total_ms == 10.0  # a str as a Path


def test_dir_at_n_and_step_load_that_capture(tmp_path: Path) -> None:
    run = _run(tmp_path)
    assert Report.load(f"{run}@500").row("").total_ms == 500.0
    assert Report.load(f"{run}@500").source_dir == (run / "step_500").absolute()
    assert Report.load(run, step=500).row("").total_ms == 500.0
    assert Report.load(f"{run}@500", step=500).row("").total_ms == 500.0  # both, agreeing
    with pytest.raises(ValueError) as info:
        Report.load(f"{run}@500", step=10)
    assert str(info.value) == f"{run}@500 and step 10 name different steps"
    # the file, and its directory, are that report (its siblings below are not searched)
    _save(run / "step_500" / "replay", 7.0, 500, 3_000)
    assert Report.load(run / "step_500" / "report.json").row("").total_ms == 500.0
    assert Report.load(run / "step_500").row("").total_ms == 500.0
    assert Report.load(f"{run}@500").row("").total_ms == 7.0  # of two of step 500, the newest (3000)


@pytest.mark.parametrize(("tail", "got"), [("x", "not 'x'"), ("", "nothing after the '@'"), ("-1", "not '-1'")])
def test_a_malformed_step_says_n_must_be_a_capture_step_number(tmp_path: Path, tail: str, got: str) -> None:
    run = _run(tmp_path)
    with pytest.raises(InvalidStepError) as info:
        Report.load(f"{run}@{tail}")
    # was: FileNotFoundError: no report.json at run@x/report.json; the steps listed ascending
    assert str(info.value) == (
        f"{run}@{tail}: in DIR@N, N must be a capture step number (0, 1, 2 ...), {got}; "
        f"capture steps at or under {run}: 10, 500"
    )
    assert isinstance(info.value, ValueError) and isinstance(info.value, LookupError)  # a bad argument, not there
    assert isinstance(info.value, StepNotFoundError)


def test_cb_report_says_the_same_in_one_line_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(tmp_path)
    for location in (f"{run}@x", f"{run}@7"):
        with pytest.raises(LookupError) as info:
            Report.load(location)
        assert main(["report", location]) == 2
        assert capsys.readouterr().err == f"cb: error: {info.value}\n"  # the same message, one line
    assert str(info.value) == f"no report of capture step 7 at or under {run}; capture steps there: 10, 500"
    assert main(["report", f"{run}@x"]) == 2  # was: "no report.json at or under run@x"
    assert capsys.readouterr().err == (
        f"cb: error: {run}@x: in DIR@N, N must be a capture step number (0, 1, 2 ...), not 'x'; "
        f"capture steps at or under {run}: 10, 500\n"
    )
    assert main(["diff", f"{run}@10", f"{run}@ten"]) == 2
    assert "N must be a capture step number" in capsys.readouterr().err


def test_nothing_there_is_a_file_not_found_error_worded_as_cb_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    for location in (tmp_path / "empty", tmp_path / "missing", f"{tmp_path / 'missing'}@x"):
        with pytest.raises(FileNotFoundError) as info:
            Report.load(location)
        assert main(["report", str(location)]) == 2
        assert capsys.readouterr().err == f"cb: error: {info.value}\n"
    assert str(info.value) == f"no report.json at or under {tmp_path / 'missing'}@x"  # no DIR there: nothing found
    with pytest.raises(InvalidStepError, match=f"; there is no report.json at or under {tmp_path / 'empty'}$"):
        Report.load(f"{tmp_path / 'empty'}@x")  # DIR exists but holds none: said so


def test_a_directory_named_with_an_at_is_a_path(tmp_path: Path) -> None:
    _save(tmp_path / "run@3", 3.0, 3)
    _save(tmp_path / "run@x", 4.0)
    _save(tmp_path / "run", 5.0, 5)
    assert Report.load(tmp_path / "run@3").row("").total_ms == 3.0  # exists as written: not run + step 3
    assert Report.load(f"{tmp_path / 'run@3'}@3").row("").total_ms == 3.0  # run@3, capture step 3
    assert Report.load(tmp_path / "run@x").row("").total_ms == 4.0  # exists: not a malformed run@N
    assert Report.load(f"{tmp_path / 'run@x'}/report.json").row("").total_ms == 4.0  # "x/report.json": a path


def test_internal_readers_read_the_one_file_not_a_report_below(tmp_path: Path) -> None:
    from cb_callback._lightning.publish import _holds_report

    # a run's output_dir whose own report.json is gone (a failed write) but a replay's is below:
    # it does not hold a report (Report.load(dir) would find the replay's).
    _save(tmp_path / "snapshot" / "replay", 1.0)
    assert Report.load(tmp_path).row("").total_ms == 1.0
    assert not _holds_report(tmp_path)
    _save(tmp_path, 2.0)
    assert _holds_report(tmp_path)


def test_snapshots_follow_the_same_rules(tmp_path: Path) -> None:
    from cb_callback._whatif.snapshot import resolve_snapshot_dir

    with pytest.raises(InvalidStepError) as info:
        resolve_snapshot_dir(f"{tmp_path}@x")
    assert str(info.value) == (
        f"{tmp_path}@x: in DIR@N, N must be a capture step number (0, 1, 2 ...), not 'x'; "
        f"there is no snapshot.pt at or under {tmp_path}"
    )


def test_a_file_names_that_file_never_another_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file is read as a report whatever its name; one that is not a report is refused, naming it."""
    _run(tmp_path)  # reports below tmp_path: notes.json's directory holds some (was: the newest taken, exit 0)
    monkeypatch.chdir(tmp_path)
    Path("notes.json").write_text('{"a": 1}')  # JSON, not a report
    (tmp_path / "sub").mkdir()
    Path("sub/bad.json").write_text("hello")  # not JSON
    expected = {
        # from_dict's reason; was: FileNotFoundError: [Errno 2] No such file or directory: 'report.json'
        "notes.json": "cannot read a report at notes.json: 'rows' missing",
        # was: "cannot read a report at sub/report.json: no report.json at or under sub"
        "sub/bad.json": "cannot read a report at sub/bad.json: not JSON (Expecting value: line 1 column 1 (char 0))",
    }
    for location, message in expected.items():
        with pytest.raises(ValueError) as info:
            Report.load(location)
        assert str(info.value) == message
        assert main(["report", location]) == 2
        assert capsys.readouterr() == ("", f"cb: error: {message}\n")  # one line, nothing on stdout


def test_a_report_under_another_name_is_read_and_its_step_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run(tmp_path)
    (run / "step_500" / "report.json").rename(tmp_path / "kept.json")  # a report of step 500, renamed
    assert Report.load(tmp_path / "kept.json").row("").total_ms == 500.0  # that file: not step_10's, the newest
    assert Report.load(f"{tmp_path / 'kept.json'}@500").row("").total_ms == 500.0
    assert Report.load(tmp_path / "kept.json", step=500).source_dir == tmp_path.absolute()
    with pytest.raises(StepNotFoundError) as info:
        Report.load(tmp_path / "kept.json", step=10)
    assert str(info.value) == f"no report of capture step 10 at {tmp_path / 'kept.json'}: it records capture step 500"
    assert main(["report", str(tmp_path / "kept.json")]) == 0
    out = capsys.readouterr()
    assert out.err == ""  # named directly: no "cb: using" line
    assert " 500 " in out.out  # root total_ms 500 (sig: "500"), not step 10's "10.0"
