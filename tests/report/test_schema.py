"""Issue 25 §2: typed data. A row's ``status`` is a ``Literal``, its ``details`` a ``TypedDict`` whose keys
docs/columns.md lists, and ``report.json`` carries a ``schema_version``; a file of the previous release
(no version: version 1) still loads.

``data/report_v1/report.json`` is what cb_callback 379e0da wrote for ``data/make_report_v1.py``'s model,
byte for byte (the script's docstring says how it was made).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import get_args

import pytest
import torch

import cb_callback
from cb_callback import ComponentRow, Report
from cb_callback._report.headroom import headroom_ms
from cb_callback._report.schema import SCHEMA_VERSION, STATUSES, RowDetails, Status
from tests.conftest import FAST
from tests.report.data.make_report_v1 import Tiny

DATA = Path(__file__).parent / "data"
V1 = DATA / "report_v1" / "report.json"
COLUMNS_MD = Path(__file__).parents[2] / "docs" / "columns.md"


def _declared() -> dict[str, str]:
    """``RowDetails``' keys and their annotations as written (``from __future__ import annotations``)."""
    return {k: getattr(v, "__forward_arg__", str(v)) for k, v in RowDetails.__annotations__.items()}


def _documented() -> list[tuple[str, str]]:
    """``(key, type)`` of each row of docs/columns.md's "Details keys" table, in order."""
    text = COLUMNS_MD.read_text(encoding="utf-8")
    section = text.split("\n## Details keys", 1)[1].split("\n## ", 1)[0]
    out = []
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        out.append((cells[0].strip("`"), cells[1].strip("`").replace("\\|", "|")))
    return out


def test_columns_md_lists_exactly_the_typed_details_keys_with_their_types() -> None:
    documented = _documented()
    keys = [k for k, _ in documented]
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)
    assert dict(documented) == _declared()
    assert len(keys) == 51  # 49 in the class, "as" and "from" in its functional base
    assert RowDetails.__optional_keys__ == frozenset(keys)  # total=False throughout: every key optional


def test_the_statuses_are_the_status_literal() -> None:
    assert STATUSES == ("ok", "estimated", "failed", "not_run", "skipped")
    assert get_args(Status) == STATUSES
    with pytest.raises(ValueError, match=r"status='measured' is not one of"):
        ComponentRow("", "Net", 0, None, "measured")  # type: ignore[arg-type]


def test_a_report_of_the_previous_release_loads() -> None:
    raw = json.loads(V1.read_text(encoding="utf-8"))
    assert "schema_version" not in raw  # written before the key: version 1
    report = Report.load(V1.parent)
    assert [(r.path, r.module_type, r.status) for r in report] == [
        ("", "Tiny", "ok"),
        ("blocks", "ModuleList", "estimated"),
        ("flaky", "Flaky", "failed"),
        ("head", "Linear", "skipped"),
        ("unused", "Linear", "not_run"),
        ("blocks.0", "Linear", "ok"),
        ("blocks.1", "Linear", "ok"),
    ]
    assert report.row("flaky").error == "replay raised RuntimeError: only inside Tiny's forward"
    assert report.row("head").note == "matched exclude pattern 'head'"
    assert report.row("blocks").note == "never called itself (a container); estimated from 2 of 2 children"
    # Linear(4, 4) on a (2, 4) input: 2 * 2 * 4 * 4 = 64 FLOPs forward. blocks.0's input needs no
    # gradient (weight only: 64), blocks.1's does (input and weight: 128); the container sums them.
    assert [(report.row(p).fwd_flops, report.row(p).bwd_flops) for p in ("blocks.0", "blocks.1", "blocks")] == [
        (64.0, 64.0),
        (64.0, 128.0),
        (128.0, 192.0),
    ]
    assert report.row("blocks.0").params_mb == (4 * 4 + 4) * 4 / 2**20
    measured = {
        "bwd_bytes", "bwd_iqr_ms", "bwd_repeats", "flags", "floor_ms", "fwd_bytes", "fwd_iqr_ms", "fwd_repeats",
        "insitu", "mutates_inputs", "peak_mem_source", "roofline", "timing", "top_bytes_ops", "uncounted_ops",
        "working_set_bytes",
    }  # fmt: skip
    assert {r.path: set(r.details) for r in report} == {
        "": measured,
        "blocks": {"flags", "roofline"},
        "flaky": {"flags", "insitu"},
        "head": {"flags", "insitu"},
        "unused": {"flags"},
        "blocks.0": measured,
        "blocks.1": measured,
    }
    assert set().union(*(r.details for r in report)) <= set(_declared())  # every key of v1 is a typed one
    leaf = report.row("blocks.0").details
    assert leaf["uncounted_ops"] == ["aten.sum"]  # the bias gradient's sum: torch has no FLOP formula for it
    assert leaf["mutates_inputs"] is False and leaf["peak_mem_source"] == "cpu_profiler_allocations"
    assert (leaf["fwd_repeats"], leaf["bwd_repeats"]) == (29, 29)  # as the file says: timed runs of that machine
    assert leaf["roofline"]["ridge"] == 10.0  # peak_flops 1e12 / peak_bandwidth 1e11
    # The machine was busy while blocks.1 was timed (metadata["quality"] counts that one flag).
    assert {r.path: r.details["flags"] for r in report if r.details["flags"]} == {"blocks.1": ["contention"]}
    assert report.metadata["quality"]["flags"]["contention"] == 1
    assert report.metadata["peaks"]["flops_source"] == "user"


