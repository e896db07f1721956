"""torchrec ``DistributedModelParallel`` over 2 CPU gloo ranks: every sharding type trains, profiles, stays untouched.

Each 2-rank run is ``tests/_dmp_script.py`` in a subprocess with a timeout, so a hang fails the test. The
planner estimate (``planned_perf``) is checked against hand-derived formulas and against torchrec's own
enumerator on the unsharded model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torchrec")

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "_dmp_script.py"
GLOO_TYPES = ("table_wise", "column_wise", "row_wise", "data_parallel")
RUNS = (*GLOO_TYPES, "mixed")  # mixed: t0 table-wise on rank 0, t1 column-wise, t2 row-wise, t3 data-parallel
UNEVEN = "row_wise+uneven"  # row-wise, rank 0 training 4 samples and rank 1 three (the script's --uneven)
EBC = "sparse_arch.embedding_bag_collection"
ROWS = {"t0": 100, "t1": 110, "t2": 120, "t3": 130}  # the script's tables, all of dim 8, fp32
# torchrec's default bandwidths (planner/constants.py), bytes per ms
INTRA_HOST_BW = 600 * 1024 * 1024 * 1024 / 1000
CROSS_HOST_BW = 12.5 * 1024 * 1024 * 1024 / 1000
DDR_BW = 51 * 1024 * 1024 * 1024 / 1000


def _run(out: Path, shardings: str, *extra: str) -> dict[str, list[dict[str, Any]]]:
    env = {k: v for k, v in os.environ.items() if k != "LOCAL_WORLD_SIZE"}  # the default topology: 1 host
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), shardings, *extra],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {s: [json.loads((out / s / f"rank_{r}.json").read_text()) for r in (0, 1)] for s in shardings.split(",")}


@pytest.fixture
def runs(dmp_runs: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """The 4 sharding types gloo runs and a plan mixing them, even batches (4 samples per rank), and UNEVEN, one
    2-rank launch (tests/integrations/conftest.py: shared with test_torchrec_rows)."""
    return dmp_runs


def _status(result: dict[str, Any]) -> dict[str, str]:
    return {p: row[0] for p, row in result["rows"].items()}


# The script's rows: path -> [status, error, note, module_type, total_ms, fwd_ms, bwd_ms, comm_bytes, comm_ms, bytes,
# details["comm"], details["no_backward"], {the details "torchrec", "parts", "planned", "ranks"}]
TOTAL, BWD, COMM_BYTES, COMM, NO_BWD, DETAILS = 4, 6, 7, 10, 11, 12
B, W, D = 4, 2, 8  # samples per rank, ranks, embedding dim
I64, F32 = 8, 4
SPLITS = W * 3 * I64  # an input dist's first all-to-all: 3 counts (lengths, ids, batch) for each destination rank


def _ids(rank: int) -> list[list[int]]:
    """The ids of each feature in ``rank``'s batch of the profiled step (the script's own batch)."""
    from tests._dmp_script import rank_batch

    kjt = rank_batch(rank, 0, False)[1]
    return [kjt[f"f{i}"].values().tolist() for i in range(len(ROWS))]


def _expected(sharding: str, rank: int, plan: dict[str, list[Any]]) -> dict[str, Any]:
    """The sharded EBC's collectives on ``rank``, derived from the batches and the plan (nccl-tests' payloads).

    Input dist (per sharding type): the splits, then every length and id bound for each rank (int64): table- and
    data-parallel features go to one rank (their table's), column-wise ones to every rank holding a column shard,
    row-wise lengths to every rank and each id to the rank whose row block holds it. Output dist (fp32 pooled
    embeddings, all W x B samples): all-to-all of this rank's shards (column-wise: D/2 wide), row-wise a
    reduce-scatter of the full W x B x D tensor per table; the backward runs them in reverse: the all-to-all sends
    back the gradient of what this rank received (B samples, every table of the type), the row-wise all-gather
    the full tensor. A data-parallel table's gradient is all-reduced (DDP) in the backward.
    """
    ids = _ids(rank)
    tables = {t: int(t[1]) for t in ROWS}  # table name -> its feature index
    mine = [t for t, (_, _, ranks) in plan.items() if rank in ranks]
    stages: dict[str, int] = {}
    fwd: dict[str, int] = {}
    bwd: dict[str, int] = {}

    def add(table: dict[str, int], op: str, nbytes: int) -> None:
        table[op] = table.get(op, 0) + nbytes

    by_type: dict[str, list[str]] = {}
    for t, (stype, _, _) in plan.items():
        by_type.setdefault(stype, []).append(t)
    for stype, ts in by_type.items():
        feats = [tables[t] for t in ts]
        if stype == "data_parallel":
            add(bwd, "c10d.allreduce_", sum(ROWS[t] * D * F32 for t in ts))
            continue
        lengths = B * len(feats) * (1 if stype == "table_wise" else W)
        sent = sum(len(ids[f]) for f in feats) * (W if stype == "column_wise" else 1)
        stages["input_dist"] = stages.get("input_dist", 0) + SPLITS + (lengths + sent) * I64
        if stype == "row_wise":
            full = len(ts) * D * W * B * F32
            stages[f"output_dist:{stype}"] = full
            add(fwd, "c10d._reduce_scatter_base_", full)
            add(bwd, "c10d._allgather_base_", full)
            continue
        width = D // 2 if stype == "column_wise" else D
        local = sum(1 for t in ts if t in mine) * width * W * B * F32
        stages[f"output_dist:{stype}"] = local
        add(fwd, "c10d.alltoall_base_", local)
        add(bwd, "c10d.alltoall_base_", len(ts) * D * B * F32)
    if "input_dist" in stages:
        add(fwd, "c10d.alltoall_base_", stages["input_dist"])
    return {"stages": stages, "forward": fwd, "backward": bwd, "total": sum(fwd.values()) + sum(bwd.values())}


def _received_ids(sharding: str, table: str, rank: int) -> int:
    """Ids of ``table``'s feature that reach ``rank``'s lookup: data-parallel its own, row-wise those in its block."""
    f = int(table[1])
    if sharding == "data_parallel":
        return len(_ids(rank)[f])
    every = [v for r in range(W) for v in _ids(r)[f]]
    if sharding == "row_wise":
        block = -(-ROWS[table] // W)  # torchrec's row-wise block: ceil(rows / world)
        return sum(1 for v in every if v // block == rank)
    return len(every)  # table-wise (the owner), column-wise (every column shard)


@pytest.mark.slow
@pytest.mark.parametrize("sharding", RUNS)
def test_each_sharding_type_trains_and_profiles_on_gloo_and_leaves_training_untouched(
    runs: dict[str, list[dict[str, Any]]], sharding: str
) -> None:
    ranks = runs[sharding]
    for rank, res in enumerate(ranks):
        assert res["error"] is None, res.get("traceback")
        if sharding != "mixed":
            kernel = "dense" if sharding == "data_parallel" else "fused"
            assert {t: ps[:2] for t, ps in res["plan"][EBC].items()} == {t: [sharding, kernel] for t in ROWS}
        # the twin is built and stepped like the profiled model: equal losses, bit for bit
        assert res["losses"][0] == res["losses"][1] and res["losses_after"][0] == res["losses_after"][1]
        # profiling changed no table, fused optimizer state or dense parameter, nor the next step
        assert res["state_diff_after_profile"] == [] and res["state_diff_after_step"] == []
        status = _status(res)
        # unsharded paths, with no extra argument; every row that ran is measured: the dense arch 7 (itself,
        # model, _mlp, 2 perceptrons, 2 linears), inter arch 1, over arch 7, the root, sparse arch and its EBC
        assert not any(p.startswith("_dmp_wrapped_module") for p in status)
        ran = {p: st for p, st in status.items() if ".embedding_bags" not in p}
        assert len(ran) == 18 and set(ran.values()) == {"ok"}, {p: st for p, st in ran.items() if st != "ok"}
        # the sharded EBC keeps its tables in its lookups: its embedding_bags placeholders never run
        assert {st for p, st in status.items() if ".embedding_bags" in p} == {"not_run"}
        row = res["rows"][EBC]
        # replayed in lockstep on both ranks, forward and backward (the fused update inside it, then undone)
        assert row[NO_BWD] is None and row[BWD] > 0
        want = _expected(res["sharding"], rank, res["plan"][EBC])
        assert row[COMM_BYTES] == want["total"]
        comm = {(c["phase"], c["op"]): c["bytes"] for c in row[COMM]}
        assert comm == {**{("forward", k): v for k, v in want["forward"].items()},
                        **{("backward", k): v for k, v in want["backward"].items()}}  # fmt: skip
        assert all(c["ms"] > 0 for c in row[COMM])  # each timed, waited for as issued
        details = row[DETAILS]
        assert {s["stage"]: s["comm_bytes"] for s in details["torchrec"]["stages"]} == want["stages"]
        # one part per local lookup: the tables on this rank, the ids it received, its TBE bytes and own time
        types = details["torchrec"]["sharding_types"]
        assert [p["name"] for p in details["parts"]] == [f"lookup:{t}" for t in types]
        for part, stype in zip(details["parts"], types, strict=True):
            tables = sorted(t for t, (st, _, rk) in res["plan"][EBC].items() if st == stype and rank in rk)
            assert part["tables"] == tables
            assert part["ids"] == sum(_received_ids(stype, t, rank) for t in tables)
            assert part["fwd_ms"] > 0 and (part["bytes"] > 0) == (part["ids"] > 0)
        # beside it, torchrec's planner estimate of this rank's shards: planned_perf's, to the last bit
        planned, mine = details["planned"], res["torchrec_planned"][EBC]["ranks"][str(rank)]
        assert {k: planned[k] for k in mine} == mine and planned["rank"] == rank
        # rank 0 merges both ranks' times: exactly what each rank measured
        spread = details["ranks"]["total_ms"]
        assert spread["per_rank"] == [ranks[0]["rows"][EBC][TOTAL], ranks[1]["rows"][EBC][TOTAL]]
        assert details["ranks"]["straggler"] == max((0, 1), key=lambda r: spread["per_rank"][r])
    assert _status(ranks[0]).keys() == _status(ranks[1]).keys()


@pytest.mark.slow
def test_row_wise_with_unequal_batches_needs_nccl(runs: dict[str, list[dict[str, Any]]]) -> None:
    # rank 0 trains 4 samples, rank 1 three: the row-wise output dist reduce-scatters unequal splits
    # (gloo runs it) and its backward all-gathers them into a list of unequal tensors, which gloo refuses
    # on both ranks at once: an error, not a hang
    (r0, r1) = runs[UNEVEN]
    assert r0["sharding"] == "row_wise" and r0["uneven"] and r1["uneven"]
    assert "ProcessGroupGloo::allgather: invalid tensor size at index 1 (expected (4, 32), got (3, 32))" in r0["error"]
    assert "ProcessGroupGloo::allgather: invalid tensor size at index 0 (expected (3, 32), got (4, 32))" in r1["error"]


# --- planned_perf on the plans of the 2-rank runs ----------------------------------------------------------------


def _planned(runs: dict[str, list[dict[str, Any]]], sharding: str, rank: int = 0) -> dict[str, Any]:
    planned = runs[sharding][rank]["torchrec_planned"]
    assert list(planned) == [EBC]  # one entry per sharded module, under its unsharded path
    return planned[EBC]


@pytest.mark.slow
def test_planned_table_wise_comms_are_bytes_over_the_intra_host_bandwidth(
    runs: dict[str, list[dict[str, Any]]],
) -> None:
    entry = _planned(runs, "table_wise")
    assert entry["module_type"] == "ShardedEmbeddingBagCollection"
    assert entry["assumptions"]["batch_size"] == 4 and entry["assumptions"]["world_size"] == 2
    for table, rows in ROWS.items():
        t = entry["tables"][table]
        (shard,) = t["shards"]
        assert shard["size"] == [rows, 8] and shard["offset"] == [0, 0]
        assert [shard["rank"]] == runs["table_wise"][0]["plan"][EBC][table][2]
        # output all-to-all: 4 samples x 2 ranks x 8 dims x 4 bytes = 256 bytes, forward and backward
        assert t["fwd_comms_ms"] == pytest.approx(256 / INTRA_HOST_BW, rel=1e-12)
        assert t["bwd_comms_ms"] == pytest.approx(256 / INTRA_HOST_BW, rel=1e-12)
        # input all-to-all: 4 ids (1 per bag) x 2 ranks x 8 bytes (int64) = 64 bytes
        assert t["input_dist_comms_ms"] == pytest.approx(64 / INTRA_HOST_BW, rel=1e-12)
        # the backward multiplier: bwd compute is 2 x fwd compute (a doubling is exact in floats)
        assert t["bwd_compute_ms"] == 2 * t["fwd_compute_ms"] and t["prefetch_compute_ms"] == 0.0
        # Perf.total: compute and comms of both passes, not the input dist
        parts = t["fwd_compute_ms"] + t["bwd_compute_ms"] + t["fwd_comms_ms"] + t["bwd_comms_ms"]
        assert t["total_ms"] == pytest.approx(parts, rel=1e-12)


@pytest.mark.slow
def test_planned_data_parallel_is_an_all_reduce_and_optimizer_kernels_per_replica(
    runs: dict[str, list[dict[str, Any]]],
) -> None:
    entry = _planned(runs, "data_parallel")
    for table, rows in ROWS.items():
        t = entry["tables"][table]
        assert [(s["rank"], s["size"]) for s in t["shards"]] == [(0, [rows, 8]), (1, [rows, 8])]  # a full replica each
        assert t["fwd_comms_ms"] == 0.0 and t["input_dist_comms_ms"] == 0.0
        # per replica: the table's gradient (rows x 8 x 4 bytes) all-reduced at the cross-host bandwidth x 2
        # local ranks (one NIC per device, one host: (2 x 1 - 1) / 1 = 1 pass), plus 9.22 elementwise
        # optimizer passes over it at the dense kernel's half DDR bandwidth
        grad = rows * 8 * 4
        per_replica = grad / (2 * CROSS_HOST_BW) + grad * 9.22 / (0.5 * DDR_BW)
        assert t["bwd_comms_ms"] == pytest.approx(2 * per_replica, rel=1e-12)


@pytest.mark.slow
def test_planned_shards_are_the_plans_and_sums_add_up(runs: dict[str, list[dict[str, Any]]]) -> None:
    cw = _planned(runs, "column_wise")["tables"]["t1"]["shards"]
    assert [(s["rank"], s["size"], s["offset"]) for s in cw] == [(0, [110, 4], [0, 0]), (1, [110, 4], [0, 4])]
    rw = _planned(runs, "row_wise")["tables"]["t3"]["shards"]
    assert [(s["rank"], s["size"], s["offset"]) for s in rw] == [(0, [65, 8], [0, 0]), (1, [65, 8], [65, 0])]
    for sharding in GLOO_TYPES:
        for rank in (0, 1):
            entry = _planned(runs, sharding, rank)
            shards = [s for t in entry["tables"].values() for s in t["shards"]]
            for key in ("fwd_compute_ms", "fwd_comms_ms", "bwd_compute_ms", "bwd_comms_ms", "total_ms"):
                # floating sums in another order: equal to 1e-12 relative
                assert entry[key] == pytest.approx(sum(s[key] for s in shards), rel=1e-12, abs=0.0)
                for r, per_rank in entry["ranks"].items():
                    mine = sum(s[key] for s in shards if str(s["rank"]) == r)
                    assert per_rank[key] == pytest.approx(mine, rel=1e-12, abs=0.0)
            assert _planned(runs, sharding, 1) == _planned(runs, sharding, 0)  # every rank sees the same plan


@pytest.mark.slow
def test_planned_perf_is_what_torchrecs_planner_estimates_for_the_same_options(
    runs: dict[str, list[dict[str, Any]]],
) -> None:
    """torchrec's EmbeddingEnumerator, on the unsharded model, rates the options the planner chose from."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.types import ParameterConstraints, Topology

    from tests._dmp_script import build_dlrm

    topology = Topology(world_size=2, local_world_size=2, compute_device="cpu")
    for sharding in ("table_wise", "column_wise", "data_parallel"):  # the planner refuses row-wise on CPU
        kernel = "dense" if sharding == "data_parallel" else "fused"
        cons = {
            t: ParameterConstraints(sharding_types=[sharding], compute_kernels=[kernel], min_partition=4) for t in ROWS
        }
        options = EmbeddingEnumerator(topology=topology, batch_size=4, constraints=cons).enumerate(
            build_dlrm(), [EmbeddingBagCollectionSharder()]
        )
        entry = _planned(runs, sharding)
        fields = ("fwd_compute", "fwd_comms", "bwd_compute", "bwd_comms", "input_dist_comms", "prefetch_compute")
        for opt in options:
            got = [[s["size"], *(s[f"{f}_ms"] for f in fields)] for s in entry["tables"][opt.name]["shards"]]
            want = [[list(s.size), *(getattr(s.perf, f) for f in fields)] for s in opt.shards]
            assert got == want, (sharding, opt.name)  # the same inputs, the same float operations: equal
