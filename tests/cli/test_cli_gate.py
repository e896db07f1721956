"""`cb diff --fail-over`: exit 0 passed, 1 regressed, 2 could not compare; text, markdown and json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cb_callback import ComponentRow, Report
from cb_callback._cli import main


def _report(values: dict[str, float], mem: float = 100.0, **extra: ComponentRow) -> Report:
    """Rows by path: total_ms (noise 0.01, peak_mem_mb ``mem`` on the root); the root is ""."""
    rows = [
        ComponentRow(
            p, "Net" if p == "" else "Linear", 0 if p == "" else 1, None if p == "" else "", "ok",
            calls=1, total_ms=t, noise=0.01, peak_mem_mb=mem if p == "" else 10.0, fwd_flops=1e6, params_mb=1.0,
        )
        for p, t in values.items()
    ]  # fmt: skip
    return Report([*rows, *extra.values()], {"device_name": "cpu", "dtype": "fp32"})


@pytest.fixture
def dirs(tmp_path: Path) -> dict[str, str]:
    # base: a 4 ms, b 6 ms. slow: a doubled (+100 %, beyond 1 + 2 x 0.01). same: as base.
    # renamed: b is "c" (same type, parent, FLOPs, params); a grew 5 % (not over 10 %).
    reports = {
        "base": _report({"": 10.0, "a": 4.0, "b": 6.0}),
        "same": _report({"": 10.0, "a": 4.0, "b": 6.0}),
        "slow": _report({"": 14.0, "a": 8.0, "b": 6.0}),
        "renamed": _report({"": 10.2, "a": 4.2, "c": 6.0}),
        "bigger": _report({"": 10.0, "a": 4.0, "b": 6.0}, mem=120.0),
    }
    out = {}
    for name, report in reports.items():
        report.save(tmp_path / name)
        out[name] = str(tmp_path / name)
    return out


def test_exit_codes_0_passed_1_regressed_2_could_not_compare(
    dirs: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["diff", dirs["base"], dirs["same"], "--fail-over", "10"]) == 0
    assert main(["diff", dirs["base"], dirs["slow"], "--fail-over", "10"]) == 1
    assert main(["diff", dirs["base"], dirs["slow"], "--fail-over", "150%"]) == 0  # +100 % is not over 150 %
    assert main(["diff", dirs["base"], dirs["slow"]]) == 0  # no gate without --fail-over: cb diff as before
    capsys.readouterr()
    assert main(["diff", dirs["base"], str(tmp_path / "none"), "--fail-over", "10"]) == 2
    assert "cb: error: no report.json" in capsys.readouterr().err
    assert main(["diff", dirs["base"], dirs["slow"], "--format", "json"]) == 2
    assert "give --fail-over PCT" in capsys.readouterr().err
    with pytest.raises(SystemExit) as bad:
        main(["diff", dirs["base"], dirs["slow"], "--fail-over", "-5"])
    assert bad.value.code == 2  # argparse: an invalid option
    assert "expected a percent >= 0" in capsys.readouterr().err


def test_text_names_the_regressed_after_the_diff(dirs: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", dirs["base"], dirs["slow"], "--fail-over", "10"]) == 1
    out = capsys.readouterr().out.splitlines()
    gate = next(i for i, ln in enumerate(out) if ln.startswith("gate: "))
    assert out[0].startswith("A: ") and out[gate - 1] == ""  # the diff first, as without the gate
    assert out[gate].endswith("2 components got worse beyond the threshold and the noise: a, (root)")
    assert [ln.split()[0] for ln in out[gate + 3 : gate + 5]] == ["a", "(root)"]
    assert out[gate + 3].split() == ["a", "Linear", "4.00", "ms", "8.00", "ms", "+100", "%", "±2.00", "%", "regressed"]
    assert out[-1] == "verdicts: 2 regressed, 1 unchanged"


def test_markdown_lists_the_renamed_and_is_a_table(dirs: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", dirs["base"], dirs["renamed"], "--fail-over", "10", "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert not out.startswith("A: ")  # the table alone: a pull-request comment
    lines = out.splitlines()
    assert lines[0] == "### cb diff gate: passed"
    rows = {
        ln.split("|")[1].strip(): [c.strip() for c in ln.strip("|").split("|")] for ln in lines if ln.startswith("| `")
    }
    # a: 4 -> 4.2, +5 %: beyond 1.02 but not over 10 %; the root 10 -> 10.2 (+2 %, within 1 + 2 x 0.01)
    assert rows["`a`"][4:] == ["+5.00 %", "±2.00 %", "within threshold"]
    assert rows["`(root)`"][6] == "within noise"
    assert rows["`c`"] == ["`c`", "Linear", "6.00 ms", "6.00 ms", "0", "±2.00 %", "renamed from b"]


def test_json_for_a_memory_metric(dirs: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    args = ["diff", dirs["base"], dirs["bigger"], "--fail-over", "10", "--metric", "peak_mem_mb", "--format", "json"]
    assert main(args) == 1
    data = json.loads(capsys.readouterr().out)  # stdout is the JSON alone
    assert data["options"]["metric"] == "peak_mem_mb" and data["options"]["exact"] is True
    assert data["base"] == dirs["base"] and data["new"] == dirs["bigger"]
    # the root's peak 100 -> 120 MiB: +20 %, exact (no noise): regressed; a and b 10 -> 10 MiB: unchanged
    assert {c["path"]: c["verdict"] for c in data["components"]} == {
        "": "regressed",
        "a": "unchanged",
        "b": "unchanged",
    }
    root = data["components"][0]
    assert (root["base"], root["new"], root["change"], root["noise_bound"]) == (100.0, 120.0, 0.2, 0.0)
    assert main([*args[:4], "25", *args[5:]]) == 0  # +20 % is not over 25 %


def test_only_in_one_report_is_listed_and_filter_selects_what_is_gated(
    dirs: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = ComponentRow("x", "ReLU", 1, "", "ok", calls=1, total_ms=1.0, noise=0.01)
    _report({"": 14.0, "a": 8.0}, **{"x": extra}).save(tmp_path / "other")
    assert main(["diff", dirs["base"], str(tmp_path / "other"), "--fail-over", "10", "--format", "json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert {c["path"]: c["verdict"] for c in data["components"]} == {
        "": "regressed", "a": "regressed", "b": "only_in_base", "x": "only_in_new",
    }  # fmt: skip
    # --filter b: only b is kept, and it is in one report only: no component judged, could not compare (was: passed)
    assert main(["diff", dirs["base"], str(tmp_path / "other"), "--fail-over", "10", "--filter", "b"]) == 2
    out = capsys.readouterr().out
    assert "only in base" in out and "gate: could not compare" in out and "judged 0 of 1 component" in out
    # a --filter that matches nothing: exit 2, naming it
    assert main(["diff", dirs["base"], str(tmp_path / "other"), "--fail-over", "10", "--filter", "nothing*"]) == 2
    assert "--filter 'nothing*' matches no component" in capsys.readouterr().err


def test_could_not_compare_is_exit_2_with_the_reason(
    dirs: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Report([], {"device_name": "cpu", "dtype": "fp32"}).save(tmp_path / "norows")
    assert main(["diff", dirs["base"], str(tmp_path / "norows"), "--fail-over", "10"]) == 2  # was 0: passed
    assert "gate: could not compare" in capsys.readouterr().out
    # a different model (another root type), with a regressed component: exit 2 unless --allow-mismatch
    other = _report({"": 14.0, "a": 8.0, "b": 6.0})
    other.rows[0] = ComponentRow("", "CNN", 0, None, "ok", calls=1, total_ms=14.0, noise=0.01)
    other.save(tmp_path / "other")
    assert main(["diff", dirs["base"], str(tmp_path / "other"), "--fail-over", "10", "--format", "json"]) == 2
    captured = capsys.readouterr()
    assert json.loads(captured.out)["outcome"] == "inconclusive" and "different models" in captured.err
    assert main(["diff", dirs["base"], str(tmp_path / "other"), "--fail-over", "10", "--allow-mismatch"]) == 1
    capsys.readouterr()
    with pytest.raises(SystemExit) as raised:  # a share of the step above 100 %: argparse's usage error
        main(["diff", dirs["base"], dirs["same"], "--fail-over", "10", "--min-share", "150"])
    assert raised.value.code == 2 and "from 0 to 100" in capsys.readouterr().err
