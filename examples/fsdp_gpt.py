"""The small GPT of ``examples/gpt.py`` sharded with FSDP2 over 2 ranks, profiled per component in lockstep.

Lightning's ``ModelParallelStrategy`` (data parallel over 2 ranks, no tensor
parallelism) calls ``configure_model``, which applies ``fully_shard`` to every
transformer block and then to the whole model: each rank holds half of every
parameter. ``ComponentBenchmark`` captures step ``--capture-step`` on both
ranks; the blocks (FSDP2 units) and the root are replayed on both ranks
together, their all-gathers and reduce-scatters measured (``comm_bytes``,
``comm_ms``, ``details["comm"]``); each block's children are replayed with
their block unsharded (their rows: compute alone). Rank 0 writes the report,
each row with every rank's time (``details["ranks"]``, the page's rank-spread
column). Training goes on bit-identically.

Run (one command; Lightning starts the second process itself)::

    python examples/fsdp_gpt.py                           # 2 CPU processes, gloo, about a minute
    python examples/fsdp_gpt.py --accelerator cuda --devices 8 --n-layer 12 --n-embd 768

On a CPU the two processes share the cores: the spread over ranks is mostly
the machine's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpt import CharCorpus, GPTConfig, GPTModule

from cb_callback import ComponentBenchmark


class ShardedGPT(GPTModule):
    """:class:`gpt.GPTModule` with every block, then the model, sharded by FSDP2 (``fully_shard``)."""

    def configure_model(self) -> None:
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["data_parallel"]
        for block in self.model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(self.model, mesh=mesh)


def main(argv: list[str] | None = None) -> None:
    """Train on 2 ranks, profile step ``--capture-step``, print rank 0's hotspots and where the files are."""
    parser = argparse.ArgumentParser(description="Shard a small GPT with FSDP2 over 2 ranks and profile one step.")
    parser.add_argument("--accelerator", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--capture-step", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=64)
    parser.add_argument("--out", default="cb_out/fsdp_gpt", help="report directory")
    args = parser.parse_args(argv)

    corpus = CharCorpus(args.block_size)
    cfg = GPTConfig(corpus.vocab_size, args.block_size, args.n_layer, args.n_head, args.n_embd)
    loader = DataLoader(corpus, batch_size=args.batch_size, drop_last=True)
    out = Path(args.out).resolve()
    bench = ComponentBenchmark(capture_step=args.capture_step, output_dir=str(out / "report"))
    torch.set_num_threads(1)  # two processes on a small CPU: one thread each
    trainer = pl.Trainer(
        strategy=ModelParallelStrategy(data_parallel_size=args.devices, tensor_parallel_size=1),
        accelerator=args.accelerator,
        devices=args.devices,
        max_steps=args.steps,
        callbacks=[bench],
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        default_root_dir=str(out),
    )
    pl.seed_everything(0, workers=True)
    trainer.fit(ShardedGPT(cfg), train_dataloaders=loader)
    if trainer.global_rank != 0:
        return
    if bench.report is None:
        raise SystemExit("no report: training stopped before the capture step")
    print(bench.report.summary())
    print(f"\nreport.html:  {Path(bench.output_dir) / 'report.html'}  (open it in a browser; works offline)")


if __name__ == "__main__":  # Lightning starts rank 1 by running this script again
    main()
