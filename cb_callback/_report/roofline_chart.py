"""``roofline.png``: a report's roofline drawn with matplotlib (the points of :mod:`cb_callback._report.roofline`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from cb_callback._report.numbers import sig
from cb_callback._report.roofline import RooflineData, RooflinePoint, headroom_ranking, left_out_text, roofline_data

if TYPE_CHECKING:
    from cb_callback._report.model import Report

__all__ = ["ROOFLINE_FILE", "roofline_figure", "roofline_target", "save_roofline"]

#: The chart's file name, beside ``report.json``.
ROOFLINE_FILE = "roofline.png"

_FIGSIZE = (16.0, 9.0)  # 1600x900 px at _DPI, as the icicles: TensorBoard shows an image at its own size
_DPI = 100
_TYPES = 9  # module types with a colour of their own (the rest "other", grey)
_OTHER = "#9e9e9e"
_MARKERS = {"fwd": "o", "bwd": "^"}
_LABELLED = 5  # the components with most headroom over the step get their path written beside them
_CEILING_COLOURS = ("#1f3b73", "#2f6fde", "#5fa35a", "#e08a2c", "#b3261e", "#6a5acd")


def _colours(points: list[RooflinePoint]) -> dict[str, str]:
    """A colour per module type, the types with most time over the step first; past :data:`_TYPES`, grey."""
    weight: dict[str, float] = {}
    for p in points:
        weight[p.module_type] = weight.get(p.module_type, 0.0) + p.ms * max(p.calls, 1)
    cmap = colormaps["tab10"]
    ranked = sorted(weight, key=lambda t: -weight[t])
    return {t: (cmap(i) if i < _TYPES else _OTHER) for i, t in enumerate(ranked)}  # type: ignore[misc]


def _limits(data: RooflineData) -> tuple[float, float, float, float]:
    """x and y ranges (log axes) holding every point, every ridge and the compute roof, with a margin."""
    xs = [p.intensity for p in data.points] + [c.ridge for c in data.ceilings if math.isfinite(c.ridge)]
    ys = [p.tflops for p in data.points] + ([data.peak_flops / 1e12] if data.peak_flops else [])
    x0, x1 = (min(xs), max(xs)) if xs else (0.1, 100.0)
    y0, y1 = (min(ys), max(ys)) if ys else (1e-3, 1.0)
    return x0 / 4, x1 * 4, y0 / 4, y1 * 3


def _draw_ceilings(ax: Axes, data: RooflineData, x0: float, x1: float) -> None:
    """The compute roof (flat) and each bandwidth roof (``bandwidth × intensity``, up to its ridge)."""
    peak = data.peak_flops / 1e12 if data.peak_flops else None
    for i, c in enumerate(data.ceilings):
        colour = _CEILING_COLOURS[i % len(_CEILING_COLOURS)]
        end = c.ridge if math.isfinite(c.ridge) else x1
        ax.plot([x0, end], [c.bandwidth * x0 / 1e12, c.bandwidth * end / 1e12], color=colour, lw=1.6)
        ax.text(x0 * 1.15, c.bandwidth * x0 * 1.15 / 1e12, f"{c.name} {sig(c.bandwidth / 1e9)} GB/s",
                color=colour, fontsize=9, rotation=0, va="bottom")  # fmt: skip
        if peak is not None:
            ax.plot([c.ridge], [peak], marker="D", color=colour, ms=6)
            ax.annotate(f"ridge {sig(c.ridge)} FLOP/B", (c.ridge, peak), textcoords="offset points",
                        xytext=(4, -14 - 11 * i), fontsize=8, color=colour)  # fmt: skip
    if peak is not None:
        start = min((c.ridge for c in data.ceilings), default=x0)
        ax.plot([start, x1], [peak, peak], color="black", lw=1.8)
        ax.text(x1 / 1.1, peak * 1.08, f"peak {sig(peak)} TFLOP/s", ha="right", fontsize=9)


def _size(share: float) -> float:
    """A marker's area in points²: 30 for no share, 30 + 600 × the pass's share of the step (at most 1)."""
    return 30.0 + 600.0 * min(max(share, 0.0), 1.0) if math.isfinite(share) else 30.0


def _draw_points(ax: Axes, data: RooflineData, colours: dict[str, str], labelled: set[str]) -> None:
    for name in ("fwd", "bwd"):
        mine = [p for p in data.points if p.pass_name == name]
        if not mine:
            continue
        sizes = [_size(p.share) for p in mine]
        ax.scatter([p.intensity for p in mine], [p.tflops for p in mine], s=sizes, marker=_MARKERS[name],
                   c=[colours[p.module_type] for p in mine], alpha=0.75, edgecolors="black", linewidths=0.5,
                   zorder=3)  # fmt: skip
    slowest: dict[str, RooflinePoint] = {}  # a labelled component's pass with the more time carries its label
    for p in data.points:
        if p.path in labelled and (p.path not in slowest or p.ms > slowest[p.path].ms):
            slowest[p.path] = p
    for p in slowest.values():
        ax.annotate(f"{p.path or '(root)'} {p.pass_name}", (p.intensity, p.tflops), textcoords="offset points",
                    xytext=(6, 4), fontsize=8, zorder=4)  # fmt: skip


def _legend(ax: Axes, colours: dict[str, str]) -> None:
    words = {"fwd": "forward", "bwd": "backward"}
    handles = [Line2D([], [], ls="", marker=m, color="#555555", label=words[n]) for n, m in _MARKERS.items()]
    shown = [(t, c) for t, c in colours.items() if c != _OTHER]
    handles += [Line2D([], [], ls="", marker="s", color=c, label=t) for t, c in shown]
    if len(shown) < len(colours):
        handles.append(Line2D([], [], ls="", marker="s", color=_OTHER, label="other types"))
    ax.legend(handles=handles, loc="lower right", fontsize=9, title="marker: pass; colour: module type; area: share")


def roofline_figure(report: Report) -> Figure:
    """The roofline of ``report``: log–log, x FLOP/byte, y TFLOP/s; the title says what was left out."""
    data = roofline_data(report)
    fig = Figure(figsize=_FIGSIZE, dpi=_DPI)
    ax = fig.add_subplot(1, 1, 1)
    x0, x1, y0, y1 = _limits(data)
    ax.set_xscale("log")
    ax.set_yscale("log")
    _draw_ceilings(ax, data, x0, x1)
    ranked = {h.row.path for h in headroom_ranking(report, _LABELLED)}
    colours = _colours(data.points)
    _draw_points(ax, data, colours, ranked)
    ax.set_xlim(x0, x1)
    ax.set_ylim(y0, y1)
    ax.set_xlabel("arithmetic intensity (FLOP / byte moved, per pass)")
    ax.set_ylabel("achieved TFLOP/s (per pass)")
    ax.grid(True, which="major", alpha=0.3)
    _legend(ax, colours)
    device = report.metadata.get("device_name") or "device"
    roofs = "" if data.ceilings or data.peak_flops else "; no peaks: no ceilings"
    fig.suptitle(f"roofline \u2014 {device}: {len(data.points)} points (forward and backward per component){roofs}")
    ax.set_title(left_out_text(data.left_out) + "; labelled: the most headroom over the step", fontsize=10)
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.08, top=0.9)
    return fig


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
    roofline_figure(report).savefig(target, dpi=_DPI)
    return target
