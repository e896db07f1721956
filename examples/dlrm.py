"""DLRM on synthetic Criteo-like data, profiled per component (the ``make demo`` target).

A ``LightningModule`` around ``torchrec.models.dlrm.DLRM``: 13 dense features,
26 sparse features looked up in an ``EmbeddingBagCollection`` (one table per
feature), the dot-product interaction arch and the over arch, trained with
binary cross-entropy. The data is synthetic but shaped like Criteo: log-scaled
dense counts, multi-hot bags, ids drawn from a Zipf distribution (a few hot
ids, a long tail). ``ComponentBenchmark`` profiles one early step; the report
shows the sparse arch memory-bound (bytes, GB/s) and the dense/over arch GEMMs
with their FLOPs and MFU.

Run::

    python examples/dlrm.py                       # CPU, about a minute
    python examples/dlrm.py --device cuda --batch-size 4096 --table-rows 1000000

The model and the data are importable (``DLRMConfig``, ``build_dlrm``,
``synthetic_batch``) so tests and notebooks can profile the same model with
``cb_callback.profile_components``.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.data import DataLoader, Dataset
from torchrec.models.dlrm import DLRM
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

import cb_callback.integrations.torchrec  # noqa: F401  (registers KJT batch rules, TBE traffic rules)
from cb_callback import ComponentBenchmark

NUM_DENSE = 13
NUM_SPARSE = 26
#: A Criteo-like spread of table sizes (rows), cycled over the 26 features.
DEFAULT_ROWS = (100_000, 10_000, 1_000, 50_000, 100, 20_000)


@dataclass
class DLRMConfig:
    """Shape of the model and of the synthetic data.

    Args:
        table_rows: rows of each of the 26 tables (one per sparse feature); a
            shorter sequence is cycled.
        embedding_dim: ``D``, also the dense arch's output size.
        dense_arch: layer sizes of the dense arch (the last must be ``D``).
        over_arch: layer sizes of the over arch (the last is 1, the logit).
        max_bag: the most ids per (sample, feature); bags have 1..max_bag ids.
        zipf_alpha: exponent of the id distribution (1.0: P(id = k) ~ 1 / (k + 1)).
        pooling: ``"sum"`` or ``"mean"``.
    """

    table_rows: Sequence[int] = DEFAULT_ROWS
    embedding_dim: int = 16
    dense_arch: Sequence[int] = (64, 16)
    over_arch: Sequence[int] = (64, 32, 1)
    max_bag: int = 4
    zipf_alpha: float = 1.05
    pooling: str = "sum"
    feature_names: list[str] = field(default_factory=lambda: [f"cat_{i}" for i in range(NUM_SPARSE)])

    def rows(self) -> list[int]:
        """Rows of each feature's table (``table_rows`` cycled to 26)."""
        return [int(self.table_rows[i % len(self.table_rows)]) for i in range(NUM_SPARSE)]


def build_dlrm(cfg: DLRMConfig | None = None, *, device: str | torch.device = "cpu", seed: int = 0) -> DLRM:
    """torchrec's DLRM with one table per sparse feature.

    ``device`` may be ``"meta"`` for the tables only: pass ``device="meta"`` to
    declare tables without memory (then profile with ``ReduceHashSize``); the
    dense and over arch are always on ``"cpu"`` in that case.
    """
    cfg = cfg or DLRMConfig()
    torch.manual_seed(seed)
    pooling = PoolingType.SUM if cfg.pooling == "sum" else PoolingType.MEAN
    tables = [
        EmbeddingBagConfig(
            name=f"t_{name}",
            embedding_dim=cfg.embedding_dim,
            num_embeddings=rows,
            feature_names=[name],
            pooling=pooling,
        )
        for name, rows in zip(cfg.feature_names, cfg.rows(), strict=True)
    ]
    dev = torch.device(device)
    ebc = EmbeddingBagCollection(tables=tables, device=dev)
    dense_device = torch.device("cpu") if dev.type == "meta" else dev
    return DLRM(
        embedding_bag_collection=ebc,
        dense_in_features=NUM_DENSE,
        dense_arch_layer_sizes=list(cfg.dense_arch),
        over_arch_layer_sizes=list(cfg.over_arch),
        dense_device=dense_device,
    )


def _zipf_ids(n: int, rows: int, alpha: float, gen: torch.Generator) -> torch.Tensor:
    """``n`` ids in ``[0, rows)`` with P(id = k) ~ (k + 1) ** -alpha (continuous inverse CDF)."""
    u = torch.rand(n, generator=gen, dtype=torch.float64)
    if abs(alpha - 1.0) < 1e-9:
        x = torch.exp(u * math.log(rows + 1.0))
    else:
        a = 1.0 - alpha
        x = (u * ((rows + 1.0) ** a - 1.0) + 1.0) ** (1.0 / a)
    ids = (x.floor().long() - 1).clamp_(0, rows - 1)
    # Spread the hot ids over the table (a fixed odd multiplier), as hashing would.
    return (ids * 2_654_435_761) % rows


