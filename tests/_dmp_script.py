"""A torchrec DLRM sharded by ``DistributedModelParallel`` over 2 CPU gloo ranks: a real step, then a profile on each.

The harness for issue 16 §4 (run by ``tests/integrations/test_torchrec_dmp.py``; the lockstep replay is tested with it).
Each rank:

1. builds a DLRM with 4 ``EmbeddingBagConfig`` tables (``t0``…``t3``, dim 8, 100/110/120/130 rows) sharded with
   the chosen sharding type (fused kernels; ``dense`` for data-parallel, the only kernel it has), a row-wise
   Adagrad fused optimizer on the tables and SGD on the dense parameters, and an unprofiled twin built the same
   way from the same seeds;
2. runs one real training step on both (its own batch: 4 samples, or 4 and 3 with ``--uneven``);
3. calls ``cb_callback.profile_components`` on the profiled model with that step's batch (every rank at once);
4. compares the two models' local state (tables, fused optimizer state, dense parameters): right after the
   profile and after one more real step on both;
5. writes ``OUT/<sharding>/rank_<r>.json``: the plan, the report's rows (``path -> [status, error, note,
   module_type, total_ms, fwd_ms, bwd_ms, comm_bytes, comm_ms, bytes, details["comm"], details["no_backward"],
   {details "torchrec", "parts", "planned", "ranks", "flags", "own_flags"}]``), ``torchrec_planned``
   (:func:`cb_callback.integrations.torchrec.planned_perf` of the plan), the
   twin comparison (``state_diff_after_profile``, ``state_diff_after_step``: the names of the tensors that differ),
   and ``error`` (the profile's exception, if it raised; the script still writes its file).

Sharding types: ``table_wise``, ``column_wise``, ``data_parallel`` (chosen by torchrec's planner through
``ParameterConstraints``), ``row_wise`` (the planner refuses it on CPU, so the plan is built by hand with
``construct_module_sharding_plan``), and ``mixed`` (t0 table-wise, t1 column-wise, t2 row-wise, t3
data-parallel, by hand).

Several sharding types (``table_wise,row_wise``) run one after the other in the same two processes. Every
collective has a 60 s timeout (the process group's), so a rank left alone fails instead of hanging; the caller
bounds the whole run with its own timeout too.

A run named ``SHARDING+uneven`` (``row_wise+uneven``) is that sharding type with ``--uneven``'s batches, into
``OUT/SHARDING+uneven/``, among runs with even ones: put it last (its collectives may fail on both ranks).

Usage: ``PYTHONPATH=<repo> python tests/_dmp_script.py OUT SHARDING[,SHARDING...] [--uneven]``
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

WORLD = 2
TABLES = 4
DIM = 8
SHARDINGS = ("table_wise", "column_wise", "row_wise", "data_parallel", "mixed")
EBC_PATH = "sparse_arch.embedding_bag_collection"


def build_dlrm() -> Any:
    """The unsharded DLRM: tables on ``meta`` (DMP materialises its shards), dense parts seeded."""
    import torch
    from torchrec.models.dlrm import DLRM
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    tables = [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=DIM, num_embeddings=100 + 10 * i, feature_names=[f"f{i}"])
        for i in range(TABLES)
    ]
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    return DLRM(
        embedding_bag_collection=ebc, dense_in_features=4, dense_arch_layer_sizes=[16, DIM],
        over_arch_layer_sizes=[8, 1],
    )  # fmt: skip


def sharding_plan(model: Any, sharding: str) -> Any:
    """The plan for ``sharding``: torchrec's planner with constraints, or by hand (row-wise, mixed)."""
    import torch.distributed as dist
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.sharding_plan import (
        column_wise,
        construct_module_sharding_plan,
        data_parallel,
        row_wise,
        table_wise,
    )
    from torchrec.distributed.types import ShardingPlan

    if sharding in ("table_wise", "column_wise", "data_parallel"):
        kernel = "dense" if sharding == "data_parallel" else "fused"
        constraints = {
            f"t{i}": ParameterConstraints(sharding_types=[sharding], compute_kernels=[kernel], min_partition=DIM // 2)
            for i in range(TABLES)
        }
        topology = Topology(world_size=WORLD, local_world_size=WORLD, compute_device="cpu")
        planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints)
        return planner.collective_plan(model, [EmbeddingBagCollectionSharder()], dist.GroupMember.WORLD)
    if sharding == "row_wise":
        per_table = {f"t{i}": row_wise() for i in range(TABLES)}
    else:  # mixed
        per_table = {"t0": table_wise(rank=0), "t1": column_wise(ranks=[0, 1]), "t2": row_wise(), "t3": data_parallel()}
    ebc = model.get_submodule(EBC_PATH)
    module_plan = construct_module_sharding_plan(ebc, per_table, local_size=WORLD, world_size=WORLD, device_type="cpu")
    return ShardingPlan({EBC_PATH: module_plan})


