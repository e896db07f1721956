"""Triage: from the in-situ times, which components are replayed, which take a representative's row
(only where proven to do its work), which are not descended into, decided before any isolated replay runs."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from cb_callback._engine.capture.inputs import ComponentInputs
from cb_callback._engine.capture.tree import Node
from cb_callback._engine.clocks.insitu import InSitu
from cb_callback._engine.selection.groups import (
    call_difference,
    corresponding,
    sibling_groups,
    subtree,
    view_difference,
)

__all__ = ["Plan", "differs", "first_difference", "insitu_costs", "triage"]

#: Per captured batch, ``{path: (forward FLOPs, backward FLOPs, bytes)}`` in the step
#: (:mod:`cb_callback._engine.counting.census`).
Counts = Sequence[Mapping[str, tuple[int, ...] | None]]

#: A member is measured alone when its in-situ time per call and its representative's differ by more
#: than this fraction plus both spreads (and by :data:`MEMBER_SLACK_MS`): as wide as ``insitu_mismatch``'s
#: margin, the run-to-run drift of a shared CPU (a member measured alone costs a replay).
MEMBER_MARGIN = 0.5
MEMBER_SLACK_MS = 0.05

#: The top hotspots: the leaves of the largest in-situ shares (each as many times as it stands for
#: members, below a representative), this many, each holding at least
#: ``descend_share / TOP_HOTSPOTS`` of the step (five such leaves together reach ``descend_share``), are
#: replayed whatever their own share, and the nodes on the way to them: a model whose leaves are
#: each under ``descend_share`` still has its largest measured alone, and a leaf of a negligible share
#: is not replayed for its rank alone.
TOP_HOTSPOTS = 5


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
        not_copies: ``{path: why}`` for a group member's node that is replayed
            itself although it stands where a representative's node stands: it,
            or a descendant, was called unlike its counterpart or counted other
            FLOPs in the step (:func:`first_difference`).
        census_s: what the census of the step's FLOPs cost (s; 0: none ran).
        census: per captured batch, every node's ``(forward FLOPs, backward FLOPs,
            bytes)`` in the step (:class:`cb_callback._engine.counting.census.Census`;
            empty: none ran): what the proof of a copy compares, and the
            numbers of a row left unreplayed (``details["as"] = "insitu"``).
    """

    skip: dict[str, tuple[str, float]] = field(default_factory=dict)
    copy: dict[str, str] = field(default_factory=dict)
    alone: set[str] = field(default_factory=set)
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    shares: dict[str, float | None] = field(default_factory=dict)
    effective: dict[str, float | None] = field(default_factory=dict)
    not_copies: dict[str, str] = field(default_factory=dict)
    census_s: float = 0.0
    census: list[dict[str, tuple[int, int, int] | None]] = field(default_factory=list)

    @property
    def replayed(self) -> int:
        """How many nodes the plan leaves to replay."""
        return len(self.shares) - len(self.skip) - len(self.copy)


