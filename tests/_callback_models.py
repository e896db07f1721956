"""LightningModules for the callback tests, in an importable module (fork mode unpickles them).

Every model has Dropout and BatchNorm, so that a profile that leaked RNG or
running statistics into training would change the losses.
"""

from __future__ import annotations

import os
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests._figures import blank_in_a_child

FEATURES = 8
CLASSES = 3
SAMPLES = 64
BATCH = 8

# Set while a training_step runs: lets GatedOnStep fail only outside of it (in a replay).
IN_STEP = [False]


def _dataset(n: int = SAMPLES, seed: int = 1) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    return TensorDataset(x, y)


class MLPModule(pl.LightningModule):
    """Linear -> BatchNorm -> ReLU -> Dropout -> Linear; ``training_step`` calls ``self(x)``.

    Args:
        fail_at: raise in ``training_step`` when ``global_step`` equals it.
        none_at: return ``None`` from ``training_step`` at this ``global_step``.
        validate: also have a validation loop (with BatchNorm in eval mode).
    """

    def __init__(self, fail_at: int | None = None, none_at: int | None = None, validate: bool = True) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(FEATURES, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.3))
        self.head = nn.Linear(16, CLASSES)
        self.fail_at = fail_at
        self.none_at = none_at
        self.validate = validate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self.fail_at is not None and self.global_step == self.fail_at:
            self(batch[0])  # the capture sees the forward, then the step raises
            raise RuntimeError(f"training_step failed at step {self.global_step}")
        x, y = batch
        IN_STEP[0] = True
        try:
            loss = nn.functional.cross_entropy(self(x), y)
        finally:
            IN_STEP[0] = False
        if self.none_at is not None and self.global_step == self.none_at:
            return None
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self(x), y))

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_dataset(), batch_size=BATCH, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(_dataset(16, seed=2), batch_size=BATCH)


class ChildrenOnlyModule(MLPModule):
    """``training_step`` calls the submodules directly: the root is never called."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        return nn.functional.cross_entropy(self.head(self.encoder(x)), y)


class ScriptedModule(MLPModule):
    """The MLP with ``encoder.0`` (``Linear(8 -> 16)``) and ``encoder.1`` (``BatchNorm1d(16)``: running stats
    the replays update) TorchScript modules (``torch.jit.script``): modules no module hook can see."""

    def __init__(self, validate: bool = False) -> None:
        super().__init__(validate=validate)
        self.encoder[0] = torch.jit.script(self.encoder[0])
        self.encoder[1] = torch.jit.script(self.encoder[1])


class GatedOnStep(nn.Module):
    """Doubles its input inside a training step; raises anywhere else (in a replay)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not IN_STEP[0]:
            raise RuntimeError("GatedOnStep only runs inside training_step")
        return x * 2


class GatedModule(MLPModule):
    """An MLP whose ``gate`` component cannot be replayed (no validation: it would raise there)."""

    def __init__(self) -> None:
        super().__init__(validate=False)
        self.gate = GatedOnStep()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.gate(self.encoder(x)))


class CrashInChild(nn.Module):
    """Identity in the process that built it; kills any other process that runs it."""

    def __init__(self) -> None:
        super().__init__()
        self.owner_pid = os.getpid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if os.getpid() != self.owner_pid:
            os._exit(7)
        return x


class CrashingChildModule(MLPModule):
    """An MLP that a fork-mode child cannot profile: the child process dies."""

    def __init__(self) -> None:
        super().__init__()
        self.crash = CrashInChild()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.crash(self.encoder(x)))


