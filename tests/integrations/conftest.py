"""The 2-rank torchrec DMP runs, launched once for every test that reads them."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def dmp_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """``tests/_dmp_script.py`` on the 4 sharding types gloo runs and a plan mixing them, even batches (4 samples
    per rank), then ``row_wise+uneven`` (4 and 3 samples: its collectives fail on both ranks, so it runs last),
    one 2-rank launch: each run's two ranks' results (test_torchrec_dmp, test_torchrec_rows)."""
    pytest.importorskip("torchrec")
    from tests.integrations.test_torchrec_dmp import RUNS, UNEVEN, _run

    return _run(tmp_path_factory.mktemp("dmp"), ",".join((*RUNS, UNEVEN)))
