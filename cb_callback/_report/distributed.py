"""The summary's lines for a run over several ranks: the spread over ranks, communication, measured vs planned.

A renderer: it reads rows (``details["ranks"]``, ``comm_bytes``/``comm_ms``,
``details["planned"]``) and metadata only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from cb_callback._report.finite import finite
from cb_callback._report.numbers import sig

if TYPE_CHECKING:
    from cb_callback._report.model import ComponentRow, Report

__all__ = ["SPREAD_BAD", "SPREAD_WARN", "distributed_lines", "imbalanced", "rank_spread"]

#: A row whose ranks differ by more than this fraction of the median rank is imbalanced (the page colours
#: it amber; above :data:`SPREAD_BAD` red), unless the spread is within twice its noise (run-to-run
#: variation on one rank explains it).
SPREAD_WARN = 0.10
SPREAD_BAD = 0.25
#: Rows below this share of the step are not listed as imbalanced in the summary (the page colours them).
_LIST_SHARE = 0.01

_PARTS = (
    ("fwd_compute_ms", "fwd compute"), ("fwd_comms_ms", "fwd comms"), ("bwd_compute_ms", "bwd compute"),
    ("bwd_comms_ms", "bwd comms"), ("total_ms", "total"),
)  # fmt: skip


def rank_spread(row: ComponentRow) -> float | None:
    """``(slowest - fastest rank) / median rank`` of the row's ``total_ms`` (``details["ranks"]``), if known."""
    ranks = row.details.get("ranks")
    total = ranks.get("total_ms") if isinstance(ranks, Mapping) else None
    if not isinstance(total, Mapping):
        return None
    lo, mid, hi = total.get("min"), total.get("median"), total.get("max")
    if not (finite(lo) and finite(mid) and finite(hi)):
        return None
    return float((hi - lo) / mid) if mid > 0 else None


def imbalanced(row: ComponentRow) -> bool:
    """Whether the ranks' times differ by more than :data:`SPREAD_WARN` and more than twice the row's noise."""
    spread = rank_spread(row)
    if spread is None or spread <= SPREAD_WARN:
        return False
    return not (finite(row.noise) and spread <= 2 * row.noise)


def _label(row: ComponentRow) -> str:
    return row.path or "(root)"


def _g(v: object) -> str:
    return f"{v:.3g}" if finite(v) else "-"


def _ranks_lines(report: Report) -> list[str]:
    meta = report.metadata.get("ranks")
    if not isinstance(meta, Mapping):
        return []
    head = f"ranks: {meta.get('world_size')} (this report: rank {meta.get('rank')}; profiles={meta.get('profiles')!r})"
    spreads = [(s, r) for r in report.rows if (s := rank_spread(r)) is not None]
    if not spreads:
        return [head]
    lines = [head]
    root = next((r for r in report.rows if r.path == ""), None)
    root_spread = rank_spread(root) if root is not None else None
    if root is not None and root_spread is not None:
        lines.append(
            f"  whole model: ranks differ by {sig(root_spread, scale=100.0)} % of the median; "
            f"straggler rank {root.details['ranks'].get('straggler')}"
        )
    bad = sorted(
        ((s, r) for s, r in spreads if r.path and imbalanced(r) and finite(r.share) and r.share >= _LIST_SHARE),
        key=lambda x: -x[0],
    )
    for s, r in bad[:5]:
        lines.append(
            f"  imbalanced: {_label(r)} {sig(s, scale=100.0)} % (straggler rank {r.details['ranks'].get('straggler')}; "
            f"{sig(r.share, scale=100.0)} % of the step)"
        )
    if len(bad) > 5:
        lines.append(f"  ... and {len(bad) - 5} more")
    return lines


def _comm_lines(report: Report) -> list[str]:
    comm = [r for r in report.rows if finite(r.comm_bytes) and r.comm_bytes > 0 and r.path]
    if not comm:
        return []
    deepest = [r for r in comm if not any(c.path.startswith(r.path + ".") for c in comm)]  # leaf-most communicators
    deepest.sort(key=lambda r: -(r.comm_ms if finite(r.comm_ms) else 0.0))
    lines = ["communication (leaf-most components that communicate; per call, each collective waited as issued):"]
    for r in deepest[:5]:
        ops = ", ".join(f"{c.get('op')} {c.get('phase')} x{c.get('count')}" for c in r.details.get("comm") or ())
        lines.append(f"  {_label(r)}: {r.comm_bytes / 1024:.4g} KiB in {_g(r.comm_ms)} ms ({ops})")
    return lines


def _planned_lines(report: Report) -> list[str]:
    rows = [r for r in report.rows if isinstance(r.details.get("planned"), Mapping)]
    if not rows:
        return []
    lines = ["measured vs planned (ms per call; x: measured / planned; compute measured alone unless 'derived'):"]
    for r in rows:
        p = r.details["planned"]
        if "error" in p:
            lines.append(f"  {_label(r)}: no estimate ({p['error']})")
            continue
        measured, planned, ratio = p.get("measured", {}), p.get("planned_on_split", {}), p.get("ratio", {})
        how, negative = p.get("measured_how") or {}, p.get("derived_negative") or {}
        cells = []
        for key, name in _PARTS:
            x = f" (x{ratio[key]:.3g})" if finite(ratio.get(key)) else ""
            if key in negative:  # a derivation below zero: no value (the row is flagged derived_negative)
                got = f"<0 (derived {_g(negative[key])})"
            else:
                got = _g(measured.get(key)) + (" (derived)" if how.get(key) == "derived" else "")
            cells.append(f"{name} {got} vs {_g(planned.get(key))}{x}")
        lines.append(f"  {_label(r)} [{p.get('source', 'planner')}]: " + "; ".join(cells))
    return lines


def distributed_lines(report: Report) -> list[str]:
    """The summary's section for a run over several ranks, or with a planner's estimate; empty otherwise."""
    blocks = [b for b in (_ranks_lines(report), _comm_lines(report), _planned_lines(report)) if b]
    out: list[str] = []
    for block in blocks:
        out += ["", *block]
    return out
