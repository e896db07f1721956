"""Tests of the TensorBoard reporter: tags, values, texts and images read back from events."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.figure import Figure
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.text import text_plugin
from torch.utils.tensorboard import SummaryWriter

import cb_callback._report.tensorboard as tensorboard_module
from cb_callback import BenchmarkConfig
from cb_callback._report.context import ReportContext, Reporter
from cb_callback._report.model import ComponentRow, Report
from cb_callback._report.tensorboard import (
    SCALAR_METRICS,
    TensorBoardReporter,
    log_report,
    scalar_layout,
    scalar_rows,
    scalar_tag,
)
from tests._figures import blank_figures

NAN = math.nan
ICICLES = {f"component_benchmark/icicle/{m}" for m in ("mfu", "total_ms", "peak_mem_mb")}
IMAGES = {*ICICLES, "cb/roofline"}  # issue 26: the roofline beside the icicles
TEXTS = {"component_benchmark/table", "component_benchmark/summary"}
LAYOUT_TAG = "custom_scalars__config__"  # where SummaryWriter.add_custom_scalars puts the layout


def _report() -> Report:
    rows = [
        ComponentRow(
            "", "Net", 0, None, "ok", calls=1, fwd_ms=4.0, bwd_ms=6.0, total_ms=10.0,
            tflops=0.5, mfu=0.25, peak_mem_mb=12.0, gbps=50.0, bw_util=0.125,
        ),
        ComponentRow("enc.0", "Linear", 1, "", "ok", calls=2, fwd_ms=1.0, total_ms=1.0),
        ComponentRow("enc.1", "Linear", 1, "", "failed", error="boom"),
    ]  # fmt: skip
    # one capture of a series (capture_every): log_scalars=None logs the root and the 10 costliest
    return Report(rows, {"device_name": "cpu", "dtype": "float32", "capture_series": True})


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
    assert set(events.Tags()["images"]) == IMAGES
    for tag in IMAGES:
        (image,) = events.Images(tag)
        assert image.step == 7
        assert (image.width, image.height) == (1600, 900)


def _text(acc: EventAccumulator, tag: str) -> str:
    (event,) = acc.Tensors(tag)
    assert event.step == 7
    return bytes(event.tensor_proto.string_val[0]).decode()


def test_texts_read_back(events: EventAccumulator) -> None:
    # stored under exactly the contract's tags (not add_text's "<tag>/text_summary"), beside the layout
    assert set(events.Tags()["tensors"]) == {*TEXTS, LAYOUT_TAG}
    table = _text(events, "component_benchmark/table").split("\n")
    # a fenced code block: the columns of format_table (MARKDOWN_HEADERS), aligned, a rule, one line per row
    assert table[0] == table[-1] == "```"
    assert table[1].split() == [
        "path", "type", "status", "calls", "fwd", "ms", "bwd", "ms", "total", "ms", "share", "%",
        "TFLOP/s", "MFU", "%", "MB", "bound",
    ]  # fmt: skip
    assert set(table[2]) == {"-", " "}
    assert len(table) == 1 + 2 + 3 + 1
    summary = _text(events, "component_benchmark/summary")
    assert summary.startswith("```\ncb_callback component benchmark\n")
    assert '"device_name": "cpu"' in summary


def test_the_text_tab_shows_the_table_as_one_unwrapped_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 23 §7: TensorBoard's Text tab renders the logged table with its own markdown (the text
    plugin's ``text_array_to_html``, the sanitizer included) as a ``<pre><code>`` block, each row one
    line with its numbers whole; a markdown ``<table>`` wrapped inside its cells there ("136.0" over "29")."""
    blank_figures(monkeypatch)  # reads no image
    rows = [
        ComponentRow(
            "", "Net", 0, None, "ok", calls=1, fwd_ms=40.0, bwd_ms=96.0, total_ms=136.0, share=1.0,
            tflops=0.6, mfu=0.125, peak_mem_mb=136.0, bound="compute",
        ),
        ComponentRow(
            "blocks.0.attn", "Attention<causal>", 2, "blocks.0", "ok", calls=29, fwd_ms=0.0123, bwd_ms=0.02,
            total_ms=0.0323, share=0.0069, tflops=0.0219, mfu=2.19e-5, peak_mem_mb=0.5, bound="memory",
        ),
    ]  # fmt: skip
    writer = SummaryWriter(str(tmp_path))
    log_report(writer, Report(rows, {}), step=7)
    writer.close()
    text = _text(_read(tmp_path), "component_benchmark/table")
    html = text_plugin.text_array_to_html(np.array(text.encode()), enable_markdown=True)
    assert html.startswith("<pre><code>") and html.endswith("</code></pre>") and "<table" not in html
    lines = html.removeprefix("<pre><code>").removesuffix("</code></pre>").rstrip("\n").split("\n")
    assert len(lines) == 2 + 2  # header, rule, one line per row: no row broken over lines
    assert lines[0].split()[:3] == ["path", "type", "status"]
    # the root: 136.0 ms -> "136"; share 1.0 -> "100"; mfu 0.125 -> "12.5"; peak 136.0 MiB -> "136"
    assert lines[2].split() == [
        "(root)",
        "Net",
        "ok",
        "1",
        "40.0",
        "96.0",
        "136",
        "100",
        "0.600",
        "12.5",
        "136",
        "compute",
    ]
    # two spaces per depth level; the type's "<" and ">" escaped, not stripped; share 0.0069 -> 0.690 %,
    # mfu 2.19e-5 -> 0.00219 %: 3 significant figures, none of them a 0 beside a non-zero rate
    assert lines[3].startswith("    blocks.0.attn  Attention&lt;causal&gt;  ok")
    assert lines[3].split()[3:] == ["29", "0.0123", "0.0200", "0.0323", "0.690", "0.0219", "0.00219", "0.500", "memory"]


