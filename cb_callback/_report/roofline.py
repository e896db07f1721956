"""The roofline of a report: each measured pass a point under the device's ceilings, and the headroom ranked.

A renderer's data: it reads the :class:`~cb_callback._report.model.Report` only and imports no
plotting library, so the summary, ``cb roofline``, the PNG (:mod:`cb_callback._report.roofline_chart`),
the TensorBoard image and ``report.html`` draw the same points (docs/columns.md, "The roofline chart").

A point is one pass of one ``ok`` row: x the arithmetic intensity ``flops / bytes`` of that pass
(``fwd_flops`` and ``details["fwd_bytes"]``, or the backward's), y its achieved TFLOP/s ``flops /
(ms / 1e3) / 1e12`` (``fwd_ms`` or ``bwd_ms``). A pass with a time and bytes but no FLOPs counted
(``0``: PyTorch's FlopCounterMode counts none for Embedding, LayerNorm, GELU, ReLU, Dropout...) has no
place on a log-log roofline: it is a :class:`BandwidthPoint` (achieved GB/s against the memory ceiling
that bounds it), drawn in the charts' bandwidth panel. Nothing is drawn that was not measured: a row
that is not ``ok`` and a pass without bytes, a time, FLOPs (NaN), flagged at the harness floor or with a
non-finite coordinate are counted in :attr:`RooflineData.left_out` by reason (:data:`LEFT_OUT`); a
backward that never ran (``bwd_ms == 0`` with no FLOPs) in :attr:`RooflineData.no_backward`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from cb_callback._report.finite import finite
from cb_callback._report.headroom import has_peaks
from cb_callback._report.numbers import sig

if TYPE_CHECKING:
    from cb_callback._report.model import ComponentRow, Report

__all__ = [
    "LEFT_OUT",
    "PASSES",
    "BandwidthPoint",
    "Ceiling",
    "Headroom",
    "RooflineData",
    "RooflinePoint",
    "headroom_lines",
    "headroom_ranking",
    "left_out_text",
    "no_headroom_reason",
    "roofline_data",
]

#: The passes a row is drawn as: forward and backward, each a point of its own.
PASSES = ("fwd", "bwd")

#: Why a row or a pass is not drawn: reason -> the words the charts say. The row statuses count
#: components (the row has no measurement of its own); the others count passes of ``ok`` rows.
LEFT_OUT: dict[str, str] = {
    "estimated": "estimated",
    "failed": "failed",
    "skipped": "skipped",
    "not_run": "not run",
    "at_floor": "within its noise of the harness floor",
    "no_time": "without a time",
    "no_flops": "without FLOPs (not counted)",
    "no_bytes": "without bytes",
    "not_finite": "with an infinite FLOP/s or FLOP/byte",
}
_COMPONENT_REASONS = ("estimated", "failed", "skipped", "not_run")


class RooflinePoint(NamedTuple):
    """One pass of one component: ``intensity = flops / bytes`` (FLOP/byte), ``tflops = flops / (ms / 1e3)
    / 1e12``; ``share`` the pass's share of the step (``row.share × ms / row.total_ms``, NaN when unknown);
    ``headroom_ms`` the row's (both passes, per call)."""

    path: str
    module_type: str
    pass_name: str
    flops: float
    bytes: float
    ms: float
    intensity: float
    tflops: float
    share: float
    calls: int
    headroom_ms: float


class Ceiling(NamedTuple):
    """A memory roof: its level's ``name`` (``"L1"``, ``"DRAM"``, ``"HBM"``), ``bandwidth`` in bytes/s and
    its ``ridge``, ``peak FLOP/s ÷ bandwidth`` FLOP/byte (NaN without a FLOP/s peak)."""

    name: str
    bandwidth: float
    ridge: float


class BandwidthPoint(NamedTuple):
    """A pass with no FLOPs counted, a time and bytes: ``gbps = bytes / (ms / 1e3) / 1e9`` against
    ``ceiling``, the memory roof that bounds it (the row's ``details["bw_ceiling"]`` level, else the
    device's bandwidth; ``None`` without peaks); ``share`` and ``headroom_ms`` as :class:`RooflinePoint`'s."""

    path: str
    module_type: str
    pass_name: str
    bytes: float
    ms: float
    gbps: float
    ceiling: str | None
    ceiling_gbps: float
    share: float
    calls: int
    headroom_ms: float


