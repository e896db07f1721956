"""Profile every component of a small model from a plain PyTorch script.

Run: ``python examples/quickstart.py`` (after ``make install``; ``make demo`` runs
``examples/dlrm.py``, not this script). It prints the summary and the path of the
``report.html`` it wrote.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn

from cb_callback import profile_components


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


class TinyRecModel(nn.Module):
    """An embedding lookup (memory-bound) feeding an MLP (compute-bound GEMMs)."""

    def __init__(self, vocab: int = 50_000, dim: int = 256, depth: int = 2) -> None:
        super().__init__()
        self.embedding = nn.EmbeddingBag(vocab, dim, mode="sum")
        self.blocks = nn.Sequential(*[Block(dim) for _ in range(depth)])
        self.head = nn.Linear(dim, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embedding(ids)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="cb_out/quickstart", help="where the report files go")
    parser.add_argument("--batch-size", type=int, default=512)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model = TinyRecModel()
    ids = torch.randint(0, 50_000, (args.batch_size, 20))
    # With an output_dir, profile_components writes report.json, components.csv, report.html and icicle PNGs.
    report = profile_components(model, (ids,), output_dir=args.out)
    print(report.summary())
    out = Path(args.out).resolve()
    print(f"\nreport files: {out} (report.json, components.csv, report.html, icicle_*.png)")
    print(f"report.html:  {out / 'report.html'}  (open it in a browser; works offline)")


if __name__ == "__main__":
    main()
