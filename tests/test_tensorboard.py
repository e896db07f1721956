"""Tests of the TensorBoard reporter: tags, values, texts and images read back from events."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.figure import Figure
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter

import cb_callback._tensorboard as tensorboard_module
from cb_callback._plugins import ReportContext, Reporter
from cb_callback._report import ComponentRow, Report
from cb_callback._tensorboard import TensorBoardReporter, log_report, scalar_tag

NAN = math.nan
ICICLES = {f"component_benchmark/icicle/{m}" for m in ("mfu", "total_ms", "peak_mem_mb")}
TEXTS = {"component_benchmark/table", "component_benchmark/summary"}


def _report() -> Report:
    rows = [
        ComponentRow(
            "", "Net", 0, None, "ok", calls=1, fwd_ms=4.0, bwd_ms=6.0, total_ms=10.0,
            tflops=0.5, mfu=0.25, peak_mem_mb=12.0, gbps=50.0, bw_util=0.125,
        ),
        ComponentRow("enc.0", "Linear", 1, "", "ok", calls=2, fwd_ms=1.0, total_ms=1.0),
        ComponentRow("enc.1", "Linear", 1, "", "failed", error="boom"),
    ]  # fmt: skip
    return Report(rows, {"device_name": "cpu", "dtype": "float32"})


def _read(logdir: Path) -> EventAccumulator:
    acc = EventAccumulator(str(logdir), size_guidance={"images": 0, "scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def _expected_scalars() -> dict[str, float]:
    root = {
        "total_ms": 10.0, "fwd_ms": 4.0, "bwd_ms": 6.0, "mfu": 0.25, "tflops": 0.5,
        "peak_mem_mb": 12.0, "gbps": 50.0, "bw_util": 0.125,
    }  # fmt: skip
    out = {f"component_benchmark/{m}/root": v for m, v in root.items()}
    # enc.0 has only fwd_ms and total_ms; enc.1 failed with no values: no scalars
    out["component_benchmark/fwd_ms/enc.0"] = 1.0
    out["component_benchmark/total_ms/enc.0"] = 1.0
    return out


def test_scalar_tag() -> None:
    assert scalar_tag("mfu", "") == "component_benchmark/mfu/root"
    assert scalar_tag("mfu", "a.b.0") == "component_benchmark/mfu/a.b.0"


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> EventAccumulator:
    """The hand-made report logged once at step 7 by a real SummaryWriter, read back."""
    logdir = tmp_path_factory.mktemp("tb")
    writer = SummaryWriter(str(logdir))
    log_report(writer, _report(), step=7)
    writer.close()
    return _read(logdir)


def test_scalars_read_back(events: EventAccumulator) -> None:
    expected = _expected_scalars()
    assert set(events.Tags()["scalars"]) == set(expected)
    for tag, value in expected.items():
        (event,) = events.Scalars(tag)
        assert (event.step, event.value) == (7, value)  # all values exact in float32


def test_images_read_back(events: EventAccumulator) -> None:
    assert set(events.Tags()["images"]) == ICICLES
    for tag in ICICLES:
        (image,) = events.Images(tag)
        assert image.step == 7
        assert (image.width, image.height) == (1400, 700)


def _text(acc: EventAccumulator, tag: str) -> str:
    (event,) = acc.Tensors(tag)
    assert event.step == 7
    return bytes(event.tensor_proto.string_val[0]).decode()


def test_texts_read_back(events: EventAccumulator) -> None:
    # stored under exactly the contract's tags (not add_text's "<tag>/text_summary")
    assert set(events.Tags()["tensors"]) == set(TEXTS)
    table = _text(events, "component_benchmark/table")
    assert table.split("\n")[0] == "| path | type | status | ms | TFLOP/s | MFU | MB | bound |"
    assert len(table.split("\n")) == 2 + 3
    summary = _text(events, "component_benchmark/summary")
    assert summary.startswith("```\ncb_callback component benchmark\n")
    assert '"device_name": "cpu"' in summary


class _ImageOnlyWriter:
    """A SummaryWriter-like object without add_figure."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any, int]] = []

    def add_scalar(self, tag: str, value: float, global_step: int) -> None:
        self.calls.append(("scalar", tag, value, global_step))

    def add_text(self, tag: str, text: str, global_step: int) -> None:
        self.calls.append(("text", tag, text, global_step))

    def add_image(self, tag: str, image: np.ndarray, global_step: int, dataformats: str) -> None:
        assert dataformats == "HWC"
        self.calls.append(("image", tag, image, global_step))


def test_reporter_uses_ctx_writer() -> None:
    writer = _ImageOnlyWriter()
    reporter = TensorBoardReporter()
    assert isinstance(reporter, Reporter) and reporter.name == "tensorboard"
    assert reporter.write(_report(), ReportContext(step=3, writer=writer)) == []
    assert {c[1] for c in writer.calls if c[0] == "scalar"} == set(_expected_scalars())
    assert {c[1] for c in writer.calls if c[0] == "text"} == TEXTS
    images = {c[1]: c[2] for c in writer.calls if c[0] == "image"}
    assert set(images) == ICICLES
    assert all(im.shape == (700, 1400, 3) and im.dtype == np.uint8 for im in images.values())
    assert {c[3] for c in writer.calls} == {3}


def test_reporter_opens_and_closes_its_own_writer(tmp_path: Path) -> None:
    out = TensorBoardReporter().write(_report(), ReportContext(output_dir=tmp_path, step=5))
    assert out == []
    acc = _read(tmp_path)
    assert set(acc.Tags()["scalars"]) == set(_expected_scalars())
    assert acc.Scalars("component_benchmark/mfu/root")[0].step == 5


def test_reporter_without_writer_or_dir_writes_nothing() -> None:
    assert TensorBoardReporter().write(_report(), ReportContext()) == []


@pytest.mark.parametrize("value", [NAN, math.inf])
def test_non_finite_values_are_skipped(value: float, monkeypatch: pytest.MonkeyPatch) -> None:
    # the icicles are not under test here: draw a small empty figure instead
    monkeypatch.setattr(tensorboard_module, "icicle_figure", lambda report, metric: Figure((1, 1)))
    writer = _ImageOnlyWriter()
    report = Report([ComponentRow("", "Net", 0, None, "ok", calls=1, total_ms=1.0, mfu=value)])
    log_report(writer, report, step=0)
    assert [c[1] for c in writer.calls if c[0] == "scalar"] == ["component_benchmark/total_ms/root"]
