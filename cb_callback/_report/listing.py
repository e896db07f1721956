"""A report's components selected, sorted and listed: ``cb report --filter/--depth/--sort`` and ``cb diff``'s selection.

A renderer: it reads rows only. The rules:

- ``pattern`` matches a row's path (``(root)`` for the root) or its module type,
  case-insensitively: a substring (``attn``, ``Conv2d``), or, when it has
  ``*``, ``?`` or ``[``, a glob that matches the whole path or the whole type
  (``blocks.*.attn``, ``Conv*``), as the html page's path filter does;
- ``depth``: rows that deep or shallower (the root is 0);
- ``sort``: a report column; numbers largest first, text A to Z, missing values
  (``None``, NaN) last; without one, the report's order (the tree's, breadth first).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from cb_callback._report.finite import finite
from cb_callback._report.numbers import si, sig
from cb_callback._report.table import format_rows

if TYPE_CHECKING:
    from cb_callback._report.model import ComponentRow, Report

__all__ = ["ADDED_COLUMNS", "TEXT_COLUMNS", "format_listing", "matches", "select_rows", "sort_rows"]

#: Columns sorted as text (A to Z); every other column is a number (largest first).
TEXT_COLUMNS: tuple[str, ...] = ("path", "module_type", "status", "parent", "bound")


def _cell(value: object, scale: float = 1.0) -> str:
    """``value * scale`` to 3 significant figures (:func:`~cb_callback._report.numbers.sig`); ``"-"`` when missing."""
    return sig(value, scale=scale)


#: The columns the summary's component lines lack (:data:`cb_callback._report.table.SUMMARY_HEADERS`):
#: ``(header, cell)`` of the one :func:`format_listing` adds, last, when it is sorted by. Numbers to
#: 3 significant figures, counts (FLOP, bytes) with an SI prefix (``134 k``, ``1.20 M``): a value that
#: is not 0 never shows as 0.
ADDED_COLUMNS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "depth": ("depth", str),
    "parent": ("parent", lambda v: "-" if v is None else (v or "(root)")),
    "cpu_ms": ("cpu ms", _cell),
    "device_ms": ("device ms", _cell),
    "fwd_flops": ("fwd FLOP", si),
    "bwd_flops": ("bwd FLOP", si),
    "params_mb": ("params MB", _cell),
    "activation_mb": ("activation MB", _cell),
    "bytes": ("bytes moved", si),
    "bw_util": ("bw util %", lambda v: _cell(v, 100.0)),
    "intensity": ("FLOP/byte", _cell),
    "noise": ("noise %", lambda v: _cell(v, 100.0)),
    "compiled_ms": ("compiled ms", _cell),
    "compile_speedup": ("compile x", _cell),
    "comm_bytes": ("comm bytes", si),
    "comm_ms": ("comm ms", _cell),
    "insitu_ms": ("in-situ ms", _cell),
    "headroom_ms": ("headroom ms", _cell),
}


def matches(row: ComponentRow, pattern: str) -> bool:
    """Whether ``pattern`` matches the row's path or module type (the module docstring's rule)."""
    names = ((row.path or "(root)").lower(), str(row.module_type).lower())
    wanted = pattern.lower()
    if any(ch in pattern for ch in "*?["):
        return any(fnmatch.fnmatchcase(n, wanted) for n in names)
    return any(wanted in n for n in names)


def select_rows(rows: Sequence[ComponentRow], depth: int | None, pattern: str | None) -> list[ComponentRow]:
    """The rows ``depth`` deep or shallower (``None``: any) that ``pattern`` matches (``None``/empty: all), in order."""
    return [r for r in rows if (depth is None or r.depth <= depth) and (not pattern or matches(r, pattern))]


def _sort_key(column: str) -> Callable[[ComponentRow], tuple[int, Any]]:
    def key(r: ComponentRow) -> tuple[int, Any]:
        v = getattr(r, column)
        if column in TEXT_COLUMNS:
            return (0, str(v)) if v is not None else (1, "")
        return (0, -v) if finite(v) else (1, 0)

    return key


def sort_rows(rows: Sequence[ComponentRow], column: str) -> list[ComponentRow]:
    """``rows`` by ``column``: numbers largest first, text A to Z, missing values last (a stable sort)."""
    return sorted(rows, key=_sort_key(column))


def format_listing(
    report: Report,
    *,
    sort: str | None = None,
    depth: int | None = None,
    pattern: str | None = None,
    top: int | None = None,
) -> list[str]:
    """The selected components as one table, with a title saying what was selected and how it is ordered.

    Args:
        report: the report.
        sort: the column to sort by (``None``: the report's order).
        depth: only rows this deep or shallower.
        pattern: only rows it matches (:func:`matches`).
        top: only the first ``top`` rows after sorting (``None``: all).

    Returns:
        ``components (2 of 5; filter 'Conv2d' (path or type); by noise, largest
        first):`` (``first K of N selected, M in all`` when ``top`` cut, ``first K of M`` when all were selected), then
        the columns of the summary's component lines
        (:func:`cb_callback._report.table.format_rows`) and, when sorted by a
        column they lack, that column last (:data:`ADDED_COLUMNS`: ``noise %``,
        ``bw util %`` ...), so the order can be read off the table.
    """
    selected = select_rows(report.rows, depth, pattern)
    if sort:
        selected = sort_rows(selected, sort)
    shown = selected if top is None else selected[:top]
    how = []
    if pattern:
        how.append(f"filter {pattern!r} (path or type)")
    if depth is not None:
        how.append(f"depth <= {depth}")
    how.append(
        f"by {sort}, {'A to Z' if sort in TEXT_COLUMNS else 'largest'} first" if sort else "in the report's order"
    )
    count = f"{len(selected)} of {len(report.rows)}"
    if len(shown) < len(selected):
        count = f"first {len(shown)} of {len(selected)}"
        count += f" selected, {len(report.rows)} in all" if len(selected) < len(report.rows) else ""
    lines = format_rows(shown).split("\n")
    if sort in ADDED_COLUMNS:
        header, cell = ADDED_COLUMNS[sort]
        cells = [header, "", *(cell(getattr(r, sort)) for r in shown)]
        width = max(len(c) for c in cells)
        cells[1] = "-" * width
        edge = max(len(ln) for ln in lines)
        lines = [f"{ln.ljust(edge)}  {c.rjust(width)}" for ln, c in zip(lines, cells, strict=True)]
    return [f"components ({count}; {'; '.join(how)}):", *lines]