@dataclass
class RooflineData:
    """The points, the bandwidth panel's points (passes with no FLOPs counted), the ceilings, what was
    left out (reason of :data:`LEFT_OUT` -> count) and the backwards that never ran.

    Accounting: ``2 × rows = len(points) + len(bandwidth) + 2 × (components left out) + (passes left
    out) + no_backward``.
    """

    points: list[RooflinePoint]
    peak_flops: float | None
    ceilings: list[Ceiling]
    left_out: dict[str, int] = field(default_factory=dict)
    bandwidth: list[BandwidthPoint] = field(default_factory=list)
    no_backward: int = 0

    def text(self) -> str:
        """What the charts say was left out, drawn in the bandwidth panel and never ran (:func:`left_out_text`)."""
        return left_out_text(self.left_out, len(self.bandwidth), self.no_backward)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (NaN as ``None``): what report.html's chart draws."""

        def clean(v: object) -> object:
            return None if isinstance(v, float) and not math.isfinite(v) else v

        return {
            "points": [{k: clean(v) for k, v in p._asdict().items()} for p in self.points],
            "bandwidth": [{k: clean(v) for k, v in p._asdict().items()} for p in self.bandwidth],
            "peak_flops": self.peak_flops,
            "ceilings": [{k: clean(v) for k, v in c._asdict().items()} for c in self.ceilings],
            "left_out": dict(self.left_out),
            "no_backward": self.no_backward,
            "left_out_text": self.text(),
        }


def _positive(value: object) -> float | None:
    return float(value) if finite(value) and value > 0 else None


def ceilings(metadata: Mapping[str, Any]) -> tuple[float | None, list[Ceiling]]:
    """``(peak FLOP/s, the memory ceilings, fastest first)`` of ``metadata["peaks"]``.

    Each cache level of ``peaks["levels"]`` with a bandwidth (CPU; levels of one figure are one
    ceiling, their names joined: ``"L1/L2"``), and the device's
    ``peaks["bandwidth"]`` unless a level has that figure already: named ``"HBM"`` on a CUDA
    device, ``"DRAM"`` elsewhere.
    """
    peaks = metadata.get("peaks")
    peaks = peaks if isinstance(peaks, Mapping) else {}
    flops = _positive(peaks.get("flops"))
    out: list[Ceiling] = []
    levels = peaks.get("levels")
    for level in levels if isinstance(levels, (list, tuple)) else ():
        bw = _positive(level.get("bandwidth")) if isinstance(level, Mapping) else None
        if bw is None:
            continue
        name = str(level.get("name") or "cache")
        same = next((i for i, c in enumerate(out) if math.isclose(c.bandwidth, bw, rel_tol=1e-9)), None)
        if same is not None:  # levels measured at one figure (L1 = L2 = L3) are one roof: "L1/L2/L3"
            out[same] = out[same]._replace(name=f"{out[same].name}/{name}")
        else:
            out.append(Ceiling(name, bw, flops / bw if flops else math.nan))
    device = _positive(peaks.get("bandwidth"))
    if device is not None and not any(math.isclose(c.bandwidth, device, rel_tol=1e-9) for c in out):
        name = "HBM" if str(metadata.get("device", "")).startswith("cuda") else "DRAM"
        out.append(Ceiling(name, device, flops / device if flops else math.nan))
    return flops, sorted(out, key=lambda c: -c.bandwidth)


def _has_pass(row: ComponentRow, name: str, at_floor: Sequence[str]) -> bool:
    """Whether the row ran this pass: always the forward; the backward when it has a time, FLOPs or is
    at the floor (``bwd_ms == 0`` with no FLOPs: no backward ran, nothing to draw or leave out)."""
    if name == "fwd" or name in at_floor:
        return True
    return (finite(row.bwd_ms) and row.bwd_ms > 0) or (finite(row.bwd_flops) and row.bwd_flops > 0)


def _share(row: ComponentRow, ms: float) -> float:
    ok = finite(row.share) and finite(row.total_ms) and row.total_ms > 0
    return row.share * ms / row.total_ms if ok else math.nan


def _bounding(row: ComponentRow, roofs: Sequence[Ceiling]) -> tuple[str | None, float]:
    """The memory ceiling bounding ``row``: its working set's level (``details["bw_ceiling"]``), else the
    device's (the slowest roof); ``(name, GB/s)``, ``(None, NaN)`` without one."""
    own = row.details.get("bw_ceiling")
    gbps = own.get("gbps") if isinstance(own, Mapping) else None
    if finite(gbps) and gbps > 0:
        return str(own.get("level") or "cache") if isinstance(own, Mapping) else None, float(gbps)
    return (roofs[-1].name, roofs[-1].bandwidth / 1e9) if roofs else (None, math.nan)


