"""The 2-rank torchrec DMP runs, launched once for every test that reads them."""

from __future__ import annotations

import fcntl
import json
import os
from typing import Any

import pytest


@pytest.fixture(scope="session")
def dmp_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """``tests/_dmp_script.py`` on the 4 sharding types gloo runs and a plan mixing them, even batches (4 samples
    per rank), then ``row_wise+uneven`` (4 and 3 samples: its collectives fail on both ranks, so it runs last),
    one 2-rank launch: each run's two ranks' results (test_torchrec_dmp, test_torchrec_rows).

    Under pytest-xdist the two files may sit on two workers: the first to get here launches the runs, the
    other waits for it (a lock in the folder the workers share) and reads the same results."""
    pytest.importorskip("torchrec")
    from tests.integrations.test_torchrec_dmp import RUNS, UNEVEN, _run

    runs = ",".join((*RUNS, UNEVEN))
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return _run(tmp_path_factory.mktemp("dmp"), runs)
    shared = tmp_path_factory.getbasetemp().parent / "dmp"
    shared.mkdir(exist_ok=True)
    with open(shared / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        done = shared / "runs.json"
        if not done.exists():
            # a launch that fails raises here, on this worker; the other then launches its own and fails alike
            done.write_text(json.dumps(_run(shared / "out", runs)))
        result: dict[str, list[dict[str, Any]]] = json.loads(done.read_text())
    return result
