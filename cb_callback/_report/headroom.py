"""``headroom_ms``: the time per call a row would save at its own roof (docs/columns.md, "Headroom").

The one copy of the formula: the engine's derive step (:func:`cb_callback._engine.derive.estimate.derive`)
fills the column with it, and :meth:`cb_callback._report.model.Report.from_dict` with it where a
``report.json`` written before the column lacks the key (:func:`missing_headroom`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from cb_callback._report.finite import finite

__all__ = ["has_peaks", "headroom_ms", "missing_headroom", "row_bandwidth"]

_NAN = float("nan")


class ComponentRow(Protocol):
    """What the formula reads of a :class:`cb_callback._report.model.ComponentRow` (this module is below
    the model: the model's loader calls it)."""

    @property
    def status(self) -> str: ...
    @property
    def fwd_ms(self) -> float: ...
    @property
    def bwd_ms(self) -> float: ...
    @property
    def fwd_flops(self) -> float: ...
    @property
    def bwd_flops(self) -> float: ...
    @property
    def details(self) -> Mapping[str, object]: ...


def _pass_at_floor(row: ComponentRow, name: str) -> bool:
    floor = row.details.get("floor_ms")
    return isinstance(floor, Mapping) and name in (floor.get("at_floor") or ())


def headroom_ms(row: ComponentRow, peak_flops: float | None, bandwidth: float | None) -> float:
    """The time per call ``row`` would save at its own roof, ms; NaN where that is unknown.

    Per pass (forward, backward): ``max(0, t - max(flops / peak_flops, bytes / bandwidth))``, with
    ``t`` the pass's time (``fwd_ms``, ``bwd_ms``, net of the harness floor), its FLOPs (``fwd_flops``,
    ``bwd_flops``) and bytes (``details["fwd_bytes"]``, ``["bwd_bytes"]``): what the pass takes beyond
    the time its work needs at the ceiling that binds it. ``bandwidth`` is the row's own memory roof
    (bytes/s: ``details["bw_ceiling"]``, else the device's peak: :func:`row_bandwidth`), as ``bound``'s.
    The two passes add up.

    A pass with no time (``0``: no backward; NaN: not timed) or flagged at the harness floor
    (``details["floor_ms"]["at_floor"]``: its time is within its noise of the harness floor) adds 0.
    NaN for a row that is not ``ok`` (an estimate sums isolated children; failed, skipped and not-run
    rows have no time), without both peaks, when no pass has a time above the floor, or when a pass
    that does lacks its FLOPs or bytes. The result is ms per call.
    """
    if row.status != "ok" or not peak_flops or not bandwidth:
        return _NAN
    passes = (("fwd", row.fwd_ms, row.fwd_flops), ("bwd", row.bwd_ms, row.bwd_flops))
    total, timed = 0.0, False
    for name, ms, flops in passes:
        if not finite(ms) or ms <= 0 or _pass_at_floor(row, name):
            continue
        nbytes = row.details.get(f"{name}_bytes")
        if not finite(flops) or not finite(nbytes):
            return _NAN
        roof_ms = max(flops / peak_flops, float(nbytes) / bandwidth) * 1e3
        total += max(0.0, ms - roof_ms)
        timed = True
    return total if timed else _NAN


def _positive(value: object) -> float | None:
    return float(value) if finite(value) and value > 0 else None


def has_peaks(metadata: Mapping[str, Any]) -> bool:
    """Whether ``metadata["peaks"]`` has both a FLOP/s and a bandwidth peak: the roofs a headroom needs."""
    peaks = metadata.get("peaks")
    return isinstance(peaks, Mapping) and bool(_positive(peaks.get("flops")) and _positive(peaks.get("bandwidth")))


def row_bandwidth(row: ComponentRow, device_bandwidth: float | None) -> float | None:
    """The row's memory roof, bytes/s: its working set's level (``details["bw_ceiling"]["gbps"]``), else
    ``device_bandwidth`` (as :func:`cb_callback._engine.derive.rollup.derive_all` passes it)."""
    own = row.details.get("bw_ceiling")
    gbps = own.get("gbps") if isinstance(own, Mapping) else None
    return float(gbps) * 1e9 if finite(gbps) and gbps > 0 else device_bandwidth


def missing_headroom(
    rows: Sequence[ComponentRow], raw: Sequence[Any], metadata: Mapping[str, Any]
) -> list[float | None]:
    """``headroom_ms`` derived for each row whose JSON (``raw``, the same order) has no such key (a
    ``report.json`` written before the column), ``None`` for the others: they keep theirs. All ``None``
    without both peaks in ``metadata``."""
    if not has_peaks(metadata):
        return [None] * len(rows)
    peaks = metadata["peaks"]
    flops, device = float(peaks["flops"]), float(peaks["bandwidth"])
    return [
        headroom_ms(row, flops, row_bandwidth(row, device))
        if isinstance(data, dict) and "headroom_ms" not in data
        else None
        for row, data in zip(rows, raw, strict=True)
    ]
