"""What the in-situ clock's hooks add to a container's time, and how much of it the measured hook cost removes.

Run: ``python benchmarks/hook_cost.py [--blocks 30] [--width 64] [--passes 30] [--repeats 3]`` (a few seconds on
2 CPU cores, one compute thread). Prints what it measured; the figures live in docs/benchmarks.md.

The model is a ``Sequential`` of ``--blocks`` blocks of ``Linear(width, width)`` and ``ReLU`` on a batch of 32:
many tiny modules, where hooking each call costs most against the work. Each pass is a forward, timed by the
in-situ pass's own hooks (:func:`cb_callback._engine.clocks.insitu.hook_clock`, with a ``NodeClock`` claiming
each call's autograd nodes, as on CPU), then a backward. Per repeat, the median over the passes (the first 5
untimed) of the root's forward:

- ``plain``: no hook at all, ``time.perf_counter`` around the forward;
- ``root alone``: the root hooked, nothing inside it (what its forward costs, read by the clock);
- ``every module, raw``: every module hooked, as the in-situ pass hooks them, no cost subtracted (as before
  ``HookCost``);
- ``every module, net``: the same, less the cost ``measure_hook_cost`` measured just before.

And the backward, which the cost does not correct: the plain backward against the whole backward with every
module's nodes claimed and timed by the ``NodeClock``, less the node hooks' own work (``hooks_s``), as the
in-situ pass reads a top's backward.
"""

from __future__ import annotations

import statistics
import time

import torch
from _mlp import arguments, plain_forward_ms, tiny_mlp
from torch import nn

from cb_callback._engine.clocks.clock import HookClock, HookCost
from cb_callback._engine.clocks.insitu import hook_clock, measure_hook_cost
from cb_callback._engine.clocks.nodeclock import NodeClock

_UNTIMED = 5


def _hooked_ms(model: nn.Module, x: torch.Tensor, only: set[str] | None, cost: HookCost, passes: int) -> float:
    """The root's median forward (ms) as the clock reads it, ``only`` hooked (``None``: every module)."""
    clock = HookClock(torch.device("cpu"), cost=cost)
    took = []
    for i in range(passes + _UNTIMED):
        nodes = NodeClock()
        with hook_clock(model, clock, only, nodes):
            y = model(x)
        y.sum().backward()
        nodes.close()
        if i >= _UNTIMED:
            took.append(clock.durations()[""][0] * 1e3)
        clock.clear()
    return statistics.median(took)


def _backward_ms(model: nn.Module, x: torch.Tensor, timed: bool, passes: int) -> float:
    """The median whole backward (ms), every module's nodes claimed and timed (``timed``) or none."""
    took = []
    for i in range(passes + _UNTIMED):
        nodes = NodeClock() if timed else None
        with hook_clock(model, HookClock(torch.device("cpu")), None, nodes):
            y = model(x).sum()
        t0 = time.perf_counter()
        y.backward()
        seconds = time.perf_counter() - t0 - (nodes.hooks_s if nodes is not None else 0.0)
        if nodes is not None:
            nodes.close()
        if i >= _UNTIMED:
            took.append(seconds * 1e3)
    return statistics.median(took)


def main() -> None:
    args = arguments(__doc__, passes=30)
    model, x = tiny_mlp(args.blocks, args.width)
    modules = sum(1 for _ in model.modules())
    print(f"Sequential of {args.blocks} x (Linear({args.width}, {args.width}), ReLU): {modules} modules, batch 32")
    for r in range(args.repeats):
        cost = measure_hook_cost(torch.device("cpu"), nodes=True)
        plain = plain_forward_ms(model, x, args.passes, _UNTIMED)
        alone = _hooked_ms(model, x, {""}, HookCost(), args.passes)
        raw = _hooked_ms(model, x, None, HookCost(), args.passes)
        net = _hooked_ms(model, x, None, cost, args.passes)
        print(
            f"repeat {r + 1}: cost own {cost.own_s * 1e6:.2f} us, nested {cost.nested_s * 1e6:.2f} us | plain "
            f"{plain:.3f} ms, root alone {alone:.3f} ms, every module raw {raw:.3f} ms ({raw / alone:.2f}x), "
            f"net {net:.3f} ms ({net / alone:.2f}x)"
        )
        bwd_plain, bwd_timed = _backward_ms(model, x, False, args.passes), _backward_ms(model, x, True, args.passes)
        print(f"  backward: nodes untimed {bwd_plain:.3f} ms, timed {bwd_timed:.3f} ms ({bwd_timed / bwd_plain:.2f}x)")


if __name__ == "__main__":
    main()
