"""`cb report`: --sort/--filter/--depth select the one component listing; --step and DIR@N pick a capture."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from cb_callback import ComponentRow, Report
from cb_callback._cli import main

NAN = math.nan


def _five() -> Report:
    """A root, a Conv2d child, a block with a Conv2d and a Linear: numbers chosen to sort apart."""
    rows = [
        ComponentRow("", "Net", 0, None, "ok", calls=1, total_ms=10.0, share=1.0, noise=0.01, bw_util=0.2),
        ComponentRow("conv", "Conv2d", 1, "", "ok", calls=1, total_ms=6.0, share=0.6, noise=0.30, bw_util=0.05),
        ComponentRow("block", "Block", 1, "", "ok", calls=1, total_ms=3.0, share=0.3, noise=0.02, bw_util=NAN),
        ComponentRow("block.conv2", "Conv2d", 2, "block", "ok", calls=1, total_ms=2.0, share=0.2, noise=0.10),
        ComponentRow("block.fc", "Linear", 2, "block", "ok", calls=1, total_ms=1.0, share=0.1, noise=0.05),
    ]
    rows[3].bw_util, rows[4].bw_util = 0.4, 0.5
    return Report(rows, {"device_name": "cpu", "dtype": "fp32"})


def _listing(out: str) -> tuple[str, list[str], list[list[str]]]:
    """The title, header cells and row cells of the component listing (the table after ``components (``)."""
    lines = out.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("components ("))
    header = lines[at + 1]
    body = []
    for ln in lines[at + 3 :]:
        if not ln.strip():
            break
        body.append(ln.split())
    return lines[at], header.split("  "), body


def test_sort_orders_the_one_listing_and_shows_the_column_it_sorts_by(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _five().save(tmp_path)
    assert main(["report", str(tmp_path), "--sort", "noise"]) == 0
    out = capsys.readouterr().out
    # One component listing: the hotspots table gives way to the selection (else two listings,
    # one of which ignores the options).
    assert "hotspots" not in out
    assert out.count("\ncomponents (") == 1
    title, header, body = _listing(out)
    assert title == "components (5 of 5; by noise, largest first):"
    assert header[-1].strip() == "noise %"  # noise is not a summary column: it is added, last
    # noise 0.30, 0.10, 0.05, 0.02, 0.01 -> in percent to 3 significant figures: 30.0, 10.0, 5.00, 2.00, 1.00
    assert [(r[0], r[-1]) for r in body] == [
        ("conv", "30.0"),
        ("block.conv2", "10.0"),
        ("block.fc", "5.00"),
        ("block", "2.00"),
        ("(root)", "1.00"),
    ]
    assert out.startswith("cb_callback component benchmark\n")  # the summary's head and whole model stay
    assert "whole model:" in out


def test_sort_by_a_shown_column_adds_none_and_missing_values_go_last(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _five().save(tmp_path)
    assert main(["report", str(tmp_path), "--sort", "share"]) == 0
    title, header, body = _listing(capsys.readouterr().out)
    assert [h.strip() for h in header if h.strip()].count("share %") == 1 and header[-1].strip() == "bound"
    assert [r[0] for r in body] == ["(root)", "conv", "block", "block.conv2", "block.fc"]  # 1.0 > 0.6 > ... > 0.1
    # --depth 1 keeps root, conv, block; bw_util 0.2, 0.05, NaN: the NaN last, then --top 2 cuts it
    assert main(["report", str(tmp_path), "--depth", "1", "--sort", "bw_util", "--top", "2"]) == 0
    title, header, body = _listing(capsys.readouterr().out)
    assert title == "components (first 2 of 3 selected, 5 in all; depth <= 1; by bw_util, largest first):"
    assert header[-1].strip() == "bw util %"
    assert [(r[0], r[-1]) for r in body] == [("(root)", "20.0"), ("conv", "5.00")]
    # text A to Z: Block < Conv2d (conv, block.conv2: a stable sort keeps their report order) < Linear < Net
    assert main(["report", str(tmp_path), "--sort", "module_type"]) == 0
    title, header, body = _listing(capsys.readouterr().out)
    assert title == "components (5 of 5; by module_type, A to Z first):" and header[-1].strip() == "bound"
    assert [r[0] for r in body] == ["block", "conv", "block.conv2", "block.fc", "(root)"]


def test_filter_matches_the_module_type_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _five().save(tmp_path)
    # A substring, case-insensitive, of the path or the type: "Conv2d" is the type of conv and block.conv2.
    assert main(["report", str(tmp_path), "--filter", "Conv2d"]) == 0
    title, _, body = _listing(capsys.readouterr().out)
    assert title == "components (2 of 5; filter 'Conv2d' (path or type); in the report's order):"
    assert [r[0] for r in body] == ["conv", "block.conv2"]
    # A glob (* ? [), case-insensitive, matching the whole path or the whole type:
    # 'lin*' is no path but the type Linear -> block.fc; 'block.*' the paths under block.
    assert main(["report", str(tmp_path), "--filter", "lin*"]) == 0
    assert [r[0] for r in _listing(capsys.readouterr().out)[2]] == ["block.fc"]
    assert main(["report", str(tmp_path), "--filter", "block.*"]) == 0
    assert [r[0] for r in _listing(capsys.readouterr().out)[2]] == ["block.conv2", "block.fc"]
    # cb diff selects the same way
    _five().save(tmp_path / "b")
    assert main(["diff", str(tmp_path), str(tmp_path / "b"), "--filter", "conv2d", "--sort", "path"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in out if ln.split() and ln.split()[1:2] == ["Conv2d"]] == ["block.conv2", "conv"]


@pytest.mark.parametrize("flag", ["--depth", "--top", "--step"])
def test_negative_depth_top_or_step_is_an_argparse_error(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _five().save(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["report", str(tmp_path), flag, "-1"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"cb report: error: argument {flag}: expected an integer >= 0, got -1" in err
    with pytest.raises(SystemExit):
        main(["diff", str(tmp_path), str(tmp_path), "--depth", "-1"])
    assert "cb diff: error: argument --depth: expected an integer >= 0, got -1" in capsys.readouterr().err


def _root_total(out: str) -> str:
    """The ``total ms`` cell of the whole model's line (the 7th column)."""
    return next(ln for ln in out.splitlines() if ln.startswith("(root)")).split()[6]


# --- pick a capture by step ----------------------------------------------------------------------

STEPS = (8, 10, 500)  # by name step_10 < step_500 < step_8: neither the name's order nor the first is the newest


def _run(root: Path) -> Path:
    """``root/version_0/component_benchmark/step_<N>/report.json`` for N in STEPS, written in step order.

    Each report's root total_ms is its step / 10 (0.8, 1.0, 50.0), so the one printed says which was taken.
    """
    cb = root / "version_0" / "component_benchmark"
    for i, step in enumerate(STEPS):
        rows = [ComponentRow("", "Net", 0, None, "ok", calls=1, total_ms=step / 10)]
        report = Report(rows, {"device_name": "cpu", "dtype": "fp32", "capture_step": step})
        out = cb / f"step_{step}"
        report.save(out)
        os.utime(out / "report.json", (1_000 + i, 1_000 + i))  # written in step order: step_500 newest
    return cb


def test_the_newest_capture_is_taken_and_the_others_are_listed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cb = _run(tmp_path)
    assert main(["report", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert captured.err == (
        f"cb: using {cb / 'step_500' / 'report.json'} (capture step 500, the newest of 3 reports under "
        f"{tmp_path}; capture steps: 8, 10, 500; pick one with --step N or DIR@N)\n"
    )
    assert _root_total(captured.out) == "50.0"  # step 500 / 10


def test_step_and_dir_at_step_pick_that_capture(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cb = _run(tmp_path)
    for argv in (["report", str(tmp_path), "--step", "10"], ["report", f"{tmp_path}@10"]):
        assert main(argv) == 0
        captured = capsys.readouterr()
        assert captured.err == (
            f"cb: using {cb / 'step_10' / 'report.json'} (capture step 10; capture steps under {tmp_path}: "
            "8, 10, 500)\n"
        )
        assert _root_total(captured.out) == "1.00"  # step 10 / 10
    assert main(["report", str(cb / "step_8"), "--step", "8"]) == 0  # the report's own directory, its step
    assert _root_total(capsys.readouterr().out) == "0.800"


def test_of_several_reports_of_one_step_the_newest_is_taken_and_that_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cb = _run(tmp_path)
    # `cb replay` of step 10's snapshot writes a second report of step 10, later (mtime 2000 > 1001)
    replayed = cb / "step_10" / "snapshot" / "replay"
    Report([ComponentRow("", "Net", 0, None, "ok", calls=1, total_ms=4.0)], {"capture_step": 10}).save(replayed)
    os.utime(replayed / "report.json", (2_000, 2_000))
    assert main(["report", f"{tmp_path}@10"]) == 0
    captured = capsys.readouterr()
    assert captured.err == (
        f"cb: using {replayed / 'report.json'} (capture step 10, the newest of 2 reports of that step; "
        f"capture steps under {tmp_path}: 8, 10, 500)\n"
    )
    assert _root_total(captured.out) == "4.00"


def test_a_step_that_is_not_there_exits_2_naming_the_steps_that_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _run(tmp_path)
    assert main(["report", str(tmp_path), "--step", "7"]) == 2
    assert capsys.readouterr().err == (
        f"cb: error: no report of capture step 7 at or under {tmp_path}; capture steps there: 8, 10, 500\n"
    )
    assert main(["diff", f"{tmp_path}@8", f"{tmp_path}@9"]) == 2
    assert "no report of capture step 9" in capsys.readouterr().err
    assert main(["report", f"{tmp_path}@8", "--step", "10"]) == 2
    assert capsys.readouterr().err == f"cb: error: {tmp_path}@8 and --step 10 name different steps\n"


def test_diff_compares_two_captures_of_one_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _run(tmp_path)
    assert main(["diff", f"{tmp_path}@10", f"{tmp_path}@500"]) == 0
    out = capsys.readouterr().out.splitlines()
    # root 1.0 ms at step 10 -> 50.0 ms at step 500: +4900 %
    assert out[:3] == [
        f"A: {tmp_path}@10  (cpu, fp32)",
        f"B: {tmp_path}@500  (cpu, fp32)",
        "whole model: A 1.00 ms -> B 50.0 ms (+4900 %)",  # 3 significant figures (numbers.sig)
    ]


def test_a_directory_named_like_dir_at_n_is_a_path_not_a_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [ComponentRow("", "Net", 0, None, "ok", calls=1, total_ms=7.0)]
    Report(rows, {"capture_step": 3}).save(tmp_path / "run@3")
    assert main(["report", str(tmp_path / "run@3")]) == 0  # exists as written: not run + step 3
    assert _root_total(capsys.readouterr().out) == "7.00"
    assert main(["report", str(tmp_path / "run@3") + "@3"]) == 0  # run@3, capture step 3
    assert _root_total(capsys.readouterr().out) == "7.00"


@pytest.mark.parametrize("line_buffering", [True, False], ids=["fails-mid-print", "fails-at-the-last-flush"])
def test_a_reader_that_stops_early_ends_the_command_quietly_with_sigpipes_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, line_buffering: bool
) -> None:
    """``cb report DIR | head -1``: ``head`` closes the pipe after one line; the next write (mid-listing, or the
    flush of what was buffered) fails with EPIPE. That is the reader's choice, not an error: status 141 (128 +
    SIGPIPE, as ``yes | head``), no traceback on stderr, and stdout's descriptor is left on the null device so
    the interpreter's flush at exit cannot fail either."""
    import contextlib
    import io

    _five().save(tmp_path)
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write: every write fails
    pipe = io.TextIOWrapper(io.FileIO(write_end, "w"), line_buffering=line_buffering)
    monkeypatch.setattr("sys.stdout", pipe)
    try:
        assert main(["report", str(tmp_path)]) == 141
        assert capsys.readouterr().err == ""
        os.write(write_end, b"after")  # the null device takes it; the closed pipe would raise BrokenPipeError
    finally:
        monkeypatch.undo()
        with contextlib.suppress(BrokenPipeError):  # what the wrapper still buffers goes nowhere
            pipe.close()
