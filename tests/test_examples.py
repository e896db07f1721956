"""The examples say where their report is: each prints the path of the report.html it wrote."""

from __future__ import annotations

import functools
import math
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


def _run_example(name: str, tmp_path: Path, *args: str) -> str:
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]), "CB_DISABLE": ""}
    cmd = [sys.executable, str(repo / "examples" / f"{name}.py"), "--out", str(tmp_path / name), *args]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
def test_the_fsdp_gpt_example_profiles_two_ranks_in_one_command(tmp_path: Path) -> None:
    out = _run_example("fsdp_gpt", tmp_path, "--steps", "3", "--capture-step", "1")
    page = (tmp_path / "fsdp_gpt" / "report" / "report.html").resolve()
    assert f"report.html:  {page}" in out and page.is_file()
    report = cb_callback.Report.load(page.parent)
    # the default profile with the triage on both ranks: every row replayed (a block, an FSDP2 unit, with its
    # collectives) or left in situ with the step's own time; the LightningModule and the ModuleList are
    # containers, estimated
    assert report.metadata["ranks"]["world_size"] == 2 and report.metadata["insitu"]["ranks"] == 2
    assert "skipped" not in report.metadata["triage"], report.metadata["triage"]
    insitu = {r.path for r in report.rows if r.details.get("as") == "insitu"}
    assert {r.path for r in report.rows if r.status != "ok"} - insitu == {"", "model.blocks"}
    assert all(math.isfinite(report.row(p).insitu_ms) for p in insitu)
    for b in range(2):
        block = report.row(f"model.blocks.{b}")
        assert block.path in insitu or block.comm_bytes > 0, (block.path, block.status, block.comm_bytes)


@pytest.mark.slow
def test_the_sharded_dlrm_example_profiles_two_ranks_in_one_command(tmp_path: Path) -> None:
    out = _run_example("sharded_dlrm", tmp_path, "--batch-size", "16", "--capture-step", "1")
    page = (tmp_path / "sharded_dlrm" / "report" / "report.html").resolve()
    assert f"report.html:  {page}" in out and page.is_file()
    report = cb_callback.Report.load(page.parent)
    ran = [r for r in report.rows if ".embedding_bags" not in r.path]
    # the default profile with the triage on both ranks: each row replayed, or left in situ with its time
    assert all(r.status == "ok" or (r.details.get("as") == "insitu" and math.isfinite(r.insitu_ms)) for r in ran)
    assert report.row("sparse_arch.embedding_bag_collection").status == "ok"  # most of the step: replayed
    ebc = report.row("sparse_arch.embedding_bag_collection")
    # three sharding types, one lookup each, and the planner's estimate beside the measurement
    names = [p["name"] for p in ebc.details["parts"]]
    assert names == ["lookup:table_wise", "lookup:column_wise", "lookup:data_parallel"]
    assert "measured vs planned" in out and ebc.details["planned"]["source"] == "torchrec EmbeddingPerfEstimator"
