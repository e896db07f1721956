"""Tolerances by dtype, and the one closeness test that every verdict uses.

:func:`compare_tensors` (and :func:`compare_numbers` for Python-number output
leaves, which goes through it) is what both ``compare_components`` and the
compile what-if's output check call, so that "equivalent" means one thing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = [
    "DEFAULT_TOLERANCES",
    "NUMBER_TYPES",
    "Closeness",
    "compare_int_lists",
    "compare_numbers",
    "compare_tensors",
    "default_tolerances",
    "number_tolerances",
]

#: ``dtype -> (rtol, atol)``: the defaults of :func:`torch.testing.assert_close`
#: (its ``_DTYPE_PRECISIONS``); integer and bool tensors must be equal (0, 0).
DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex32: (1e-3, 1e-5),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}

#: The Python numbers compared like tensors when they are output leaves (``x.sum().item()``).
NUMBER_TYPES = (bool, int, float, complex)

_INT64 = torch.iinfo(torch.int64)


def default_tolerances(dtype: torch.dtype) -> tuple[float, float]:
    """``(rtol, atol)`` for comparing tensors of ``dtype`` (see :data:`DEFAULT_TOLERANCES`)."""
    return DEFAULT_TOLERANCES.get(dtype, (0.0, 0.0))


def number_tolerances(x: object) -> tuple[float, float]:
    """``(rtol, atol)`` for a Python-number output leaf.

    A ``float`` gets fp32's (rtol 1.3e-6, atol 1e-5) and a ``complex``
    complex64's: such a leaf is most often an fp32 tensor's ``.item()``, and
    fp64's tolerances would judge fp32 arithmetic. An ``int`` or ``bool`` must be
    equal (0, 0).
    """
    if isinstance(x, float):
        return DEFAULT_TOLERANCES[torch.float32]
    if isinstance(x, complex):
        return DEFAULT_TOLERANCES[torch.complex64]
    return 0.0, 0.0


@dataclass(frozen=True)
class Closeness:
    """How close a candidate is to a reference, element by element.

    Attributes:
        close: every element is close: ``|cand - ref| <= atol + rtol * |ref|``
            with both finite, or both equal (infinities of the same sign, NaN
            against NaN).
        max_abs: ``max |cand - ref|`` over the elements; 0 for equal elements,
            ``inf`` where one side is infinite or NaN and the other is not the
            same (never clamped to the largest float). Integers: the exact
            difference, rounded once to a float.
        max_rel: ``max |cand - ref| / |ref|`` (0 where the difference is 0,
            ``inf`` where ``ref`` is 0 and the difference is not, or the
            difference is ``inf``). 0 for no elements.
    """

    close: bool
    max_abs: float
    max_rel: float


def _is_integer(t: torch.Tensor) -> bool:
    return not (t.is_floating_point() or t.is_complex())


def compare_tensors(ref: torch.Tensor, cand: torch.Tensor, rtol: float, atol: float) -> Closeness:
    """Compare ``cand`` with ``ref`` (the expected values) element by element, as :func:`torch.isclose`.

    Floating and complex values are compared in float64 / complex128 on the
    host: ``|cand - ref| <= atol + rtol * |ref|`` where both are finite (the
    bound uses the reference, as ``torch.testing.assert_close(cand, ref)``);
    equal values are always close: infinities of the same sign, and NaN against
    NaN at the same position (like ``assert_close(equal_nan=True)``: a
    reference that yields NaN there is matched by a candidate that does). An
    infinity or NaN against anything else is not close, whatever the
    tolerances, and counts as an error of ``inf``.

    Integer and bool tensors (both sides) are compared exactly in 64-bit
    integers, never through float64 (which cannot tell ``2**60`` from
    ``2**60 + 1``): at zero tolerance close means equal. The difference is taken
    as ``max - min`` of each pair, which cannot overflow into a wrong sign:
    ``-2**63`` against ``2**63 - 1`` differs by ``2**64 - 1``. Only the bound
    with non-zero tolerances is evaluated in float64. An integer against a
    floating tensor is compared in float64.

    Args:
        ref: the reference (expected) values.
        cand: the candidate, of ``ref``'s shape (the dtypes may differ).
        rtol: relative tolerance (of ``|ref|``).
        atol: absolute tolerance.

    Returns:
        The :class:`Closeness` of the two.

    Raises:
        ValueError: the shapes differ (there is no broadcasting).
    """
    if ref.shape != cand.shape:
        raise ValueError(f"cannot compare values of shapes {tuple(ref.shape)} and {tuple(cand.shape)}")
    r, c = ref.detach().to("cpu"), cand.detach().to("cpu")
    if _is_integer(r) and _is_integer(c):
        return _compare_integers(r, c, rtol, atol)
    wide = torch.complex128 if (r.is_complex() or c.is_complex()) else torch.float64
    r, c = r.to(wide), c.to(wide)
    same = (r == c) | (torch.isnan(r) & torch.isnan(c))
    finite = torch.isfinite(r) & torch.isfinite(c)
    diff = torch.where(same, 0.0, torch.where(finite, (c - r).abs(), math.inf))
    scale = torch.where(torch.isfinite(r), r.abs(), 0.0)
    close = bool(torch.all(same | (finite & (diff <= atol + rtol * scale))))
    return _closeness(close, diff, scale, None)


def _compare_integers(r: torch.Tensor, c: torch.Tensor, rtol: float, atol: float) -> Closeness:
    """Integer/bool tensors (on the host), exactly: see :func:`compare_tensors`."""
    unsigned = (r.dtype == torch.uint64, c.dtype == torch.uint64)
    if any(unsigned) and not all(unsigned):  # uint64 against a signed type: no common 64-bit type
        return compare_int_lists(r.reshape(-1).tolist(), c.reshape(-1).tolist(), rtol, atol)
    if all(unsigned):  # flipping the sign bit maps uint64 onto int64 keeping every difference
        bits = r.view(torch.int64)
        scale = bits.to(torch.float64) + (bits < 0).to(torch.float64) * 2.0**64  # |r| as unsigned
        r, c = (t.view(torch.int64) ^ _INT64.min for t in (r, c))
    else:
        r, c = r.to(torch.int64), c.to(torch.int64)
        scale = r.to(torch.float64).abs()  # float64 first: abs(-2**63) overflows in int64
    wrapped = torch.maximum(r, c) - torch.minimum(r, c)  # |c - r| modulo 2**64: negative when >= 2**63
    over = wrapped < 0
    diff = wrapped.to(torch.float64) + over.to(torch.float64) * 2.0**64
    close = bool(torch.all((wrapped == 0) | (diff <= atol + rtol * scale)))
    top: int | None = None
    if wrapped.numel():
        top = int(wrapped[over].max()) + 2**64 if bool(over.any()) else int(wrapped.max())
    return _closeness(close, diff, scale, top)


def _closeness(close: bool, diff: torch.Tensor, scale: torch.Tensor, exact_max: int | None) -> Closeness:
    if not diff.numel():
        return Closeness(close, 0.0, 0.0)
    rel = torch.where(diff == 0, 0.0, diff / scale)  # x / 0 = inf, inf / x = inf; 0 / 0 is not taken
    max_abs = float(exact_max) if exact_max is not None else float(diff.max())
    return Closeness(close, max_abs, float(rel.max()))


def _float(x: int) -> float:
    try:
        return float(x)
    except OverflowError:
        return math.inf


def compare_int_lists(ref: list[int], cand: list[int], rtol: float, atol: float) -> Closeness:
    """Exact comparison of Python ints of any size (pairwise), with :func:`compare_tensors`'s rule.

    Python compares an int with a float exactly, so ``|cand - ref| <= atol +
    rtol * |ref|`` is decided without rounding the difference.
    """
    close, max_abs, max_rel = True, 0, 0.0
    for r, c in zip(ref, cand, strict=True):
        d = abs(c - r)
        if d == 0:
            continue
        close = close and d <= atol + rtol * _float(abs(r))
        max_abs = max(max_abs, d)
        try:
            rel = d / abs(r)
        except (ZeroDivisionError, OverflowError):
            rel = math.inf
        max_rel = max(max_rel, rel)
    return Closeness(close, _float(max_abs), max_rel)


def _number_tensor(x: bool | int | float | complex) -> torch.Tensor | None:
    """A Python number as a 0-d tensor of its exact type; ``None`` for an int beyond int64."""
    if isinstance(x, bool):
        return torch.tensor(x, dtype=torch.bool)
    if isinstance(x, int):
        return torch.tensor(x, dtype=torch.int64) if _INT64.min <= x <= _INT64.max else None
    if isinstance(x, float):
        return torch.tensor(x, dtype=torch.float64)  # a Python float is a double: exact
    return torch.tensor(x, dtype=torch.complex128)


def compare_numbers(
    ref: bool | int | float | complex, cand: bool | int | float | complex, rtol: float, atol: float
) -> Closeness:
    """Two Python numbers, compared as 0-d tensors of their exact types by :func:`compare_tensors`.

    A float is a float64, a complex a complex128, an int an int64, a bool a
    bool: an int against an int is exact; an int beyond int64 is compared as a
    Python int (:func:`compare_int_lists`). Whether the two types must agree is
    the caller's rule (both verdicts: they must).
    """
    r, c = _number_tensor(ref), _number_tensor(cand)
    if r is None or c is None:
        if isinstance(ref, int) and isinstance(cand, int):
            return compare_int_lists([int(ref)], [int(cand)], rtol, atol)
        wide = torch.complex128 if isinstance(ref, complex) or isinstance(cand, complex) else torch.float64
        r = torch.tensor(_float(ref) if isinstance(ref, int) else ref, dtype=wide)
        c = torch.tensor(_float(cand) if isinstance(cand, int) else cand, dtype=wide)
    return compare_tensors(r, c, rtol, atol)