def _point(
    row: ComponentRow, name: str, at_floor: Sequence[str], roofs: Sequence[Ceiling]
) -> RooflinePoint | BandwidthPoint | str:
    """The pass as a point, a bandwidth point (no FLOPs counted), or why it is left out (:data:`LEFT_OUT`)."""
    ms = row.fwd_ms if name == "fwd" else row.bwd_ms
    flops = row.fwd_flops if name == "fwd" else row.bwd_flops
    nbytes = row.details.get(f"{name}_bytes")
    if name in at_floor:
        return "at_floor"
    if not finite(ms) or ms <= 0:
        return "no_time"
    if not finite(nbytes) or nbytes <= 0:
        return "no_bytes"
    nbytes = float(nbytes)
    if flops == 0:  # none counted (an Embedding, a LayerNorm): its bytes against the ceiling that bounds it
        gbps = nbytes / (ms / 1e3) / 1e9
        if not math.isfinite(gbps):
            return "not_finite"
        ceiling, ceiling_gbps = _bounding(row, roofs)
        return BandwidthPoint(
            row.path, row.module_type, name, nbytes, ms, gbps, ceiling, ceiling_gbps, _share(row, ms), row.calls,
            row.headroom_ms,
        )  # fmt: skip
    if not finite(flops) or flops < 0:
        return "no_flops"
    if not math.isfinite(flops / nbytes) or not math.isfinite(flops / (ms / 1e3) / 1e12):
        return "not_finite"  # a hand-edited report (1e308 FLOPs in 1e-300 ms): no place on a log axis
    share = _share(row, ms)
    return RooflinePoint(
        row.path, row.module_type, name, flops, nbytes, ms, flops / nbytes, flops / (ms / 1e3) / 1e12,
        share, row.calls, row.headroom_ms,
    )  # fmt: skip


def roofline_data(report: Report) -> RooflineData:
    """Every drawable pass of ``report`` as a point, the device's ceilings, and what was left out, by reason."""
    peak, roofs = ceilings(report.metadata)
    points: list[RooflinePoint] = []
    bandwidth: list[BandwidthPoint] = []
    left: dict[str, int] = {}
    never = 0
    for row in report.rows:
        if row.status != "ok":
            left[row.status] = left.get(row.status, 0) + 1
            continue
        floor = row.details.get("floor_ms")
        at_floor = list(floor.get("at_floor") or ()) if isinstance(floor, Mapping) else []
        for name in PASSES:
            if not _has_pass(row, name, at_floor):
                never += 1
                continue
            found = _point(row, name, at_floor, roofs)
            if isinstance(found, str):
                left[found] = left.get(found, 0) + 1
            elif isinstance(found, BandwidthPoint):
                bandwidth.append(found)
            else:
                points.append(found)
    ordered = {k: left[k] for k in LEFT_OUT if left.get(k)}
    return RooflineData(points, peak, roofs, ordered, bandwidth, never)


def left_out_text(left_out: Mapping[str, int], in_panel: int = 0, no_backward: int = 0) -> str:
    """``"left out: 2 components (1 estimated, 1 failed); 3 passes (2 within its noise of the harness floor,
    1 without bytes); 1 pass with no FLOPs counted (shown in the bandwidth panel); 3 passes never ran
    (no backward)"``; ``"nothing left out"`` where there is nothing to say."""
    parts = []
    for unit, keys in (
        ("component", _COMPONENT_REASONS),
        ("pass", [k for k in LEFT_OUT if k not in _COMPONENT_REASONS]),
    ):
        counts = [(k, left_out[k]) for k in keys if left_out.get(k)]
        if counts:
            n = sum(c for _, c in counts)
            noun = unit if n == 1 else ("passes" if unit == "pass" else "components")
            parts.append(f"{n} {noun} ({', '.join(f'{c} {LEFT_OUT[k]}' for k, c in counts)})")
    text = "left out: " + "; ".join(parts) if parts else "nothing left out"
    if in_panel:
        text += (
            f"; {in_panel} {'pass' if in_panel == 1 else 'passes'} with no FLOPs counted (shown in the bandwidth panel)"
        )
    if no_backward:
        text += f"; {no_backward} {'pass' if no_backward == 1 else 'passes'} never ran (no backward)"
    return text


