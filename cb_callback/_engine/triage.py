"""Triage: from the in-situ times, which components are replayed, which take a representative's row,
which are not descended into, decided before any isolated replay runs."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from cb_callback._engine.groups import corresponding, sibling_groups, subtree
from cb_callback._engine.inputs import ComponentInputs
from cb_callback._engine.insitu import InSitu
from cb_callback._engine.tree import Node

__all__ = ["Plan", "differs", "insitu_costs", "triage"]

#: A member is measured alone when its in-situ time per call and its representative's differ by more
#: than this fraction plus both spreads (and by :data:`MEMBER_SLACK_MS`): as wide as ``insitu_mismatch``'s
#: margin, the run-to-run drift of a shared CPU (a member measured alone costs a replay).
MEMBER_MARGIN = 0.5
MEMBER_SLACK_MS = 0.05


@dataclass
class Plan:
    """What the schedule does with each node (a node in none of these is replayed as usual).

    Attributes:
        skip: ``{path: (ancestor not descended, its effective share)}``.
        copy: ``{path: the path whose row it takes}`` (a group member below the
            representatives, and everything under it).
        alone: group members measured at their own level (their in-situ time
            differs from their representative's: :func:`differs`), not descended
            into (their subtree takes the representative's rows).
        groups: ``{member: {"members", "representatives", "share"}}`` for every
            member of a group of two or more.
        shares: each node's in-situ share of the step (``None``: not known).
        effective: the share a replayed node's descent was decided by (its own,
            or its group's total, times the members its ancestors stand for).
    """

    skip: dict[str, tuple[str, float]] = field(default_factory=dict)
    copy: dict[str, str] = field(default_factory=dict)
    alone: set[str] = field(default_factory=set)
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    shares: dict[str, float | None] = field(default_factory=dict)
    effective: dict[str, float | None] = field(default_factory=dict)

    @property
    def replayed(self) -> int:
        """How many nodes the plan leaves to replay."""
        return len(self.shares) - len(self.skip) - len(self.copy)


def insitu_costs(
    nodes: Sequence[Node], insitu_ms: Mapping[str, float], calls: Mapping[str, ComponentInputs]
) -> dict[str, float | None]:
    """Each node's in-situ forward over the step (``insitu_ms × calls``), ms.

    A node without a time of its own (a container that is never called, a
    module called as ``.forward``) is the sum of its children's known costs;
    ``None`` when nothing under it is known.
    """
    out: dict[str, float | None] = {}
    for node in sorted(nodes, key=lambda n: -n.depth):
        own = insitu_ms.get(node.path)
        if own is not None and math.isfinite(own):
            out[node.path] = own * max(calls[node.path].calls if node.path in calls else 1, 1)
            continue
        known = [out[c] for c in node.children if out.get(c) is not None]
        out[node.path] = math.fsum(k for k in known if k is not None) if known else None
    return out


def differs(a: InSitu | None, b: InSitu | None) -> bool:
    """Whether two in-situ times per call disagree beyond their spreads (``None``: unknown, no)."""
    if a is None or b is None or not (math.isfinite(a.fwd_ms) and math.isfinite(b.fwd_ms)):
        return False
    spread = sum(x.spread for x in (a, b) if math.isfinite(x.spread))
    low, high = sorted((a.fwd_ms, b.fwd_ms))
    return high - low > MEMBER_SLACK_MS and high > (1.0 + MEMBER_MARGIN + 2.0 * spread) * low


def _representatives(members: Sequence[str], k: int, insitu: Mapping[str, InSitu]) -> list[str]:
    """The ``k`` members whose in-situ time per call is nearest the group's median (in member order);
    the first ``k`` when a time is missing. The first block of a stack often runs colder than the rest:
    the median member stands for the group, and the others are compared with it."""
    k = min(k, len(members))
    times = [insitu[m].fwd_ms if m in insitu else math.nan for m in members]
    if not all(math.isfinite(t) for t in times):
        return list(members[:k])
    mid = statistics.median(times)
    nearest = sorted(range(len(members)), key=lambda i: abs(times[i] - mid))[:k]  # stable: ties keep order
    return [members[i] for i in sorted(nearest)]


def triage(
    nodes: Sequence[Node],
    modules: Mapping[str, nn.Module],
    calls: Mapping[str, ComponentInputs],
    costs: Mapping[str, float | None],
    step_ms: float,
    *,
    descend_share: float,
    representatives: int,
    insitu: Mapping[str, InSitu] | None = None,
    batches: Sequence[Mapping[str, ComponentInputs]] = (),
) -> Plan:
    """Decide the run's replays from the in-situ costs (:func:`insitu_costs`), breadth-first from the root.

    - A replayed node is descended into (its children replayed) when its
      effective share reaches ``descend_share``, or is unknown; else everything
      below it is skipped.
    - Siblings that repeat (:func:`cb_callback._engine.groups.sibling_groups`) are one
      group: its ``representatives`` members nearest the group's median in-situ
      time (:func:`_representatives`) are replayed and descended into
      when the group's **total** share (times what their ancestors stand for)
      reaches ``descend_share``; a representative's children then count as many
      times as it stands for members. Every other member gets a row at its own
      level: the representative's measurement, or, when its in-situ time per
      call differs from the representative's beyond their spreads
      (:func:`differs`: it does not run like it), replayed alone; its subtree
      takes the representative's rows either way.
    - ``representatives=0`` groups nothing.

    Args:
        nodes: every node, breadth-first.
        modules: each node's module.
        calls: the captured calls (grouping compares their inputs).
        costs: each node's in-situ forward over the step (ms).
        step_ms: what the shares divide by (the step's in-situ forward).
        descend_share: as :class:`~cb_callback.BenchmarkConfig`.
        representatives: members measured in depth per group.
        insitu: the in-situ times per call, by path (which members run unlike
            their representative).
        batches: every captured batch's calls, with several (members ran in
            the same batches).
    """
    by_path = {n.path: n for n in nodes}
    plan = Plan()
    for n in nodes:
        c = costs.get(n.path)
        plan.shares[n.path] = c / step_ms if c is not None and step_ms > 0 else None
    if not nodes:
        return plan
    root = nodes[0]

    def share(path: str) -> float | None:
        return plan.shares.get(path)

    def descend(node: Node, stands_for: float, effective: float | None) -> None:
        plan.effective[node.path] = effective
        if effective is not None and effective < descend_share:
            for child in node.children:
                for p in subtree(child, by_path):
                    plan.skip[p] = (node.path, effective)
            return
        for members in (
            sibling_groups(node, modules, calls, batches) if representatives > 0 else [[c] for c in node.children]
        ):
            if len(members) == 1:
                own = share(members[0])
                descend(by_path[members[0]], stands_for, None if own is None else own * stands_for)
                continue
            reps = _representatives(members, representatives, insitu or {})
            known = [share(m) for m in members]
            total = math.fsum(s for s in known if s is not None) if all(s is not None for s in known) else None
            info = {"members": list(members), "representatives": list(reps), "share": total}
            for m in members:
                plan.groups[m] = info
            for r in reps:
                descend(
                    by_path[r], stands_for * len(members) / len(reps), None if total is None else total * stands_for
                )
            times = insitu or {}
            for m in (m for m in members if m not in reps):
                measured = differs(times.get(m), times.get(reps[0]))
                if measured:
                    plan.alone.add(m)
                    own = share(m)
                    plan.effective[m] = own * stands_for if own is not None else None
                for p in subtree(m, by_path):
                    if p == m and measured:
                        continue
                    source = corresponding(p, m, reps[0])
                    if source in by_path:
                        plan.copy[p] = source

    descend(root, 1.0, share(root.path))
    return plan
