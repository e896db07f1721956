"""Derived metrics of a row, and estimates of unmeasurable parents from their children."""

from __future__ import annotations

import math

from cb_callback._report.model import ComponentRow

__all__ = ["ADDITIVE", "derive", "estimate_from_children"]

#: Per-call values that add up over children (weighted by their calls).
ADDITIVE = (
    "fwd_ms", "bwd_ms", "cpu_ms", "device_ms", "fwd_flops", "bwd_flops", "bytes", "activation_mb", "comm_bytes",
    "comm_ms",
)  # fmt: skip

_NAN = float("nan")


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def _or0(x: float) -> float:
    return x if _finite(x) else 0.0


def derive(row: ComponentRow, peak_flops: float | None, peak_bandwidth: float | None) -> None:
    """Fill ``total_ms``, ``tflops``, ``mfu``, ``gbps``, ``bw_util``, ``intensity``, ``bound``.

    ``total_ms = fwd_ms + bwd_ms``; ``tflops = (fwd_flops + bwd_flops) / total
    seconds / 1e12``; ``mfu = FLOP/s / peak_flops``; ``gbps = bytes / total seconds
    / 1e9``; ``bw_util = bytes/s / peak_bandwidth``; ``intensity = FLOPs / bytes``;
    ``bound = "compute"`` if intensity >= peak_flops / peak_bandwidth (the roofline
    ridge), else ``"memory"``. Unknown inputs leave NaN (``bound`` ``None``).
    """
    if _finite(row.fwd_ms):
        row.total_ms = row.fwd_ms + _or0(row.bwd_ms)
    seconds = row.total_ms / 1e3 if _finite(row.total_ms) and row.total_ms > 0 else _NAN
    flops = _or0(row.fwd_flops) + _or0(row.bwd_flops) if _finite(row.fwd_flops) else _NAN
    if _finite(flops) and _finite(seconds):
        row.tflops = flops / seconds / 1e12
        row.mfu = flops / seconds / peak_flops if peak_flops else _NAN
    if _finite(row.bytes) and _finite(seconds):
        row.gbps = row.bytes / seconds / 1e9
        row.bw_util = row.bytes / seconds / peak_bandwidth if peak_bandwidth else _NAN
    if _finite(flops) and _finite(row.bytes) and row.bytes > 0:
        row.intensity = flops / row.bytes
        if peak_flops and peak_bandwidth:
            row.bound = "compute" if row.intensity >= peak_flops / peak_bandwidth else "memory"


def _joined(first: str | None, then: str) -> str:
    return then if not first else f"{first}; {then}"


def estimate_from_children(row: ComponentRow, children: list[ComponentRow]) -> bool:
    """Set ``row``'s values from its measured/estimated children; return whether it could.

    Additive values are ``sum(child.value * child.calls) / max(row.calls, 1)`` (per
    call of the parent); ``peak_mem_mb`` is the children's maximum. The row becomes
    ``estimated``, how (the children used) added to its ``note``; its ``error``
    (why its own replay failed, if it did) stays. With no usable child it becomes
    ``failed``, the reason added to ``error``. ``details`` are kept (e.g. the
    ``unknown_leaves`` of a call that could not be captured).

    Notes:
        An estimate is a lower bound of a parent that ran but could not be
        measured: it misses the parent's own ops between its children and any
        overlap or fusion across them.
    """
    children = [c for c in children if c.status != "not_run"]  # they cost nothing in the step
    usable = [c for c in children if c.status in ("ok", "estimated") and _finite(c.fwd_ms)]
    if not usable:
        row.status = "failed"
        row.error = _joined(row.error, "no child could be measured to estimate it")
        return False
    divisor = max(row.calls, 1)
    for name in ADDITIVE:
        vals = [(getattr(c, name), max(c.calls, 1)) for c in usable]
        if any(_finite(v) for v, _ in vals):
            setattr(row, name, sum(_or0(v) * k for v, k in vals) / divisor)
    peaks = [c.peak_mem_mb for c in usable if _finite(c.peak_mem_mb)]
    row.peak_mem_mb = max(peaks) if peaks else _NAN
    missing = [c.path for c in children if c not in usable]
    row.status = "estimated"
    note = f"estimated from {len(usable)} of {len(children)} children"
    if missing:
        note += f" (missing: {', '.join(missing[:5])}{'…' if len(missing) > 5 else ''})"
    row.note = _joined(row.note, note)
    return True