def insitu_costs(
    nodes: Sequence[Node], insitu_ms: Mapping[str, float], calls: Mapping[str, ComponentInputs]
) -> dict[str, float | None]:
    """Each node's in-situ time over the step (``insitu_ms × calls``, ms: per call, what
    :meth:`cb_callback._engine.clocks.insitu.InSituTimes.cost_ms` gives, forward and backward on CPU).

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


def _own_difference(
    p: str,
    q: str,
    batches: Sequence[Mapping[str, ComponentInputs]],
    census: Counts,
    others: Sequence[Mapping[str, Any]] = (),
) -> str | None:
    """How node ``p`` itself (not its subtree) worked unlike ``q`` in the step: its calls in each batch
    (:func:`cb_callback._engine.selection.groups.call_difference`), then on every other rank (``others``: their
    :class:`~cb_callback._engine.selection.groups.ViewsOf`), then the FLOPs and bytes the census counted for it."""
    for b, calls in enumerate(batches):
        why = call_difference(calls.get(p), calls.get(q))
        if why is not None:
            return why if len(batches) == 1 else f"{why} (batch {b})"
    for views in others:
        why = view_difference(views.get(p), views.get(q))
        if why is not None:
            return f"{why}{getattr(views, 'where', '')}"
    for b, counts in enumerate(census):
        mine, theirs = counts.get(p), counts.get(q)
        where = getattr(counts, "where", "" if len(census) == 1 else f" (batch {b})")  # CountsOf: its own
        uncounted = [x for x in (p, q) if x in counts and counts[x] is None]
        if uncounted:
            return f"the census of the step's FLOPs could not count {uncounted[0] or 'root'}{where}: not proven equal"
        if mine is not None and theirs is not None and mine != theirs:
            if mine[:2] == theirs[:2]:
                return f"moved {mine[2]:.6g} bytes in the step where its counterpart moved {theirs[2]:.6g}{where}"
            return (
                f"counted {mine[0]:.6g} forward and {mine[1]:.6g} backward FLOPs in the step where its "
                f"counterpart counted {theirs[0]:.6g} and {theirs[1]:.6g}{where}"
            )
    return None


def first_difference(
    p: str,
    q: str,
    by_path: Mapping[str, Node],
    batches: Sequence[Mapping[str, ComponentInputs]],
    census: Counts = (),
    memo: dict[str, tuple[str, str] | None] | None = None,
    others: Sequence[Mapping[str, Any]] = (),
) -> tuple[str, str] | None:
    """The first node of ``p``'s subtree (parents first) that worked unlike its counterpart under ``q``:
    ``(its path, why)``; ``None`` when every node of the subtree did the same work as its counterpart
    (then ``p``'s whole subtree may take ``q``'s rows). ``memo`` caches by path."""
    memo = {} if memo is None else memo
    if p in memo:
        return memo[p]
    why = _own_difference(p, q, batches, census, others)
    found: tuple[str, str] | None = (p, why) if why is not None else None
    for child in by_path[p].children if found is None else ():
        other = corresponding(child, p, q)
        if other not in by_path:
            found = (child, f"no counterpart {other} under the representative")
        else:
            found = first_difference(child, other, by_path, batches, census, memo, others)
        if found is not None:
            break
    memo[p] = found
    return found


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
    census: Counts = (),
    others: Sequence[Mapping[str, Any]] = (),
) -> Plan:
    """Decide the run's replays from the in-situ costs (:func:`insitu_costs`), breadth-first from the root.

    - A node is replayed when its own effective share reaches
      ``descend_share`` (or is unknown), when it is a top hotspot
      (:data:`TOP_HOTSPOTS`) or on the way to one,
      or when it represents a group whose summed share reaches it; the root
      always. A replayed node is descended into (its children considered by
      the same rule) when its effective share reaches ``descend_share``, or is
      unknown; else everything below it is skipped. A container's share alone
      is not enough: of its children, those too small are skipped themselves
      (``skip[p] == (p, share)``), and take the step's numbers
      (``details["as"] = "insitu"``).
    - Siblings that repeat (:func:`cb_callback._engine.selection.groups.sibling_groups`) are one
      group: its ``representatives`` members nearest the group's median in-situ
      time (:func:`_representatives`) are replayed and descended into
      when the group's **total** share (times what their ancestors stand for)
      reaches ``descend_share``; a representative's children then count as many
      times as it stands for members.
    - Every other member is compared with the (first) representative node by
      node (:func:`first_difference`: called or not, call count, grad mode,
      flags, autograd wrapper, reach of the loss, other calls, arguments, and
      the FLOPs the ``census`` counted). A member whose whole subtree did the
      same work gets a row at its own level: the representative's measurement,
      or, when its in-situ time per call differs beyond their spreads
      (:func:`differs`), replayed alone; its subtree takes the
      representative's rows either way. A node that did not is replayed itself
      (``not_copies`` says why) and descended into by its own share; each of
      its children is compared again, and one whose subtree did the same work
      takes its counterpart's rows.
    - ``representatives=0`` groups nothing.

    Args:
        nodes: every node, breadth-first.
        modules: each node's module.
        calls: the captured calls (grouping compares their inputs).
        costs: each node's in-situ time over the step (ms; :func:`insitu_costs`).
        step_ms: what the shares divide by (the step's in-situ time, of the same passes).
        descend_share: as :class:`~cb_callback.BenchmarkConfig`.
        representatives: members measured in depth per group.
        insitu: the in-situ times per call, by path (which members run unlike
            their representative).
        batches: every captured batch's calls, with several (members ran in
            the same batches, and their nodes alike in each).
        census: per batch, each node's FLOPs in the step
            (:func:`cb_callback._engine.counting.census.count_step`); empty: not counted.
        others: under several ranks, every other rank's calls (its
            :class:`~cb_callback._engine.selection.groups.ViewsOf` each batch): members
            group, and copy, only when called alike on every rank.
    """
    shares = {n.path: _share(costs.get(n.path), step_ms) for n in nodes}
    if not nodes:
        return Plan(shares=shares)
    by_path = {n.path: n for n in nodes}
    unwalked = _Planner(
        Plan(shares=shares), by_path, modules, calls, descend_share, representatives, insitu or {},
        list(batches), census, set(), others=list(others),
    )  # fmt: skip
    # The top hotspots rank by the share each leaf stands for (below a representative: times its members),
    # as a first walk without them finds it; a second walk replays them and the way to them.
    first = _walked(unwalked, nodes[0], set())
    toward = _toward_top(nodes, by_path, first, descend_share)
    if all(p not in first.plan.skip for p in toward):
        return first.plan
    return _walked(unwalked, nodes[0], toward).plan


def _share(cost: float | None, step_ms: float) -> float | None:
    """A node's in-situ share of the step: its cost over the step's (``None``: either unknown)."""
    return cost / step_ms if cost is not None and step_ms > 0 else None


def _walked(unwalked: _Planner, root: Node, toward_top: set[str]) -> _Planner:
    """One walk of the triage from ``root``, with ``unwalked``'s options and shares and a plan of its own;
    ``toward_top`` are the nodes replayed whatever their share (the top hotspots and the way to them)."""
    planner = dataclasses.replace(
        unwalked, plan=Plan(shares=dict(unwalked.plan.shares)), batches=list(unwalked.batches),
        toward_top=toward_top, others=list(unwalked.others), stands={},
    )  # fmt: skip
    planner.descend(root, 1.0, unwalked.plan.shares.get(root.path))
    return planner


def _toward_top(nodes: Sequence[Node], by_path: Mapping[str, Node], first: _Planner, descend_share: float) -> set[str]:
    """The top hotspots (:data:`TOP_HOTSPOTS`, each leaf ranked by its share times the members it stands
    for in ``first``'s walk; a copy stands for its source, not ranked) and every node above them."""
    least = descend_share / TOP_HOTSPOTS
    rank: dict[str, float] = {}
    for n in nodes:
        if n.children or n.path in first.plan.copy:
            continue
        value = first.scaled(n.path, first.stands.get(n.path, 1.0))
        if value is not None and value >= least > 0:
            rank[n.path] = value
    top = sorted(rank, key=lambda p: -rank[p])[:TOP_HOTSPOTS]  # stable: ties keep breadth-first order
    out: set[str] = set()
    for leaf in top:
        path: str | None = leaf
        while path is not None and path not in out:
            out.add(path)
            path = by_path[path].parent if path in by_path else None
    return out


@dataclass
class _Planner:
    """The walk :func:`triage` makes, breadth-first from the root, filling ``plan``."""

    plan: Plan
    by_path: dict[str, Node]
    modules: Mapping[str, nn.Module]
    calls: Mapping[str, ComponentInputs]
    descend_share: float
    representatives: int
    times: Mapping[str, InSitu]
    batches: list[Mapping[str, ComponentInputs]]
    census: Counts
    toward_top: set[str]
    #: Every other rank's calls (:class:`~cb_callback._engine.selection.groups.ViewsOf`), under several ranks.
    others: list[Mapping[str, Any]] = field(default_factory=list)
    #: ``{path: the members it stands for}`` of every node the walk reached, replayed or left (and the
    #: nodes below one left or not descended into).
    stands: dict[str, float] = field(default_factory=dict)

    def share(self, path: str) -> float | None:
        return self.plan.shares.get(path)

    def scaled(self, path: str, stands_for: float) -> float | None:
        own = self.share(path)
        return None if own is None else own * stands_for

    def skip_below(self, node: Node, effective: float) -> None:
        stands_for = self.stands.get(node.path, 1.0)
        for child in node.children:
            for p in subtree(child, self.by_path):
                self.plan.skip[p] = (node.path, effective)
                self.stands[p] = stands_for

    def small(self, paths: Sequence[str], effective: float | None) -> bool:
        """Whether nodes of this ``effective`` share are too small to replay (none on the way to a top hotspot)."""
        return effective is not None and effective < self.descend_share and not self.toward_top.intersection(paths)

    def leave(self, path: str, effective: float, stands_for: float) -> None:
        """Skip ``path`` itself and everything below it: too small to replay (``skip[path] == (path, share)``)."""
        self.plan.effective[path] = effective
        for p in subtree(path, self.by_path):
            self.plan.skip[p] = (path, effective)
            self.stands[p] = stands_for

    def visit(self, path: str, stands_for: float) -> None:
        """A child of a node descended into, by its own effective share: replayed, or left."""
        own = self.scaled(path, stands_for)
        if own is not None and self.small([path], own):
            self.leave(path, own, stands_for)
        else:
            self.descend(self.by_path[path], stands_for, own)

    def descend(self, node: Node, stands_for: float, effective: float | None) -> None:
        """Replay ``node``; descend into it when ``effective`` reaches ``descend_share`` (or is unknown), or
        when a top hotspot is below it."""
        plan = self.plan
        plan.effective[node.path] = effective
        self.stands[node.path] = stands_for
        if effective is not None and effective < self.descend_share and node.path not in self.toward_top:
            self.skip_below(node, effective)
            return
        groups = (
            sibling_groups(node, self.modules, self.calls, self.batches, self.others)
            if self.representatives > 0
            else [[c] for c in node.children]
        )
        for members in groups:
            if len(members) == 1:
                self.visit(members[0], stands_for)
                continue
            reps = _representatives(members, self.representatives, self.times)
            known = [self.share(m) for m in members]
            total = math.fsum(s for s in known if s is not None) if all(s is not None for s in known) else None
            info = {"members": list(members), "representatives": list(reps), "share": total}
            for m in members:
                plan.groups[m] = info
            together = None if total is None else total * stands_for
            if together is not None and self.small(members, together):
                for m in members:  # the group's summed share: too small for its representatives too
                    self.leave(m, together, stands_for)
                continue
            for r in reps:
                self.descend(self.by_path[r], stands_for * len(members) / len(reps), together)
            for m in (m for m in members if m not in reps):
                self.member(m, reps[0], m, stands_for, {})

    def member(self, p: str, q: str, top: str, stands_for: float, memo: dict[str, tuple[str, str] | None]) -> None:
        """Node ``p`` of member ``top``, standing where ``q`` stands under the representative: copied with
        its subtree when that did the same work, else replayed and its children compared in turn."""
        plan, by_path = self.plan, self.by_path
        every = self.batches or [self.calls]
        diff = first_difference(p, q, by_path, every, self.census, memo, self.others)
        if diff is None:
            measured = p == top and differs(self.times.get(p), self.times.get(q))
            if measured:
                plan.alone.add(p)
                plan.effective[p] = self.scaled(p, stands_for)
            for x in subtree(p, by_path):
                source = corresponding(x, p, q)
                if source in by_path and not (x == p and measured):
                    plan.copy[x] = source
            return
        where, why = diff
        plan.not_copies[p] = f"{where or 'root'}: {why}" if where == p else f"its descendant {where}: {why}"
        effective = self.scaled(p, stands_for)
        if p != top and effective is not None and self.small([p], effective):
            # A small node of a member that differs: the step's own numbers. The member itself is
            # replayed at its own level (its group's share reached descend_share).
            self.leave(p, effective, stands_for)
            return
        plan.effective[p] = effective
        self.stands[p] = stands_for
        if effective is not None and effective < self.descend_share and p not in self.toward_top:
            self.skip_below(by_path[p], effective)
            return
        for child in by_path[p].children:
            other = corresponding(child, p, q)
            if other in by_path:
                self.member(child, other, top, stands_for, memo)
            else:
                self.visit(child, stands_for)