class TransformerModule(pl.LightningModule):
    """A small transformer-like model: encoder layer (attention + MLP, dropout), BatchNorm, head."""

    def __init__(self, seq: int = 6, d_model: int = 16) -> None:
        super().__init__()
        self.seq, self.d_model = seq, d_model
        self.embed = nn.Linear(FEATURES, d_model)
        self.block = nn.TransformerEncoderLayer(d_model, nhead=2, dim_feedforward=32, dropout=0.2, batch_first=True)
        self.norm = nn.BatchNorm1d(d_model)
        self.head = nn.Linear(d_model, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)  # (B, T, D)
        h = self.block(h)
        h = self.norm(h.transpose(1, 2)).transpose(1, 2)
        return self.head(h.mean(dim=1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(3)
        x = torch.randn(SAMPLES, self.seq, FEATURES, generator=g)
        y = torch.randint(0, CLASSES, (SAMPLES,), generator=g)
        return DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True)


#: Sequence length of training batch ``i`` of :class:`VarLenModule`: ``VAR_LENGTHS[i % 3]``.
VAR_LENGTHS = (4, 8, 16)


def _var_len_collate(items: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> Any:
    """Stack a batch and cut its sequences to the length its batch number gives (dynamic shapes)."""
    index = int(items[0][0]) // BATCH
    length = VAR_LENGTHS[index % len(VAR_LENGTHS)]
    x = torch.stack([it[1][:length] for it in items])
    return x, torch.stack([it[2] for it in items])


class VarLenModule(TransformerModule):
    """:class:`TransformerModule` on batches whose sequence length varies (4, 8, 16, 4, …)."""

    def __init__(self) -> None:
        super().__init__(seq=max(VAR_LENGTHS))

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(3)
        x = torch.randn(SAMPLES, self.seq, FEATURES, generator=g)
        y = torch.randint(0, CLASSES, (SAMPLES,), generator=g)
        data = TensorDataset(torch.arange(SAMPLES), x, y)
        return DataLoader(data, batch_size=BATCH, shuffle=False, collate_fn=_var_len_collate)


class LossRecorder(Callback):
    """Records every training batch's loss (``outputs["loss"]``), exactly."""

    def __init__(self) -> None:
        self.losses: list[torch.Tensor] = []
        self.steps: list[int] = []

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            self.losses.append(loss.detach().clone())
        self.steps.append(trainer.global_step)


def run_fit(
    root: Any,
    callbacks: list[Callback] | tuple[Callback, ...] = (),
    model_cls: type[pl.LightningModule] = MLPModule,
    *,
    model_kwargs: dict[str, Any] | None = None,
    logger: Any = "tb",
    **trainer_kwargs: Any,
) -> tuple[pl.Trainer, pl.LightningModule, LossRecorder]:
    """Seed, build ``model_cls`` and fit it on CPU; the first callback records the losses.

    ``logger="tb"`` is a ``TensorBoardLogger(root, name="tb")``; any other value is
    passed to the Trainer as is.
    """
    from lightning.pytorch.loggers import TensorBoardLogger

    pl.seed_everything(0, verbose=False)
    model = model_cls(**(model_kwargs or {}))
    recorder = LossRecorder()
    options: dict[str, Any] = dict(
        default_root_dir=str(root),
        max_steps=6,
        accelerator="cpu",
        devices=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        log_every_n_steps=1,
        num_sanity_val_steps=1,
        val_check_interval=3,
    )
    if not getattr(model, "validate", False) or not hasattr(model, "val_dataloader"):
        options.pop("val_check_interval")
        options["limit_val_batches"] = 0
    options.update(trainer_kwargs)
    trainer = pl.Trainer(
        logger=TensorBoardLogger(str(root), name="tb") if logger == "tb" else logger,
        callbacks=[recorder, *callbacks],
        **options,
    )
    trainer.fit(model)
    return trainer, model, recorder


#: A callback whose fork child ``WaitsForForkModule`` waits for (tests set it; a ``spawn`` child sees it empty, a
#: forked one (tests/_children.py) holds it too, but a module loaded from a snapshot has no trainer, so never waits).
WAIT_FOR_FORK: list[Any] = []


class WaitsForForkModule(MLPModule):
    """At ``global_step == wait_at`` its step first waits (60 s at most) for the fork child of the callback in
    ``WAIT_FOR_FORK`` to end, so that a capture scheduled there is not held back by a child still profiling."""

    wait_at = 2

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if WAIT_FOR_FORK and self.global_step == self.wait_at:
            fork = WAIT_FOR_FORK[0]._fork
            if fork is not None:
                fork.child._proc.join(60)
        return super().training_step(batch, batch_idx)


blank_in_a_child()  # a fork-mode child of a test that reads no image (tests._figures.blank_figures)
