"""A container's isolated forward against the same forward timed plainly: what the replay harness adds.

Run: ``python benchmarks/replay_modes.py [--blocks 30] [--width 64] [--repeats 3]`` (about 10 s a repeat on 2 CPU
cores, one compute thread). Prints what it measured; the figures live in docs/benchmarks.md.

The model is a ``Sequential`` of ``--blocks`` blocks of ``Linear(width, width)`` and ``ReLU`` on a batch of 32.
Per repeat: ``profile_components(..., descend="all")``'s ``fwd_ms`` of the root and of block 1 (net of the
harness floor), beside the median of 200 plain forwards of each (``time.perf_counter`` around the call, each
after a backward, as the replays alternate them). Run it with ``PYTHONPATH`` at another checkout to compare
the code.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from cb_callback import profile_components


def _plain_ms(module: nn.Module, x: torch.Tensor, runs: int = 200) -> float:
    took = []
    for i in range(runs + 10):
        t0 = time.perf_counter()
        y = module(x)
        t1 = time.perf_counter()
        y.sum().backward()
        if i >= 10:
            took.append((t1 - t0) * 1e3)
    return statistics.median(took)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU()) for _ in range(args.blocks)])
    x = torch.randn(32, args.width)
    print(f"Sequential of {args.blocks} x (Linear({args.width}, {args.width}), ReLU), batch 32, 1 thread")
    for r in range(args.repeats):
        report = profile_components(model, (x,), descend="all")
        root, block = report.row(""), report.row("1")
        plain_root, plain_block = _plain_ms(model, x), _plain_ms(model[1], x)
        print(
            f"repeat {r + 1}: root isolated {root.fwd_ms:.4f} ms vs plain {plain_root:.4f} ms "
            f"({root.fwd_ms / plain_root:.2f}x); block isolated {block.fwd_ms:.4f} ms vs plain {plain_block:.4f} ms "
            f"({block.fwd_ms / plain_block:.2f}x); quality {report.metadata['quality']['verdict']}"
        )


if __name__ == "__main__":
    main()
