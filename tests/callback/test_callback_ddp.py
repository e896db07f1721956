"""ComponentBenchmark under DDP: two CPU processes (gloo), ``ranks="zero"`` and ``ranks="all"``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from cb_callback import Report

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "_ddp_script.py"


@pytest.mark.slow
def test_ddp_rank_zero_profiles_while_the_other_waits_and_all_ranks_profile_their_own(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "CB_DISABLE": ""}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in (0, 1)]
    assert [r["global_step"] for r in ranks] == [4, 4]

    # ranks="zero": only rank 0 profiles and writes, into output_dir itself
    assert [r["zero_report"] for r in ranks] == [True, False]
    assert {p.name for p in (tmp_path / "zero").iterdir()} >= {"report.json", "components.csv"}
    assert not list((tmp_path / "zero").glob("rank_*"))
    assert Report.load(tmp_path / "zero").metadata["world_size"] == 2
    # bounded by half of the 30 min default collective timeout
    assert ranks[0]["max_total_time_s"] == 900.0
    # rank 1 waited at the barrier: it left step 1's batch end after rank 0 finished profiling
    assert ranks[1]["left"]["2"] >= ranks[0]["left"]["2"] - 0.5

    # ranks="all": each rank profiles its own device into rank_<r>/
    assert [r["all_report"] for r in ranks] == [True, True]
    assert [r["all_output_dir"] for r in ranks] == [str(tmp_path / "all" / f"rank_{i}") for i in (0, 1)]
    for i in (0, 1):
        report = Report.load(tmp_path / "all" / f"rank_{i}")
        assert report.metadata["global_rank"] == i
        assert report.metadata["capture_step"] == 2
        assert {r.status for r in report.rows} == {"ok"}

    # the series: rank 0 profiled both captures into step_<N>/, rank 1 none
    assert [r["series_reports"] for r in ranks] == [[1, 3], []]
    for step in (1, 3):
        meta = Report.load(tmp_path / "series" / f"step_{step}").metadata
        assert (meta["capture_step"], meta["capture_series"], meta["world_size"]) == (step, True, 2)

    # rank 0 logged both reports, each at its capture step
    acc = EventAccumulator(str(tmp_path / "tb" / "version_0"), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("component_benchmark/total_ms/root")] == [1, 2]
    assert "component_benchmark/icicle/mfu" in acc.Tags()["images"]
