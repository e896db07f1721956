"""Per-component artifacts: a Kineto trace, an operator table, a memory record, linked from the row."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from cb_callback import BenchmarkConfig, profile_components
from cb_callback._metrics.artifacts import OPS_COLUMNS
from cb_callback._report.html import with_artifact_tables

FAST = dict(min_run_time_s=0.0, min_repeats=2, max_repeats=2, rounds=1)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))


def test_every_measured_component_gets_its_trace_ops_and_memory(tmp_path: Path) -> None:
    # descend_share=0: every row replayed (which small rows the triage leaves in situ follows the load)
    opts = dict(artifacts=("trace", "ops", "memory"), output_dir=str(tmp_path), descend_share=0.0)
    report = profile_components(_model(), (torch.randn(16, 32),), **opts, **FAST)
    for row in report:
        name = row.path or "root"
        assert row.details["artifacts"] == {
            "trace": f"artifacts/{name}/trace.json.gz",
            "ops": f"artifacts/{name}/ops.csv",
            "memory": f"artifacts/{name}/memory_timeline.csv",
        }
        for rel in row.details["artifacts"].values():
            assert (tmp_path / rel).is_file()
    with gzip.open(tmp_path / "artifacts/0/trace.json.gz", "rt") as f:
        trace = json.load(f)
    assert trace["cb_component"] == "0"
    names = {e.get("name") for e in trace["traceEvents"]}
    assert "aten::addmm" in names and "aten::mm" in names  # the forward and the backward's weight grad
    with (tmp_path / "artifacts/0/ops.csv").open() as f:
        ops = list(csv.DictReader(f))
    assert list(ops[0]) == list(OPS_COLUMNS)
    addmm = next(o for o in ops if o["name"] == "aten::addmm")
    # Linear(32 -> 64) on 16 rows: 2 * 16 * 32 * 64 = 65,536 FLOPs, one call
    assert addmm["flops"] == "65536" and addmm["calls"] == "1"
    assert json.loads(addmm["input_shapes"])[1:3] == [[16, 32], [32, 64]]
    with (tmp_path / "artifacts/0/memory_timeline.csv").open() as f:
        assert next(csv.reader(f)) == ["time_us", "bytes", "total_bytes"]


def test_artifacts_top_limits_them_to_the_most_expensive(tmp_path: Path) -> None:
    # descend_share=0: every row replayed, each a candidate (the small rows the triage leaves in situ follow the load)
    timing = FAST | dict(warmup=1, min_repeats=7, max_repeats=7, descend_share=0.0)
    report = profile_components(
        _model(), (torch.randn(16, 32),), artifacts=("ops",), artifacts_top=1, output_dir=str(tmp_path), **timing
    )
    measured = [r for r in report if r.status == "ok"]
    assert len(measured) == 4  # the root and its 3 children: 3 candidates beside the one chosen
    # The one component that costs the most over the step, (fwd_ms + bwd_ms) x calls as measured. On a quiet
    # machine the root (it contains every other component); with two CPU hogs beside the suite a child's
    # median of 7 microsecond runs read 10 ms (3 of 40 profiles): the ranking follows the times measured.
    top = max(measured, key=lambda r: (r.fwd_ms + r.bwd_ms) * max(r.calls, 1))
    assert [r.path for r in report if "artifacts" in r.details] == [top.path]
    assert (tmp_path / top.details["artifacts"]["ops"]).is_file()


def test_without_an_output_dir_nothing_is_written_and_it_says_so() -> None:
    with pytest.warns(RuntimeWarning, match=r"artifacts=\['trace'\] need an output_dir"):
        report = profile_components(_model(), (torch.randn(4, 32),), artifacts="trace", **FAST)
    assert all("artifacts" not in r.details for r in report)


def test_invalid_kinds_are_refused() -> None:
    with pytest.raises(ValueError, match=r"BenchmarkConfig.artifacts=\['flamegraph'\] is invalid"):
        BenchmarkConfig(artifacts=["flamegraph"])
    assert BenchmarkConfig(artifacts="trace,ops").artifacts == ("trace", "ops")  # the CLI form


def test_the_page_shows_each_components_top_operators(tmp_path: Path) -> None:
    # descend_share=0: every row replayed, "0" among them (which small rows the triage leaves in situ follows the load)
    opts = dict(artifacts=("ops",), output_dir=str(tmp_path), descend_share=0.0)
    report = profile_components(_model(), (torch.randn(16, 32),), **opts, **FAST)
    report.save(tmp_path)
    data = with_artifact_tables(report.to_dict(), tmp_path, top=3)
    row = next(r for r in data["rows"] if r["path"] == "0")
    assert len(row["details"]["ops_top"]) == 3 and set(row["details"]["ops_top"][0]) == set(OPS_COLUMNS)
    assert "ops_top" not in json.loads((tmp_path / "report.json").read_text())["rows"][1]["details"]


def test_artifact_directories_never_collide_or_escape(tmp_path: Path) -> None:
    from cb_callback._engine.run.component import artifact_dir as _artifact_dir

    cfg = BenchmarkConfig(output_dir=str(tmp_path))
    assert _artifact_dir(cfg, "") == tmp_path / "artifacts" / "root"
    assert _artifact_dir(cfg, "root") == tmp_path / "artifacts" / "%72oot"  # a child named "root"
    assert _artifact_dir(cfg, "/etc") == tmp_path / "artifacts" / "%2Fetc"  # a ModuleDict key with "/"
    assert _artifact_dir(cfg, "blocks.0.attn") == tmp_path / "artifacts" / "blocks.0.attn"


def test_the_page_reads_no_ops_table_outside_the_report(tmp_path: Path) -> None:
    secret = tmp_path / "secret.csv"
    secret.write_text("name,calls\nsecret,1\n")
    (tmp_path / "rep").mkdir()
    data = {
        "metadata": {},
        "rows": [
            {"path": "", "details": {"artifacts": {"ops": "../secret.csv"}}},
            {"path": "a", "details": {"artifacts": {"ops": str(secret)}}},
        ],
    }
    out = with_artifact_tables(data, tmp_path / "rep")
    assert all("ops_top" not in r["details"] for r in out["rows"])


def test_every_artifact_kind_the_config_accepts_has_its_plugin() -> None:
    from cb_callback._engine.run.config import ARTIFACT_KINDS
    from cb_callback._metrics.artifacts import artifact_plugins

    assert [p.name for p in artifact_plugins(ARTIFACT_KINDS)] == [f"{k}_artifact" for k in ARTIFACT_KINDS]