def synthetic_batch(
    batch_size: int, cfg: DLRMConfig | None = None, *, seed: int = 0
) -> tuple[torch.Tensor, KeyedJaggedTensor, torch.Tensor]:
    """One Criteo-like batch: ``(dense [B, 13], sparse KJT of 26 keys, labels [B])``.

    Deterministic for a given ``seed``. Labels follow a logistic model of the
    dense features and of one sparse id's parity, so the loss can go down.
    """
    cfg = cfg or DLRMConfig()
    gen = torch.Generator().manual_seed(seed)
    counts = torch.poisson(torch.full((batch_size, NUM_DENSE), 20.0), generator=gen)
    dense = torch.log1p(counts) / 4.0
    lengths = torch.randint(1, cfg.max_bag + 1, (NUM_SPARSE, batch_size), generator=gen)
    values = torch.cat(
        [_zipf_ids(int(lengths[f].sum()), rows, cfg.zipf_alpha, gen) for f, rows in enumerate(cfg.rows())]
    )
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=list(cfg.feature_names), values=values, lengths=lengths.reshape(-1))
    first_ids = values[torch.cumsum(lengths[0], 0) - lengths[0]]
    logit = dense[:, :4].sum(1) - 3.0 + (first_ids % 2 == 0).float()
    labels = torch.bernoulli(torch.sigmoid(logit), generator=gen)
    return dense, kjt, labels


class SyntheticCriteo(Dataset[tuple[torch.Tensor, KeyedJaggedTensor, torch.Tensor]]):
    """``steps`` pre-batched synthetic batches (use ``DataLoader(..., batch_size=None)``)."""

    def __init__(self, steps: int, batch_size: int, cfg: DLRMConfig, seed: int = 0) -> None:
        self.steps, self.batch_size, self.cfg, self.seed = steps, batch_size, cfg, seed

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, i: int) -> tuple[torch.Tensor, KeyedJaggedTensor, torch.Tensor]:
        return synthetic_batch(self.batch_size, self.cfg, seed=self.seed + i)


def _as_is(batch: Any) -> Any:
    return batch


class DLRMModule(pl.LightningModule):
    """BCE-with-logits training of :func:`build_dlrm` (Adagrad, as in DLRM's reference)."""

    def __init__(self, cfg: DLRMConfig, lr: float = 0.05) -> None:
        super().__init__()
        self.model = build_dlrm(cfg)
        self.lr = lr

    def training_step(
        self, batch: tuple[torch.Tensor, KeyedJaggedTensor, torch.Tensor], batch_idx: int
    ) -> torch.Tensor:
        dense, sparse, labels = batch
        logits = self.model(dense, sparse).squeeze(-1)
        loss = F.binary_cross_entropy_with_logits(logits, labels)
        self.log("train_loss", loss, prog_bar=True, batch_size=labels.numel())
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adagrad(self.parameters(), lr=self.lr)


def _rows_arg(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


def main(argv: list[str] | None = None) -> None:
    """Train, profile step ``--capture-step``, print the hotspots and where the files are."""
    parser = argparse.ArgumentParser(description="Train torchrec's DLRM on synthetic data and profile one step.")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--capture-step", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument(
        "--table-rows", type=_rows_arg, default=DEFAULT_ROWS, help="rows per table, comma-separated, cycled over 26"
    )
    parser.add_argument("--embedding-dim", type=int, default=16)
    parser.add_argument("--out", default="cb_out/dlrm", help="log and report directory")
    args = parser.parse_args(argv)

    device = "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    cfg = DLRMConfig(table_rows=args.table_rows, embedding_dim=args.embedding_dim, dense_arch=(64, args.embedding_dim))
    loader = DataLoader(SyntheticCriteo(args.steps, args.batch_size, cfg), batch_size=None, collate_fn=_as_is)
    out = Path(args.out).resolve()
    bench = ComponentBenchmark(
        capture_step=args.capture_step, mode="pause", output_dir=str(out / "report"), min_run_time_s=0.05
    )
    trainer = pl.Trainer(
        max_steps=args.steps,
        accelerator="gpu" if device == "cuda" else "cpu",
        devices=1,
        logger=TensorBoardLogger(str(out), name="logs"),
        callbacks=[bench],
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        log_every_n_steps=5,
    )
    pl.seed_everything(0, workers=True)
    trainer.fit(DLRMModule(cfg), train_dataloaders=loader)
    if bench.report is None:
        raise SystemExit("no report: training stopped before the capture step")
    print(bench.report.summary(top=12))
    print(f"\nreport files: {bench.output_dir} (report.json, components.csv, report.html, icicle_*.png)")
    print(f"report.html:  {Path(bench.output_dir) / 'report.html'}  (open it in a browser; works offline)")
    print(f"TensorBoard:  tensorboard --logdir {out}")


if __name__ == "__main__":
    main()