def test_a_report_saved_now_has_the_version_and_round_trips(tmp_path: Path) -> None:
    old = Report.load(V1.parent)
    old.save(tmp_path, html=False)
    raw, new = json.loads(V1.read_text()), json.loads((tmp_path / "report.json").read_text())
    assert list(new) == ["schema_version", "metadata", "rows"] and new["schema_version"] == SCHEMA_VERSION == 2
    # Version 2 only adds the key: the previous release's rows and metadata pass through unchanged, but for
    # the column added since (headroom_ms, issue 26): not in the old file, it is derived on load from the
    # rows' counts and times and the file's peaks (1e12 FLOP/s, 1e11 B/s), NaN (saved as null) where it
    # cannot be (the rows that are not ok).
    assert all("headroom_ms" not in r for r in raw["rows"])
    peaks = raw["metadata"]["peaks"]
    for row, saved in zip(old, new["rows"], strict=True):
        expected = headroom_ms(row, peaks["flops"], peaks["bandwidth"])  # the root: 0.1264 - 568 / 1e11 s ...
        assert (saved["headroom_ms"] is None) == (row.status != "ok") == math.isnan(expected), row.path
        assert row.status != "ok" or saved["headroom_ms"] == row.headroom_ms == expected, row.path
        saved.pop("headroom_ms")
    assert new["rows"] == raw["rows"] and new["metadata"] == raw["metadata"]
    again = Report.load(tmp_path)
    assert again.to_dict() == old.to_dict()


@pytest.mark.parametrize(
    ("version", "message"),
    [
        (3, "schema_version 3 is newer than this cb_callback reads (1 to 2): upgrade cb_callback to read it"),
        (0, "schema_version is 0, expected 1 to 2"),
        ("2", "schema_version is str, expected int"),
        (True, "schema_version is bool, expected int"),
        (None, "schema_version is None, expected int"),
    ],
)
def test_a_schema_version_it_cannot_read_is_refused(tmp_path: Path, version: object, message: str) -> None:
    data = {"schema_version": version, "metadata": {}, "rows": []}
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        Report.from_dict(data)
    (tmp_path / "report.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=f"^cannot read a report at .*report.json: {re.escape(message)}$"):
        Report.load(tmp_path)


def test_versions_one_and_two_read_alike() -> None:
    raw = json.loads(V1.read_text())
    one, two = Report.from_dict({**raw, "schema_version": 1}), Report.from_dict({**raw, "schema_version": 2})
    assert one.to_dict() == two.to_dict() == Report.from_dict(raw).to_dict()


def test_the_built_ins_write_only_typed_details_keys() -> None:
    torch.manual_seed(0)
    batches = [torch.randn(2, 4), torch.randn(3, 4)]  # two shapes: the many-batches keys too
    report = cb_callback.profile_components(
        Tiny(), batches=batches, descend="all", exclude=["head"], insitu_passes=1, peak_flops=1e12,
        peak_bandwidth=1e11, **FAST,
    )  # fmt: skip
    written = set().union(*(r.details for r in report))
    assert written <= set(_declared()), sorted(written - set(_declared()))
    assert {"batches", "median_batch", "median_ms", "p90_ms", "shapes", "timing", "floor_ms", "flags"} <= written
