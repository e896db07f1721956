"""Tests of the icicle layout, figure and PNGs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from matplotlib.figure import Figure
from matplotlib.image import imread
from matplotlib.patches import Rectangle

from cb_callback._icicle import icicle_figure, icicle_rectangles, resolve_metric, save_icicles
from cb_callback._report import ComponentRow, Report

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
    assert (width, height) == (1400, 700)
    colorbar_labels = [ax.get_ylabel() for ax in fig.axes]
    assert any(label.startswith("MFU (%)") for label in colorbar_labels)
    texts = [t.get_text() for t in fig.axes[0].texts]
    # a is 0.6 of ~1100 px: wide enough for its name and 0.25 -> 25.0 %
    assert "a\n25.0%" in texts
    assert "(root)\n50.0%" in texts


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
        assert width >= 1200 and height >= 600
