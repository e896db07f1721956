"""The summary's lines for a run on hash-size-reduced embedding tables (the torchrec integration's ``ReduceHashSize``).

A renderer: it reads ``metadata["hash_size_reduction"]`` (what the preprocessor
rebuilt) and the rows' flags only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cb_callback._report.model import Report

__all__ = ["reduced_lines"]

#: Tables listed one per line; the rest are counted.
_LISTED = 5


def reduced_lines(report: Report) -> list[str]:
    """Which tables were profiled shrunk (real and reduced rows) and which columns come from which table.

    Empty when no table was remapped. Times (and the rates, memory, ``params_mb`` and bandwidth ceiling derived
    from the run) are the reduced tables'; bytes and FLOPs the real ones' (see the rows' ``details["hash_size"]``).
    """
    record = report.metadata.get("hash_size_reduction")
    if not isinstance(record, Mapping):
        return []
    tables = record.get("tables")
    if not isinstance(tables, Mapping):
        return []
    shrunk = [(p, t) for p, t in tables.items() if isinstance(t, Mapping) and t.get("remapped")]
    if not shrunk:
        return []
    flagged = sum(1 for r in report.rows if "hash_reduced" in (r.details.get("flags") or ()))
    collapsed = [r.path or "(root)" for r in report.rows if "hash_collapsed" in (r.details.get("flags") or ())]
    lines = [
        f"hash-size reduction (max_rows={record.get('max_rows')}): {len(shrunk)} table(s) profiled shrunk, "
        f"{flagged} row(s) flagged hash_reduced: times, rates, params_mb, memory and the bandwidth ceiling are "
        "the shrunk tables' (not scaled); bytes and FLOPs the real tables'",
    ]
    for path, t in shrunk[:_LISTED]:
        lines.append(f"  {path}: {t.get('original_rows'):,} real rows, {t.get('reduced_rows'):,} profiled")
    if len(shrunk) > _LISTED:
        lines.append(f"  ... and {len(shrunk) - _LISTED} more")
    if collapsed:
        lines.append(f"  distinct ids collapsed onto one row by id % max_rows in: {', '.join(collapsed[:_LISTED])}")
    return lines
