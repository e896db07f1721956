"""Tests of the icicle layout, figure and PNGs."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.image import imread
from matplotlib.patches import Rectangle

from cb_callback._report.icicle import (
    _Measure,
    colour_range,
    fit_label,
    icicle_figure,
    icicle_rectangles,
    leaf_most_paths,
    resolve_metric,
    save_icicles,
    short_names,
)
from cb_callback._report.model import ComponentRow, Report

NAN = math.nan


def _report() -> Report:
    rows = [
        ComponentRow("", "Net", 0, None, "ok", calls=1, total_ms=10.0, mfu=0.5, peak_mem_mb=8.0),
        ComponentRow("a", "Block", 1, "", "ok", calls=1, total_ms=6.0, mfu=0.25, peak_mem_mb=4.0),
        ComponentRow("b", "Block", 1, "", "ok", calls=1, total_ms=3.0, peak_mem_mb=2.0),
        ComponentRow("c", "Block", 1, "", "failed", error="boom"),
        ComponentRow("a.x", "Linear", 2, "a", "ok", calls=2, total_ms=2.0, mfu=0.1),
        ComponentRow("c.0", "Linear", 2, "c", "ok", calls=1, total_ms=1.0),
    ]
    return Report(rows, {"device_name": "cpu"})


def _drawn(fig: Figure) -> dict[str, Rectangle]:
    return {
        str(p.get_gid()): p
        for ax in fig.axes
        for p in ax.patches
        if isinstance(p, Rectangle) and p.get_gid() is not None
    }


def test_layout_exact() -> None:
    rects = icicle_rectangles(_report(), "mfu")
    # times (total_ms x calls): root 10, a 6, b 3, a.x 2 x 2 = 4 -> a.x is 4/6 of a's 0.6.
    # c has no time: no bar, and neither has its child c.0.
    expected = [
        ("", 0.0, 1.0, 0, 0.5),
        ("a", 0.0, 0.6, 1, 0.25),
        ("a.x", 0.0, 0.4, 2, 0.1),
        ("b", 0.6, 0.3, 1, NAN),
    ]
    assert [r.path for r in rects] == [e[0] for e in expected]
    for got, want in zip(rects, expected, strict=True):
        assert got.x == pytest.approx(want[1], abs=1e-12)
        assert got.width == pytest.approx(want[2], abs=1e-12)
        assert got.depth == want[3]
        assert got.value == pytest.approx(want[4], nan_ok=True)


def test_layout_scales_children_that_overflow_the_parent() -> None:
    rows = [
        ComponentRow("", "Net", 0, None, "estimated", calls=1, total_ms=10.0),
        ComponentRow("a", "L", 1, "", "ok", calls=1, total_ms=8.0),
        ComponentRow("b", "L", 1, "", "ok", calls=1, total_ms=4.0),
        ComponentRow("z", "L", 1, "", "ok", calls=3, total_ms=0.0),
    ]
    rects = icicle_rectangles(Report(rows), "total_ms")
    # 8 + 4 = 12 > 10: both scaled by 10 / 12 -> a 8/12, b 4/12; z has zero time
    assert [(r.path, r.depth, r.value) for r in rects] == [
        ("", 0, 10.0), ("a", 1, 8.0), ("b", 1, 4.0),
    ]  # fmt: skip
    assert [r.x for r in rects] == pytest.approx([0.0, 0.0, 8 / 12])
    assert [r.width for r in rects] == pytest.approx([1.0, 8 / 12, 4 / 12])


def test_metric_aliases_and_unknown_metric() -> None:
    report = _report()
    assert resolve_metric("latency") == "total_ms"
    assert resolve_metric("memory") == "peak_mem_mb"
    assert [r.value for r in icicle_rectangles(report, "latency")] == [10.0, 6.0, 2.0, 3.0]
    memory = [r.value for r in icicle_rectangles(report, "memory")]
    assert memory[:2] == [8.0, 4.0] and math.isnan(memory[2]) and memory[3] == 2.0
    with pytest.raises(ValueError, match="not supported"):
        icicle_rectangles(report, "flops")


def test_figure_rectangles_match_layout() -> None:
    report = _report()
    fig = icicle_figure(report, "mfu")
    drawn = _drawn(fig)
    layout = icicle_rectangles(report, "mfu")
    assert set(drawn) == {r.path for r in layout}
    assert len(drawn) == 4
    for r in layout:
        assert drawn[r.path].get_x() == pytest.approx(r.x)
        assert drawn[r.path].get_width() == pytest.approx(r.width)
    # b has no MFU: grey
    assert drawn["b"].get_facecolor()[:3] == pytest.approx((200 / 255,) * 3)
    width, height = fig.get_size_inches() * fig.dpi
    assert (width, height) == (1600, 900)
    # the horizontal colorbar (the second axes) names the metric and how it is scaled
    colorbar_label = fig.axes[1].get_xlabel()
    assert colorbar_label.startswith("MFU (%): scaled on the leaf-most components (top: their 95th percentile)")
    texts = [t.get_text() for t in fig.axes[0].texts]
    # a is 0.6 of 1464 px: wide enough for its name and 0.25 -> 25.0 %
    assert "a\n25.0%" in texts
    assert "(root)\n50.0%" in texts
    # the legend explains the blank under a bar and the grey
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == [
        "blank below a bar: its own time (not in a measured child)", "grey: no value",
    ]  # fmt: skip


def test_narrow_bar_has_no_label() -> None:
    rows = [
        ComponentRow("", "Net", 0, None, "ok", calls=1, total_ms=1000.0, mfu=0.5),
        ComponentRow("tiny", "L", 1, "", "ok", calls=1, total_ms=1.0, mfu=0.5),
    ]
    fig = icicle_figure(Report(rows), "mfu")
    assert set(_drawn(fig)) == {"", "tiny"}
    # tiny is 1/1000 of the width, about one pixel
    assert [t.get_text() for t in fig.axes[0].texts] == ["(root)\n50.0%"]


def test_no_measured_components() -> None:
    report = Report([ComponentRow("", "Net", 0, None, "failed", error="boom")])
    assert icicle_rectangles(report) == []
    fig = icicle_figure(report, "total_ms")
    assert _drawn(fig) == {}
    assert [t.get_text() for t in fig.axes[0].texts] == ["no measured components"]


def test_save_icicles_png_size(tmp_path: Path) -> None:
    paths = save_icicles(_report(), tmp_path / "out", metrics=("mfu", "latency"))
    assert paths == [tmp_path / "out" / "icicle_mfu.png", tmp_path / "out" / "icicle_total_ms.png"]
    for path in paths:
        height, width = imread(path).shape[:2]
        assert (width, height) == (1600, 900)


# --- labels and colours --------------------------------------------------------------------


def test_short_names_are_unambiguous_tails() -> None:
    paths = ["", "embed", "blocks", "blocks.0", "blocks.0.attn", "blocks.1.attn", "enc.fc", "dec.fc", "head.0"]
    assert short_names(paths) == {
        "": "(root)",
        "embed": "embed",
        "blocks": "blocks",
        "blocks.0": "blocks.0",  # "0" is unique, but an index alone says nothing
        "blocks.0.attn": "blocks.0.attn",  # "attn" twice; "0.attn" starts with an index
        "blocks.1.attn": "blocks.1.attn",
        "enc.fc": "enc.fc",  # "fc" twice
        "dec.fc": "dec.fc",
        "head.0": "head.0",
    }
    # a path that is the tail of another keeps its whole self
    assert short_names(["a", "x.a"]) == {"": "(root)", "a": "a", "x.a": "x.a"}


def test_fit_label_cuts_from_the_left() -> None:
    def ten_px(text: str) -> float:
        return 10.0 * len(text)  # every character (the ellipsis too) 10 px wide

    assert fit_label("blocks.3.attn", 130, ten_px) == "blocks.3.attn"  # 13 characters
    # 100 px: the ellipsis and the last 9 characters
    assert fit_label("blocks.3.attn", 100, ten_px) == "\u2026ks.3.attn"
    # 40 px: the ellipsis and 3 characters, the least shown; 39 px: nothing
    assert fit_label("blocks.3.attn", 40, ten_px) == "\u2026ttn"
    assert fit_label("blocks.3.attn", 39, ten_px) is None
    # a tail does not start with the dot it was cut after: 80 px fit 8, "….mlp.fc1" would be 9
    assert fit_label("a.mlp.fc1", 80, ten_px) == "\u2026mlp.fc1"
    # a short name shows whole or not at all
    assert fit_label("fc", 20, ten_px) == "fc"
    assert fit_label("fc", 19, ten_px) is None


def _fit_label_by_scanning(name: str, room_px: float, width_of: Callable[[str], float]) -> str | None:
    """fit_label's rule spelled out: the whole name, else every tail from the longest down (3 characters at least)."""
    if width_of(name) <= room_px:
        return name
    for keep in range(len(name) - 1, 2, -1):
        tail = name[-keep:]
        if not tail.startswith(".") and width_of("\u2026" + tail) <= room_px:
            return "\u2026" + tail
    return None


