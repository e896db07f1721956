"""The roll-up after the timed runs: estimates from children, derived rates, ceilings, shares."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from cb_callback._engine.capture.tree import Node
from cb_callback._engine.derive.estimate import derive, estimate_from_children
from cb_callback._engine.derive.parts import derive_parts
from cb_callback._engine.derive.quality import inconsistent_pairs
from cb_callback._hardware.peaks import Peaks, bandwidth_ceiling
from cb_callback._report.finite import finite, or_zero
from cb_callback._report.model import ComponentRow

__all__ = ["derive_all", "estimate_parents", "fill_share", "pairs_by_batch", "row_cost"]


def row_cost(row: ComponentRow) -> float:
    """``(fwd_ms + bwd_ms) × calls``: what a measured component costs over the step."""
    return (or_zero(row.fwd_ms) + or_zero(row.bwd_ms)) * max(row.calls, 1)


def estimate_parents(nodes: Sequence[Node], rows: dict[str, ComponentRow]) -> None:
    """Bottom-up: a failed or container row takes its children's sums."""
    for node in sorted(nodes, key=lambda n: -n.depth):
        row = rows[node.path]
        if row.status not in ("failed", "estimated"):
            continue
        children = [rows[c] for c in node.children if c in rows]
        if not children:
            row.status = "failed"
            row.error = row.error or "no child was profiled to estimate it from"
            continue
        ran = [c for c in children if c.status != "not_run"]
        if row.error is None and ran and all(c.status == "skipped" and c.details.get("as") != "insitu" for c in ran):
            # a container whose children were all skipped (not replayed for budget_s, excluded, not
            # descended into) is not measured either, nor failed: skipped as they are
            row.status = "skipped"
            row.note = (row.note + "; " if row.note else "") + "its children were skipped: nothing to estimate it from"
            if any(c.details.get("unreplayed") == "budget_s" for c in ran):
                row.details["unreplayed"] = "budget_s"
            continue
        estimate_from_children(row, children)


def fill_share(
    rows: Mapping[str, ComponentRow], per_batch: Mapping[str, Mapping[int, ComponentRow]] | None = None
) -> None:
    """``share`` = ``total_ms × calls ÷ (root total_ms × root calls)`` where both are known.

    Time over the step as a fraction of the root's time over the step: for a
    root called once (the usual step) that is ``total_ms × calls ÷ root
    total_ms``; a step that calls the model twice (a siamese step) does not
    double every share.

    With several batches (``per_batch``: each component's row per batch) a
    measured row's share is ``Σ_b total_ms_b × calls_b ÷ Σ_b root's``, over the
    batches the root was measured in and the component was not failed in (a
    batch it did not run in counts 0): a component that ran in one batch of four
    is not credited with that batch's time in all four. An estimated row's share
    is then its children's sum (what it is in one batch, too).
    """
    root = rows.get("")
    if root is None or not math.isfinite(root.total_ms) or root.total_ms <= 0:
        return
    if per_batch and "" in per_batch:
        _share_by_batch(rows, per_batch)
        return
    whole = root.total_ms * max(root.calls, 1)
    for row in rows.values():
        if row.status in ("ok", "estimated") and math.isfinite(row.total_ms):
            row.share = row.total_ms * max(row.calls, 1) / whole


def _share_by_batch(rows: Mapping[str, ComponentRow], per_batch: Mapping[str, Mapping[int, ComponentRow]]) -> None:
    def cost(r: ComponentRow) -> float:
        return (
            (r.fwd_ms + or_zero(r.bwd_ms)) * max(r.calls, 1)
            if r.status == "ok" and math.isfinite(r.fwd_ms)
            else math.nan
        )

    root = {b: cost(r) for b, r in per_batch[""].items()}
    root = {b: c for b, c in root.items() if math.isfinite(c) and c > 0}
    for path, row in rows.items():
        if row.status != "ok" or path not in per_batch:
            continue
        mine = per_batch[path]
        counted = [b for b in root if b not in mine or mine[b].status == "ok"]
        whole = sum(root[b] for b in counted)
        if whole > 0:
            row.share = sum(or_zero(cost(mine[b])) for b in counted if b in mine) / whole
    by_parent: dict[str, list[ComponentRow]] = {}
    for row in rows.values():
        if row.parent is not None:
            by_parent.setdefault(row.parent, []).append(row)
    for row in sorted(rows.values(), key=lambda r: -r.depth):  # children first
        if row.status == "estimated":
            kids = [c.share for c in by_parent.get(row.path, []) if c.status in ("ok", "estimated")]
            if kids and all(math.isfinite(k) for k in kids):
                row.share = math.fsum(kids)


def pairs_by_batch(per_batch: Mapping[str, Mapping[int, ComponentRow]], n: int) -> list[tuple[str, str]]:
    """``(child, parent)`` pairs measured slower than the parent on the same batch, over all batches."""
    out: list[tuple[str, str]] = []
    for b in range(n):
        mine = {path: rows[b] for path, rows in per_batch.items() if b in rows}
        medians = {
            p: or_zero(r.fwd_ms) + or_zero(r.bwd_ms)
            for p, r in mine.items()
            if r.status == "ok" and math.isfinite(r.fwd_ms)
        }
        out += [pair for pair in inconsistent_pairs(mine, medians) if pair not in out]
    return out


def derive_all(rows: Iterable[ComponentRow], peaks: Peaks) -> None:
    """Each row's derived rates (:func:`cb_callback._engine.derive.estimate.derive`) and, for a measured
    row whose working set picks a cache level, ``details["bw_ceiling"]`` (the level and its GB/s); a plugin's
    ``details["parts"]`` and ``details["planned"]`` completed (:mod:`cb_callback._engine.derive.parts`).

    The roofline behind ``bound`` takes the row's own ceiling as its memory roof where it has one (an
    in-cache ReLU is judged against its cache level, not DRAM: ``details["roofline"]["ceiling"]`` names
    it), else the device's ``peaks.bandwidth``.
    """
    for row in rows:
        ceiling = bandwidth_ceiling(peaks, row.details.get("working_set_bytes")) if row.status == "ok" else None
        if ceiling is not None and ceiling.bandwidth is not None:
            row.details["bw_ceiling"] = {"level": ceiling.name, "gbps": ceiling.bandwidth / 1e9}
        own = row.details.get("bw_ceiling")  # ours, or one a plugin set
        own = own if isinstance(own, Mapping) else {}
        gbps = own.get("gbps")
        roof = float(gbps) * 1e9 if finite(gbps) and gbps > 0 else None
        derive(row, peaks.flops, peaks.bandwidth, roof)
        if roof is not None and "roofline" in row.details:
            row.details["roofline"]["ceiling"] = own.get("level")
        derive_parts(row, peaks.bandwidth)