class Headroom(NamedTuple):
    """A line of the ranking: ``row`` (the measured one, when rows taken from it are folded in), ``n`` rows
    folded, each one's ``calls`` and ``step_ms``, ``Σ headroom_ms × calls``: what they would save over the step."""

    row: ComponentRow
    n: int
    calls: tuple[int, ...]
    step_ms: float


def headroom_ranking(report: Report, top: int = 10) -> list[Headroom]:
    """The leaf-most measured components (:meth:`Report.hotspots`) by ``headroom_ms × calls``, largest first.

    Rows taken from a representative of repeated structure are folded into the row they were taken
    from (their headroom over the step added up), as the summary's hotspots are. Rows without a
    finite ``headroom_ms`` are not ranked; none is without both peaks in the report's metadata (no roof:
    a stored ``headroom_ms`` then has nothing to be measured against).
    """
    if not has_peaks(report.metadata):
        return []
    groups: dict[str, list[Any]] = {}
    for r in report.hotspots(len(report.rows)):
        if not finite(r.headroom_ms):
            continue
        source = r.details.get("from") if r.details.get("as") == "representative" else None
        key = source if isinstance(source, str) else r.path
        step = r.headroom_ms * max(r.calls, 1)
        if key in groups:
            item = groups[key]
            item[0] = r if r.path == key else item[0]
            item[1] += 1
            item[2] = (r.calls, *item[2]) if r.path == key else (*item[2], r.calls)
            item[3] += step
        else:
            groups[key] = [r, 1, (r.calls,), step]
    ranked = sorted((Headroom(*g) for g in groups.values()), key=lambda h: -h.step_ms)
    return ranked[:top]


def _calls_text(calls: tuple[int, ...]) -> str:
    """Each folded row's calls as the summary's hotspots show them: ``3``, ``1+3`` or ``1–3 (Σ 40)``."""
    if len(set(calls)) == 1:
        return str(calls[0])
    return "+".join(map(str, calls)) if len(calls) <= 6 else f"{min(calls)}–{max(calls)} (Σ {sum(calls)})"


def _step_total_ms(report: Report) -> float:
    root = next((r for r in report.rows if r.parent is None), None)
    if root is None or not finite(root.total_ms) or root.total_ms <= 0:
        return math.nan
    return root.total_ms * max(root.calls, 1)


def no_headroom_reason(report: Report, top: int) -> str:
    """Why :func:`headroom_lines` is ``[]``, in the words ``cb roofline`` prints."""
    if top <= 0:
        return "no headroom ranking asked for (--top 0)"
    if not has_peaks(report.metadata):
        return "no peaks in this report: no roof, no headroom"
    return (
        "no measured component has a headroom (none is ok with a pass timed above the harness floor "
        "and that pass's FLOPs and bytes)"
    )


def headroom_lines(report: Report, top: int = 10) -> list[str]:
    """The ranking as text: a title, then one aligned line per component (``path ×n`` for folded rows);
    ``[]`` when no component has a headroom (:func:`no_headroom_reason` says why)."""
    ranked = headroom_ranking(report, top)
    if not ranked or top <= 0:
        return []
    whole = _step_total_ms(report)
    header = ["path", "type", "calls", "total ms", "headroom ms", "x calls ms", "% of step", "bound"]
    lines = [header]
    for h in ranked:
        path = h.row.path or "(root)"
        lines.append([
            f"{path} ×{h.n}" if h.n > 1 else path, h.row.module_type, _calls_text(h.calls), sig(h.row.total_ms),
            sig(h.row.headroom_ms), sig(h.step_ms), sig(h.step_ms / whole, scale=100.0), h.row.bound or "-",
        ])  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = [
        "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True)))
        for line in lines
    ]
    title = (
        f"where optimisation pays most (top {len(ranked)} by headroom_ms x calls: what each would save over the "
        "step at its own roof, max(flops/peak, bytes/bandwidth) per pass; leaf-most measured components"
        + ("; ×N: N rows of repeated structure, calls each one's" if any(h.n > 1 for h in ranked) else "")
        + "):"
    )
    return [title, text[0].rstrip(), "  ".join("-" * w for w in widths), *(t.rstrip() for t in text[1:])]
