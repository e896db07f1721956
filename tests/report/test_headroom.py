"""Issue 26 §1: ``headroom_ms``, the time a component would save at its own roof.

Per pass ``max(0, t - max(flops / peak_flops, bytes / bandwidth))`` in ms, forward plus backward, the
bandwidth the row's own ceiling (``details["bw_ceiling"]``) else the device's peak (docs/columns.md,
"Headroom: where optimisation pays"). Hand-built rows with round numbers give exact values; a real
``profile_components(..., descend="all")`` report carries the column on every row, in the DataFrame,
in report.json and back.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cb_callback import COLUMNS, ComponentRow, Report, profile_components
from cb_callback._engine.derive.estimate import derive, headroom_ms
from cb_callback._engine.derive.rollup import derive_all
from cb_callback._engine.selection.groups import take_row
from cb_callback._hardware.calibration import CacheLevel
from cb_callback._hardware.peaks import Peaks
from cb_callback._report import headroom as headroom_module
from cb_callback._report.listing import format_listing
from cb_callback._report.roofline import headroom_lines, headroom_ranking, no_headroom_reason
from tests._roofline_report import roofline_report
from tests.conftest import FAST

PEAK_FLOPS = 1e12  # FLOP/s
PEAK_BW = 1e11  # bytes/s: the ridge at 10 FLOP/byte


def _row(path: str = "mm", **kw: Any) -> ComponentRow:
    details = kw.pop("details", {})
    values: dict[str, Any] = dict(status="ok", calls=1, fwd_ms=8.0, bwd_ms=16.0, fwd_flops=4e9, bwd_flops=8e9)
    values.update(kw)
    row = ComponentRow(path, "Linear", 1, "", **values)
    row.details.update({"fwd_bytes": 4e7, "bwd_bytes": 1.6e8, **details})  # type: ignore[typeddict-item]
    row.bytes = row.details["fwd_bytes"] + row.details["bwd_bytes"]
    return row


def test_a_compute_bound_row_saves_its_time_beyond_the_flop_roof() -> None:
    row = _row()
    # forward: roof max(4e9 / 1e12, 4e7 / 1e11) = max(4, 0.4) ms = 4 ms; 8 - 4 = 4 ms
    # backward: max(8e9 / 1e12, 1.6e8 / 1e11) = max(8, 1.6) ms = 8 ms; 16 - 8 = 8 ms
    assert headroom_ms(row, PEAK_FLOPS, PEAK_BW) == 12.0
    derive(row, PEAK_FLOPS, PEAK_BW)
    assert row.headroom_ms == 12.0  # derive() fills the column beside bound


def test_a_memory_bound_row_is_judged_against_its_own_ceiling() -> None:
    row = _row(fwd_ms=3.0, bwd_ms=0.0, fwd_flops=1e8, bwd_flops=0.0, details={"fwd_bytes": 2e8, "bwd_bytes": 0.0})
    # against DRAM (1e11 B/s): roof max(1e8 / 1e12, 2e8 / 1e11) = max(0.1, 2) ms = 2 ms; 3 - 2 = 1 ms;
    # no backward (0 ms, 0 FLOPs) adds 0
    assert headroom_ms(row, PEAK_FLOPS, PEAK_BW) == 1.0
    # derive_all takes the row's own ceiling: its working set fits the L1 (4e11 B/s): roof 2e8 / 4e11 = 0.5 ms
    row.details["working_set_bytes"] = 1024
    levels = (CacheLevel("L1", 32768, 4e11), CacheLevel("DRAM", None, PEAK_BW))
    peaks = Peaks("cpu", "fp32", PEAK_FLOPS, PEAK_BW, "user", "user", "test", levels=levels)
    derive_all([row], peaks)
    assert row.details["bw_ceiling"] == {"level": "L1", "gbps": 400.0}
    assert row.headroom_ms == 2.5  # 3 - 0.5


def test_a_pass_faster_than_its_roof_saves_nothing() -> None:
    row = _row(fwd_ms=1.0)  # faster than the 4 ms the roof allows (an over_peak row): 0, never negative
    assert headroom_ms(row, PEAK_FLOPS, PEAK_BW) == 8.0  # 0 + the backward's 16 - 8


def test_a_pass_at_the_floor_adds_nothing_and_a_row_all_at_the_floor_has_none() -> None:
    fwd_at = _row(details={"floor_ms": {"at_floor": ["fwd"]}})
    assert headroom_ms(fwd_at, PEAK_FLOPS, PEAK_BW) == 8.0  # the backward's 16 - 8 alone
    both = _row(details={"floor_ms": {"at_floor": ["fwd", "bwd"]}})
    assert math.isnan(headroom_ms(both, PEAK_FLOPS, PEAK_BW))
    fwd_only = _row(bwd_ms=0.0, bwd_flops=0.0, details={"floor_ms": {"at_floor": ["fwd"]}, "bwd_bytes": 0.0})
    assert math.isnan(headroom_ms(fwd_only, PEAK_FLOPS, PEAK_BW))  # no pass above the floor


def test_no_trustworthy_time_counts_or_peaks_give_nan() -> None:
    for status in ("estimated", "failed", "skipped", "not_run"):
        assert math.isnan(headroom_ms(_row(status=status), PEAK_FLOPS, PEAK_BW)), status
    assert math.isnan(headroom_ms(_row(), None, PEAK_BW))
    assert math.isnan(headroom_ms(_row(), PEAK_FLOPS, None))
    assert math.isnan(headroom_ms(_row(fwd_flops=math.nan), PEAK_FLOPS, PEAK_BW))
    no_bytes = _row()
    del no_bytes.details["bwd_bytes"]
    assert math.isnan(headroom_ms(no_bytes, PEAK_FLOPS, PEAK_BW))
    untimed = _row(fwd_ms=math.nan, bwd_ms=math.nan)
    assert math.isnan(headroom_ms(untimed, PEAK_FLOPS, PEAK_BW))


def test_a_row_taken_from_a_representative_has_its_headroom_per_call() -> None:
    source = _row("blocks.0.mm")
    copy = take_row(ComponentRow("blocks.1.mm", "Linear", 2, "blocks.1", calls=3), source)
    for r in (source, copy):
        derive(r, PEAK_FLOPS, PEAK_BW)
    assert copy.details["as"] == "representative" and copy.calls == 3
    assert copy.headroom_ms == source.headroom_ms == 12.0  # per call: the same times and counts
    report = Report([ComponentRow("", "Net", 0, None, "ok", calls=1, fwd_ms=50.0, bwd_ms=50.0, total_ms=100.0),
                     source, copy], {"peaks": {"flops": PEAK_FLOPS, "bandwidth": PEAK_BW}})  # fmt: skip
    (only,) = headroom_ranking(report)  # the copy is folded into its source, as the hotspots are
    assert (only.row.path, only.n, only.calls, only.step_ms) == ("blocks.0.mm", 2, (1, 3), 48.0)  # 12 × 1 + 12 × 3
    lines = headroom_lines(report)
    assert lines[0].startswith("where optimisation pays most (top 1 by headroom_ms x calls")
    # total 8 + 16 = 24 ms per call; headroom 12 per call, 48 over the step = 48 / (100 × 1) = 48 % of it
    assert lines[3].split() == ["blocks.0.mm", "×2", "Linear", "1+3", "24.0", "12.0", "48.0", "48.0", "compute"]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def _expected(row: ComponentRow, peak_flops: float, peak_bw: float) -> float:
    """The docs' formula, written out again: per pass above the floor max(0, t - roof), summed."""
    own = row.details.get("bw_ceiling") or {}
    bw = own["gbps"] * 1e9 if own else peak_bw
    floor = (row.details.get("floor_ms") or {}).get("at_floor") or []
    out, timed = 0.0, False
    for name, ms, flops in (("fwd", row.fwd_ms, row.fwd_flops), ("bwd", row.bwd_ms, row.bwd_flops)):
        if math.isfinite(ms) and ms > 0 and name not in floor:
            nbytes = row.details[f"{name}_bytes"]  # type: ignore[literal-required]
            out += max(0.0, ms - 1e3 * max(flops / peak_flops, nbytes / bw))
            timed = True
    return out if timed else math.nan


