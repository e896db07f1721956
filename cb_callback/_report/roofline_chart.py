"""``roofline.png``: a report's roofline drawn with matplotlib (the points of :mod:`cb_callback._report.roofline`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import LogLocator

from cb_callback._report.numbers import sig
from cb_callback._report.pixels import save_png
from cb_callback._report.roofline import (
    PASSES,
    BandwidthPoint,
    RooflineData,
    RooflinePoint,
    headroom_ranking,
    roofline_data,
)

if TYPE_CHECKING:
    from cb_callback._report.model import Report

__all__ = ["ROOFLINE_FILE", "roofline_figure", "roofline_target", "save_roofline"]

#: The chart's file name, beside ``report.json``.
ROOFLINE_FILE = "roofline.png"

_FIGSIZE = (16.0, 9.0)  # 1600x900 px at _DPI, as the icicles: TensorBoard shows an image at its own size
_DPI = 100
#: The module types' colours: tab10 without its grey (#7f7f7f, too near "other types"); the rest grey.
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf")
_OTHER = "#9e9e9e"
_MARKERS = {"fwd": "o", "bwd": "^"}
_LABELLED = 5  # the plotted components with most headroom over the step get their path written beside them
#: The ceilings are black and dark grey, told apart by their dashes: no module type's colour is near one.
_CEILING_STYLES = (("#222222", "-"), ("#222222", "--"), ("#444444", "-."), ("#444444", ":"), ("#666666", "--"))


def _ceiling_style(i: int) -> tuple[str, str]:
    return _CEILING_STYLES[i % len(_CEILING_STYLES)]


def _colours(points: list[RooflinePoint], bandwidth: list[BandwidthPoint]) -> dict[str, str]:
    """A colour per module type, the types with most time over the step first; past ``len(_PALETTE)``, grey."""
    weight: dict[str, float] = {}
    both: list[RooflinePoint | BandwidthPoint] = [*points, *bandwidth]
    for p in both:
        weight[p.module_type] = weight.get(p.module_type, 0.0) + p.ms * max(p.calls, 1)
    ranked = sorted(weight, key=lambda t: -weight[t])
    return {t: (_PALETTE[i] if i < len(_PALETTE) else _OTHER) for i, t in enumerate(ranked)}


def _limits(data: RooflineData) -> tuple[float, float, float, float]:
    """x and y ranges (log axes) holding every point, every ridge and the compute roof, with a margin."""
    xs = [p.intensity for p in data.points] + [c.ridge for c in data.ceilings if math.isfinite(c.ridge)]
    ys = [p.tflops for p in data.points] + ([data.peak_flops / 1e12] if data.peak_flops else [])
    x0, x1 = (min(xs), max(xs)) if xs else (0.1, 100.0)
    y0, y1 = (min(ys), max(ys)) if ys else (1e-3, 1.0)
    return x0 / 4, x1 * 4, y0 / 4, y1 * 3


def _along(ax: Axes, xy0: tuple[float, float], xy1: tuple[float, float]) -> float:
    """The on-screen angle (degrees) of the segment ``xy0``–``xy1`` in data coordinates (limits set first)."""
    (a, b), (c, d) = ax.transData.transform([xy0, xy1])
    return math.degrees(math.atan2(d - b, c - a))


def _draw_ceilings(ax: Axes, data: RooflineData, x0: float, x1: float) -> None:
    """The compute roof (flat) and each bandwidth roof (``bandwidth × intensity``, up to its ridge), each
    labelled above its own line (along it, so the line never strikes its words), the ridge in the label."""
    peak = data.peak_flops / 1e12 if data.peak_flops else None
    for i, c in enumerate(data.ceilings):
        colour, dash = _ceiling_style(i)
        end = c.ridge if math.isfinite(c.ridge) else x1
        ax.plot([x0, end], [c.bandwidth * x0 / 1e12, c.bandwidth * end / 1e12], color=colour, ls=dash, lw=1.6)
        at = x0 * 1.3 ** (i + 1)  # each roof's label a little further along: parallel roofs do not stack words
        angle = _along(ax, (at, c.bandwidth * at / 1e12), (at * 10, c.bandwidth * at * 10 / 1e12))
        ridge = f" (ridge {sig(c.ridge)} FLOP/B)" if peak is not None else ""
        ax.annotate(f"{c.name} {sig(c.bandwidth / 1e9)} GB/s{ridge}", (at, c.bandwidth * at / 1e12),
                    textcoords="offset points", xytext=(-4 * math.sin(math.radians(angle)),
                    4 * math.cos(math.radians(angle))), rotation=angle, rotation_mode="anchor",
                    color=colour, fontsize=9, va="bottom", ha="left")  # fmt: skip
        if peak is not None:
            ax.plot([c.ridge], [peak], marker="D", color=colour, ms=6, zorder=4)
    if peak is not None:
        start = min((c.ridge for c in data.ceilings), default=x0)
        ax.plot([start, x1], [peak, peak], color="black", lw=1.8)
        ax.annotate(f"peak {sig(peak)} TFLOP/s", (x1, peak), textcoords="offset points", xytext=(-6, 4),
                    ha="right", va="bottom", fontsize=9)  # fmt: skip


def _size(share: float) -> float:
    """A marker's area in points²: 30 for no share, 30 + 600 × the pass's share of the step (at most 1)."""
    return 30.0 + 600.0 * min(max(share, 0.0), 1.0) if math.isfinite(share) else 30.0


_Drawn = tuple[RooflinePoint | BandwidthPoint, float, float]  # a pass and where it is drawn


def _scatter(ax: Axes, drawn: list[_Drawn], colours: dict[str, str]) -> None:
    for name in PASSES:
        mine = [d for d in drawn if d[0].pass_name == name]
        if mine:
            ax.scatter([x for _, x, _ in mine], [y for _, _, y in mine], s=[_size(p.share) for p, _, _ in mine],
                       marker=_MARKERS[name], c=[colours[p.module_type] for p, _, _ in mine], alpha=0.75,
                       edgecolors="black", linewidths=0.5, zorder=3)  # fmt: skip


def _label(ax: Axes, drawn: list[_Drawn], labelled: set[str]) -> None:
    """The labelled components' path beside the pass of theirs with the more time, on a pale box."""
    slowest: dict[str, _Drawn] = {}
    for d in drawn:
        if d[0].path in labelled and (d[0].path not in slowest or d[0].ms > slowest[d[0].path][0].ms):
            slowest[d[0].path] = d
    for p, x, y in slowest.values():
        ax.annotate(f"{p.path or '(root)'} {p.pass_name}", (x, y), textcoords="offset points", xytext=(7, 5),
                    fontsize=8, zorder=5, bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none",
                    "alpha": 0.7})  # fmt: skip


