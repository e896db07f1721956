"""A two-process CPU DDP fit whose model all-reduces a statistic inside a submodule's forward.

What ``SyncBatchNorm`` does (torch's own refuses CPU inputs): ``GlobalCenter``
subtracts the mean over every rank's batch. Replaying it on one rank alone would
wait forever for the other: it is replayed on both ranks together (lockstep),
with ``ranks="zero"`` and with ``ranks="all"`` (run by test_ddp_collectives.py;
each rank writes ``rank_<r>.json``).

Two fits, one after another in the same two processes (the second Trainer finds the ranks launched and
the process group made): ``plain``, the same fit without the callbacks (the unprofiled twin), then
``profiled``; each rank writes ``OUT/<mode>/rank_<r>.json``, with its final parameters (``params``: name ->
the tensor's values as nested lists).

Lightning's own launcher (``strategy="ddp"``: a subprocess) starts rank 1 by running this script again: the one
2-rank Lightning script that keeps it under test (``tests/_ranks.py`` forks the others' ranks, ``torchrun``-style).

Usage: ``PYTHONPATH=<repo> python tests/_ddp_collective_script.py OUT [MODE[,MODE]]`` (``plain,profiled``
unless given)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def main(out: Path, plain: bool) -> None:
    """One fit, into ``out``: without the callbacks where ``plain``."""
    import lightning.pytorch as pl
    import torch
    import torch.distributed as dist
    from torch import nn

    from cb_callback import ComponentBenchmark
    from tests._callback_models import MLPModule
    from tests.conftest import FAST

    class GlobalCenter(nn.Module):
        """x minus the mean of x over the whole global batch (an all-reduce in forward)."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            stats = torch.stack([x.detach().sum(0), torch.full_like(x[0], x.shape[0])])
            dist.all_reduce(stats)
            return x - stats[0] / stats[1]

    class CenteredMLP(MLPModule):
        def __init__(self) -> None:
            super().__init__(validate=False)
            self.encoder = nn.Sequential(nn.Linear(8, 16), GlobalCenter(), nn.ReLU())

    # the in-situ pass and the triage run on every rank; descend_share=0: every row replayed
    opts: dict[str, Any] = {**FAST, "peak_flops": 1e11, "peak_bandwidth": 1e10, "descend_share": 0.0}
    zero = ComponentBenchmark(capture_step=1, ranks="zero", output_dir=str(out / "zero"), **opts)
    every = ComponentBenchmark(capture_step=2, ranks="all", output_dir=str(out / "all"), **opts)
    pl.seed_everything(0, verbose=False)
    trainer = pl.Trainer(
        strategy="ddp", devices=2, accelerator="cpu", max_steps=3, default_root_dir=str(out), logger=False,
        callbacks=[] if plain else [zero, every], enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, limit_val_batches=0,
    )  # fmt: skip
    trainer.fit(CenteredMLP())
    rank = trainer.global_rank

    def rows(report: Any) -> dict[str, list[Any]] | None:
        if report is None:
            return None
        return {r.path: [r.status, r.error, r.note, r.comm_bytes, r.comm_ms, r.fwd_flops] for r in report.rows}

    result = {
        "rank": rank, "global_step": trainer.global_step, "zero": rows(zero.report), "all": rows(every.report),
        "params": {n: p.detach().tolist() for n, p in trainer.lightning_module.named_parameters()},
    }  # fmt: skip
    (out / f"rank_{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    from tests._figures import blank_here

    blank_here()  # its test reads no image; rank 1, the script again, blanks its own
    modes = sys.argv[2].split(",") if sys.argv[2:] else ["plain", "profiled"]
    for mode in modes:
        (Path(sys.argv[1]) / mode).mkdir(parents=True, exist_ok=True)
        main(Path(sys.argv[1]) / mode, plain=mode == "plain")