def build_dmp(sharding: str) -> tuple[Any, Any]:
    """A DMP-sharded DLRM and its dense optimizer; the same on every call (seeded)."""
    import torch
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.optim import RowWiseAdagrad
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    model = build_dlrm()
    apply_optimizer_in_backward(RowWiseAdagrad, model.sparse_arch.parameters(), {"lr": 0.1})
    plan = sharding_plan(model, sharding)
    torch.manual_seed(1)  # the tables' init (DMP materialises them from their configs' init_fn)
    dmp = DistributedModelParallel(
        model, device=torch.device("cpu"), plan=plan, sharders=[EmbeddingBagCollectionSharder()]
    )
    dense = [p for name, p in dmp.named_parameters() if "embedding_bags" not in name]
    return dmp, torch.optim.SGD(dense, lr=0.1)


def rank_batch(rank: int, step: int, uneven: bool) -> tuple[Any, Any, Any]:
    """(dense, kjt, labels) of ``rank`` at ``step``: 4 samples (rank 1: 3 with ``uneven``), 0-2 ids per bag."""
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    n = 4 - (rank % 2 if uneven else 0)
    g = torch.Generator().manual_seed(1000 * step + rank)
    lengths = torch.randint(0, 3, (TABLES * n,), generator=g)
    values = torch.randint(0, 100, (int(lengths.sum()),), generator=g)
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=[f"f{i}" for i in range(TABLES)], values=values, lengths=lengths)
    return torch.randn(n, 4, generator=g), kjt, torch.randint(0, 2, (n,), generator=g).float()


def train_step(dmp: Any, opt: Any, batch: tuple[Any, Any, Any]) -> float:
    """One real step: forward, BCE loss, backward (the fused optimizer updates the tables), dense SGD step."""
    import torch

    dense, kjt, labels = batch
    loss = torch.nn.functional.binary_cross_entropy_with_logits(dmp(dense, kjt).squeeze(-1), labels)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return float(loss.detach())


def local_state(dmp: Any) -> dict[str, Any]:
    """This rank's tensors of the model and its fused optimizer: local shards of sharded tensors, by name."""
    import torch
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    out: dict[str, Any] = {}

    def walk(prefix: str, obj: Any) -> None:
        if isinstance(obj, ShardedTensor):
            for i, shard in enumerate(obj.local_shards()):
                out[f"{prefix}#shard{i}"] = shard.tensor.detach().clone()
        elif isinstance(obj, torch.Tensor):
            out[prefix] = obj.detach().clone()
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(f"{prefix}.{i}", v)

    walk("model", dict(dmp.state_dict()))
    walk("fused_optim", dmp.fused_optimizer.state_dict())
    return out


