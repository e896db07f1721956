"""A small GPT, trained on text bundled with the repo, profiled per component.

The model is the NanoGPT shape: token + position embeddings, ``n_layer`` blocks
of LayerNorm → causal self-attention (``F.scaled_dot_product_attention`` with
``is_causal=True``) → LayerNorm → MLP, a final LayerNorm and the LM head. It is
trained character-level on ``examples/data/lighthouse.txt`` with Lightning, and
``ComponentBenchmark`` profiles step ``--capture-step``: every block, attention,
MLP, norm and the LM head gets its own row (time, FLOPs, MFU, bytes, memory).

Run::

    python examples/gpt.py                      # CPU, ~30 s
    python examples/gpt.py --artifacts trace,ops   # + a trace and an op table per component
    python examples/gpt.py --device cuda --steps 200 --n-layer 6 --n-embd 384

The model and data are importable (``build_gpt``, ``CharCorpus``), so the same
model can be profiled from a plain loop with ``cb_callback.profile_components``.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import TensorBoardLogger
from torch import nn
from torch.utils.data import DataLoader, Dataset

from cb_callback import ComponentBenchmark

DATA = Path(__file__).resolve().parent / "data" / "lighthouse.txt"


@dataclass
class GPTConfig:
    """Shape of the model (defaults: a ~0.1 M-parameter model that trains on a CPU)."""

    vocab_size: int = 96
    block_size: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: one QKV projection, SDPA, an output projection."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        if cfg.n_embd % cfg.n_head:
            raise ValueError(f"n_embd={cfg.n_embd} must be a multiple of n_head={cfg.n_head}")
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        # (B, T, C) -> (B, H, T, hd)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    """Position-wise feed-forward: ``C -> 4C -> GELU -> C``."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Token + position embeddings, ``n_layer`` blocks, final norm, LM head (untied)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, T, vocab)`` of token ids ``(B, T)``."""
        t = idx.shape[1]
        if t > self.cfg.block_size:
            raise ValueError(f"sequence length {t} exceeds block_size={self.cfg.block_size}")
        pos = torch.arange(t, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class CharCorpus(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Character-level windows of a text: ``(ids[i:i+T], ids[i+1:i+T+1])``.

    Args:
        block_size: window length ``T``.
        path: the text file (default: the bundled story).
    """

    def __init__(self, block_size: int, path: Path = DATA) -> None:
        text = path.read_text(encoding="utf-8")
        self.chars = sorted(set(text))
        self.stoi = {ch: i for i, ch in enumerate(self.chars)}
        self.ids = torch.tensor([self.stoi[ch] for ch in text], dtype=torch.long)
        self.block_size = block_size

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def __len__(self) -> int:
        return self.ids.numel() - self.block_size - 1

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        window = self.ids[i : i + self.block_size + 1]
        return window[:-1], window[1:]

    def batch(self, batch_size: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """A deterministic batch of random windows (for ``profile_components``)."""
        gen = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, len(self), (batch_size,), generator=gen).tolist()
        xs, ys = zip(*(self[i] for i in starts), strict=True)
        return torch.stack(xs), torch.stack(ys)


def build_gpt(cfg: GPTConfig | None = None, seed: int = 0) -> GPT:
    """The example model, initialised deterministically."""
    torch.manual_seed(seed)
    return GPT(cfg or GPTConfig())


class GPTModule(pl.LightningModule):
    """Next-character cross-entropy on :class:`GPT`, AdamW."""

    def __init__(self, cfg: GPTConfig, lr: float = 3e-3) -> None:
        super().__init__()
        self.model = build_gpt(cfg)
        self.lr = lr

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self.model(x)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def main(argv: list[str] | None = None) -> None:
    """Train, profile step ``--capture-step``, print the hotspots and where the files are."""
    parser = argparse.ArgumentParser(description="Train a small GPT and profile one step per component.")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--capture-step", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=64)
    parser.add_argument("--out", default="cb_out/gpt", help="log and report directory")
    parser.add_argument(
        "--artifacts", default="", help="per-component artifacts, e.g. trace,ops,memory (see BenchmarkConfig.artifacts)"
    )
    parser.add_argument("--artifacts-top", type=int, default=None, help="artifacts for the K most expensive only")
    args = parser.parse_args(argv)

    device = "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    corpus = CharCorpus(args.block_size)
    cfg = GPTConfig(corpus.vocab_size, args.block_size, args.n_layer, args.n_head, args.n_embd)
    loader = DataLoader(
        corpus, batch_size=args.batch_size, shuffle=True, generator=torch.Generator().manual_seed(0), drop_last=True
    )
    out = Path(args.out).resolve()
    bench = ComponentBenchmark(
        capture_step=args.capture_step, mode="pause", output_dir=str(out / "report"),
        artifacts=[k for k in args.artifacts.split(",") if k], artifacts_top=args.artifacts_top,
    )  # fmt: skip
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
    module = GPTModule(cfg)
    trainer.fit(module, train_dataloaders=loader)
    if bench.report is None:
        raise SystemExit("no report: training stopped before the capture step")
    print(bench.report.summary())
    print(f"\nreport files: {bench.output_dir} (report.json, components.csv, report.html, icicle_*.png)")
    print(f"report.html:  {Path(bench.output_dir) / 'report.html'}  (open it in a browser; works offline)")
    print(f"TensorBoard:  tensorboard --logdir {out}")
    print(f"({math.ceil(sum(p.numel() for p in module.parameters()) / 1e3)} k parameters, {device})")


if __name__ == "__main__":
    main()
