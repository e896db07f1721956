"""Which components a run descends into: levels, each component's time over the step, the cold subtrees."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from cb_callback._engine.capture.inputs import ComponentInputs
from cb_callback._engine.capture.tree import Node
from cb_callback._engine.derive.rollup import row_cost
from cb_callback._report.model import ComponentRow

__all__ = ["below_cold", "descendants_called", "levels", "not_descended_note", "step_cost_ms"]


def levels(nodes: Sequence[Node]) -> list[list[Node]]:
    """The nodes grouped by depth, shallowest first, each group in the nodes' order."""
    out: dict[int, list[Node]] = {}
    for n in nodes:
        out.setdefault(n.depth, []).append(n)
    return [out[d] for d in sorted(out)]


def step_cost_ms(
    path: str,
    nodes: Mapping[str, Node],
    rows: Mapping[str, ComponentRow],
    per_batch: Mapping[str, Mapping[int, ComponentRow]] | None = None,
) -> float | None:
    """``(fwd_ms + bwd_ms) × calls`` of a component over the step, as far as known now.

    The one figure every selection ranks by (descent, ``artifacts_top``,
    ``compile_top``), as ``share`` counts it: with several batches (``per_batch``)
    the sum over the batches it was measured in, not its median batch's. A
    measured (``ok``) row has its own; a row without one of its own (a
    container, a failed replay) is the sum of its children's known costs (as
    it will be estimated); a component that never ran costs 0; ``None`` when
    nothing is known (skipped, or no child profiled yet).
    """
    row = rows.get(path)
    if row is None:
        return None
    if row.status == "ok" and math.isfinite(row.fwd_ms):
        mine = (per_batch or {}).get(path)
        if mine:
            return math.fsum(row_cost(r) for r in mine.values() if r.status == "ok" and math.isfinite(r.fwd_ms))
        return row_cost(row)
    if row.status == "not_run":
        return 0.0
    if row.status not in ("estimated", "failed"):
        return None
    parts = [step_cost_ms(c, nodes, rows, per_batch) for c in nodes[path].children]
    known = [x for x in parts if x is not None]
    return sum(known) if known else None


def below_cold(
    level: Sequence[Node],
    nodes: Mapping[str, Node],
    rows: Mapping[str, ComponentRow],
    descend_share: float,
    not_descended: Mapping[str, tuple[str, float]],
    per_batch: Mapping[str, Mapping[int, ComponentRow]] | None = None,
) -> dict[str, tuple[str, float]]:
    """The children of ``level`` not to profile: ``{child: (ancestor not descended, its share)}``.

    A node's ``share`` is :func:`step_cost_ms` over the root's (as
    :func:`cb_callback._engine.derive.rollup.fill_share` computes it). Below a node with a known
    share under ``descend_share`` nothing is profiled; a node whose share is not
    known yet (a container, before its children ran; or no root time) is
    descended into; a node that was not descended into passes its reason on.
    """
    ref = step_cost_ms("", nodes, rows, per_batch)  # the root's time over the step, as _fill_share divides by
    out: dict[str, tuple[str, float]] = {}
    for node in level:
        if node.path in not_descended:
            why = not_descended[node.path]
        else:
            cost = step_cost_ms(node.path, nodes, rows, per_batch)
            if ref is None or ref <= 0 or cost is None or rows[node.path].status != "ok":
                continue
            share = cost / ref
            if share >= descend_share:
                continue
            why = (node.path, share)
        out.update(dict.fromkeys(node.children, why))
    return out


def not_descended_note(node: Node, ancestor: str, share: float, descend_share: float, group: int = 0) -> str:
    """The ``note`` of a component below one whose share was under ``descend_share`` (``ancestor`` its
    own path: the component itself was too small to replay, its parent descended into; ``group``: the
    members of its group, whose summed share that is)."""
    if ancestor == node.path:
        whose = f"its group's share ({group} members, summed)" if group > 1 else "its share"
        return f"not replayed: {whose} {share:.3g} < descend_share {descend_share:g}"
    who = "parent" if node.parent == ancestor else "ancestor"
    return f"not descended: {who} {ancestor or 'root'} has share {share:.3g} < descend_share {descend_share:g}"


def descendants_called(nodes: list[Node], calls: Mapping[str, ComponentInputs]) -> dict[str, bool]:
    out = {n.path: n.path in calls for n in nodes}
    by_path = {n.path: n for n in nodes}
    for n in sorted(nodes, key=lambda n: -n.depth):
        if out[n.path] and n.parent is not None and n.parent in by_path:
            out[n.parent] = True
    return out
