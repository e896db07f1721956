"""Icicle charts of a :class:`~cb_callback._report.model.Report`: the component tree as nested bars."""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Colormap, Normalize, to_rgba
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import PercentFormatter

from cb_callback._report.numbers import sig
from cb_callback._report.pixels import save_png

if TYPE_CHECKING:
    from cb_callback._report.model import ComponentRow, Report

__all__ = [
    "ICICLE_METRICS",
    "IcicleRect",
    "colour_range",
    "fit_label",
    "icicle_figure",
    "icicle_rectangles",
    "leaf_most_paths",
    "resolve_metric",
    "save_icicles",
    "short_names",
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
#: 1600x900 px: TensorBoard's Images tab shows an image at its own size, so 10 pt
#: labels (about 14 px high) stay legible there.
_FIGSIZE = (16.0, 9.0)
_DPI = 100
_FONT_SIZE = 10
_PAD_PX = 3.0  # room left between a label and its bar's edges, in pixels
_LINE_PX = _FONT_SIZE / 72 * _DPI * 1.25  # the height of one line of label text
_MIN_CHARS = 3  # a name shows at least this many characters (after the ellipsis) or not at all
_ELLIPSIS = "\u2026"
_ROW_GAP = 0.06  # vertical gap between depth levels, in data units (a level is 1)
_PERCENTILE = 0.95  # the colour scale's top, among the leaf-most components (as report.html)
# where the parts go, in figure fractions: (left, bottom, width, height)
_AXES_BOX = (0.065, 0.22, 0.915, 0.64)
_COLORBAR_BOX = (0.065, 0.075, 0.915, 0.022)
_MEASURED = ("ok", "estimated")


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

    def place(kids: Iterable[ComponentRow], x: float, width: float, parent_time: float, depth: int) -> None:
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
            out.append(IcicleRect(kid.path, x, w, depth, value if math.isfinite(value) else math.nan))
            place(children.get(kid.path, []), x, w, t, depth + 1)
            x += w

    top = children.get(None, [])
    place(top, 0.0, 1.0, math.fsum(_time(r) for r in top), 0)
    return out


def short_names(paths: Iterable[str]) -> dict[str, str]:
    """The shortest unambiguous name of each path: its last dotted parts, as few as are unique.

    A name is the shortest tail of ``path`` (whole dotted parts) that is the
    tail of no other path; one that would start with an index (``3.attn``)
    takes the part before it too (``blocks.3.attn``). The root ``""`` is
    ``"(root)"``.

    Example:
        ``["blocks.0.attn", "blocks.1.attn", "head"]`` gives ``blocks.0.attn``,
        ``blocks.1.attn`` and ``head``.
    """
    parts = {p: p.split(".") for p in dict.fromkeys(paths) if p}
    tails = Counter(".".join(ps[-k:]) for ps in parts.values() for k in range(1, len(ps) + 1))
    out = {"": "(root)"}
    for path, ps in parts.items():
        for k in range(1, len(ps) + 1):
            tail = ps[-k:]
            if tails[".".join(tail)] == 1 and (not tail[0].isdigit() or k == len(ps)):
                break
        out[path] = ".".join(tail)
    return out


def _value_text(value: float, scale: float, column: str) -> str:
    if not math.isfinite(value):
        return ""
    v = value * scale
    if column == "mfu":  # 3 significant figures (numbers.sig): a small non-zero MFU is never "0.0%"
        return f"{sig(v)}%"
    return f"{sig(v)} {_UNITS[column]}"


class _Measure:
    """Text widths in pixels of :data:`_FONT_SIZE` labels at :data:`_DPI`, as the Agg renderer draws them.

    Kept per process (the last :data:`_WIDTHS_KEPT` texts): a report's three icicles label the
    same bars with the same names, and the next capture's mostly too.
    """

    def __init__(self, canvas: FigureCanvasAgg) -> None:
        self._renderer = canvas.get_renderer()
        self._font = FontProperties(size=_FONT_SIZE)  # the family rcParams name now
        self._dpi = canvas.figure.dpi

    def __call__(self, text: str) -> float:
        key = (hash(self._font), self._dpi, text)  # another font (rcParams changed) is measured anew
        width = _WIDTHS.get(key)
        if width is None:
            width = float(self._renderer.get_text_width_height_descent(text, self._font, ismath=False)[0])
            with _WIDTHS_LOCK:  # reports may be drawn on several threads at once
                _WIDTHS[key] = width
                while len(_WIDTHS) > _WIDTHS_KEPT:
                    del _WIDTHS[next(iter(_WIDTHS))]  # the oldest
        return width


#: Label widths measured in this process (:class:`_Measure`) by font, dpi and text, oldest first.
_WIDTHS: dict[tuple[int, float, str], float] = {}
_WIDTHS_KEPT = 20_000
_WIDTHS_LOCK = threading.Lock()


def fit_label(name: str, room_px: float, width_of: Callable[[str], float]) -> str | None:
    """``name`` if it fits in ``room_px``, else its longest tail after ``"…"`` that does.

    A longer tail is never narrower (each character adds its advance), so the longest
    tail that fits is found by bisection: a few measurements, not one per character.

    Returns:
        The text, or ``None`` when not even ``"…"`` and :data:`_MIN_CHARS`
        characters fit (a name shorter than that shows whole or not at all).
        A tail never starts with the dot it was cut after.
    """
    if width_of(name) <= room_px:
        return name
    low, high = _MIN_CHARS - 1, len(name)  # the longest tail that fits has low < keep < high, if any
    while high - low > 1:
        keep = (low + high) // 2
        if width_of(_ELLIPSIS + name[-keep:]) <= room_px:
            low = keep
        else:
            high = keep
    for keep in range(low, _MIN_CHARS - 1, -1):
        tail = name[-keep:]
        if not tail.startswith("."):  # "…mlp.fc1", not "….mlp.fc1"
            return _ELLIPSIS + tail
    return None


def _is_dark(color: str | tuple[float, float, float, float]) -> bool:
    """Whether white text reads better than black on ``color`` (relative luminance)."""
    red, green, blue, _ = to_rgba(color)
    return 0.2126 * red + 0.7152 * green + 0.0722 * blue < 0.45


def leaf_most_paths(report: Report) -> set[str]:
    """Measured components other than the root with no measured child (what the colours are scaled on)."""
    parents = {r.parent for r in report.rows if r.parent is not None and r.status in _MEASURED}
    return {r.path for r in report.rows if r.path and r.status in _MEASURED and r.path not in parents}


def colour_range(report: Report, rects: Sequence[IcicleRect], scale: float) -> tuple[float, float]:
    """``(low, high)`` of the colour scale, in display units (``value * scale``).

    ``high`` is the 95th percentile (nearest rank, as ``report.html``) of the
    finite values of the leaf-most bars (:func:`leaf_most_paths`); all bars'
    when no leaf-most bar has a value. ``low`` is ``min(0, smallest)``. A parent
    sums its children, so scaling on every bar would let the root take the top
    of the scale and leave the hotspots dark; bars above ``high`` saturate.
    """
    leaves = leaf_most_paths(report)
    values = sorted(r.value * scale for r in rects if r.path in leaves and math.isfinite(r.value))
    if not values:
        values = sorted(r.value * scale for r in rects if math.isfinite(r.value))
    if not values:
        return 0.0, 1.0
    high = values[min(len(values) - 1, math.floor(_PERCENTILE * (len(values) - 1) + 0.5))]
    low = min(0.0, values[0])
    return low, high if high > low else low + 1.0


def icicle_figure(report: Report, metric: str = "mfu") -> Figure:
    """An icicle chart of the component tree, coloured by ``metric``.

    Args:
        report: the report to draw.
        metric: ``"mfu"``, ``"total_ms"`` (alias ``"latency"``) or
            ``"peak_mem_mb"`` (alias ``"memory"``).

    Returns:
        A 1600x900 px figure (not managed by pyplot) with one
        :class:`~matplotlib.patches.Rectangle` per bar of
        :func:`icicle_rectangles`, each tagged with its path by ``set_gid``;
        grey bars have no value. Each bar wide enough for :data:`_MIN_CHARS`
        characters carries its :func:`short_names` name (cut from the left
        with "…" to fit: :func:`fit_label`), and its value below when that
        fits too; 10 pt text. A horizontal colorbar names the metric, its unit
        and its range (:func:`colour_range`); a legend says what a blank area
        and a grey bar mean. A report with no measured time gives a figure
        saying so.

    Notes:
        Widths are shares of the step's time in the real call pattern (a module
        called twice counts twice); colours are per call. The blank part under
        a bar is the time of that component not spent in a measured child:
        its own code (or children that failed or were skipped).
    """
    column = resolve_metric(metric)
    label, scale, cmap_name = ICICLE_METRICS[column]
    fig = Figure(figsize=_FIGSIZE, dpi=_DPI)
    canvas = FigureCanvasAgg(fig)
    device = report.metadata.get("device_name")
    title = f"component icicle: {label}" + (f" on {device}" if device else "")
    fig.suptitle(title, x=_AXES_BOX[0], ha="left", y=0.955, fontsize=14)
    ax = fig.add_axes(_AXES_BOX)

    rects = icicle_rectangles(report, column)
    if not rects:
        ax.set_axis_off()
        ax.text(0.5, 0.5, "no measured components", ha="center", va="center", fontsize=14)
        return fig

    norm, cmap = _colour_key(fig, report, rects, label, scale, cmap_name)
    levels = max(r.depth for r in rects) + 1
    _depth_axes(ax, levels)
    _draw_bars(ax, canvas, report, rects, norm, cmap, scale, column, levels)
    return fig


def _colour_key(
    fig: Figure, report: Report, rects: Sequence[IcicleRect], label: str, scale: float, cmap_name: str
) -> tuple[Normalize, Colormap]:
    """Add the colorbar (its range :func:`colour_range`, extended when a bar saturates) and the legend.

    Returns:
        ``(norm, cmap)``: the bars' colour is ``cmap(norm(value * scale))``.
    """
    low, high = colour_range(report, rects, scale)
    norm = Normalize(vmin=low, vmax=high)
    cmap = colormaps[cmap_name]
    saturated = any(math.isfinite(r.value) and r.value * scale > high for r in rects)
    colorbar = fig.colorbar(
        ScalarMappable(norm=norm, cmap=cmap), cax=fig.add_axes(_COLORBAR_BOX),
        orientation="horizontal", extend="max" if saturated else "neither",
    )  # fmt: skip
    colorbar.set_label(
        f"{label}: scaled on the leaf-most components (top: their 95th percentile); "
        "bars above the top (often parents) saturate",
        fontsize=_FONT_SIZE + 1,
    )
    legend = [
        Patch(
            facecolor="white", edgecolor="#808080", label="blank below a bar: its own time (not in a measured child)"
        ),
        Patch(facecolor=_NAN_COLOR, edgecolor="white", label="grey: no value"),
    ]
    fig.legend(
        handles=legend, loc="lower left", bbox_to_anchor=(_AXES_BOX[0], _AXES_BOX[1] + _AXES_BOX[3] + 0.005),
        ncols=2, frameon=False, fontsize=_FONT_SIZE + 1, borderaxespad=0.0,
    )  # fmt: skip
    return norm, cmap


def _depth_axes(ax: Axes, levels: int) -> None:
    """Shares of the root's time across (as percent), one labelled row per depth down, no top or right spine."""
    ax.set_xlim(0.0, 1.0)
    ax.set_ylim(levels, 0.0)
    ax.set_yticks([d + 0.5 for d in range(levels)], [f"depth {d}" for d in range(levels)])
    ax.xaxis.set_major_formatter(PercentFormatter(xmax=1.0))
    ax.set_xlabel("share of the root's time over the step (time = total_ms x calls)", fontsize=_FONT_SIZE + 1)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _draw_bars(
    ax: Axes,
    canvas: FigureCanvasAgg,
    report: Report,
    rects: Sequence[IcicleRect],
    norm: Normalize,
    cmap: Colormap,
    scale: float,
    column: str,
    levels: int,
) -> None:
    """One rectangle per bar, tagged with its path, and its label where it fits (:func:`fit_label`)."""
    axes_px = _AXES_BOX[2] * _FIGSIZE[0] * _DPI
    bar_px = _AXES_BOX[3] * _FIGSIZE[1] * _DPI / levels * (1.0 - _ROW_GAP)
    lines_fit = int((bar_px - _PAD_PX) // _LINE_PX)
    names = short_names(r.path for r in report.rows)
    width_of = _Measure(canvas)
    for r in rects:
        color = cmap(norm(r.value * scale)) if math.isfinite(r.value) else _NAN_COLOR
        rect = Rectangle(
            (r.x, r.depth + _ROW_GAP / 2), r.width, 1.0 - _ROW_GAP,
            facecolor=color, edgecolor="white", linewidth=0.8,
        )  # fmt: skip
        rect.set_gid(r.path)
        ax.add_patch(rect)
        room = r.width * axes_px - 2 * _PAD_PX
        name = fit_label(names.get(r.path, r.path), room, width_of) if lines_fit >= 1 else None
        if name is None:
            continue
        value = _value_text(r.value, scale, column)
        text = f"{name}\n{value}" if value and lines_fit >= 2 and width_of(value) <= room else name
        ax.text(
            r.x + r.width / 2, r.depth + 0.5, text,
            ha="center", va="center", fontsize=_FONT_SIZE, clip_on=True,
            color="white" if _is_dark(color) else "black",
        )  # fmt: skip


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
        # the pixels TensorBoard's image shares: drawn once per report (cb_callback._report.pixels)
        written.append(save_png(path, _DPI, report, icicle_figure, column))
    return written