def test_fit_label_finds_what_trying_every_tail_finds_with_the_real_font() -> None:
    fig = Figure(figsize=(16.0, 9.0), dpi=100)
    width_of = _Measure(FigureCanvasAgg(fig))
    names = ["blocks.11.attn.c_proj", "encoder.layers.3.self_attn.out_proj", "a.mlp.fc1", "fc", "W" * 30,
             "iiiiiiiiii.llll.WWWW.mmm", "tables.0", "x.y.z", "over.0.1.2.3.4.5.6.7.8.9"]  # fmt: skip
    compared = 0
    for name in names:
        for room in range(0, int(width_of(name)) + 12, 3):
            assert fit_label(name, room, width_of) == _fit_label_by_scanning(name, room, width_of), (name, room)
            compared += 1
    assert compared > 300


def _wide_report(leaves: int = 21) -> Report:
    """A root over ``leaves`` leaves ``l0``... of 1, 2, ... ms; the root is their sum."""
    rows = [ComponentRow("", "Net", 0, None, "ok", calls=1, total_ms=leaves * (leaves + 1) / 2)]
    rows += [ComponentRow(f"l{i}", "Linear", 1, "", "ok", calls=1, total_ms=float(i + 1)) for i in range(leaves)]
    return Report(rows)


def test_colour_scale_is_the_leaf_most_95th_percentile() -> None:
    report = _wide_report()
    rects = icicle_rectangles(report, "total_ms")
    assert leaf_most_paths(report) == {f"l{i}" for i in range(21)}
    # leaves 1..21 ms: nearest rank floor(0.95 x 20 + 0.5) = 19 -> 20 ms; the root (231 ms) saturates
    assert colour_range(report, rects, 1.0) == (0.0, 20.0)
    fig = icicle_figure(report, "total_ms")
    drawn = _drawn(fig)
    plasma = colormaps["plasma"]  # total_ms's colormap
    assert drawn[""].get_facecolor() == pytest.approx(plasma(1.0))
    assert drawn["l20"].get_facecolor() == pytest.approx(plasma(1.0))  # 21 ms > 20: saturates too
    assert drawn["l9"].get_facecolor() == pytest.approx(plasma(0.5))  # 10 ms of 20
    # the small report: the leaf-most measured rows are b, a.x and c.0 (c.0 has no bar): MFU 10 % tops
    small = _report()
    assert leaf_most_paths(small) == {"b", "a.x", "c.0"}
    assert colour_range(small, icicle_rectangles(small, "mfu"), 100.0) == (0.0, 10.0)


