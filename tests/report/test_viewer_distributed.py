"""report.html of a run over several ranks: comm columns, the rank-spread colour, parts, measured vs planned."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import pytest

from cb_callback._engine.derive.parts import derive_parts
from cb_callback._report.html import write_html
from cb_callback._report.model import ComponentRow, Report
from cb_callback._report.table import format_summary
from tests._browser import new_page
from tests.report.test_viewer_browser import _cell, _headers, _open_file


def _spread(per_rank: list[float]) -> dict[str, Any]:
    ordered = sorted(per_rank)
    return {"per_rank": per_rank, "min": ordered[0], "median": (ordered[0] + ordered[-1]) / 2, "max": ordered[-1]}


def _row(path: str, parent: str | None, total: float, per_rank: list[float], noise: float, **kw: Any) -> ComponentRow:
    row = ComponentRow(
        path=path, module_type="M", depth=path.count(".") + (1 if path else 0), parent=parent, status="ok", calls=1,
        fwd_ms=total / 2, bwd_ms=total / 2, total_ms=total, noise=noise, share=total / 10.0, **kw,
    )  # fmt: skip
    straggler = max(range(len(per_rank)), key=per_rank.__getitem__)
    row.details["ranks"] = {"total_ms": _spread(per_rank), "comm_ms": _spread([0.0] * len(per_rank))}
    row.details["ranks"]["straggler"] = straggler
    return row


@pytest.fixture
def report() -> Report:
    root = _row("", None, 10.0, [10.0, 10.0], 0.01, comm_bytes=4096.0, comm_ms=1.0)
    # 4 ms on rank 0, 6 ms on rank 1: spread (6 - 4) / 5 = 40 % > 25 %, quiet (noise 2 %): red
    bad = _row("ebc", "", 5.0, [4.0, 6.0], 0.02, comm_bytes=4096.0, comm_ms=1.0)
    # 40 % too, but its own noise is 30 %: within twice its noise, not coloured
    noisy = _row("noisy", "", 2.0, [1.6, 2.4], 0.30, comm_bytes=0.0, comm_ms=0.0)
    # 15 % and quiet: amber
    warn = _row("mlp", "", 1.0, [0.925, 1.075], 0.01, comm_bytes=0.0, comm_ms=0.0)
    bad.details["comm"] = [
        {"op": "c10d.alltoall_base_", "phase": "forward", "count": 3, "bytes": 2048, "ms": 0.6},
        {"op": "c10d.alltoall_base_", "phase": "backward", "count": 1, "bytes": 2048, "ms": 0.4},
    ]
    bad.details["parts"] = [{"name": "lookup:table_wise", "kind": "lookup", "tables": ["t0", "t1"], "ids": 12,
                             "bytes": 2000, "fwd_ms": 0.5}]  # fmt: skip
    bad.details["planned"] = {
        "source": "torchrec EmbeddingPerfEstimator", "rank": 0, "fwd_compute_ms": 0.25, "fwd_comms_ms": 0.1,
        "bwd_compute_ms": 0.5, "bwd_comms_ms": 0.1, "input_dist_comms_ms": 0.1, "total_ms": 0.95,
    }  # fmt: skip
    derive_parts(bad, 1e10)
    return Report([root, bad, noisy, warn], {"ranks": {"world_size": 2, "rank": 0, "profiles": "all"}})


def test_the_engine_derives_the_parts_bandwidth_and_the_measured_split(report: Report) -> None:
    row = report.row("ebc")
    (part,) = row.details["parts"]
    assert part["gbps"] == 2000 / 0.5e-3 / 1e9 and part["bw_util"] == 2000 / 0.5e-3 / 1e10
    planned = row.details["planned"]
    # measured: the lookup alone is the forward compute; the collectives' ms by phase; the rest by difference
    assert planned["measured"] == {
        "fwd_compute_ms": 0.5, "fwd_comms_ms": 0.6, "bwd_compute_ms": 2.5 - 0.4, "bwd_comms_ms": 0.4, "total_ms": 5.0,
    }  # fmt: skip
    # planned on the same split: its input all-to-all joins the forward comms and the total
    assert planned["planned_on_split"] == {
        "fwd_compute_ms": 0.25, "fwd_comms_ms": 0.1 + 0.1, "bwd_compute_ms": 0.5, "bwd_comms_ms": 0.1,
        "total_ms": 0.95 + 0.1,
    }  # fmt: skip
    assert planned["ratio"]["fwd_compute_ms"] == 0.5 / 0.25 and planned["ratio"]["total_ms"] == 5.0 / (0.95 + 0.1)


def test_the_summary_lists_ranks_communication_and_measured_vs_planned(report: Report) -> None:
    text = format_summary(report)
    assert "ranks: 2 (this report: rank 0; profiles='all')" in text
    assert "whole model: ranks differ by 0 % of the median; straggler rank 0" in text
    # only the quiet imbalanced rows above 1 % of the step: ebc (40 %), mlp (15 %); not the noisy one
    assert "imbalanced: ebc 40.0 % (straggler rank 1; 50.0 % of the step)" in text
    assert "imbalanced: mlp 15.0 %" in text and "imbalanced: noisy" not in text
    assert "  ebc: 4 KiB in 1 ms (c10d.alltoall_base_ forward x3, c10d.alltoall_base_ backward x1)" in text
    assert "ebc [torchrec EmbeddingPerfEstimator]: fwd compute 0.5 vs 0.25 (x2);" in text


def test_the_page_shows_comm_columns_the_rank_spread_colour_and_the_sections(
    browser: object, report: Report, tmp_path: Path
) -> None:
    page_file = write_html(report, tmp_path)
    with new_page(browser) as (page, log):
        _open_file(browser, page, page_file)
        headers = _headers(page)
        at = headers.index("total ms")
        assert headers[at + 1 : at + 4] == ["planned ms", "\u00d7 planned", "rank spread %"]
        assert headers.index("comm ms") == headers.index("comm KiB") + 1
        assert _cell(page, "ebc", "comm KiB") == "4.00" and _cell(page, "ebc", "rank spread %") == "40.0"
        assert _cell(page, "ebc", "planned ms") == "1.05" and _cell(page, "ebc", "\u00d7 planned") == "4.76"
        col = headers.index("rank spread %")

        def cls(path: str) -> str:
            return page.locator(f'#table tbody tr[data-path="{path}"] td').nth(col).get_attribute("class") or ""

        assert "imbalance-bad" in cls("ebc") and cls("mlp") == "num imbalance"
        assert "imbalance" not in cls("noisy") and "imbalance" not in cls("")  # within its noise; no spread
        table = list(csv.DictReader(io.StringIO(page.evaluate("window.cbViewer.csv()"))))
        ebc = next(t for t in table if t["path"] == "ebc")
        assert float(ebc["comm KiB"]) == 4.0 and float(ebc["rank spread %"]) == 40.0
        page.click('#table tr[data-path="ebc"]')
        details = page.locator("#details")
        assert "forward compute" in details.locator(".planned").inner_text()
        assert details.locator(".planned-table tbody tr").count() == 5
        assert details.locator(".part-table tbody tr").inner_text().split("\t")[0] == "lookup:table_wise (2)"
        assert details.locator(".comm-table tbody tr").count() == 2
        assert "straggler: rank 1" in details.locator(".ranks").inner_text()
        assert details.locator(".rank-table tr.straggler").inner_text().startswith("1")
        dump = details.locator("pre").inner_text()
        assert '"planned"' not in dump and '"parts"' not in dump and '"comm"' not in dump and '"ranks"' not in dump
        page.select_option("#metric", "rank_spread")
        assert "rank spread" in page.locator("#legend").inner_text()
        assert log.errors == []