def _bandwidth_columns(data: RooflineData) -> list[tuple[str, float]]:
    """The bandwidth panel's columns: each ceiling that bounds a pass there, fastest first (``(name, GB/s)``)."""
    seen = {(b.ceiling or "no ceiling", b.ceiling_gbps) for b in data.bandwidth}
    return sorted(seen, key=lambda c: -c[1] if math.isfinite(c[1]) else math.inf)


def _draw_bandwidth(ax: Axes, data: RooflineData) -> list[_Drawn]:
    """The passes with no FLOPs counted: achieved GB/s (log) in one column per ceiling that bounds them,
    the ceiling a line across its column; returns where each pass is drawn."""
    columns = _bandwidth_columns(data)
    drawn: list[_Drawn] = []
    for i, (name, gbps) in enumerate(columns):
        mine = sorted((b for b in data.bandwidth if (b.ceiling or "no ceiling", b.ceiling_gbps) == (name, gbps)),
                      key=lambda b: -b.gbps)  # fmt: skip
        for j, b in enumerate(mine):  # a strip: spread across the column so equal GB/s do not hide each other
            drawn.append((b, i - 0.3 + 0.6 * (j + 0.5) / len(mine), b.gbps))
        if math.isfinite(gbps):
            ax.plot([i - 0.45, i + 0.45], [gbps, gbps], color="#222222", lw=1.6)
            ax.annotate(f"{name} {sig(gbps)} GB/s", (i, gbps), textcoords="offset points", xytext=(0, 4),
                        ha="center", va="bottom", fontsize=8)  # fmt: skip
    ys = [y for _, _, y in drawn] + [g for _, g in columns if math.isfinite(g)]
    ax.set_yscale("log")
    ax.set_ylim(min(ys) / 4, max(ys) * 4)
    ax.set_xlim(-0.6, len(columns) - 0.4)
    ax.set_xticks(range(len(columns)), [n for n, _ in columns])
    ax.set_ylabel("achieved GB/s (per pass)")
    ax.set_title("passes with no FLOPs counted:\nachieved GB/s against the\nbandwidth ceiling that bounds them",
                 fontsize=9)  # fmt: skip
    ax.grid(True, which="major", axis="y", alpha=0.3)
    return drawn


