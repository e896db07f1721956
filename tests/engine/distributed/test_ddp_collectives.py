"""A component that all-reduces inside its forward, under 2-rank CPU DDP: measured in lockstep, never a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "tests" / "_ddp_collective_script.py"


@pytest.mark.slow
@pytest.mark.timeout(600)  # the subprocess's 480 s (two fits' 240 s) fails a hang first
def test_a_communicating_component_is_measured_in_lockstep_with_ranks_zero_and_all(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "CB_DISABLE": ""}
    # Both fits in one pair of processes, one after the other: the unprofiled twin ("plain"), then "profiled".
    # Before the fix this hung in both modes (rank 0 replayed the all-reduce alone): the timeout fails it.
    args = [sys.executable, str(SCRIPT), str(tmp_path), "plain,profiled"]
    proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=480)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = {
        mode: [json.loads((tmp_path / mode / f"rank_{r}.json").read_text()) for r in (0, 1)]
        for mode in ("profiled", "plain")
    }
    ranks = runs["profiled"]
    # two captures (steps 1 and 2) changed nothing: every rank's weights equal the unprofiled twin's, exactly
    assert [r["params"] for r in ranks] == [r["params"] for r in runs["plain"]]
    assert [r["global_step"] for r in ranks] == [3, 3]
    assert ranks[1]["zero"] is None  # ranks="zero": rank 0 profiles alone
    reports = [ranks[0]["zero"], ranks[0]["all"], ranks[1]["all"]]
    for rows in reports:
        status = {p: v[0] for p, v in rows.items()}
        # GlobalCenter (encoder.1) communicates: replayed on both ranks together (lockstep), it and the
        # components that contain it are measured; before issue 16 it was skipped and they estimated.
        assert status == dict.fromkeys(["", "encoder", "head", "encoder.0", "encoder.1", "encoder.2"], "ok")
        # one all-reduce per forward of a [2, 16] float32 tensor (the sum and the count of 16 features):
        # 2 * 16 * 4 = 128 bytes; nothing in the backward (the statistics are detached)
        assert rows["encoder.1"][3] == 128.0
        assert rows["encoder"][3] == rows[""][3] == 128.0  # the only collective in the model
        assert rows["encoder.0"][3] == 0.0
        comm_ms = rows["encoder.1"][4]
        assert comm_ms is not None and comm_ms == comm_ms and comm_ms > 0  # timed, finite (NaN != NaN)
