"""A component that all-reduces inside its forward, profiled under 2-rank CPU DDP: skipped, never a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "_ddp_collective_script.py"


@pytest.mark.slow
def test_a_communicating_component_is_skipped_with_ranks_zero_and_all(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "CB_DISABLE": ""}
    # Before the fix this hung in both modes (rank 0 replayed the all-reduce alone): the timeout fails it.
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in (0, 1)]
    assert [r["global_step"] for r in ranks] == [3, 3]
    assert ranks[1]["zero"] is None  # ranks="zero": rank 0 profiles alone
    reports = [ranks[0]["zero"], ranks[0]["all"], ranks[1]["all"]]
    for rows in reports:
        status = {p: v[0] for p, v in rows.items()}
        # GlobalCenter (encoder.1) communicates: skipped with the reason; the components that
        # contain it (encoder, the root) are estimated from their other children; the rest ok.
        assert status == {
            "": "estimated",
            "encoder": "estimated",
            "head": "ok",
            "encoder.0": "ok",
            "encoder.1": "skipped",
            "encoder.2": "ok",
        }
        reason = " ".join(x for x in rows["encoder.1"][1:] if x)
        assert "communicates across ranks (c10d.allreduce_" in reason
