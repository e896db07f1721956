"""Issue 23 §4: numbers shown to their significance (cb_callback/_report/numbers.py)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from cb_callback import ComponentRow, Report
from cb_callback._cli import main
from cb_callback._report.numbers import percent, si, sig

NAN = math.nan


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0"),  # exactly 0 is "0", not "0.00"
        (0.0, "0"),
        (-0.0, "0"),
        (4.0, "4.00"),  # trailing zeros kept: the digits shown are the digits known
        (10.0, "10.0"),
        (100.0, "100"),
        (12.5, "12.5"),
        (1.34e-4, "0.000134"),  # 134 kFLOP in GFLOP: never "0.000"
        (0.0009996, "0.00100"),  # rounding carries: 9.996e-4 -> 1.00e-3
        (9.996, "10.0"),  # not "10.00"
        (999.96, "1000"),
        (12345.6, "12346"),  # no exponent for large values: the integer
        (-0.000134, "-0.000134"),  # negatives keep their figures
        (-2.5, "-2.50"),
        (1.0e-6, "0.00000100"),  # the smallest without an exponent
        (1.234e-7, "1.23e-7"),  # below: an exponent, without a padded "e-07"
        (9.99e15, "9990000000000000"),  # the largest without an exponent: 16 digits
        (1.0e16, "1.00e16"),  # above: an exponent, without a "+"
        (-1.0e300, "-1.00e300"),  # not a 301-character cell
        (NAN, "-"),  # missing: the table's convention
        (math.inf, "-"),
        (None, "-"),
        (True, "-"),  # a bool is no number to show
        ("1.5", "-"),
        (np.float32(0.5), "0.500"),  # numpy scalars are numbers
        (np.int64(3), "3.00"),
    ],
)
def test_sig(value: object, text: str) -> None:
    assert sig(value) == text


def test_sig_options() -> None:
    assert sig(0.125, scale=100.0) == "12.5"  # a fraction as a percent cell
    assert sig(0.0219, scale=100.0) == "2.19"
    assert sig(0.123456, 4) == "0.1235"
    assert sig(0.5, 2) == "0.50"
    assert sig(NAN, missing="") == ""  # a table whose missing cells are empty


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (0, "", "0"),
        (0, "FLOP", "0 FLOP"),
        (512, "", "512"),  # below 1000: no prefix
        (134_000, "", "134 k"),
        (134_217.7, "", "134 k"),
        (1.34e5, "FLOP", "134 kFLOP"),
        (6e9, "", "6.00 G"),
        (2 * 64 * 32 * 64, "", "262 k"),  # a Linear(32, 64)'s forward on 64 rows: 2 * 64 * 32 * 64 = 262144
        (999.4, "", "999"),
        (999.96, "", "1.00 k"),  # rounding up carries across the prefix: never "1000"
        (999_960.0, "B", "1.00 MB"),
        (-2.5e6, "B", "-2.50 MB"),
        (0.5, "", "0.500"),  # a mean count below 1: significant figures, no milli
        (NAN, "", "-"),
        (None, "FLOP", "-"),
    ],
)
def test_si(value: object, unit: str, text: str) -> None:
    assert si(value, unit) == text


@pytest.mark.parametrize(
    ("fraction", "text"),
    [
        (0.0219, "2.19 %"),
        (0.25, "25.0 %"),
        (1.0, "100 %"),
        (0.00042, "0.0420 %"),  # a small MFU: not "0.0 %"
        (0.0, "0 %"),
        (-0.05, "-5.00 %"),
        (NAN, "-"),  # missing: no "%"
        (None, "-"),
    ],
)
def test_percent(fraction: object, text: str) -> None:
    assert percent(fraction) == text


def test_no_non_zero_value_shows_as_zero() -> None:
    """Over 30 decades, positive and negative, no value that is not 0 prints as a zero."""
    for exp in range(-15, 16):
        for mantissa in (1.0, 1.234, 4.9999, 9.9996):
            for v in (mantissa * 10.0**exp, -mantissa * 10.0**exp):
                for text in (sig(v), si(v).split()[0], percent(v).split()[0]):
                    assert float(text) != 0.0, (v, text)


def test_cb_report_shows_a_tiny_linear_s_flop_beside_its_mfu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's case: a Linear showed ``GFLOP 0.000`` beside ``MFU 2.2 %``. Its FLOP now has an SI prefix."""
    # Linear(32, 32) on 64 rows: forward 2 * 64 * 32 * 32 = 131072 FLOP, backward twice that (input and weight
    # grads) = 262144: 393216 in all, "0.000" in GFLOP with 3 decimals.
    rows = [
        ComponentRow("", "Net", 0, None, "ok", calls=1, fwd_ms=0.02, bwd_ms=0.04, total_ms=0.06, share=1.0,
                     fwd_flops=131072.0, bwd_flops=262144.0, tflops=0.00655, mfu=0.022),
        ComponentRow("fc", "Linear", 1, "", "ok", calls=1, fwd_ms=0.02, bwd_ms=0.04, total_ms=0.06, share=1.0,
                     fwd_flops=131072.0, bwd_flops=262144.0, tflops=0.00655, mfu=0.022),
    ]  # fmt: skip
    Report(rows, {}).save(tmp_path)
    assert main(["report", str(tmp_path), "--sort", "fwd_flops"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("components ("))
    header = re.split(r"\s{2,}", lines[at + 1].strip())
    fc = re.split(r"\s{2,}", next(ln for ln in lines[at + 3 :] if ln.startswith("fc ")).strip())
    cells = dict(zip(header, fc, strict=True))
    assert cells["FLOP"] == "393 k"  # 393216 (was "0.000" under "GFLOP")
    assert cells["MFU %"] == "2.20"  # 0.022 -> 3 significant figures
    assert cells["TFLOP/s"] == "0.00655"  # was "0.007"
    assert cells["fwd FLOP"] == "131 k"  # the column --sort fwd_flops adds (was "fwd GFLOP" "0.000")
    assert cells["total ms"] == "0.0600"
