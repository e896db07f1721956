"""Issue 26 §1: the roofline's points, ceilings and left-out counts; roofline.png; ``cb/roofline`` in TensorBoard.

The report is :mod:`tests._roofline_report`'s, built by hand: its docstring derives every coordinate.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.image as mpimg
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter

from cb_callback._report.context import ReportContext
from cb_callback._report.files import FileReporter
from cb_callback._report.html import render_html
from cb_callback._report.roofline import ceilings, left_out_text, roofline_data
from cb_callback._report.roofline_chart import roofline_figure
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
    assert left_out_text(data.left_out) == (
        "left out: 3 components (1 estimated, 1 failed, 1 skipped); "
        "3 passes (1 at the harness floor, 1 without FLOPs, 1 without bytes)"
    )
    assert left_out_text({}) == "nothing left out"
    assert data.to_dict()["left_out_text"] == left_out_text(data.left_out)


def test_the_png_says_what_was_left_out() -> None:
    fig = roofline_figure(roofline_report())
    (ax,) = fig.axes
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert ax.get_title().startswith(left_out_text(LEFT_OUT))
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
