"""Each image of a report drawn once: the PNG files and TensorBoard's images are the same pixels."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import cb_callback._report.icicle as icicle_module
import cb_callback._report.roofline_chart as roofline_module
import cb_callback._report.tensorboard as tensorboard_module
from cb_callback._report import pixels
from cb_callback._report.context import ReportContext
from cb_callback._report.files import FileReporter
from cb_callback._report.icicle import icicle_figure, save_icicles
from cb_callback._report.model import ComponentRow, Report
from cb_callback._report.roofline_chart import roofline_figure
from cb_callback._report.tensorboard import log_report

PNGS = ("icicle_mfu.png", "icicle_total_ms.png", "icicle_peak_mem_mb.png", "roofline.png")


def _report(root_ms: float = 10.0) -> Report:
    rows = [
        ComponentRow(
            "", "Net", 0, None, "ok", calls=1, fwd_ms=4.0, bwd_ms=root_ms - 4.0, total_ms=root_ms,
            fwd_flops=2e9, bwd_flops=4e9, tflops=0.6, mfu=0.3, peak_mem_mb=12.0, gbps=50.0, bw_util=0.125,
        ),
        ComponentRow(
            "enc", "Linear", 1, "", "ok", calls=2, fwd_ms=1.0, bwd_ms=2.0, total_ms=3.0,
            fwd_flops=1e9, bwd_flops=2e9, tflops=1.0, mfu=0.5, peak_mem_mb=4.0, gbps=20.0,
        ),
    ]  # fmt: skip
    return Report(rows, {"device_name": "cpu", "dtype": "float32", "peak_flops": 2e12, "peak_bandwidth": 4e11})


@pytest.fixture(autouse=True)
def _nothing_kept() -> None:
    pixels._kept.clear()


class _Counting:
    """Wraps a figure function and counts its calls."""

    def __init__(self, draw: Any) -> None:
        self.draw, self.calls = draw, 0

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        return self.draw(*args)


def test_write_png_writes_the_bytes_savefig_writes(tmp_path: Path) -> None:
    report = _report()
    for name, draw in [("icicle", lambda: icicle_figure(report, "mfu")), ("roofline", lambda: roofline_figure(report))]:
        saved = io.BytesIO()
        draw().savefig(saved, dpi=100)
        written = pixels.write_png(pixels.figure_pixels(draw()), tmp_path / f"{name}.png", dpi=100)
        assert written == tmp_path / f"{name}.png"
        assert written.read_bytes() == saved.getvalue()


@pixels.sharing()
def test_an_image_is_drawn_once_for_two_uses_and_again_when_the_report_changes() -> None:
    report, drawn = _report(), _Counting(icicle_figure)
    first = pixels.rendered(report, drawn, "mfu")
    assert first.shape == (900, 1600, 4) and first.dtype == np.uint8 and not first.flags.writeable
    # the second use takes the kept pixels; equal content in another object is the same report
    assert pixels.rendered(_report(), drawn, "mfu") is first and drawn.calls == 1
    assert not pixels._kept  # taken: nothing stays held
    assert np.array_equal(pixels.rendered(report, drawn, "mfu"), first)  # a third use draws again
    assert drawn.calls == 2
    # any field of any row, or the metadata, changed: drawn again (the kept image is not that report's)
    report.rows[1] = replace(report.rows[1], total_ms=3.5)
    pixels.rendered(report, drawn, "mfu")
    assert drawn.calls == 3
    report.metadata["device_name"] = "other"
    pixels.rendered(report, drawn, "mfu")
    assert drawn.calls == 4
    # another image of the same report (other arguments, or another function) is another entry
    pixels.rendered(report, drawn, "total_ms")
    assert drawn.calls == 5
    other = _Counting(icicle_figure)
    pixels.rendered(report, other, "total_ms")
    assert (drawn.calls, other.calls) == (5, 1)


@pixels.sharing()
def test_only_the_last_images_wait_for_their_second_use() -> None:
    drawn = _Counting(lambda report, i: icicle_figure(report, "mfu"))
    report = _report()
    for i in range(pixels.KEEP + 1):
        pixels.rendered(report, drawn, i)
    assert drawn.calls == pixels.KEEP + 1 and len(pixels._kept) == pixels.KEEP
    pixels.rendered(report, drawn, pixels.KEEP)  # the newest: kept
    assert drawn.calls == pixels.KEEP + 1
    pixels.rendered(report, drawn, 0)  # the oldest: let go, drawn again
    assert drawn.calls == pixels.KEEP + 2


@pixels.sharing()
def test_a_report_that_cannot_be_digested_is_drawn_every_time() -> None:
    report = _report()
    report.metadata["writer"] = lambda: None  # a value pickle refuses
    drawn = _Counting(icicle_figure)
    pixels.rendered(report, drawn, "mfu")
    pixels.rendered(report, drawn, "mfu")
    assert drawn.calls == 2 and not pixels._kept


class _ImageWriter:
    def __init__(self) -> None:
        self.images: dict[str, np.ndarray] = {}

    def add_scalar(self, tag: str, value: float, global_step: int) -> None:
        pass

    def add_text(self, tag: str, text: str, global_step: int) -> None:
        pass

    def add_image(self, tag: str, image: np.ndarray, global_step: int, dataformats: str) -> None:
        assert dataformats == "HWC"
        self.images[tag] = image


def test_tensorboard_after_the_files_draws_nothing_and_logs_the_files_pixels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    icicles = _Counting(icicle_module.icicle_figure)
    roofline = _Counting(roofline_module.roofline_figure)
    monkeypatch.setattr(icicle_module, "icicle_figure", icicles)
    monkeypatch.setattr(roofline_module, "roofline_figure", roofline)
    monkeypatch.setattr(tensorboard_module, "icicle_figure", icicles)
    monkeypatch.setattr(tensorboard_module, "roofline_figure", roofline)
    report = _report()
    writer = _ImageWriter()
    with pixels.sharing():  # as the callback and profile_components publish
        FileReporter().write(report, ReportContext(output_dir=tmp_path))
        assert (icicles.calls, roofline.calls) == (3, 1)
        log_report(writer, report, step=0)
        assert (icicles.calls, roofline.calls) == (3, 1)  # TensorBoard drew nothing
        assert not pixels._kept  # and took every kept image: none stays held
    tags = {
        "component_benchmark/icicle/mfu": "icicle_mfu.png",
        "component_benchmark/icicle/total_ms": "icicle_total_ms.png",
        "component_benchmark/icicle/peak_mem_mb": "icicle_peak_mem_mb.png",
        "cb/roofline": "roofline.png",
    }
    assert set(writer.images) == set(tags)
    for tag, name in tags.items():
        on_disk = np.asarray(Image.open(tmp_path / name).convert("RGB"))
        assert on_disk.shape == (900, 1600, 3)
        assert np.array_equal(writer.images[tag], on_disk)


def test_outside_a_sharing_scope_nothing_is_kept_and_closing_one_lets_everything_go() -> None:
    report, drawn = _report(), _Counting(icicle_figure)
    pixels.rendered(report, drawn, "mfu")
    pixels.rendered(report, drawn, "mfu")
    assert drawn.calls == 2 and not pixels._kept  # files alone (cb replay, a FileReporter of one's own)
    with pixels.sharing():
        with pixels.sharing():  # nested: the outer one decides
            pixels.rendered(report, drawn, "mfu")
        assert len(pixels._kept) == 1
    assert not pixels._kept  # published without TensorBoard: nothing stays held


def test_the_pngs_are_upright_and_follow_the_users_savefig_settings(tmp_path: Path) -> None:
    import matplotlib as mpl

    report = _report()
    with mpl.rc_context({"image.origin": "lower"}):  # imsave's default; savefig always writes the top row first
        (written,) = save_icicles(report, tmp_path / "lower", ["mfu"])
        saved = io.BytesIO()
        icicle_figure(report, "mfu").savefig(saved, dpi=100)
        assert written.read_bytes() == saved.getvalue()
    with mpl.rc_context({"savefig.transparent": True}):  # a setting savefig applies and the canvas does not
        with pixels.sharing():
            (written,) = save_icicles(report, tmp_path / "transparent", ["mfu"])
            assert not pixels._kept  # written by savefig itself: nothing drawn for TensorBoard to share
        saved = io.BytesIO()
        icicle_figure(report, "mfu").savefig(saved, dpi=100)
        assert written.read_bytes() == saved.getvalue()
        assert np.asarray(Image.open(written))[0, 0, 3] == 0  # the corner is transparent, as savefig makes it


def test_label_widths_are_kept_per_font() -> None:
    import matplotlib as mpl
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from cb_callback._report.icicle import _Measure

    text = "blocks.11.attn.c_proj"
    sans = _Measure(FigureCanvasAgg(Figure(dpi=100)))(text)
    with mpl.rc_context({"font.family": "DejaVu Sans Mono"}):
        mono = _Measure(FigureCanvasAgg(Figure(dpi=100)))(text)
    assert mono != sans  # measured anew for the other font, not the width kept for the first
    assert _Measure(FigureCanvasAgg(Figure(dpi=100)))(text) == sans
