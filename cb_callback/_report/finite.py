"""Which values are numbers: finite, NaN, and a ratio of two (the standard library only).

One rule for the engine and the renderers alike (it sits at the bottom of the layers,
beside the model of results, so both may import it):

- :func:`finite`: a real number (``int``, ``float``, a numpy scalar: anything
  :class:`numbers.Real`) that is neither NaN nor infinite; a ``bool`` is not a
  number here (``True`` is no count of anything), nor is ``None`` or a string;
- :func:`is_nan`: a real number that is NaN (``None`` or a string is not: it is
  missing, not NaN);
- :func:`ratio`: ``a / b`` when both are finite and ``b`` is not 0, else NaN;
- :func:`or_zero`: ``x`` as a float when it is finite, else ``0.0`` (a missing part of a sum).
"""

from __future__ import annotations

import math
from numbers import Real  # the standard library's (numpy's scalars are registered there)
from typing import TypeGuard

__all__ = ["finite", "is_nan", "or_zero", "ratio"]


def finite(x: object) -> TypeGuard[float]:
    """Whether ``x`` is a finite real number: not a ``bool``, NaN, an infinity, ``None`` or a string."""
    if type(x) is float:  # the common case, without the ABC's check
        return math.isfinite(x)
    return isinstance(x, Real) and not isinstance(x, bool) and math.isfinite(x)


def is_nan(x: object) -> bool:
    """Whether ``x`` is a real number that is NaN (what ``x != x`` tests, spelled out)."""
    if type(x) is float:
        return math.isnan(x)
    return isinstance(x, Real) and math.isnan(x)


def ratio(a: object, b: object) -> float:
    """``a / b`` when both are :func:`finite` and ``b`` is not 0, else NaN.

    Notes:
        The quotient itself may overflow to an infinity (a finite ``a`` over a
        denormal ``b``); it is returned as it is.
    """
    if finite(a) and finite(b) and b != 0:
        return float(a / b)
    return math.nan


def or_zero(x: object) -> float:
    """``x`` as a float when it is :func:`finite`, else ``0.0``: a part that is missing adds nothing to a sum."""
    return float(x) if finite(x) else 0.0
