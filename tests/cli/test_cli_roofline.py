"""`cb roofline REPORT [--out FILE]`: draws roofline.png, says what it left out, ranks headroom; 2 without a report."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image as mpimg
import pytest

from cb_callback._cli import main
from tests._roofline_report import roofline_report


def test_it_writes_the_png_beside_report_json_and_ranks_the_headroom(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    roofline_report().save(tmp_path, html=False)
    assert main(["roofline", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    png = tmp_path / "roofline.png"
    assert out[0] == (
        f"cb: wrote {png} (4 points; left out: 3 components (1 estimated, 1 failed, 1 skipped); "
        "2 passes (1 within its noise of the harness floor, 1 without bytes); 1 pass with no FLOPs counted "
        "(shown in the bandwidth panel); 3 passes never ran (no backward))"
    )
    assert mpimg.imread(png).shape[:2] == (900, 1600)
    assert out[1].startswith("where optimisation pays most (top 3 by headroom_ms x calls")
    # the leaf-most measured rows with a headroom, by headroom_ms × calls: mlp 1.0 ms, tiny 0.99 ms, act 0.49 ms
    # (the root has measured children: not leaf-most); % of the step: 1 / 24 = 4.17 %, 0.99 / 24 = 4.125 %
    # (0.99 is 0.98999… in floats: 4.12), 0.49 / 24 = 2.04 %
    assert [line.split() for line in out[4:]] == [  # after the title, the header and the rule
        ["mlp", "Linear", "1", "2.00", "1.00", "1.00", "4.17", "-"],
        ["tiny", "Conv1d", "1", "1.00", "0.990", "0.990", "4.12", "-"],
        ["act", "ReLU", "1", "0.500", "0.490", "0.490", "2.04", "-"],
    ]


def test_out_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    roofline_report().save(tmp_path / "run", html=False)
    target = tmp_path / "charts" / "mine.png"
    assert main(["roofline", str(tmp_path / "run" / "report.json"), "--out", str(target), "--top", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"cb: wrote {target} (4 points;") and target.is_file()
    assert not (tmp_path / "run" / "roofline.png").exists()
    assert len(out) == 1 + 4  # --top 1: the title, the header, the rule and one component


def test_a_missing_or_unreadable_report_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["roofline", str(tmp_path / "nowhere")]) == 2
    assert "no report.json at or under" in capsys.readouterr().err
    (tmp_path / "report.json").write_text("{not json")
    assert main(["roofline", str(tmp_path)]) == 2
    assert f"cannot read a report at {tmp_path / 'report.json'}: not JSON" in capsys.readouterr().err
    assert not (tmp_path / "roofline.png").exists()


def test_out_without_an_extension_or_a_directory_prints_the_file_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    roofline_report().save(tmp_path / "run", html=False)
    report = str(tmp_path / "run")
    assert main(["roofline", report, "--out", str(tmp_path / "chart")]) == 0  # matplotlib adds .png
    assert (
        capsys.readouterr().out.startswith(f"cb: wrote {tmp_path / 'chart.png'} (")
        and (tmp_path / "chart.png").is_file()
    )
    (tmp_path / "dir").mkdir()
    assert main(["roofline", report, "--out", str(tmp_path / "dir")]) == 0
    assert capsys.readouterr().out.startswith(f"cb: wrote {tmp_path / 'dir' / 'roofline.png'} (")
    assert (tmp_path / "dir" / "roofline.png").is_file()


def test_out_of_no_image_format_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    roofline_report().save(tmp_path, html=False)
    assert main(["roofline", str(tmp_path), "--out", str(tmp_path / "x.xyz")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cb: error: --out: cannot write {tmp_path / 'x.xyz'}: '.xyz' is not an image format (")
    assert "png" in err and not (tmp_path / "x.xyz").exists()


def test_it_says_why_there_is_no_ranking(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    roofline_report().save(tmp_path / "a", html=False)
    assert main(["roofline", str(tmp_path / "a"), "--top", "0"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == ["no headroom ranking asked for (--top 0)"]
    data = json.loads((tmp_path / "a" / "report.json").read_text())
    del data["metadata"]["peaks"]  # the rows keep their headroom_ms; without a roof it is not ranked
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "report.json").write_text(json.dumps(data))
    assert main(["roofline", str(tmp_path / "b")]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == ["no peaks in this report: no roof, no headroom"]


def test_an_old_report_without_the_column_is_ranked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = roofline_report().to_dict()
    for row in data["rows"]:
        del row["headroom_ms"]  # written before the column
    (tmp_path / "report.json").write_text(json.dumps(data))
    assert main(["roofline", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    # derived on load: mlp 2 - 1 = 1 ms, tiny 1 - 0.01 = 0.99 ms, act 0.5 - 0.01 = 0.49 ms (of 24: 2.04 %)
    assert [line.split()[:5] for line in out[4:]] == [
        ["mlp", "Linear", "1", "2.00", "1.00"],
        ["tiny", "Conv1d", "1", "1.00", "0.990"],
        ["act", "ReLU", "1", "0.500", "0.490"],
    ]


def test_an_infinite_flop_rate_is_left_out_not_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = roofline_report()
    report.row("mlp").fwd_flops, report.row("mlp").fwd_ms = 1e308, 1e-300
    report.save(tmp_path, html=False)
    assert main(["roofline", str(tmp_path)]) == 0
    assert "1 with an infinite FLOP/s or FLOP/byte" in capsys.readouterr().out.splitlines()[0]