def test_a_real_report_has_the_column_everywhere(tmp_path: Path) -> None:
    torch.manual_seed(0)
    report = profile_components(
        Net(), (torch.randn(16, 32, requires_grad=True),), descend="all", peak_flops=1e11, peak_bandwidth=1e10,
        output_dir=str(tmp_path), **FAST,
    )  # fmt: skip
    assert "headroom_ms" in COLUMNS and "headroom_ms" in report.to_dataframe().columns
    for row in report:
        if row.status == "ok":
            expected = _expected(row, 1e11, 1e10)
            assert row.headroom_ms == expected or (math.isnan(expected) and math.isnan(row.headroom_ms)), row.path
        else:
            assert math.isnan(row.headroom_ms), row.path
    # the root is timed well above the floor (a forward and backward of two Linears) and has every count
    assert math.isfinite(report.row("").headroom_ms) and report.row("").headroom_ms >= 0
    loaded = Report.load(tmp_path)
    for a, b in zip(report, loaded, strict=True):
        assert a.headroom_ms == b.headroom_ms or (math.isnan(a.headroom_ms) and math.isnan(b.headroom_ms))
    listing = format_listing(loaded, sort="headroom_ms")  # cb report --sort headroom_ms
    assert listing[0].endswith("by headroom_ms, largest first):") and "headroom ms" in listing[1]


class Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32)) for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


def test_rows_taken_from_a_representative_carry_its_headroom() -> None:
    torch.manual_seed(0)
    # descend_share=0.0: every group is measured in depth, its other members taken from its representative
    # where the census proves them copies (which member is measured depends on times: the claim holds for any)
    report = profile_components(
        Blocks(), (torch.randn(16, 32, requires_grad=True),), descend_share=0.0, peak_flops=1e11,
        peak_bandwidth=1e10, **FAST,
    )  # fmt: skip
    copies = [r for r in report if r.details.get("as") == "representative"]
    for row in copies:
        source = report.row(row.details["from"])
        same = row.headroom_ms == source.headroom_ms
        assert same or (math.isnan(row.headroom_ms) and math.isnan(source.headroom_ms)), (row.path, source.path)
        expected = _expected(row, 1e11, 1e10) if row.status == "ok" else math.nan
        assert row.headroom_ms == expected or (math.isnan(expected) and math.isnan(row.headroom_ms)), row.path


def test_one_copy_of_the_formula_serves_the_engine_and_the_loader() -> None:
    assert headroom_ms is headroom_module.headroom_ms  # the engine's name is the _report function


def test_a_report_written_before_the_column_gets_it_derived_on_load() -> None:
    report = roofline_report()
    data = report.to_dict()
    for row in data["rows"]:
        row.pop("headroom_ms")
    data["rows"][1]["details"]["bw_ceiling"] = {"level": "L1", "gbps": 400.0}  # mlp fits L1
    loaded = Report.from_dict(data)
    # the root: (8 - max(4e9 / 1e12, 4e7 / 1e11) = 4) + (16 - max(8, 1.6)) = 12 ms (against DRAM, 1e11 B/s);
    # mlp against its L1 (4e11 B/s): 2 - max(1e8 / 1e12, 1e8 / 4e11) ms = 2 - 0.25 = 1.75 ms;
    # act: 0.5 - 1e6 / 1e11 s = 0.49 ms; tiny: the backward alone, 1 - max(2e-3, 1e-2) = 0.99 ms
    assert loaded.row("").headroom_ms == 12.0
    assert loaded.row("mlp").headroom_ms == 1.75
    assert loaded.row("act").headroom_ms == 0.5 - 0.01
    assert loaded.row("tiny").headroom_ms == 1.0 - 0.01
    assert math.isnan(loaded.row("nob").headroom_ms)  # a timed pass without bytes
    assert math.isnan(loaded.row("bad").headroom_ms)  # not ok
    # a stored value (also NaN: null) is kept; without peaks nothing is derived
    data["rows"][1]["headroom_ms"] = None
    assert math.isnan(Report.from_dict(data).row("mlp").headroom_ms)
    del data["metadata"]["peaks"]
    assert math.isnan(Report.from_dict(data).row("").headroom_ms)


def test_no_ranking_without_peaks_and_each_reason_said() -> None:
    report = roofline_report()
    assert headroom_lines(report) and no_headroom_reason(report, 0) == "no headroom ranking asked for (--top 0)"
    del report.metadata["peaks"]  # the rows still carry their stored headroom_ms: no roof to measure it against
    assert headroom_ranking(report) == [] and headroom_lines(report) == []
    assert no_headroom_reason(report, 10) == "no peaks in this report: no roof, no headroom"
    measured = roofline_report()
    for row in measured.rows:
        row.headroom_ms = math.nan
    assert no_headroom_reason(measured, 10).startswith("no measured component has a headroom")
