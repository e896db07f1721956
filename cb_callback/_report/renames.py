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

Then a second, structural pass pairs what is left of a renamed parent whose work changed (renamed
*and* slower: other FLOPs): an unmatched row with children and an unmatched one of the same type,
depth and parent (the same path or a found pair) whose children have the same names relative
to it and the same types (``attn.{qkv,proj}`` and ``attention.{qkv,proj}``), unique both ways;
its unmatched descendants are then paired by their relative names (same type). Such a pair is
judged as any rename: it reads ``regressed`` when it regressed.
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
    _structural(a, b, only_a, only_b, paths_b, found)
    return found


def _shape(report: Report, path: str) -> frozenset[tuple[str, str]]:
    """The children of ``path``: ``(name relative to it, module type)``."""
    prefix = path + "." if path else ""
    return frozenset((r.path[len(prefix) :], r.module_type) for r in report.rows if r.parent == path)


def _structural(
    a: Report,
    b: Report,
    only_a: list[ComponentRow],
    only_b: list[ComponentRow],
    paths_b: set[str],
    found: dict[str, str],
) -> None:
    """The second pass (module docstring): unmatched parents by type and their children's names; then their
    descendants by relative name. Adds to ``found``."""
    by_b = {r.path: r for r in only_b}
    for ra in only_a:  # root first
        if ra.path in found:
            continue
        mapped = next((p for p in found if ra.path.startswith(p + ".") and p), None)
        taken = set(found.values())
        if mapped is not None:  # a descendant of a structural pair: by its relative name
            rb = by_b.get(found[mapped] + ra.path[len(mapped) :])
            if rb is not None and rb.path not in taken and rb.module_type == ra.module_type:
                found[ra.path] = rb.path
            continue
        parent = _parent_in_b(ra, paths_b, found)
        shape = _shape(a, ra.path)
        if parent is None or not shape:
            continue
        candidates = [
            r
            for r in only_b
            if r.parent == parent and r.path not in taken and r.module_type == ra.module_type
            and r.depth == ra.depth and _shape(b, r.path) == shape
        ]  # fmt: skip
        rivals = [
            r for r in only_a if r.path not in found and r.parent == ra.parent and r.module_type == ra.module_type
            and _shape(a, r.path) == shape
        ]  # fmt: skip
        if len(candidates) == 1 and len(rivals) == 1:
            found[ra.path] = candidates[0].path