def _legend(ax: Axes, colours: dict[str, str]) -> None:
    words = {"fwd": "forward", "bwd": "backward"}
    handles = [Line2D([], [], ls="", marker=m, color="#555555", label=words[n]) for n, m in _MARKERS.items()]
    shown = [(t, c) for t, c in colours.items() if c != _OTHER]
    handles += [Line2D([], [], ls="", marker="s", color=c, label=t) for t, c in shown]
    if len(shown) < len(colours):
        handles.append(Line2D([], [], ls="", marker="s", color=_OTHER, label="other types"))
    ax.legend(handles=handles, loc="lower right", fontsize=9, title="marker: pass; colour: module type; area: share")


def _labelled(report: Report, data: RooflineData) -> set[str]:
    """The :data:`_LABELLED` components with most headroom over the step among those drawn (either panel)."""
    plotted = {p.path for p in data.points} | {b.path for b in data.bandwidth}
    ranked = [h.row.path for h in headroom_ranking(report, len(report.rows)) if h.row.path in plotted]
    return set(ranked[:_LABELLED])


def roofline_figure(report: Report) -> Figure:
    """The roofline of ``report``: log–log, x FLOP/byte, y TFLOP/s; the passes with no FLOPs counted in a
    narrow panel beside it (GB/s against their ceiling); the title says what was left out."""
    data = roofline_data(report)
    fig = Figure(figsize=_FIGSIZE, dpi=_DPI)
    if data.bandwidth:
        grid = fig.add_gridspec(1, 2, width_ratios=(5, 1), wspace=0.12)
        ax, side = fig.add_subplot(grid[0]), fig.add_subplot(grid[1])
    else:
        ax, side = fig.add_subplot(1, 1, 1), None
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.08, top=0.88)
    x0, x1, y0, y1 = _limits(data)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x0, x1)
    ax.set_ylim(y0, y1)
    _draw_ceilings(ax, data, x0, x1)
    colours = _colours(data.points, data.bandwidth)
    labelled = _labelled(report, data)
    drawn: list[_Drawn] = [(p, p.intensity, p.tflops) for p in data.points]
    _scatter(ax, drawn, colours)
    _label(ax, drawn, labelled)
    if side is not None:
        beside = _draw_bandwidth(side, data)
        _scatter(side, beside, colours)
        _label(side, beside, labelled)
    ax.set_xlabel("arithmetic intensity (FLOP / byte moved, per pass)")
    ax.set_ylabel("achieved TFLOP/s (per pass)")
    ax.grid(True, which="major", alpha=0.3)
    _legend(ax, colours)
    device = report.metadata.get("device_name") or "device"
    roofs = "" if data.ceilings or data.peak_flops else "; no peaks: no ceilings"
    passes = {p.pass_name for p in data.points} | {b.pass_name for b in data.bandwidth}
    what = "forward and backward" if "bwd" in passes else "forward"
    fig.suptitle(f"roofline \u2014 {device}: {len(data.points)} points ({what} per component){roofs}")
    ax.set_title(data.text() + "; labelled: the most headroom over the step", fontsize=10, wrap=True)
    _quick_axes(fig)
    return fig


def _quick_axes(fig: Figure) -> None:
    """What makes a log–log figure slow to draw, made cheap without changing what it says: minor ticks at 2 and 5
    of each decade (not 2…9: each tick is a few artists), and titles at the axes' top (no tick labels sit there, so
    matplotlib's search for a free place above them, which measures every tick label, finds the same place)."""
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_scale() == "log":
                axis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
        ax.title.set_y(1.0)


def roofline_target(out: Path | None, beside: Path) -> Path:
    """Where ``cb roofline --out OUT`` writes: ``beside / roofline.png`` without ``OUT``, ``OUT / roofline.png``
    for a directory, ``OUT.png`` for a name without an extension, else ``OUT``.

    Raises:
        ValueError: ``OUT``'s extension is not a format matplotlib writes (``.xyz``), saying which are.
    """
    if out is None:
        return beside / ROOFLINE_FILE
    if out.is_dir():
        return out / ROOFLINE_FILE
    if not out.suffix:
        return out.with_name(out.name + ".png")
    formats = Figure().canvas.get_supported_filetypes()
    if out.suffix[1:].lower() not in formats:
        raise ValueError(f"cannot write {out}: {out.suffix!r} is not an image format ({', '.join(sorted(formats))})")
    return out


def save_roofline(report: Report, directory: str | Path, name: str = ROOFLINE_FILE) -> Path:
    """Write the roofline of ``report`` as ``directory / name`` (PNG, 1600x900 px); returns the path.

    ``name`` may be a path of its own (``cb roofline --out``): then ``directory`` is ignored.
    """
    target = Path(directory) / name
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.suffix.lower() == ".png":  # the pixels TensorBoard's image shares (drawn once per report)
        return save_png(target, _DPI, report, roofline_figure)
    roofline_figure(report).savefig(target, dpi=_DPI)
    return target
