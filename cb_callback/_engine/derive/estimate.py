"""Derived metrics of a row, and estimates of unmeasurable parents from their children."""

from __future__ import annotations

from cb_callback._engine.clocks.floor import is_at_floor
from cb_callback._report.finite import finite, or_zero
from cb_callback._report.headroom import headroom_ms
from cb_callback._report.model import ComponentRow
from cb_callback._report.schema import Roofline

__all__ = ["ADDITIVE", "ROOF_NEAR", "derive", "estimate_from_children", "headroom_ms", "roofline"]

#: Per-call values that add up over children (weighted by their calls).
ADDITIVE = (
    "fwd_ms", "bwd_ms", "cpu_ms", "device_ms", "fwd_flops", "bwd_flops", "bytes", "activation_mb", "comm_bytes",
    "comm_ms",
)  # fmt: skip

_NAN = float("nan")

#: ``bound`` names a roof (``"compute"``, ``"memory"``) only where the row runs at this fraction of it or
#: more (``details["roofline"]["roof_util"]``); below, ``"latency"``. A quarter: within 4× of the roof, where
#: the datasheet's dense peaks put tuned GEMMs (40-80 % MFU) and streaming kernels (50-90 % of HBM), while the
#: lookups the issue found (1-7 % of DRAM) and sub-µs ops dominated by launches fall well below.
ROOF_NEAR = 0.25


def derive(
    row: ComponentRow, peak_flops: float | None, peak_bandwidth: float | None, ceiling_bandwidth: float | None = None
) -> None:
    """Fill ``total_ms``, ``tflops``, ``mfu``, ``gbps``, ``bw_util``, ``intensity``, ``bound``, ``headroom_ms``.

    ``total_ms = fwd_ms + bwd_ms``; ``tflops = (fwd_flops + bwd_flops) / total
    seconds / 1e12``; ``mfu = FLOP/s / peak_flops``; ``gbps = bytes / total seconds
    / 1e9``; ``bw_util = bytes/s / peak_bandwidth``; ``intensity = FLOPs / bytes``;
    ``bound`` from :func:`roofline` (``"compute"``, ``"memory"`` or ``"latency"``), its
    figures in ``details["roofline"]``. ``ceiling_bandwidth`` is the row's own memory
    roof (bytes/s: the cache level its working set fits, ``details["bw_ceiling"]``), else
    ``peak_bandwidth``. Unknown inputs leave NaN (``bound`` ``None``).

    A row at the harness floor (:func:`cb_callback._engine.clocks.floor.is_at_floor`) gets
    ``total_ms`` only: its time is indistinguishable from a replay that does nothing, so
    TFLOP/s, GB/s, MFU, ``bw_util`` and ``bound`` stay NaN/``None`` (``intensity``, and the
    roof it puts the row under, need no time and are kept). ``headroom_ms`` is :func:`headroom_ms`
    against the same roofs, pass by pass (a pass at the floor adds nothing).
    """
    if finite(row.fwd_ms):
        row.total_ms = row.fwd_ms + or_zero(row.bwd_ms)
    timed = not is_at_floor(row.details)
    seconds = row.total_ms / 1e3 if timed and finite(row.total_ms) and row.total_ms > 0 else _NAN
    flops = or_zero(row.fwd_flops) + or_zero(row.bwd_flops) if finite(row.fwd_flops) else _NAN
    if finite(flops) and finite(seconds):
        row.tflops = flops / seconds / 1e12
        row.mfu = flops / seconds / peak_flops if peak_flops else _NAN
    if finite(row.bytes) and finite(seconds):
        row.gbps = row.bytes / seconds / 1e9
        row.bw_util = row.bytes / seconds / peak_bandwidth if peak_bandwidth else _NAN
    if finite(flops) and finite(row.bytes) and row.bytes > 0:
        row.intensity = flops / row.bytes
        found = roofline(flops, row.bytes, seconds, peak_flops, ceiling_bandwidth or peak_bandwidth)
        if found is not None:
            row.bound = found["bound"]
            row.details["roofline"] = found
    row.headroom_ms = headroom_ms(row, peak_flops, ceiling_bandwidth or peak_bandwidth)


