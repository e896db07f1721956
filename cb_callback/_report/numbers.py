"""How a number is shown to a person: significant figures, SI prefixes for counts, percents.

One rule for every text a person reads (the summary, ``cb report``, the markdown
and TensorBoard tables; ``viewer.js`` follows the same rules in the page):

- :func:`sig`: ``digits`` significant figures (3 by default), trailing zeros
  kept (``4.00``, ``0.0420``: the digits shown are the digits known), without an
  exponent from ``1e-6`` up to below ``1e16`` (``0.000134``, ``12346``); outside that
  ``1.23e-7``, ``1.00e300`` (a 300-digit number would fill the table);
- a value that is not exactly 0 never shows as ``0``: it keeps its significant
  figures however small; exactly 0 (or ``-0.0``) is ``0``;
- :func:`si`: a count (FLOP, bytes) with an SI prefix, a factor 1000 apart
  (``134 k``, ``6.00 G``), rounding carried across a prefix (``999.96`` is
  ``1.00 k``, never ``1000``);
- :func:`percent`: a fraction (``mfu``, ``share``, ``bw_util``: 0.25 = 25 %)
  as a percent to 3 significant figures (``0.0219`` is ``2.19 %``,
  ``0.00042`` is ``0.0420 %``);
- a missing value (``None``, NaN, inf, anything not a number) is ``missing``
  (``"-"`` unless the caller's table has another convention).
"""

from __future__ import annotations

from cb_callback._report.finite import finite

__all__ = ["SI_PREFIXES", "percent", "si", "sig"]

#: SI prefixes of :func:`si`, a factor 1000 apart (``k`` is 10^3).
SI_PREFIXES: tuple[str, ...] = ("", "k", "M", "G", "T", "P", "E")

#: Below this magnitude :func:`sig` writes an exponent (``1.23e-7``).
_SMALLEST_FIXED_EXPONENT = -6
#: Above this magnitude :func:`sig` writes an exponent (``1.00e300``): 16 digits still read as a number.
_LARGEST_FIXED_EXPONENT = 15


def _exponent(v: float, digits: int) -> int:
    """The decimal exponent of ``v`` once rounded to ``digits`` significant figures (9.996 -> 1 at 3)."""
    return int(f"{v:.{digits - 1}e}".split("e")[1])


def sig(value: object, digits: int = 3, *, scale: float = 1.0, missing: str = "-") -> str:
    """``value * scale`` to ``digits`` significant figures (the module docstring's rules).

    Examples: ``sig(4.0)`` is ``4.00``; ``sig(0.000134)`` ``0.000134``; ``sig(12345.6)``
    ``12346``; ``sig(9.996)`` ``10.0``; ``sig(0.0)`` ``0``; ``sig(math.nan)`` ``-``;
    ``sig(0.125, scale=100)`` ``12.5``.
    """
    if not finite(value):
        return missing
    v = float(value) * scale
    if v == 0:
        return "0"
    exp = _exponent(v, digits)
    if exp < _SMALLEST_FIXED_EXPONENT or exp > _LARGEST_FIXED_EXPONENT:
        mantissa, power = f"{v:.{digits - 1}e}".split("e")
        return f"{mantissa}e{int(power)}"
    return f"{v:.{max(digits - 1 - exp, 0)}f}"


def si(value: object, unit: str = "", digits: int = 3, *, missing: str = "-") -> str:
    """A count with an SI prefix: ``value`` over ``1000**k`` to ``digits`` significant figures, then
    ``" " + prefix + unit`` (nothing when both are empty).

    Examples: ``si(134_000)`` is ``134 k``; ``si(6e9, "FLOP")`` ``6.00 GFLOP``; ``si(512)`` ``512``;
    ``si(999.96)`` ``1.00 k`` (rounding carries into the next prefix); ``si(0)`` ``0``;
    ``si(-2.5e6, "B")`` ``-2.50 MB``. Values below 1000 take no prefix (``0.500``: a mean count).
    """
    if not finite(value):
        return missing
    v = float(value)
    if v == 0:
        return "0" if not unit else f"0 {unit}"
    i = 0
    while i < len(SI_PREFIXES) - 1 and _exponent(v, digits) >= 3:
        v /= 1000.0
        i += 1
    suffix = SI_PREFIXES[i] + unit
    return f"{sig(v, digits)} {suffix}" if suffix else sig(v, digits)


def percent(fraction: object, digits: int = 3, *, missing: str = "-") -> str:
    """A fraction as a percent with its sign: ``0.0219`` is ``2.19 %``, ``0.25`` ``25.0 %``, ``1.0``
    ``100 %``, ``0`` ``0 %``; ``missing`` when it is missing (no ``%`` then)."""
    text = sig(fraction, digits, scale=100.0, missing=missing)
    return f"{text} %" if finite(fraction) else text
