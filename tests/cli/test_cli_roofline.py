"""`cb roofline REPORT [--out FILE]`: draws roofline.png, says what it left out, ranks headroom; 2 without a report."""

from __future__ import annotations

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
        "3 passes (1 at the harness floor, 1 without FLOPs, 1 without bytes))"
    )
    assert mpimg.imread(png).shape[:2] == (900, 1600)
    assert out[1].startswith("where optimisation pays most (top 2 by headroom_ms x calls")
    # the leaf-most measured rows with a headroom, by headroom_ms × calls: mlp 1.0 ms, tiny 0.99 ms (the root
    # has measured children: not leaf-most); % of the step: 1 / 24 = 4.17 %, 0.99 / 24 = 4.125 %
    # (0.99 is 0.98999… in floats: 4.12)
    assert [line.split() for line in out[4:]] == [  # after the title, the header and the rule
        ["mlp", "Linear", "1", "2.00", "1.00", "1.00", "4.17", "-"],
        ["tiny", "Conv1d", "1", "1.00", "0.990", "0.990", "4.12", "-"],
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
