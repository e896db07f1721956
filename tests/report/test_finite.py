"""Issue 25 §3: one rule for which values are numbers (cb_callback/_report/finite.py), exact cases."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from cb_callback._report.finite import finite, is_nan, or_zero, ratio

NAN, INF = math.nan, math.inf


@pytest.mark.parametrize(
    ("x", "expected"),
    [
        (1.5, True),
        (0.0, True),
        (-2.0, True),
        (3, True),  # an int is a number
        (10**300, True),  # and a large one (it fits a float)
        (Fraction(1, 3), True),
        (np.float32(0.5), True),  # numpy's scalars are numbers
        (np.int64(3), True),
        (True, False),  # a bool is no count of anything
        (False, False),
        (None, False),
        (NAN, False),
        (INF, False),
        (-INF, False),
        (np.float64("nan"), False),
        (np.float32("inf"), False),
        ("1.5", False),  # a string is not a number, even one that reads as one
        ("nan", False),
        ([1.0], False),
    ],
)
def test_finite(x: Any, expected: bool) -> None:
    assert finite(x) is expected


@pytest.mark.parametrize(
    ("x", "expected"),
    [
        (NAN, True),
        (-NAN, True),
        (np.float64("nan"), True),
        (np.float32("nan"), True),
        (INF, False),  # an infinity is no NaN (what x != x says too)
        (1.0, False),
        (0, False),
        (False, False),
        (None, False),  # missing, not NaN
        ("nan", False),
    ],
)
def test_is_nan(x: Any, expected: bool) -> None:
    assert is_nan(x) is expected
    if isinstance(x, float):
        assert is_nan(x) is bool(x != x)  # the spelling it replaces


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (3.0, 2.0, 1.5),
        (3, 4, 0.75),  # ints divide as numbers
        (-3.0, 2.0, -1.5),
        (3.0, -2.0, -1.5),  # a negative denominator is a denominator
        (0.0, 2.0, 0.0),
        (np.float32(1.0), 4, 0.25),
    ],
)
def test_ratio_of_two_finite_numbers(a: Any, b: Any, expected: float) -> None:
    got = ratio(a, b)
    assert type(got) is float and got == expected


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (1.0, 0.0),
        (1.0, 0),
        (0.0, 0.0),
        (NAN, 1.0),
        (1.0, NAN),
        (INF, 1.0),
        (1.0, INF),
        (None, 1.0),
        (1.0, None),
        (True, 1.0),
        (1.0, True),
        ("2", 1.0),
    ],
)
def test_ratio_is_nan_unless_both_finite_and_the_denominator_not_zero(a: Any, b: Any) -> None:
    assert math.isnan(ratio(a, b))


def test_a_quotient_that_overflows_is_returned_as_it_is() -> None:
    assert ratio(1e300, 1e-300) == INF  # both finite, b not 0: the division's own result


@pytest.mark.parametrize(
    ("x", "expected"),
    [(2.5, 2.5), (3, 3.0), (np.float32(0.5), 0.5), (0.0, 0.0), (NAN, 0.0), (INF, 0.0), (-INF, 0.0), (None, 0.0),
     (True, 0.0), ("1", 0.0)],
)  # fmt: skip
def test_or_zero_is_the_float_of_a_finite_number_else_zero(x: Any, expected: float) -> None:
    got = or_zero(x)
    assert type(got) is float and got == expected
