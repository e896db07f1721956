"""What report.json holds for values a plugin or a hand-made row may carry: numpy scalars, huge numbers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from cb_callback import ComponentRow, Report


def _report(**fields: object) -> Report:
    row = ComponentRow(path="", module_type="Linear", depth=0, parent=None, **fields)  # type: ignore[arg-type]
    return Report(rows=[row], metadata={})


def test_numpy_scalars_are_written_as_the_numbers_they_hold_and_load_again(tmp_path: Path) -> None:
    # np.int64 is no int and np.float32 no float: before, they were written as their text ("2", "1.5")
    # and the file was refused on load ("rows[0].calls is str, expected int")
    report = _report(
        calls=np.int64(2), fwd_ms=np.float32(1.5), mfu=np.float32("nan"), comm_bytes=np.int64(123),
        details={"mine": np.float32(0.25), "flag": np.bool_(True), "sizes": [np.int32(3), np.uint8(4)]},
    )  # fmt: skip
    report.save(tmp_path, html=False)
    raw = json.loads((tmp_path / "report.json").read_text())["rows"][0]
    assert (raw["calls"], raw["fwd_ms"], raw["mfu"], raw["comm_bytes"]) == (2, 1.5, None, 123)
    assert raw["details"] == {"mine": 0.25, "flag": True, "sizes": [3, 4]}
    assert type(raw["details"]["flag"]) is bool and type(raw["calls"]) is int
    row = Report.load(tmp_path).row("")
    assert (row.calls, row.fwd_ms, row.comm_bytes) == (2, 1.5, 123) and math.isnan(row.mfu)


def test_an_integer_too_large_for_a_float_is_refused_on_load_with_its_field(tmp_path: Path) -> None:
    _report(fwd_ms=1.0).save(tmp_path, html=False)
    path = tmp_path / "report.json"
    data = json.loads(path.read_text())
    data["rows"][0]["total_ms"] = 10**400  # what a hand-edited "1e400" written without its "e" reads as
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"rows\[0\]\.total_ms is an integer of 401 digits, too large for a float"):
        Report.load(tmp_path)
    data["rows"][0]["total_ms"] = 10**300  # a float holds it: it loads, and shows with an exponent
    path.write_text(json.dumps(data))
    loaded = Report.load(tmp_path)
    assert loaded.row("").total_ms == 10**300
    assert "1.00e300" in loaded.summary()  # not a 301-digit cell
