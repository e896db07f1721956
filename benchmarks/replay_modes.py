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

from _mlp import arguments, plain_forward_ms, tiny_mlp

from cb_callback import profile_components


def main() -> None:
    args = arguments(__doc__)
    model, x = tiny_mlp(args.blocks, args.width)
    print(f"Sequential of {args.blocks} x (Linear({args.width}, {args.width}), ReLU), batch 32, 1 thread")
    for r in range(args.repeats):
        report = profile_components(model, (x,), descend="all")
        root, block = report.row(""), report.row("1")
        plain_root, plain_block = plain_forward_ms(model, x, 200, 10), plain_forward_ms(model[1], x, 200, 10)
        print(
            f"repeat {r + 1}: root isolated {root.fwd_ms:.4f} ms vs plain {plain_root:.4f} ms "
            f"({root.fwd_ms / plain_root:.2f}x); block isolated {block.fwd_ms:.4f} ms vs plain {plain_block:.4f} ms "
            f"({block.fwd_ms / plain_block:.2f}x); quality {report.metadata['quality']['verdict']}"
        )


if __name__ == "__main__":
    main()
