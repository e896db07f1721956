"""A hand-built report with known FLOPs, bytes and times, shared by the roofline tests (png, TB, CLI, browser).

Peaks: 1e12 FLOP/s; bandwidth ceilings L1 4e11 B/s (ridge 2.5 FLOP/byte) and DRAM 1e11 B/s (ridge 10).
The drawable passes, x = flops / bytes and y = flops / (ms / 1e3) / 1e12:

- the root forward: 4e9 FLOP, 4e7 B, 8 ms -> x 100, y 0.5; backward: 8e9, 1.6e8, 16 ms -> x 50, y 0.5;
- ``mlp`` forward: 1e8 FLOP, 1e8 B, 2 ms -> x 1, y 0.05 (no backward: 0 ms, 0 FLOPs, nothing left out);
- ``tiny`` backward: 2e6 FLOP, 1e6 B, 1 ms -> x 2, y 0.002 (its forward is at the floor: left out).

The bandwidth panel (no FLOPs counted): ``act`` forward, 1e6 B in 0.5 ms -> 1e6 / 5e-4 / 1e9 = 2 GB/s
against DRAM's 100 GB/s (no ``bw_ceiling`` of its own: the device's, the slowest roof).

Left out: ``nob`` (forward without bytes), ``tiny``'s forward (flagged at the floor), ``blocks``
(estimated), ``bad`` (failed), ``skip`` (skipped). No backward ran in ``mlp``, ``act``, ``nob``: 3
passes. Accounting: 8 rows × 2 = 16 = 4 points + 1 in the bandwidth panel + 2 × 3 components + 2
passes + 3 that never ran.
"""

from __future__ import annotations

from typing import Any

from cb_callback import ComponentRow, Report

PEAKS: dict[str, Any] = {
    "flops": 1e12,
    "bandwidth": 1e11,
    "levels": [
        {"name": "L1", "size_bytes": 32768, "bandwidth": 4e11},
        {"name": "DRAM", "size_bytes": None, "bandwidth": 1e11},
    ],
}

#: (path, pass) -> (x, y) as the module docstring derives them.
EXPECTED = {
    ("", "fwd"): (100.0, 0.5),
    ("", "bwd"): (50.0, 0.5),
    ("mlp", "fwd"): (1.0, 0.05),
    ("tiny", "bwd"): (2.0, 0.002),
}
LEFT_OUT = {"estimated": 1, "failed": 1, "skipped": 1, "at_floor": 1, "no_bytes": 1}


def _row(path: str, module_type: str, status: str = "ok", fwd_bytes: float | None = None, **kw: Any) -> ComponentRow:
    row = ComponentRow(path, module_type, 0 if path == "" else 1, None if path == "" else "", status, calls=1, **kw)  # type: ignore[arg-type]
    if fwd_bytes is not None:
        row.details["fwd_bytes"] = fwd_bytes
    return row


def roofline_report() -> Report:
    """The report of the module docstring (its headroom and bound as if derived: no engine involved)."""
    root = _row(
        "", "Net", fwd_bytes=4e7, fwd_ms=8.0, bwd_ms=16.0, total_ms=24.0, fwd_flops=4e9, bwd_flops=8e9, share=1.0
    )
    root.details["bwd_bytes"] = 1.6e8
    root.headroom_ms = 12.0  # (8 - 4) + (16 - 8): compute-bound passes at 1e12 FLOP/s
    mlp = _row("mlp", "Linear", fwd_bytes=1e8, fwd_ms=2.0, bwd_ms=0.0, total_ms=2.0, fwd_flops=1e8, bwd_flops=0.0)
    mlp.details["bwd_bytes"] = 0.0
    mlp.share = 2.0 / 24.0
    mlp.headroom_ms = 1.0  # 2 - max(0.1, 1e8 / 1e11 = 1) ms
    act = _row("act", "ReLU", fwd_bytes=1e6, fwd_ms=0.5, bwd_ms=0.0, total_ms=0.5, fwd_flops=0.0, bwd_flops=0.0)
    act.headroom_ms = 0.5 - 1e6 / 1e11 * 1e3  # 0.5 - max(0 / 1e12, 1e6 / 1e11 = 0.01) ms = 0.49 ms
    nob = _row("nob", "Linear", fwd_ms=1.0, bwd_ms=0.0, total_ms=1.0, fwd_flops=1e6, bwd_flops=0.0)
    tiny = _row("tiny", "Conv1d", fwd_bytes=10.0, fwd_ms=0.0, bwd_ms=1.0, total_ms=1.0, fwd_flops=1e3, bwd_flops=2e6)
    tiny.details["bwd_bytes"] = 1e6
    tiny.details["floor_ms"] = {"at_floor": ["fwd"]}
    tiny.share = 1.0 / 24.0
    tiny.headroom_ms = 1.0 - max(2e6 / 1e12, 1e6 / 1e11) * 1e3  # the backward alone, against DRAM: 0.99 ms
    blocks = _row("blocks", "ModuleList", "estimated", fwd_ms=1.0, bwd_ms=1.0, total_ms=2.0)
    bad = _row("bad", "Linear", "failed", error="RuntimeError: boom")
    skip = _row("skip", "Linear", "skipped")
    rows = [root, mlp, act, nob, tiny, blocks, bad, skip]
    return Report(rows, {"device": "cpu", "device_name": "test CPU", "dtype": "fp32", "peaks": PEAKS})
