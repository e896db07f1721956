"""Lightning's ``ModelParallelStrategy`` (FSDP2) on 2 CPU ranks, with or without ``ComponentBenchmark``.

Run by ``tests/callback/test_callback_fsdp.py``. The model is ``tests/_lockstep_script.py``'s ``Net`` (3 residual MLP
blocks and a head), every block and then the model ``fully_shard``-ed in ``configure_model``; 4 steps of SGD
with momentum on a fixed dataset. Each rank writes ``OUT/rank_<r>.pt``: the losses, the local shards of the
parameters and of the optimizer's momentum after training, and, when profiled, the report's rows (rank 0's
report; ``ranks="zero"``, the default) and the callback's mode at the end.

Several modes (``plain,pause,fork``) train one after the other in the same two processes, a Trainer each (the
process group Lightning started for the first is the later ones'), each into ``OUT/<mode>/``; before each,
rank 0 prints ``MARK + mode`` on stdout and stderr, so the caller can tell each fit's output.

The two ranks are forked from this process as ``torchrun`` starts them (``tests/_ranks.py``), after it imported
what they import (:data:`PRELOAD`): none imports it again.

Usage: ``PYTHONPATH=<repo> python tests/_fsdp_lightning_script.py OUT plain|pause|fork[,...]``
"""

from __future__ import annotations

import importlib
import math
import os
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests._figures import blank_here
from tests._lockstep_script import Net

MARK = "== _fsdp_lightning_script mode: "


class Sharded(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = Net()
        self.losses: list[float] = []

    def configure_model(self) -> None:
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["data_parallel"]
        for block in self.net.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(self.net, mesh=mesh)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    def train_dataloader(self) -> DataLoader[Any]:
        g = torch.Generator().manual_seed(1)
        data = TensorDataset(torch.randn(64, 16, generator=g), torch.randint(0, 4, (64,), generator=g))
        return DataLoader(data, batch_size=8)


def _num(v: float) -> float | None:
    return v if isinstance(v, float) and math.isfinite(v) else None


def main(out: Path, mode: str) -> None:
    from lightning.pytorch.strategies import ModelParallelStrategy

    from cb_callback import ComponentBenchmark

    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    bench = None
    if mode != "plain":
        # the in-situ pass and the triage run on every rank; descend_share=0: every row replayed
        bench = ComponentBenchmark(
            capture_step=1, mode=mode, warmup=1, min_run_time_s=0.0, min_repeats=2, max_repeats=2, rounds=2,
            peak_flops=1e12, peak_bandwidth=1e11, load_plugins=False, output_dir=str(out / "cb"), descend_share=0.0,
        )  # fmt: skip
    trainer = pl.Trainer(
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1), accelerator="cpu", devices=2,
        max_steps=4, callbacks=[bench] if bench is not None else [], logger=False, default_root_dir=str(out),
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
    )  # fmt: skip
    module = Sharded()
    trainer.fit(module)
    opt = trainer.optimizers[0]
    report = bench.report if bench is not None else None
    result = {
        "losses": module.losses,
        "params": {n: p.to_local().detach().clone() for n, p in module.named_parameters()},
        "momentum": {n: opt.state[p]["momentum_buffer"].to_local().clone() for n, p in module.named_parameters()},
        "mode": None if bench is None else bench.mode,
        "rows": None if report is None else {
            r.path: {
                "status": r.status, "error": r.error, "note": r.note, "comm_bytes": _num(r.comm_bytes),
                "fwd_flops": _num(r.fwd_flops), "bwd_flops": _num(r.bwd_flops),
            }
            for r in report.rows
        },
    }  # fmt: skip
    torch.save(result, out / f"rank_{trainer.global_rank}.pt")


def modes(out: Path, names: list[str]) -> None:
    """One rank's fits, one per mode, one after the other."""
    for name in names:
        if os.environ["LOCAL_RANK"] == "0":
            print(MARK + name, flush=True)
            print(MARK + name, file=sys.stderr, flush=True)
        main(out / name, name)


#: What the ranks import (the strategy, FSDP2, the callback, the report's writers), imported before the fork.
PRELOAD = (
    "lightning.pytorch.strategies", "torch.distributed.fsdp", "torch._dynamo", "pandas", "plotly",
    "cb_callback._lightning.callback",
)  # fmt: skip


if __name__ == "__main__":
    from tests._ranks import fork_ranks

    blank_here()  # test_callback_fsdp reads no image (its fork mode falls back to pause: no child)

    for module in PRELOAD:
        importlib.import_module(module)
    sys.exit(fork_ranks(lambda: modes(Path(sys.argv[1]), sys.argv[2].split(","))))
