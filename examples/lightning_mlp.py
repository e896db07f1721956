"""An ordinary Lightning script (an MLP on synthetic data) with ComponentBenchmark added.

The only change to the training script is the ``callbacks=[bench]`` line (and the
import): training runs exactly as before (same losses, same weights), and at
step 10 every component of the model is profiled. The report goes to
TensorBoard (scalars, table, icicles under ``component_benchmark/``) and to files.

Run::

    python examples/lightning_mlp.py            # CPU, about 15 s on 2 cores
    python examples/lightning_mlp.py --mode fork
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import TensorBoardLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from cb_callback import ComponentBenchmark


class MLPClassifier(pl.LightningModule):
    """A classifier: three hidden blocks of Linear -> BatchNorm -> ReLU -> Dropout, then a head."""

    def __init__(self, features: int = 256, hidden: int = 512, classes: int = 10, lr: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        blocks: list[nn.Module] = []
        width = features
        for _ in range(3):
            blocks.append(nn.Sequential(nn.Linear(width, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Dropout(0.1)))
            width = hidden
        self.backbone = nn.Sequential(*blocks)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y), prog_bar=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


def synthetic(samples: int, features: int = 256, classes: int = 10, seed: int = 0) -> TensorDataset:
    """Gaussian inputs whose class is a fixed random linear function of them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=g)
    w = torch.randn(features, classes, generator=g)
    return TensorDataset(x, (x @ w).argmax(dim=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--mode", choices=("pause", "fork"), default="pause")
    parser.add_argument("--root", default="lightning_logs_mlp", help="Trainer(default_root_dir=...)")
    args = parser.parse_args()

    pl.seed_everything(0)
    train = DataLoader(synthetic(8192), batch_size=args.batch_size, shuffle=True)
    val = DataLoader(synthetic(1024, seed=1), batch_size=args.batch_size)
    logger = TensorBoardLogger(args.root, name="mlp")
    bench = ComponentBenchmark(capture_step=10, mode=args.mode)
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        logger=logger,
        default_root_dir=args.root,
        callbacks=[bench],  # <- the only change to the training script
    )
    trainer.fit(MLPClassifier(), train, val)

    if bench.report is None:
        print("no component report (see the warnings above)")
        return
    print()
    print(bench.report.summary(top=8))
    print(f"\nreport files: {bench.output_dir} (report.json, components.csv, report.html, icicle_*.png)")
    print(f"report.html:  {Path(bench.output_dir) / 'report.html'}  (open it in a browser; works offline)")
    print(f"TensorBoard:  tensorboard --logdir {logger.log_dir}")


if __name__ == "__main__":
    main()
