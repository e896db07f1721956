"""Which components were renamed between two reports: a conservative pairing of unmatched rows.

``cb diff`` pairs rows by path (:func:`cb_callback._report.diff.compare_reports`); a
component whose attribute was renamed (``self.proj`` -> ``self.out_proj``, ``blocks`` ->
``layers``) is then one row *only in A* and one *only in B*. :func:`rename_pairs` pairs
such rows when nothing else could be meant:

- both are unmatched (the path is in one report only), of the same ``module_type`` and
  depth;
- their parents are the same component: the same path, or a parent pair this function
  already found (rows are taken root first, so ``blocks.1 -> layers.1`` carries
  ``blocks.1.fc -> layers.1.fc``);
- the same ``fwd_flops``, ``params_mb`` and ``calls``, both known: the same work on the same
  parameters (a row without them, a failed one, is never paired);
- and the pairing is unique both ways: exactly one such row in B for the row in A, and
  exactly one in A for that row in B. Two renamed siblings of one type and size stay
  unpaired (in one report only): the gate never guesses.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from cb_callback._report.model import ComponentRow, Report

__all__ = ["rename_pairs"]


def _same(x: float, y: float) -> bool:
    """Equal known numbers (a NaN, not measured, proves nothing)."""
    x, y = float(x), float(y)
    return math.isfinite(x) and x == y


def _signature_matches(ra: ComponentRow, rb: ComponentRow) -> bool:
    return (
        ra.module_type == rb.module_type
        and ra.depth == rb.depth
        and ra.calls == rb.calls
        and _same(ra.fwd_flops, rb.fwd_flops)
        and _same(ra.params_mb, rb.params_mb)
    )


def _parent_in_b(ra: ComponentRow, paths_b: set[str], found: Mapping[str, str]) -> str | None:
    """The path in B of ``ra``'s parent: the same path, or the parent's rename; ``None`` when it has neither."""
    if ra.parent is None:
        return None
    if ra.parent in found:
        return found[ra.parent]
    return ra.parent if ra.parent in paths_b else None


def rename_pairs(a: Report, b: Report) -> dict[str, str]:
    """The renamed components from ``a`` to ``b``: ``{path in a: path in b}`` (see the module docstring).

    Returns:
        Only the renamed ones; a component at the same path in both is not listed.
    """
    paths_a = {r.path for r in a.rows}
    paths_b = {r.path for r in b.rows}
    only_a = sorted((r for r in a.rows if r.path not in paths_b), key=lambda r: r.depth)
    only_b = [r for r in b.rows if r.path not in paths_a]
    found: dict[str, str] = {}
    for ra in only_a:
        parent = _parent_in_b(ra, paths_b, found)
        if parent is None:
            continue
        taken = set(found.values())
        candidates = [r for r in only_b if r.parent == parent and r.path not in taken and _signature_matches(ra, r)]
        if len(candidates) != 1:
            continue
        rb = candidates[0]
        rivals = [r for r in only_a if r.path not in found and r.parent == ra.parent and _signature_matches(r, rb)]
        if len(rivals) == 1:  # ra alone in A looks like rb
            found[ra.path] = rb.path
    return found