def _transformer(blocks: int) -> Report:
    """embed, ``blocks`` blocks of attn (qkv, proj) and mlp (fc1, fc2), norm and head: 3 + 7 x blocks rows."""
    rows = [ComponentRow("", "GPT", 0, None, "estimated", calls=1, total_ms=10.0 * blocks + 4.0, mfu=0.3)]
    rows.append(ComponentRow("embed", "Embedding", 1, "", "ok", calls=1, total_ms=1.0, mfu=0.01))
    for b in range(blocks):
        p = f"blocks.{b}"
        rows += [
            ComponentRow(p, "Block", 1, "", "estimated", calls=1, total_ms=10.0, mfu=0.3),
            ComponentRow(f"{p}.attn", "Attention", 2, p, "ok", calls=1, total_ms=6.0, mfu=0.2),
            ComponentRow(f"{p}.attn.qkv", "Linear", 3, f"{p}.attn", "ok", calls=1, total_ms=3.0, mfu=0.5),
            ComponentRow(f"{p}.attn.proj", "Linear", 3, f"{p}.attn", "ok", calls=1, total_ms=1.0, mfu=0.4),
            ComponentRow(f"{p}.mlp", "MLP", 2, p, "ok", calls=1, total_ms=4.0, mfu=0.45),
            ComponentRow(f"{p}.mlp.fc1", "Linear", 3, f"{p}.mlp", "ok", calls=1, total_ms=2.0, mfu=0.5),
            ComponentRow(f"{p}.mlp.fc2", "Linear", 3, f"{p}.mlp", "ok", calls=1, total_ms=1.8, mfu=0.5),
        ]
    rows.append(ComponentRow("head", "Linear", 1, "", "ok", calls=1, total_ms=3.0, mfu=0.6))
    return Report(rows, {"device_name": "cpu"})


def test_labels_fit_their_bars_and_name_the_block() -> None:
    fig = icicle_figure(_transformer(3), "mfu")
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    ax = fig.axes[0]
    drawn = _drawn(fig)
    texts = {t.get_text(): t for t in ax.texts}
    # each block's bar is 10 of 34 ms of 1464 px (430 px): its full path and MFU fit
    assert "blocks.1\n30.0%" in texts
    assert "blocks.1.attn\n20.0%" in texts
    # qkv: 3 of 34 ms, 129 px: "blocks.0.attn.qkv" (119 px in 10 pt DejaVu Sans) fits whole
    assert "blocks.0.attn.qkv\n50.0%" in texts
    # fc1: 2 of 34 ms, 86 px less 2 x 3 px of padding: cut from the left to its 80 px
    assert "\u2026" + "2.mlp.fc1\n50.0%" in texts
    # proj: 1 of 34 ms, 43 px: the ellipsis and 3 characters, no room for the value
    assert [t for t in texts if t.endswith("roj")] == ["\u2026roj"]  # the same text for the 3 blocks
    assert [t.get_text() for t in ax.texts].count("\u2026roj") == 3
    for text in ax.texts:
        x_px = ax.transData.transform([(text.get_position()[0], 0.0)])[0][0]
        bar = next(
            r
            for r in drawn.values()
            if r.get_x() <= text.get_position()[0] <= r.get_x() + r.get_width()
            and r.get_y() <= text.get_position()[1] <= r.get_y() + r.get_height()
        )
        (left, _), (right, _) = ax.transData.transform([(bar.get_x(), 0.0), (bar.get_x() + bar.get_width(), 0.0)])
        extent = text.get_window_extent(renderer)
        assert left < extent.x0 and extent.x1 < right, text.get_text()
        assert abs((extent.x0 + extent.x1) / 2 - x_px) < 1.0