def roofline(
    flops: float, nbytes: float, seconds: float, peak_flops: float | None, bandwidth: float | None
) -> Roofline | None:
    """Which roof binds a row and how near it runs; ``None`` without both peaks.

    The ridge is ``peak_flops / bandwidth`` FLOP/byte (``bandwidth``: the row's own memory
    roof, bytes/s). Below it (``flops / nbytes < ridge``) the memory roof binds (``roof =
    "memory"``, ``roof_util = bytes/s ÷ bandwidth``), at or above it the compute roof
    (``"compute"``, ``roof_util = FLOP/s ÷ peak_flops``). ``bound`` is that roof where
    ``roof_util >= ROOF_NEAR``, else ``"latency"``: neither roof is near, the time goes to
    launches, dispatch, the Python around the ops or dependent memory accesses (an embedding
    lookup at 5 % of the DRAM bandwidth is not memory-bound). Without a time (``seconds``
    NaN: at the harness floor, not measured) ``roof_util`` is NaN and ``bound`` ``None``.
    """
    if not peak_flops or not bandwidth:
        return None
    ridge = peak_flops / bandwidth
    roof = "compute" if flops / nbytes >= ridge else "memory"
    util = (flops / peak_flops if roof == "compute" else nbytes / bandwidth) / seconds if finite(seconds) else _NAN
    bound = None if not finite(util) else roof if util >= ROOF_NEAR else "latency"
    return {"bound": bound, "roof": roof, "roof_util": util, "ridge": ridge, "bandwidth_gbps": bandwidth / 1e9}


def _joined(first: str | None, then: str) -> str:
    return then if not first else f"{first}; {then}"


def _insitu_value(row: ComponentRow, name: str) -> float:
    """What a child left in situ (``details["as"] == "insitu"``) adds to its parent's estimate: its forward
    and backward inside the step for the times, the census's counts for FLOPs and bytes, nothing else
    (no isolated memory, CPU or device split, collectives)."""
    if name == "fwd_ms":
        return row.insitu_ms
    if name == "bwd_ms":
        value = (row.details.get("insitu") or {}).get("bwd_ms")
        return float(value) if isinstance(value, (int, float)) else _NAN
    if name in ("fwd_flops", "bwd_flops", "bytes"):
        return float(getattr(row, name))
    return _NAN


def estimate_from_children(row: ComponentRow, children: list[ComponentRow]) -> bool:
    """Set ``row``'s values from its measured/estimated children; return whether it could.

    A child the triage left in situ (``details["as"] == "insitu"``) counts with what the step measured
    (:func:`_insitu_value`: its in-situ forward and backward, the census's FLOPs and bytes), so that a
    container, or a root never called itself, is not the sum of its replayed children alone.

    Additive values are ``sum(child.value * child.calls) / max(row.calls, 1)`` (per
    call of the parent); ``peak_mem_mb`` is the children's maximum. The row becomes
    ``estimated``, how (the children used) added to its ``note``; its ``error``
    (why its own replay failed, if it did) stays. With no usable child it becomes
    ``failed``, the reason added to ``error``. ``details`` are kept (e.g. the
    ``unknown_leaves`` of a call that could not be captured).

    When every child it is summed from is at the harness floor, so is the estimate:
    ``details["floor_ms"] = {"at_floor": ["children"], "children": [...]}`` (its rates
    stay NaN, :func:`derive`).

    Notes:
        An estimate misses the parent's own ops between its children and any
        overlap or fusion across them (it errs low), but each child's isolated
        replay also pays isolation's per-replay cost that the parent's one call
        pays once (it errs high): one above its measured parent is flagged
        ``above_parent`` (:mod:`cb_callback._engine.derive.quality`).
    """
    children = [c for c in children if c.status != "not_run"]  # they cost nothing in the step
    usable = [c for c in children if c.status in ("ok", "estimated") and finite(c.fwd_ms)]
    insitu = [c for c in children if c.details.get("as") == "insitu" and finite(c.insitu_ms)]
    if not usable and not insitu:
        row.status = "failed"
        row.error = _joined(row.error, "no child could be measured to estimate it")
        return False
    divisor = max(row.calls, 1)
    for name in ADDITIVE:
        vals = [(getattr(c, name), max(c.calls, 1)) for c in usable]
        vals += [(_insitu_value(c, name), max(c.calls, 1)) for c in insitu]
        if any(finite(v) for v, _ in vals):
            setattr(row, name, sum(or_zero(v) * k for v, k in vals) / divisor)
    peaks = [c.peak_mem_mb for c in usable if finite(c.peak_mem_mb)]
    row.peak_mem_mb = max(peaks) if peaks else _NAN
    missing = [c.path for c in children if c not in usable and c not in insitu]
    row.status = "estimated"
    note = f"estimated from {len(usable) + len(insitu)} of {len(children)} children"
    if insitu:
        note += f" ({len(insitu)} in situ: their times inside the step, the census's FLOPs and bytes"
        uncounted = [c.path for c in insitu if not finite(c.fwd_flops)]
        if uncounted:  # a shared module, a top whose census raised: its FLOPs and bytes are not in the sum
            note += f"; not counted by the census, so not in its FLOPs and bytes: {', '.join(uncounted[:3])}"
            note += "…" if len(uncounted) > 3 else ""
        note += ")"
    if missing:
        note += f" (missing: {', '.join(missing[:5])}{'…' if len(missing) > 5 else ''})"
    row.note = _joined(row.note, note)
    if all(is_at_floor(c.details) for c in usable):
        row.details["floor_ms"] = {"at_floor": ["children"], "children": [c.path for c in usable]}
    return True
