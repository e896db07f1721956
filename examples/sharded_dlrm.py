"""The DLRM of ``examples/dlrm.py`` sharded by torchrec's ``DistributedModelParallel`` over 2 ranks, profiled.

A plain training loop (no Lightning) on each of 2 processes (``gloo`` on a CPU,
``nccl`` with ``--device cuda``): the 26 tables are sharded by torchrec's planner,
constrained to a mix of sharding types (the largest tables table-wise, the
middle ones column-wise, the smallest data-parallel; fused row-wise Adagrad on
the tables, SGD on the dense parts). After ``--capture-step`` steps every rank
calls ``cb_callback.profile_components`` on its model with its last batch:

* the sharded ``EmbeddingBagCollection`` is replayed on both ranks together,
  its input all-to-all (KJT), local lookups and output all-to-all measured:
  ``comm_bytes``, ``comm_ms``, ``details["comm"]``, ``details["torchrec"]``
  (collectives by stage) and ``details["parts"]`` (each lookup alone: ids,
  bytes, GB/s against the copy ceiling);
* beside it, torchrec's own planner estimate for this rank's shards
  (``details["planned"]``: forward/backward compute and comms), and the
  measured split, side by side in the summary and the page;
* rank 0 writes the report, each row with every rank's time.

Training then goes on, bit-identical to a run that was not profiled.

Run (one command; it starts both processes)::

    python examples/sharded_dlrm.py                  # 2 CPU processes, about a minute
    python examples/sharded_dlrm.py --device cuda    # 2 GPUs, nccl
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dlrm import DLRMConfig, build_dlrm, synthetic_batch

WORLD = 2
#: Rows of the 26 tables (cycled): small enough for a CPU, three sizes for three sharding types.
ROWS = (20_000, 2_000, 200)


def _plan(model: Any, cfg: DLRMConfig, device: torch.device) -> Any:
    """torchrec's planner, told which sharding type each table may take (by its size)."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.types import ParameterConstraints

    constraints = {}
    for name, rows in zip(cfg.feature_names, cfg.rows(), strict=True):
        sharding, kernel = ("table_wise", "fused") if rows >= 10_000 else ("column_wise", "fused")
        if rows < 1_000:
            sharding, kernel = "data_parallel", "dense"
        constraints[f"t_{name}"] = ParameterConstraints(
            sharding_types=[sharding], compute_kernels=[kernel], min_partition=cfg.embedding_dim // 2
        )
    topology = Topology(world_size=WORLD, local_world_size=WORLD, compute_device=device.type)
    planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints)
    return planner.collective_plan(model, [EmbeddingBagCollectionSharder()], dist.GroupMember.WORLD)


def _worker(rank: int, store: str, args: argparse.Namespace) -> None:
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.optim import RowWiseAdagrad
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    import cb_callback
    import cb_callback.integrations.torchrec

    cuda = args.device == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(1)  # two processes on a small CPU: one thread each
    os.environ["LOCAL_WORLD_SIZE"] = str(WORLD)  # one host: what torchrec's planner and topology assume
    dist.init_process_group(
        "nccl" if cuda else "gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
        timeout=datetime.timedelta(seconds=300),
    )  # fmt: skip
    try:
        cfg = DLRMConfig(table_rows=ROWS, embedding_dim=16)
        model = build_dlrm(cfg, device="meta")  # DMP materialises each rank's shards of the tables
        apply_optimizer_in_backward(RowWiseAdagrad, model.sparse_arch.parameters(), {"lr": 0.05})
        dmp = DistributedModelParallel(
            model, device=device, plan=_plan(model, cfg, device), sharders=[EmbeddingBagCollectionSharder()]
        )
        dense = [p for n, p in dmp.named_parameters() if "embedding_bags" not in n]
        opt = torch.optim.SGD(dense, lr=0.05)
        batch: tuple[torch.Tensor, Any, torch.Tensor] | None = None
        for step in range(args.capture_step + 1):
            dense_x, kjt, labels = synthetic_batch(args.batch_size, cfg, seed=1000 * step + rank)
            batch = (dense_x.to(device), kjt.to(device), labels.to(device))
            logits = dmp(batch[0], batch[1]).squeeze(-1)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch[2])
            loss.backward()
            opt.step()
            opt.zero_grad()
        assert batch is not None
        out = Path(args.out).resolve()
        report = cb_callback.profile_components(
            dmp, (batch[0], batch[1]), output_dir=str(out / "report") if rank == 0 else None
        )
        if rank == 0:
            print(report.summary())
            print(f"\nreport.html:  {out / 'report' / 'report.html'}  (open it in a browser; works offline)")
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    """Start both ranks; rank 0 prints the summary and where the report is."""
    parser = argparse.ArgumentParser(description="Shard a DLRM over 2 ranks with torchrec DMP and profile it.")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--capture-step", type=int, default=3, help="train this many steps first")
    parser.add_argument("--out", default="cb_out/sharded_dlrm", help="report directory")
    args = parser.parse_args(argv)
    # On a CPU the ranks are forked: they start with what this process imported (torch, torchrec: seconds
    # each) instead of importing it all again. CUDA wants fresh processes: spawned.
    start = "fork" if args.device == "cpu" and "fork" in mp.get_all_start_methods() else "spawn"
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_worker, args=(str(Path(tmp) / "store"), args), nprocs=WORLD, join=True, start_method=start)


if __name__ == "__main__":  # spawned ranks (CUDA) import this module, they do not run it
    main()
