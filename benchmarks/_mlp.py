"""The many-small-modules model two benchmarks time (hook_cost.py, replay_modes.py), and its plain forward."""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn


def arguments(doc: str, passes: int | None = None) -> argparse.Namespace:
    """``--blocks``, ``--width``, ``--repeats`` (and ``--passes`` when given a default), parsed."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--width", type=int, default=64)
    if passes is not None:
        parser.add_argument("--passes", type=int, default=passes)
    parser.add_argument("--repeats", type=int, default=3)
    return parser.parse_args()


def tiny_mlp(blocks: int, width: int) -> tuple[nn.Module, torch.Tensor]:
    """A ``Sequential`` of ``blocks`` × (``Linear(width, width)``, ``ReLU``) and a batch of 32 for it, on one
    thread (seeded)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(blocks)])
    return model, torch.randn(32, width)


def plain_forward_ms(module: nn.Module, x: torch.Tensor, passes: int, untimed: int) -> float:
    """The median forward (ms), ``time.perf_counter`` around the call, each after a backward (``untimed`` first)."""
    took = []
    for i in range(passes + untimed):
        t0 = time.perf_counter()
        y = module(x)
        t1 = time.perf_counter()
        y.sum().backward()
        if i >= untimed:
            took.append((t1 - t0) * 1e3)
    return statistics.median(took)