class _TextWriter:
    """A SummaryWriter-like object that records scalars and texts."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any, int]] = []

    def add_scalar(self, tag: str, value: float, global_step: int) -> None:
        self.calls.append(("scalar", tag, value, global_step))

    def add_text(self, tag: str, text: str, global_step: int) -> None:
        self.calls.append(("text", tag, text, global_step))


class _ImageOnlyWriter(_TextWriter):
    """A SummaryWriter-like object without add_figure."""

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
    assert set(images) == IMAGES
    assert all(im.shape == (900, 1600, 3) and im.dtype == np.uint8 for im in images.values())
    assert {c[3] for c in writer.calls} == {3}


def test_reporter_opens_and_closes_its_own_writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blank_figures(monkeypatch)  # reads no image
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


# --- which components get scalars ------------------------------------------------------------


def _fifteen(config: dict[str, Any] | None = None, series: bool = False) -> Report:
    """A root and 14 components: 3 blocks of attn + mlp, a norm called 3 times, one failed, one skipped."""
    rows = [
        ComponentRow(
            "", "Net", 0, None, "ok", calls=1, fwd_ms=40.0, bwd_ms=60.0, total_ms=100.0,
            tflops=0.5, mfu=0.25, peak_mem_mb=64.0, gbps=50.0, bw_util=0.125,
        ),
        ComponentRow("embed", "Embedding", 1, "", "ok", calls=1, fwd_ms=2.0, bwd_ms=3.0, total_ms=5.0),
        ComponentRow("blocks", "ModuleList", 1, "", "estimated", calls=1, fwd_ms=20.0, bwd_ms=40.0, total_ms=60.0),
        ComponentRow(
            "norm", "LayerNorm", 1, "", "ok", calls=3, fwd_ms=3.0, bwd_ms=6.0, total_ms=9.0,
            tflops=0.02, mfu=0.01, peak_mem_mb=1.5, gbps=7.0, bw_util=0.5,
        ),
        ComponentRow("head", "Linear", 1, "", "failed", error="boom"),
        ComponentRow("drop", "Dropout", 1, "", "skipped", error="excluded"),
    ]  # fmt: skip
    for b in range(3):
        rows.append(ComponentRow(
            f"blocks.{b}", "Block", 2, "blocks", "ok", calls=1, fwd_ms=8.0, bwd_ms=12.0, total_ms=20.0, mfu=0.25,
        ))  # fmt: skip
        rows.append(ComponentRow(f"blocks.{b}.attn", "Attn", 3, f"blocks.{b}", "ok", calls=1, total_ms=12.0))
        rows.append(ComponentRow(f"blocks.{b}.mlp", "MLP", 3, f"blocks.{b}", "ok", calls=1, total_ms=8.0))
    meta: dict[str, Any] = {"device_name": "cpu", "config": config or {}}
    if series:
        meta["capture_series"] = True
    return Report(rows, meta)


# Time over the step (total_ms x calls) of the measured non-root rows: blocks 60, norm 9 x 3 = 27,
# blocks.0/1/2 20 each, the attns 12, the mlps 8, embed 5; head failed and drop was skipped.
# log_scalars=3: the root, then blocks (60), norm (27) and blocks.0 (first of the three 20s, report order).
FIFTEEN_TOP3 = ["", "blocks", "norm", "blocks.0"]
FIFTEEN_TOP3_TAGS = {
    # the root has all 8 metrics
    *(f"component_benchmark/{m}/root" for m in SCALAR_METRICS),
    # blocks: only its times
    "component_benchmark/total_ms/blocks", "component_benchmark/fwd_ms/blocks", "component_benchmark/bwd_ms/blocks",
    # norm has all 8
    *(f"component_benchmark/{m}/norm" for m in SCALAR_METRICS),
    # blocks.0: its times and mfu
    "component_benchmark/total_ms/blocks.0", "component_benchmark/fwd_ms/blocks.0",
    "component_benchmark/bwd_ms/blocks.0", "component_benchmark/mfu/blocks.0",
}  # fmt: skip


def test_scalar_rows_are_the_root_and_the_top_by_time_over_the_step() -> None:
    report = _fifteen()
    assert len(report) == 15
    assert [r.path for r in scalar_rows(report, 3)] == FIFTEEN_TOP3
    # the default 10: the root and 10 of the 12 measured others; the last two are blocks.2.mlp (8) and embed (5)...
    ten = [r.path for r in scalar_rows(report)]
    assert ten == [
        "", "blocks", "norm", "blocks.0", "blocks.1", "blocks.2",
        "blocks.0.attn", "blocks.1.attn", "blocks.2.attn", "blocks.0.mlp", "blocks.1.mlp",
    ]  # fmt: skip
    # ... which are left out, with the failed head and the skipped drop
    assert [r.path for r in scalar_rows(report, "all")] == [r.path for r in report.rows]
    assert scalar_rows(report, 0) == []
    assert [r.path for r in scalar_rows(report, 100)] == [*ten, "blocks.2.mlp", "embed"]
    for bad in (-1, True, "some", 2.0):
        with pytest.raises(ValueError, match="log_scalars="):
            scalar_rows(report, bad)  # type: ignore[arg-type]


def test_fifteen_components_with_log_scalars_3_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blank_figures(monkeypatch)  # reads no image
    writer = SummaryWriter(str(tmp_path))
    log_report(writer, _fifteen({"log_scalars": 3}), step=2)
    writer.close()
    acc = _read(tmp_path)
    assert set(acc.Tags()["scalars"]) == FIFTEEN_TOP3_TAGS
    assert len(FIFTEEN_TOP3_TAGS) == 8 + 3 + 8 + 4
    assert [e.value for e in acc.Scalars("component_benchmark/total_ms/norm")] == [9.0]  # per call, not x 3
    assert set(acc.Tags()["tensors"]) == {*TEXTS, LAYOUT_TAG}


def test_scalars_are_written_time_first_metric_by_metric(monkeypatch: pytest.MonkeyPatch) -> None:
    blank_figures(monkeypatch)  # reads no image
    writer = _ImageOnlyWriter()
    TensorBoardReporter(log_scalars=3).write(_fifteen(), ReportContext(step=1, writer=writer))
    order = [c[1] for c in writer.calls if c[0] == "scalar"]
    assert order[:6] == [
        "component_benchmark/total_ms/root", "component_benchmark/total_ms/blocks",
        "component_benchmark/total_ms/norm", "component_benchmark/total_ms/blocks.0",
        "component_benchmark/fwd_ms/root", "component_benchmark/fwd_ms/blocks",
    ]  # fmt: skip
    assert [tag.split("/")[1] for tag in order] == sorted(
        (tag.split("/")[1] for tag in order), key=SCALAR_METRICS.index
    )


class _FigureWriter(_TextWriter):
    """A SummaryWriter-like object without add_image, whose add_figure keeps the figure undrawn (the tests that
    read scalars)."""

    def add_figure(self, tag: str, figure: Figure, global_step: int, close: bool = True) -> None:
        self.calls.append(("figure", tag, figure, global_step))


def test_log_scalars_from_the_config_the_constructor_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    blank_figures(monkeypatch)  # reads no image

    def scalars(reporter: TensorBoardReporter, report: Report) -> set[str]:
        writer = _FigureWriter()
        reporter.write(report, ReportContext(writer=writer))
        return {c[1].split("/", 2)[2] for c in writer.calls if c[0] == "scalar"}

    # the report's config says 1: the root and blocks
    assert scalars(TensorBoardReporter(), _fifteen({"log_scalars": 1})) == {"root", "blocks"}
    assert scalars(TensorBoardReporter(log_scalars=2), _fifteen({"log_scalars": 1})) == {"root", "blocks", "norm"}
    assert scalars(TensorBoardReporter(), _fifteen({"log_scalars": 0})) == set()
    assert len(scalars(TensorBoardReporter(), _fifteen({"log_scalars": "all"}))) == 13  # all but head and drop
    # None, no config (an older report) or a value that is not valid: the report decides. The run's
    # only capture (one dot per chart is no chart): the root alone; a capture of a series: 10 more.
    assert scalars(TensorBoardReporter(), _fifteen()) == {"root"}
    assert scalars(TensorBoardReporter(), _fifteen({"log_scalars": None})) == {"root"}
    assert len(scalars(TensorBoardReporter(), _fifteen(series=True))) == 11
    assert len(scalars(TensorBoardReporter(), _fifteen({"log_scalars": "lots"}, series=True))) == 11
    assert scalars(TensorBoardReporter(log_scalars=1), _fifteen()) == {"root", "blocks"}  # the constructor wins
    with pytest.raises(ValueError, match="log_scalars=-2"):
        TensorBoardReporter(log_scalars=-2)


def test_benchmark_config_log_scalars() -> None:
    # the config's default leaves it to the report (root alone, or SERIES_LOG_SCALARS more in a series)
    assert BenchmarkConfig().log_scalars is None and tensorboard_module.SERIES_LOG_SCALARS == 10
    assert BenchmarkConfig(log_scalars="all").to_metadata()["log_scalars"] == "all"
    assert BenchmarkConfig(log_scalars=0).log_scalars == 0
    for bad in (-1, True, "every", 1.5):
        with pytest.raises(ValueError, match=r"BenchmarkConfig\.log_scalars="):
            BenchmarkConfig(log_scalars=bad)  # type: ignore[arg-type]


def test_custom_scalars_layout_puts_time_first(events: EventAccumulator) -> None:
    from tensorboard.plugins.custom_scalar import layout_pb2

    (event,) = events.Tensors(LAYOUT_TAG)
    layout = layout_pb2.Layout.FromString(event.tensor_proto.string_val[0])
    charts = [[c.multiline.tag[0] for c in category.chart] for category in layout.category]
    assert charts == [
        ["component_benchmark/total_ms/.*", "component_benchmark/fwd_ms/.*", "component_benchmark/bwd_ms/.*"],
        ["component_benchmark/mfu/.*", "component_benchmark/tflops/.*"],
        ["component_benchmark/peak_mem_mb/.*", "component_benchmark/gbps/.*", "component_benchmark/bw_util/.*"],
    ]
    titles = [category.title for category in layout.category]
    assert titles[0] == "component_benchmark: time (ms per call)"
    assert "fraction" in titles[1] and "fraction" in titles[2]  # mfu and bw_util are logged as fractions
    assert list(scalar_layout()) == titles


def test_no_layout_when_asked_or_without_scalars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blank_figures(monkeypatch)  # reads no image
    for name, reporter, config in (
        ("off", TensorBoardReporter(layout=False), {}),
        ("zero", TensorBoardReporter(), {"log_scalars": 0}),
    ):
        reporter.write(_fifteen(config, series=True), ReportContext(output_dir=tmp_path / name))
        tags = _read(tmp_path / name).Tags()
        assert set(tags["tensors"]) == TEXTS, name
        # the default 10: root 8 + blocks 3 + norm 8 + blocks.0-2 4 each + 3 attns and 2 mlps 1 each
        assert len(tags["scalars"]) == (0 if name == "zero" else 8 + 3 + 8 + 3 * 4 + 3 + 2), name
