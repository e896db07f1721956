"""`cb checkpoint REPORT --save SIZE / --budget SIZE`: the plan printed, its sizes and its exit codes."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from cb_callback._cli import _size, main
from tests.whatif.test_checkpoint_plan import _tree

MIB = 1024 * 1024


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4096", 4096),
        ("1GiB", 1024**3),
        ("1.5KiB", 1536),
        ("512 MB", 512 * 10**6),
        ("8gib", 8 * 1024**3),
        ("2KB", 2000),
        ("3MiB", 3 * MIB),
        ("1GB", 10**9),
        ("7B", 7),
    ],
)
def test_sizes_take_binary_and_decimal_units_and_bare_bytes(text: str, size: int) -> None:
    assert _size(text) == size


@pytest.mark.parametrize("text", ["", "GiB", "1 parsec", "1e3", "1.2.3MB", "nan", "inf"])
def test_a_size_it_cannot_read_says_what_it_expects(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected a size such as 1GiB, 512MB or 4096"):
        _size(text)


def _saved(tmp_path: Path) -> Path:
    _tree().save(tmp_path, html=False)
    return tmp_path


def test_a_saving_target_prints_the_plan_and_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the hand-built tree of tests/whatif/test_checkpoint_plan.py: 14 MiB at the least time is {a.x, b}, 3 ms
    assert main(["checkpoint", str(_saved(tmp_path)), "--save", "14MiB"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("checkpointing plan: save >= 14.0 MiB of activations: reached\n")
    assert "total: 2 modules, saves 14.0 MiB held to the backward" in out and "adds 3.00 ms per step" in out


def test_a_budget_prints_the_plan_against_the_roots_peak(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 30 MiB peak, 20 MiB budget: {a} takes 10 MiB off (the derivation is test_a_budget_walks_the_peak_along_...)
    assert main(["checkpoint", str(_saved(tmp_path)), "--budget", "20MiB"]) == 0
    out = capsys.readouterr().out
    assert "peak <= 20.0 MiB (the root's peak_mem_mb: 30.0 MiB): reached" in out
    assert "  a     Block      1  10.0 MiB      2.50\n" in out


def test_no_target_prints_the_curve(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["checkpoint", str(_saved(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "checkpointing plan: no target (the trade-off curve only)" in out
    assert "\n      14.000       3.000  a.x, b\n" in out and "\n       0.000       0.000  -\n" in out


def test_a_target_no_plan_reaches_exits_1_saying_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["checkpoint", str(_saved(tmp_path)), "--save", "1GiB"]) == 1
    captured = capsys.readouterr()
    assert "NOT reached" in captured.out
    assert "cb: error: no plan reaches the target: the candidates save at most 23.000 MiB" in captured.err


def test_an_unreadable_report_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["checkpoint", str(tmp_path / "nothing-here"), "--save", "1MiB"]) == 2
    (tmp_path / "report.json").write_text("{not json")
    assert main(["checkpoint", str(tmp_path), "--save", "1MiB"]) == 2
    assert "not JSON" in capsys.readouterr().err


def test_a_size_it_cannot_read_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["checkpoint", str(_saved(tmp_path)), "--save", "lots"])
    assert e.value.code == 2 and "expected a size such as 1GiB" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--save", "-1MiB"], ["--save=-1MiB"], ["--budget", "-.5GiB"], ["--budget=-3"]])
def test_a_negative_size_is_a_usage_error_naming_it(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # before: "--save -1MiB" read -1MiB as an option ("expected one argument"), "--save=-1MiB" said only
    # "expected a size such as ..."
    with pytest.raises(SystemExit) as e:
        main(["checkpoint", str(_saved(tmp_path)), *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "a size cannot be negative, got '-" in err, err


def test_a_budget_on_a_report_without_the_roots_peak_exits_2_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # could not do it (2), not "no plan reaches the target" (1, before)
    _tree(**{"": {"peak_mem_mb": float("nan")}}).save(tmp_path, html=False)
    assert main(["checkpoint", str(tmp_path), "--budget", "1MiB"]) == 2
    assert "cb: error: could not plan: a memory budget needs the root's peak_mem_mb" in capsys.readouterr().err


def test_a_budget_not_found_says_not_found_not_unreachable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # budget 10 of 30 (20 off; the most any set found takes is 16): the search is not exhaustive, so it says
    # "no plan found", the best found printed
    assert main(["checkpoint", str(_saved(tmp_path)), "--budget", "10MiB"]) == 1
    err = capsys.readouterr().err
    assert "cb: error: no plan found that reaches the target (the search is not exhaustive" in err
    assert "no plan reaches" not in err
