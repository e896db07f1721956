"""Every selection (descent, artifacts_top, compile_top, hotspots) ranks by time over all batches."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest

from cb_callback._engine.capture.tree import Node
from cb_callback._engine.run.schedule import artifact_targets as _artifact_targets
from cb_callback._engine.selection.descend import below_cold as _below_cold
from cb_callback._engine.selection.descend import step_cost_ms as _step_cost_ms
from cb_callback._report.model import ComponentRow, Report

# Two batches, a 1-row one (b0) and a 16,384-row one (b1), in ms of fwd + bwd per call (calls 1):
#   root  b0 1.00  b1 10.00   -> over the batches 11.00
#   mlp   b0 0.02  b1  9.00   -> 9.02: share 9.02 / 11 = 0.82
#   fixed b0 0.90  b1  0.90   -> 1.80: share 1.80 / 11 = 0.1636...
# The median batch of two is the lower middle one, b0, for every component: there mlp reads
# 0.02 / 1.00 = 0.02 and fixed 0.90. Judged by it (as before), mlp was the cold one.
TIMES = {"": (1.0, 10.0), "mlp": (0.02, 9.0), "fixed": (0.9, 0.9)}


def _row(path: str, ms: float) -> ComponentRow:
    return ComponentRow(
        path=path, module_type="M", depth=0 if path == "" else 1, parent=None if path == "" else "",
        status="ok", calls=1, fwd_ms=ms, bwd_ms=0.0, total_ms=ms,
    )  # fmt: skip


def _tree() -> tuple[dict[str, Node], dict[str, ComponentRow], dict[str, dict[int, ComponentRow]]]:
    nodes = {
        "": Node("", "Root", 0, None, 0, ["mlp", "fixed"]),
        "mlp": Node("mlp", "Sequential", 1, "", 1, ["mlp.0"]),
        "fixed": Node("fixed", "Fixed", 1, "", 2, ["fixed.0"]),
    }
    per_batch = {p: {b: _row(p, t[b]) for b in (0, 1)} for p, t in TIMES.items()}
    rows = {p: dataclasses.replace(per_batch[p][0], details={"median_batch": 0}) for p in TIMES}
    return nodes, rows, per_batch


def test_step_cost_sums_the_batches() -> None:
    nodes, rows, per_batch = _tree()
    assert _step_cost_ms("mlp", nodes, rows, per_batch) == pytest.approx(9.02)
    assert _step_cost_ms("mlp", nodes, rows) == pytest.approx(0.02)  # one batch: the row's own


def test_hotspot_descent_judges_share_over_the_batches() -> None:
    nodes, rows, per_batch = _tree()
    level = [nodes["mlp"], nodes["fixed"]]
    cold = _below_cold(level, nodes, rows, 0.2, {}, per_batch)
    # mlp: 9.02 / 11 = 0.82 >= 0.2 -> descended; fixed: 1.8 / 11 = 0.1636 < 0.2 -> not
    assert set(cold) == {"fixed.0"}
    assert cold["fixed.0"][0] == "fixed" and cold["fixed.0"][1] == pytest.approx(1.8 / 11)
    # by the median batch alone mlp would read 0.02 / 1.00 and be skipped (the bug)
    assert set(_below_cold(level, nodes, rows, 0.2, {})) == {"mlp.0"}


def test_artifacts_top_takes_the_largest_share_over_the_batches() -> None:
    nodes, rows, per_batch = _tree()
    pending: list[Any] = [SimpleNamespace(row=per_batch[p][b], batch=b) for p in TIMES for b in (0, 1)]
    cost = {p: _step_cost_ms(p, nodes, rows, per_batch) for p in TIMES}
    config = SimpleNamespace(artifacts_top=2)
    chosen = _artifact_targets(pending, config, rows, cost)  # type: ignore[arg-type]
    # root 11.0 and mlp 9.02 (fixed 1.8); each from its median batch, b0
    assert sorted((p.row.path, p.batch) for p in chosen) == [("", 0), ("mlp", 0)]


def test_hotspots_of_a_multi_batch_report_rank_by_share() -> None:
    rows = [
        dataclasses.replace(_row("", 1.0), share=1.0),
        dataclasses.replace(_row("mlp", 0.02), share=9.02 / 11),
        dataclasses.replace(_row("fixed", 0.9), share=1.8 / 11),
    ]
    report = Report(rows, {"batches": 2})
    assert [r.path for r in report.hotspots(2)] == ["mlp", "fixed"]
