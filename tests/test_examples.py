"""The examples say where their report is: each prints the path of the report.html it wrote."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

import cb_callback
from tests.conftest import FAST, load_example

# Fixed peaks: no CPU calibration in a test (the figures do not matter here, only the files).
PEAKS: dict[str, Any] = dict(peak_flops=1e12, peak_bandwidth=1e11)


def test_quickstart_prints_the_report_html_it_wrote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    quickstart = load_example("quickstart")
    fast = functools.partial(cb_callback.profile_components, **FAST, **PEAKS)
    monkeypatch.setattr(quickstart, "profile_components", fast)
    out_dir = tmp_path / "quickstart"
    quickstart.main(["--out", str(out_dir), "--batch-size", "4"])
    out = capsys.readouterr().out
    page = out_dir.resolve() / "report.html"
    # The line names the page by its absolute path, and the page is there (written by
    # profile_components' default file reporter, since the example passes no reporters).
    assert f"report.html:  {page}" in out
    assert page.is_file()
    assert (out_dir / "report.json").is_file() and (out_dir / "components.csv").is_file()