def state_diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Names whose tensors differ bitwise (or exist on one side only)."""
    import torch

    names = sorted(set(a) | set(b))
    return [n for n in names if n not in a or n not in b or not torch.equal(a[n], b[n])]


#: The row details a rank's JSON keeps.
DETAIL_KEYS = ("torchrec", "parts", "planned", "ranks", "flags", "own_flags")


def rows_of(report: Any) -> dict[str, list[Any]]:
    def num(v: float) -> float | None:
        return v if v == v and abs(v) != float("inf") else None

    return {
        r.path: [
            r.status, r.error, r.note, r.module_type, num(r.total_ms), num(r.fwd_ms), num(r.bwd_ms),
            num(r.comm_bytes), num(r.comm_ms), num(r.bytes), r.details.get("comm"), r.details.get("no_backward"),
            {k: r.details[k] for k in DETAIL_KEYS if k in r.details},
        ]
        for r in report.rows
    }  # fmt: skip


def plan_of(dmp: Any) -> dict[str, dict[str, list[Any]]]:
    return {
        path: {t: [ps.sharding_type, ps.compute_kernel, ps.ranks] for t, ps in module_plan.items()}
        for path, module_plan in dmp.plan.plan.items()
    }


def profile_one(rank: int, sharding: str, uneven: bool) -> dict[str, Any]:
    """Steps 1-4 of the module docstring for one sharding type; what happened, as JSON types."""
    import cb_callback
    import cb_callback.integrations.torchrec as cbt

    result: dict[str, Any] = {"rank": rank, "sharding": sharding, "uneven": uneven, "error": None}
    try:
        dmp, opt = build_dmp(sharding)
        twin, twin_opt = build_dmp(sharding)
        result["plan"] = plan_of(dmp)
        batch = rank_batch(rank, 0, uneven)
        result["losses"] = [train_step(dmp, opt, batch), train_step(twin, twin_opt, batch)]
        result["torchrec_planned"] = cbt.planned_perf(dmp, batch_size=batch[0].shape[0])
        try:
            # the in-situ pass and the triage run on every rank; descend_share=0: every row replayed
            report = cb_callback.profile_components(
                dmp, (batch[0], batch[1]), warmup=0, min_run_time_s=0.0, min_repeats=1, max_repeats=1,
                load_plugins=False, peak_flops=1e11, peak_bandwidth=1e10, descend_share=0.0,
            )  # fmt: skip
            result["rows"] = rows_of(report)
            result["metadata_torchrec_sharded"] = report.metadata.get("torchrec_sharded")
        except Exception as e:  # recorded: what a profile does today is the harness's output
            result["error"] = f"{type(e).__name__}: {e}"
            result["traceback"] = traceback.format_exc()[-4000:]
        result["state_diff_after_profile"] = state_diff(local_state(dmp), local_state(twin))
        step1 = rank_batch(rank, 1, uneven)
        result["losses_after"] = [train_step(dmp, opt, step1), train_step(twin, twin_opt, step1)]
        result["state_diff_after_step"] = state_diff(local_state(dmp), local_state(twin))
    except Exception as e:
        result["error"] = result["error"] or f"{type(e).__name__}: {e}"
        result["traceback"] = traceback.format_exc()[-4000:]
    return result


def run_rank(rank: int, store: str, out: str, shardings: list[str], uneven: bool) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    # a collective that one rank never joins fails within a minute instead of the default half hour
    timeout = datetime.timedelta(seconds=60)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD, timeout=timeout)
    try:
        for run in shardings:
            sharding, plus = run.split("+", 1) if "+" in run else (run, "")
            result = profile_one(rank, sharding, uneven or plus == "uneven")
            folder = Path(out, run)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"rank_{rank}.json").write_text(json.dumps(result, indent=1, default=str))
            dist.barrier()
    finally:
        dist.destroy_process_group()


def summary(out: Path, shardings: list[str]) -> str:
    """Per sharding type and rank: the error, each row's status (and its error/note, shortened), the twin check."""
    lines = []
    for sharding in shardings:
        for rank in range(WORLD):
            path = out / sharding / f"rank_{rank}.json"
            if not path.exists():
                lines.append(f"[{sharding}] rank {rank}: no result")
                continue
            res = json.loads(path.read_text())
            lines.append(f"[{sharding}] rank {rank}: error={res['error']}")
            for p, (status, error, note, mtype, *_) in (res.get("rows") or {}).items():
                why = (error or note or "")[:110]
                lines.append(f"  {p or '<root>'} [{mtype}] {status} {why}")
            lines.append(f"  state differs after profile: {res.get('state_diff_after_profile')}")
            lines.append(f"  state differs after next step: {res.get('state_diff_after_step')}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    import torch.multiprocessing as mp

    shardings = argv[1].split(",") if len(argv) > 1 else []
    if not shardings or not {s.removesuffix("+uneven") for s in shardings} <= set(SHARDINGS):
        print(f"usage: _dmp_script.py OUT SHARDING[,SHARDING...] [--uneven]; SHARDING in {SHARDINGS}", file=sys.stderr)
        return 2
    out, uneven = Path(argv[0]), "--uneven" in argv[2:]
    out.mkdir(parents=True, exist_ok=True)
    store = out / "store"
    if store.exists():
        os.remove(store)
    # Forked ranks inherit these imports (seconds each): this process has started no process group and run no op.
    # torch.distributed.optim (TorchScript-compiles its functional optimizers: 2-4 s) is what DMP's dense DDP
    # wrapper imports in the first build.
    import torch.distributed.optim  # noqa: F401
    import torchrec.distributed.embeddingbag
    import torchrec.distributed.model_parallel
    import torchrec.distributed.planner
    import torchrec.models.dlrm
    import torchrec.optim  # noqa: F401

    import cb_callback.integrations.torchrec  # noqa: F401

    mp.start_processes(
        run_rank, args=(str(store), str(out), shardings, uneven), nprocs=WORLD, join=True, start_method="fork"
    )
    print(summary(out, shardings))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
