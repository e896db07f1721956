"""Issue 26 §1: the roofline's points, ceilings and left-out counts; roofline.png; ``cb/roofline`` in TensorBoard.

The report is :mod:`tests._roofline_report`'s, built by hand: its docstring derives every coordinate.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.image as mpimg
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter

from cb_callback._report import roofline_chart
from cb_callback._report.context import ReportContext
from cb_callback._report.files import FileReporter
from cb_callback._report.html import render_html
from cb_callback._report.roofline import ceilings, left_out_text, roofline_data
from cb_callback._report.roofline_chart import roofline_figure, save_roofline
from cb_callback._report.tensorboard import ROOFLINE_TAG, log_report
from tests._roofline_report import EXPECTED, LEFT_OUT, roofline_report


def test_the_points_are_the_rows_numbers_exactly() -> None:
    report = roofline_report()
    data = roofline_data(report)
    assert [(p.path, p.pass_name) for p in data.points] == list(EXPECTED)
    for p in data.points:
        row = report.row(p.path)
        flops = row.fwd_flops if p.pass_name == "fwd" else row.bwd_flops
        ms = row.fwd_ms if p.pass_name == "fwd" else row.bwd_ms
        nbytes = row.details["fwd_bytes" if p.pass_name == "fwd" else "bwd_bytes"]  # type: ignore[literal-required]
        assert (p.flops, p.bytes, p.ms) == (flops, nbytes, ms)
        assert p.intensity == flops / nbytes  # x: FLOP per byte of the pass
        assert p.tflops == flops / (ms / 1e3) / 1e12  # y: achieved TFLOP/s of the pass
        x, y = EXPECTED[(p.path, p.pass_name)]
        assert p.intensity == x and math.isclose(p.tflops, y, rel_tol=1e-15), (p, x, y)
        assert p.headroom_ms == row.headroom_ms
    # a pass's share of the step: the row's share × its part of the row's time (root: 1 × 8 / 24, 1 × 16 / 24)
    assert [p.share for p in data.points[:2]] == [1.0 * 8.0 / 24.0, 1.0 * 16.0 / 24.0]


def test_the_ceilings_are_the_peaks_with_their_ridges() -> None:
    data = roofline_data(roofline_report())
    assert data.peak_flops == 1e12
    # ridge = peak FLOP/s / bandwidth: 1e12 / 4e11 = 2.5, 1e12 / 1e11 = 10; the device's bandwidth is DRAM's
    assert [(c.name, c.bandwidth, c.ridge) for c in data.ceilings] == [("L1", 4e11, 2.5), ("DRAM", 1e11, 10.0)]
    # a GPU: no levels, its one ceiling HBM; levels of one figure are one ceiling
    assert ceilings({"device": "cuda:0", "peaks": {"flops": 1e15, "bandwidth": 3.35e12}}) == (
        1e15, [("HBM", 3.35e12, 1e15 / 3.35e12)],
    )  # fmt: skip
    same = {"flops": 1e12, "levels": [{"name": "L1", "bandwidth": 2e11}, {"name": "L2", "bandwidth": 2e11}]}
    assert ceilings({"peaks": same})[1] == [("L1/L2", 2e11, 5.0)]
    assert ceilings({}) == (None, [])


def test_what_is_left_out_is_counted_per_reason() -> None:
    data = roofline_data(roofline_report())
    assert data.left_out == LEFT_OUT
    assert data.text() == (
        "left out: 3 components (1 estimated, 1 failed, 1 skipped); "
        "2 passes (1 within its noise of the harness floor, 1 without bytes); "
        "1 pass with no FLOPs counted (shown in the bandwidth panel); 3 passes never ran (no backward)"
    )
    assert left_out_text({}) == "nothing left out"
    assert data.to_dict()["left_out_text"] == data.text()


def test_every_pass_is_drawn_left_out_or_never_ran() -> None:
    # rows × 2 − points − bandwidth-panel passes = 2 × components left out + passes left out + no backward:
    # 8 × 2 − 4 − 1 = 11 = 2 × 3 + 2 + 3 (the fixture's docstring)
    report = roofline_report()
    data = roofline_data(report)
    components = sum(data.left_out.get(k, 0) for k in ("estimated", "failed", "skipped", "not_run"))
    passes = sum(data.left_out.values()) - components
    assert (len(report.rows), len(data.points), len(data.bandwidth)) == (8, 4, 1)
    assert (components, passes, data.no_backward) == (3, 2, 3)
    assert len(report.rows) * 2 - len(data.points) - len(data.bandwidth) == 2 * components + passes + data.no_backward


def test_a_pass_with_no_flops_counted_is_drawn_against_its_bandwidth_ceiling() -> None:
    report = roofline_report()
    (b,) = roofline_data(report).bandwidth
    # act's forward: 1e6 B in 0.5 ms = 1e6 / 5e-4 / 1e9 = 2 GB/s; no bw_ceiling of its own: DRAM's 100 GB/s
    assert (b.path, b.module_type, b.pass_name, b.bytes, b.ms) == ("act", "ReLU", "fwd", 1e6, 0.5)
    assert b.gbps == 2.0 and (b.ceiling, b.ceiling_gbps) == ("DRAM", 100.0)
    assert b.headroom_ms == report.row("act").headroom_ms == 0.5 - 0.01
    # a row whose working set fits L1 is bounded by L1's ceiling
    report.row("act").details["bw_ceiling"] = {"level": "L1", "gbps": 400.0}
    (b,) = roofline_data(report).bandwidth
    assert (b.ceiling, b.ceiling_gbps) == ("L1", 400.0)
    fig = roofline_figure(report)
    _main, side = fig.axes
    assert side.get_yscale() == "log" and side.get_ylabel() == "achieved GB/s (per pass)"
    assert [t.get_text() for t in side.get_xticklabels()] == ["L1"]
    (dots,) = side.collections
    assert dots.get_offsets()[0][1] == 2.0  # y: its GB/s
    assert [list(line.get_ydata()) for line in side.lines] == [[400.0, 400.0]]  # its ceiling across the column


def test_the_labels_go_to_the_plotted_components_with_most_headroom(monkeypatch: pytest.MonkeyPatch) -> None:
    report = roofline_report()
    report.row("nob").headroom_ms = 5.0  # first by headroom, but without bytes: no point, no label
    monkeypatch.setattr(roofline_chart, "_LABELLED", 3)
    fig = roofline_figure(report)
    labels = {t.get_text() for ax in fig.axes for t in ax.texts if t.get_text().endswith(("fwd", "bwd"))}
    # ranked: nob 5 (not drawn), mlp 1.0, tiny 0.99, act 0.49 (in the bandwidth panel): three labels
    assert labels == {"mlp fwd", "tiny bwd", "act fwd"}


def test_the_title_says_forward_only_without_a_backward() -> None:
    report = roofline_report()
    assert "(forward and backward per component)" in roofline_figure(report).texts[0].get_text()
    report.rows = [r for r in report.rows if r.path != "tiny"]
    root = report.row("")
    root.bwd_ms, root.bwd_flops = 0.0, 0.0
    assert roofline_figure(report).texts[0].get_text() == "roofline \u2014 test CPU: 2 points (forward per component)"


def test_an_infinite_coordinate_is_left_out_not_a_crash(tmp_path: Path) -> None:
    report = roofline_report()
    mlp = report.row("mlp")
    mlp.fwd_flops, mlp.fwd_ms = 1e308, 1e-300  # 1e308 / 1e-303 s overflows: inf FLOP/s
    data = roofline_data(report)
    assert "mlp" not in {p.path for p in data.points} and data.left_out["not_finite"] == 1
    assert "1 with an infinite FLOP/s or FLOP/byte" in data.text()
    assert save_roofline(report, tmp_path).is_file()
    writer = SummaryWriter(str(tmp_path / "tb"))
    log_report(writer, report, step=1)  # raised "Axis limits cannot be NaN or Inf"
    writer.close()


def test_the_type_colours_are_apart_from_grey_and_the_ceilings() -> None:
    points = [roofline_data(roofline_report()).points[0]._replace(module_type=f"T{i}", ms=20.0 - i) for i in range(11)]
    colours = roofline_chart._colours(points, [])
    assert list(colours.values())[9:] == [roofline_chart._OTHER] * 2  # past the ninth: "other types"
    named = set(list(colours.values())[:9])
    assert len(named) == 9 and "#7f7f7f" not in named  # tab10's grey is not beside "other" grey
    assert not named & {c for c, _ in roofline_chart._CEILING_STYLES}  # the ceilings are black/grey


def test_the_png_says_what_was_left_out() -> None:
    fig = roofline_figure(roofline_report())
    ax = fig.axes[0]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert ax.get_title().startswith(roofline_data(roofline_report()).text())
    assert "4 points" in fig.texts[0].get_text()  # the suptitle
    assert (fig.get_figwidth() * fig.dpi, fig.get_figheight() * fig.dpi) == (1600, 900)


def test_the_file_reporter_writes_roofline_png(tmp_path: Path) -> None:
    written = FileReporter(icicle_metrics=(), html=False).write(roofline_report(), ReportContext(output_dir=tmp_path))
    assert [p.name for p in written] == ["report.json", "components.csv", "roofline.png"]
    assert mpimg.imread(tmp_path / "roofline.png").shape[:2] == (900, 1600)
    assert FileReporter(icicle_metrics=(), html=False, roofline=False).write(
        roofline_report(), ReportContext(output_dir=tmp_path / "none")
    )[-1].name == "components.csv"  # fmt: skip


def test_tensorboard_gets_the_image_tagged_cb_roofline(tmp_path: Path) -> None:
    writer = SummaryWriter(str(tmp_path))
    log_report(writer, roofline_report(), step=4)
    writer.close()
    acc = EventAccumulator(str(tmp_path), size_guidance={"images": 0})
    acc.Reload()
    assert ROOFLINE_TAG == "cb/roofline" and "cb/roofline" in acc.Tags()["images"]
    (image,) = acc.Images("cb/roofline")
    assert (image.step, image.width, image.height) == (4, 1600, 900)


def test_the_page_carries_the_same_points() -> None:
    html = render_html(roofline_report())
    assert "window.cbRoofline" in html and 'id="roofline"' in html  # roofline.js inlined, its container there
    data = roofline_data(roofline_report()).to_dict()
    assert [(p["path"], p["pass_name"], p["intensity"]) for p in data["points"]] == [
        (path, name, x) for (path, name), (x, _) in EXPECTED.items()
    ]


def test_each_ceiling_is_labelled_along_its_own_line() -> None:
    fig = roofline_figure(roofline_report())
    ax = fig.axes[0]
    labels = {t.get_text(): t for t in ax.texts if "GB/s" in t.get_text()}
    assert sorted(labels) == ["DRAM 100 GB/s (ridge 10.0 FLOP/B)", "L1 400 GB/s (ridge 2.50 FLOP/B)"]
    for line, text in zip(ax.lines[0:4:2], ["L1", "DRAM"], strict=True):  # each roof: its line, its ridge marker
        (xa, xb), (ya, yb) = line.get_xdata(), line.get_ydata()
        angle = roofline_chart._along(ax, (xa, ya), (xb, yb))  # slope 1 in log-log: its angle on screen
        label = next(t for name, t in labels.items() if name.startswith(text + " "))
        # the words run along the line (not across it: a flat label on a slanted line is struck through)
        assert 10 < angle < 80 and abs(label.get_rotation() - angle) < 0.5, (text, angle, label.get_rotation())
