"""Icicle charts of a :class:`~cb_callback._report.Report`: the component tree as nested bars."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize, to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

if TYPE_CHECKING:
    from cb_callback._report import ComponentRow, Report

__all__ = [
    "ICICLE_METRICS",
    "IcicleRect",
    "icicle_figure",
    "icicle_rectangles",
    "resolve_metric",
    "save_icicles",
]

#: The metrics an icicle can be coloured by: column -> (label with unit, scale, colormap).
ICICLE_METRICS: dict[str, tuple[str, float, str]] = {
    "mfu": ("MFU (%)", 100.0, "viridis"),
    "total_ms": ("latency (ms per call, fwd + bwd)", 1.0, "plasma"),
    "peak_mem_mb": ("peak memory (MiB per call)", 1.0, "cividis"),
}

_UNITS = {"mfu": "%", "total_ms": "ms", "peak_mem_mb": "MiB"}
_ALIASES = {"latency": "total_ms", "memory": "peak_mem_mb"}
_NAN_COLOR = "#c8c8c8"
_FIGSIZE = (14.0, 7.0)
_DPI = 100
_FONT_SIZE = 8
_CHAR_PX = 6.0  # about the width of one character at _FONT_SIZE, in pixels at _DPI
_ROW_GAP = 0.06  # vertical gap between depth levels, in data units (a level is 1)


class IcicleRect(NamedTuple):
    """One component's bar: ``x`` and ``width`` are fractions of the root's width.

    ``depth`` is the level under the drawn root (0); ``value`` the row's metric
    (raw units: ``mfu`` is a fraction), NaN when it has none.
    """

    path: str
    x: float
    width: float
    depth: int
    value: float


def resolve_metric(metric: str) -> str:
    """The report column an icicle metric name refers to (``"latency"`` -> ``"total_ms"``).

    Raises:
        ValueError: for a metric that is neither a column of :data:`ICICLE_METRICS`
            nor an alias.
    """
    column = _ALIASES.get(metric, metric)
    if column not in ICICLE_METRICS:
        known = sorted([*ICICLE_METRICS, *_ALIASES])
        raise ValueError(f"icicle metric {metric!r} is not supported; use one of {known}")
    return column


def _time(row: ComponentRow) -> float:
    """Time over the step: per-call ``total_ms`` times the call count (at least 1)."""
    t = float(row.total_ms) * max(row.calls, 1)
    return t if math.isfinite(t) and t > 0 else 0.0


def icicle_rectangles(report: Report, metric: str = "mfu") -> list[IcicleRect]:
    """The icicle layout of ``report``: one bar per component with time, parents first.

    Args:
        report: the report to lay out.
        metric: the value to attach to each bar (see :func:`resolve_metric`).

    Returns:
        Bars in depth-first order. The root spans ``[0, 1]``; each child sits
        under its parent, left to right in report order, with a width of its
        share of the parent's time (time = ``total_ms * max(calls, 1)``). When
        the children's shares add up to more than the parent (estimates, timing
        noise), they are scaled down together to fit. A component with zero or
        non-finite time gets no bar, nor do its descendants. Rows whose parent
        is not in the report are roots; several roots share the width by time.
    """
    column = resolve_metric(metric)
    paths = {r.path for r in report.rows}
    children: dict[str | None, list[ComponentRow]] = {}
    for r in report.rows:
        parent = r.parent if r.parent in paths else None
        children.setdefault(parent, []).append(r)

    out: list[IcicleRect] = []
    placed: set[str] = set()

    def place(
        kids: Iterable[ComponentRow], x: float, width: float, parent_time: float, depth: int
    ) -> None:
        timed = [(k, _time(k)) for k in kids]
        timed = [(k, t) for k, t in timed if t > 0 and k.path not in placed]
        placed.update(k.path for k, _ in timed)  # a malformed parent cycle ends here
        if not timed or width <= 0:
            return
        widths = [width * t / parent_time for _, t in timed]
        total = math.fsum(widths)
        if total > width:
            widths = [w * width / total for w in widths]
        for (kid, t), w in zip(timed, widths, strict=True):
            value = float(getattr(kid, column))
            out.append(
                IcicleRect(kid.path, x, w, depth, value if math.isfinite(value) else math.nan)
            )
            place(children.get(kid.path, []), x, w, t, depth + 1)
            x += w

    top = children.get(None, [])
    place(top, 0.0, 1.0, math.fsum(_time(r) for r in top), 0)
    return out


def _label(path: str, value: float, scale: float, column: str) -> str:
    name = path.rsplit(".", 1)[-1] if path else "(root)"
    if not math.isfinite(value):
        return name
    text = f"{value * scale:.1f}%" if column == "mfu" else f"{value * scale:.3g} {_UNITS[column]}"
    return f"{name}\n{text}"


def _is_dark(color: Any) -> bool:
    """Whether white text reads better than black on ``color`` (relative luminance)."""
    red, green, blue, _ = to_rgba(color)
    return 0.2126 * red + 0.7152 * green + 0.0722 * blue < 0.45


def icicle_figure(report: Report, metric: str = "mfu") -> Figure:
    """An icicle chart of the component tree, coloured by ``metric``.

    Args:
        report: the report to draw.
        metric: ``"mfu"``, ``"total_ms"`` (alias ``"latency"``) or
            ``"peak_mem_mb"`` (alias ``"memory"``).

    Returns:
        A 1400x700 px figure (not managed by pyplot) with one
        :class:`~matplotlib.patches.Rectangle` per bar of
        :func:`icicle_rectangles`, each tagged with its path by ``set_gid``;
        grey bars have no value. A colorbar names the metric and its unit; bars
        wide enough carry the last path component and the value. A report with
        no measured time gives a figure saying so.

    Notes:
        Widths are shares of the step's time in the real call pattern (a module
        called twice counts twice); colours are per call.
    """
    column = resolve_metric(metric)
    label, scale, cmap_name = ICICLE_METRICS[column]
    fig = Figure(figsize=_FIGSIZE, dpi=_DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    device = report.metadata.get("device_name")
    title = f"component icicle: {label}" + (f" on {device}" if device else "")
    ax.set_title(title)

    rects = icicle_rectangles(report, column)
    if not rects:
        ax.set_axis_off()
        ax.text(0.5, 0.5, "no measured components", ha="center", va="center", fontsize=14)
        return fig

    finite = [r.value * scale for r in rects if math.isfinite(r.value)]
    vmax = max(finite, default=1.0)
    vmin = min(0.0, *finite) if finite else 0.0
    norm = Normalize(vmin=vmin, vmax=vmax if vmax > vmin else vmin + 1.0)
    cmap = colormaps[cmap_name]
    mappable = ScalarMappable(norm=norm, cmap=cmap)
    fig.colorbar(mappable, ax=ax, label=label + " (grey: no value)")

    levels = max(r.depth for r in rects) + 1
    ax.set_xlim(0.0, 1.0)
    ax.set_ylim(levels, 0.0)
    ax.set_yticks([d + 0.5 for d in range(levels)], [f"depth {d}" for d in range(levels)])
    ax.set_xlabel("share of the root's time (time = total_ms x calls)")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)

    axes_px = ax.get_position().width * fig.get_figwidth() * fig.dpi
    for r in rects:
        color = cmap(norm(r.value * scale)) if math.isfinite(r.value) else _NAN_COLOR
        rect = Rectangle(
            (r.x, r.depth + _ROW_GAP / 2), r.width, 1.0 - _ROW_GAP,
            facecolor=color, edgecolor="white", linewidth=0.8,
        )  # fmt: skip
        rect.set_gid(r.path)
        ax.add_patch(rect)
        text = _label(r.path, r.value, scale, column)
        if r.width * axes_px >= _CHAR_PX * max(len(s) for s in text.split("\n")) + 4:
            ax.text(
                r.x + r.width / 2, r.depth + 0.5, text,
                ha="center", va="center", fontsize=_FONT_SIZE, clip_on=True,
                color="white" if _is_dark(color) else "black",
            )  # fmt: skip
    return fig


def save_icicles(
    report: Report,
    directory: str | Path,
    metrics: Iterable[str] = ("mfu", "total_ms", "peak_mem_mb"),
) -> list[Path]:
    """Write one ``icicle_<metric>.png`` per metric into ``directory`` (created if missing).

    Aliases are written under their column's name (``"latency"`` ->
    ``icicle_total_ms.png``).

    Returns:
        The written files, in the order of ``metrics``.
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for metric in metrics:
        column = resolve_metric(metric)
        path = out / f"icicle_{column}.png"
        icicle_figure(report, column).savefig(path, dpi=_DPI)
        written.append(path)
    return written
