"""``plan_checkpointing``: which components to recompute in backward, from a report's measured memory and times.

The inputs are each row's measured ``activation_mb`` (bytes autograd saves for
backward, without parameters and the component's own inputs) and ``fwd_ms``,
both per call, times ``calls``: every call's activations are held until the
backward, and a checkpoint recomputes every call's forward there.

The algorithm (exact over the tree, bounded): a chosen set must be an antichain
of the component tree (a module and its ancestor never both: the parent's
activations already hold the child's). Bottom-up, each node's *frontier* is the
set of non-dominated ``(saved bytes, added ms)`` points of the antichains of its
subtree: the Minkowski sum of its children's frontiers (disjoint subtrees add),
plus the node alone when it is a candidate, pruned to the points no other point
beats in both (more saved and less time). The root's frontier is the whole
trade-off curve; a target is met by its cheapest point that reaches it, which
is optimal among all antichains of candidates for the additive figure
(``saved_bytes``). A frontier of more than :data:`FRONTIER_CAP` points is
thinned (the cheapest point of each of ``FRONTIER_CAP`` equal steps of saved
bytes kept): a target may then cost up to the optimum of a target one such
step higher, per level thinned. :attr:`CheckpointPlan.exact` says whether that
happened.

A memory budget is held against the step's peak, which the plan predicts by
walking the backward (:mod:`cb_callback._whatif.checkpoint_peak`): that figure
does not add up over modules (a module that runs last saves nothing off the
peak), so no frontier is exact for it, and a budget is met by a search
(:func:`_choose_for_peak`), not proven optimal.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from cb_callback._report.model import ComponentRow, Report
from cb_callback._report.numbers import sig
from cb_callback._whatif.checkpoint_peak import Timeline

if TYPE_CHECKING:
    from torch import nn

    from cb_callback._whatif.checkpoint_wrap import CheckpointHandle

__all__ = [
    "FRONTIER_CAP",
    "LIMITS",
    "Candidate",
    "CheckpointPlan",
    "CurvePoint",
    "peak_saved_bytes",
    "plan_checkpointing",
]

_MIB = 1024 * 1024

#: Most points a node's frontier keeps before it is thinned (see the module docstring).
FRONTIER_CAP = 64

#: Most thresholds :func:`_choose_for_peak` tries (one frontier each).
_THRESHOLDS = 12

#: Most candidates :func:`_greedy` adds from (each step walks the backward once per candidate).
_GREEDY_MOST = 64

#: Most modules a budget's point may hold to be pruned (:func:`_pruned`).
_PRUNE_MOST = 24

#: Module types whose forward updates buffers in training mode (running statistics). The report holds class
#: names only, so a subclass of another name is missed here; ``.apply`` checks the real class (``isinstance``).
_STATEFUL_TYPES = ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm", "LazyBatchNorm1d",
                   "LazyBatchNorm2d", "LazyBatchNorm3d")  # fmt: skip

#: What the prediction cannot know, said with every plan.
LIMITS: tuple[str, ...] = (
    "saved bytes are each module's measured activation_mb x calls; a checkpoint still keeps the module's inputs, "
    "which activation_mb already leaves out (taken to be held anyway, by the parent or the module's first op)",
    "an output the module saved itself and its consumer saves too stays held; activations a module frees early "
    "(or in-place ops that reuse a buffer) were not held, and their saving is over-counted",
    "the peak figure walks the backward in the report's order of execution: at each component, what ran before "
    "it, its own isolated peak_mem_mb (which a recompute reaches again) and the gradients of what ran after it; "
    "the parent's own work between its children and the allocator's caching are not seen",
    "randomness inside (dropout) is no reason to refuse: the non-reentrant checkpoint restores the RNG state it "
    "stashed (preserve_rng_state=True), so the recompute draws the same numbers",
    "added time is fwd_ms x calls, replayed alone, less a last child that is a leaf saving only its inputs and "
    "parameters (a Linear ...: torch's non-reentrant recompute stops once the last saved tensor is back, before "
    "it); otherwise an upper bound: the recompute runs at most the forward, and stops early after the last op "
    "that saves a tensor. An op of the module's own after that child that saves its output (a functional relu) "
    "re-runs it, which the report cannot see. The recompute inside the step may also run faster (warm caches) or "
    "slower; communication inside a recompute is refused, not priced",
    "the recompute runs the forward's Python again: side effects outside tensors (a KV cache list appended to, "
    "a counter) happen twice; .apply raises at the forward that writes a buffer or modifies its input in place",
)


@dataclass(frozen=True)
class Candidate:
    """A component the plan may checkpoint.

    Attributes:
        path: its dotted path.
        module_type: its class name.
        calls: how often the step called it.
        saved_bytes: ``activation_mb × calls`` in bytes: what no longer stays until the backward.
        call_bytes: one call's ``activation_mb`` in bytes (held again while its recompute runs).
        extra_ms: the recompute's predicted time: ``fwd_ms × calls``, less its last child's forward when that
            child is a leaf saving only its inputs and parameters (a Linear ...: the non-reentrant recompute
            stops before it, see :func:`_not_rerun_ms`); otherwise an upper bound (the recompute runs at most
            the forward).
    """

    path: str
    module_type: str
    calls: int
    saved_bytes: int
    call_bytes: int
    extra_ms: float


@dataclass(frozen=True)
class CurvePoint:
    """One trade-off point: the modules checkpointed together, what they save and what they add."""

    saved_bytes: int
    extra_ms: float
    modules: tuple[str, ...]


def _refusal(row: ComponentRow, stateful: bool, communicates: bool, leaf: bool, mutator: str | None) -> str | None:
    """Why ``row``'s module cannot be checkpointed (``None``: it can).

    ``stateful`` / ``communicates``: of its subtree; ``leaf``: no row below it; ``mutator``: the
    row (itself or its first child, and so on down) that changes its input in place, if any.
    """
    d = row.details
    if row.parent is None:
        return "the root: its recompute is the whole forward, held again at the backward's start; wrap its children"
    if row.calls == 0 and row.status == "not_run":
        return (
            "never ran in the profiled step (status not_run: an unused expert, or a module whose parent uses its "
            "weights without calling it, as MultiheadAttention does its out_proj): no forward to recompute"
        )
    if row.calls == 0:
        return "never called itself (a container such as ModuleList): wrap its children"
    if row.status != "ok":
        why = "estimated from its children" if row.status == "estimated" else f"status {row.status}"
        return f"no measurement of its own ({why})"
    if d.get("shared_with") or d.get("aliases"):
        others = [*(d.get("shared_with") or []), *(d.get("aliases") or [])]
        return f"shared with {', '.join(others)}: wrapping the module would checkpoint every use of it"
    if mutator is not None:
        who = "its forward" if mutator == row.path else f"its first op {mutator}"
        return (
            f"{who} changes its input in place (mutates_inputs): the recompute would see the modified input "
            "(torch raises in the backward)"
        )
    if communicates:
        return "communicates (collectives inside): a recompute would issue them again, in step with no other rank"
    if stateful:
        return ("a BatchNorm in training mode inside: the recompute would update its running statistics twice "
                "(checkpoint it in eval mode, or its siblings)")  # fmt: skip
    call_set = d.get("call_set") or {}
    if d.get("no_backward") or call_set.get("backward_calls", 1) == 0:
        return f"no backward ({d.get('no_backward') or 'no call reached the loss'}): it holds nothing for one"
    if not math.isfinite(row.activation_mb) or not math.isfinite(row.fwd_ms):
        return "no activation_mb or fwd_ms measured"
    if leaf and row.params_mb == 0:
        return (
            "a leaf without parameters (an activation, a dropout): what it saves is its output or a mask, kept by its "
            "consumer or traded for its input, which the checkpoint keeps: no saving to count on"
        )
    return None


def _input_mutators(rows: Sequence[ComponentRow], kids: Mapping[str, list[ComponentRow]]) -> dict[str, str]:
    """``path -> the row that changes its input in place``: itself (``mutates_inputs``) or, down the first
    children (the first of each in the report's order, which gets its input), the first that does."""
    out: dict[str, str] = {}
    for row in reversed(rows):  # children before parents
        children = kids.get(row.path, [])
        if row.details.get("mutates_inputs"):
            out[row.path] = row.path
        elif children and children[0].path in out:
            out[row.path] = out[children[0].path]
    return out


def _subtree_flags(
    rows: Sequence[ComponentRow], kids: Mapping[str, list[ComponentRow]]
) -> dict[str, tuple[bool, bool]]:
    """``path -> (a stateful module inside, a collective inside)`` for every row, its own included."""
    out: dict[str, tuple[bool, bool]] = {}
    for row in reversed(rows):  # breadth-first order: children before parents when reversed
        stateful = row.module_type in _STATEFUL_TYPES
        comm = bool(row.details.get("comm")) or (math.isfinite(row.comm_bytes) and row.comm_bytes > 0)
        for k in kids.get(row.path, []):
            s, c = out.get(k.path, (False, False))
            stateful, comm = stateful or s, comm or c
        out[row.path] = (stateful, comm)
    return out


def _candidates(report: Report) -> tuple[dict[str, Candidate], dict[str, str]]:
    """The candidates (saving something) and the refused rows with their reasons."""
    kids: dict[str, list[ComponentRow]] = {}
    for r in report.rows:
        if r.parent is not None:
            kids.setdefault(r.parent, []).append(r)
    flags = _subtree_flags(report.rows, kids)
    mutators = _input_mutators(report.rows, kids)
    candidates: dict[str, Candidate] = {}
    refused: dict[str, str] = {}
    for r in report.rows:
        why = _refusal(r, *flags[r.path], leaf=r.path not in kids, mutator=mutators.get(r.path))
        call_bytes = round(r.activation_mb * _MIB) if why is None else 0
        if why is None and call_bytes <= 0:
            why = "saves no activations (activation_mb 0: only its inputs and parameters, which a checkpoint keeps)"
        if why is not None:
            refused[r.path] = why
        else:
            extra = _recompute_ms(r, kids)
            candidates[r.path] = Candidate(r.path, r.module_type, r.calls, call_bytes * r.calls, call_bytes, extra)
    return candidates, refused


def _recompute_ms(row: ComponentRow, kids: Mapping[str, list[ComponentRow]]) -> float:
    """``row``'s recompute time: ``fwd_ms × calls`` less :func:`_not_rerun_ms`, at least its other children's.

    The floor (the other children's ``fwd_ms × calls``, which the recompute does re-run) keeps a
    noisy replay (the last child timed above its parent) from predicting a free recompute.
    """
    full = row.fwd_ms * row.calls
    skip = _not_rerun_ms(row, kids)
    if skip == 0:
        return full
    others = sum(k.fwd_ms * k.calls for k in kids[row.path][:-1] if math.isfinite(k.fwd_ms))
    return min(full, max(full - skip, others))


def _not_rerun_ms(row: ComponentRow, kids: Mapping[str, list[ComponentRow]]) -> float:
    """The forward time the recompute of ``row`` skips: its last child's, when that child saves nothing of its own.

    torch's non-reentrant checkpoint stops the recompute once the last tensor the backward
    needs is back. A last child (the last of ``row``'s children in the report's order: by first
    execution) that is a leaf saving only its inputs and parameters (``activation_mb`` 0: a
    Linear, a Conv, an Embedding) produces none of them, so it is not re-run: once per call of
    ``row`` (``min(child calls, row calls)``: a child called k times in each call skips only its last).
    """
    children = kids.get(row.path, [])
    last = children[-1] if children else None
    if last is None or last.path in kids or last.status != "ok" or last.activation_mb != 0:
        return 0.0
    if not math.isfinite(last.fwd_ms) or last.calls <= 0:
        return 0.0
    return last.fwd_ms * min(last.calls, row.calls)


#: A frontier point while the frontiers are built: ``(saved bytes, added ms, modules)``, the modules a
#: tree of pairs (``None`` none, a path, or ``(left, right)``) read out only for the points kept.
_Modules: TypeAlias = "str | tuple[_Modules, _Modules] | None"
_Point = tuple[int, float, _Modules]


def _pareto(points: Iterable[_Point]) -> list[_Point]:
    """The non-dominated points (no other saves as much for no more time), by saved bytes ascending."""
    kept: list[_Point] = []
    best = math.inf
    for p in sorted(points, key=lambda p: (-p[0], p[1])):  # stable: equal points keep their order
        if p[1] < best:
            kept.append(p)
            best = p[1]
    return kept[::-1]


def _thin(points: list[_Point], cap: int) -> tuple[list[_Point], bool]:
    """At most ``cap`` + 1 points: the cheapest of each of ``cap`` equal steps of saved bytes, and the largest."""
    if len(points) <= cap:
        return points, True
    step = points[-1][0] / cap
    kept: dict[int, _Point] = {}
    for p in points:  # ascending saved and time: the first of a step is its cheapest
        kept.setdefault(int(p[0] // step), p)
    out = sorted(kept.values(), key=lambda p: p[0])
    return (out if out[-1] is points[-1] else [*out, points[-1]]), False


def _merge(a: list[_Point], b: list[_Point]) -> list[_Point]:
    """The Minkowski sum of two frontiers of disjoint subtrees, pruned."""
    return _pareto(
        (p[0] + q[0], p[1] + q[1], q[2] if p[2] is None else p[2] if q[2] is None else (p[2], q[2]))
        for p in a
        for q in b
    )


def _modules(ref: _Modules) -> tuple[str, ...]:
    """The sorted paths of a point's tree of pairs."""
    out: list[str] = []
    todo: list[_Modules] = [ref]
    while todo:
        r = todo.pop()
        if isinstance(r, str):
            out.append(r)
        elif r is not None:
            todo += r
    return tuple(sorted(out))


def _frontier(report: Report, candidates: Mapping[str, Candidate], cap: int) -> tuple[list[CurvePoint], bool]:
    """The root's frontier (the trade-off curve) and whether no node's frontier had to be thinned."""
    empty: list[_Point] = [(0, 0.0, None)]
    fronts: dict[str, list[_Point]] = {}
    exact = True
    for row in reversed(report.rows):  # children before parents
        front = fronts.pop(row.path, empty)
        c = candidates.get(row.path)
        if c is not None:
            front = _pareto([*front, (c.saved_bytes, c.extra_ms, c.path)])
        front, kept_all = _thin(front, cap)
        exact = exact and kept_all
        if row.parent is None:
            return [CurvePoint(p[0], p[1], _modules(p[2])) for p in front], exact
        parent = fronts.get(row.parent)
        merged = front if parent is None else _merge(parent, front)
        fronts[row.parent], kept_all = _thin(merged, cap)
        exact = exact and kept_all
    return [CurvePoint(0, 0.0, ())], exact  # no root row: nothing to choose from


def peak_saved_bytes(point: CurvePoint, candidates: Mapping[str, Candidate], timeline: Timeline) -> int:
    """What ``point`` takes off the step's peak (:class:`~cb_callback._whatif.checkpoint_peak.Timeline`)."""
    return timeline.peak_saved(point.modules, {p: candidates[p].saved_bytes for p in point.modules})


def _mib(n: float) -> str:
    return f"{sig(n / _MIB)} MiB" if abs(n) < 1024 * _MIB else f"{sig(n / 1024 / _MIB)} GiB"


@dataclass
class CheckpointPlan:
    """Which components to checkpoint (recompute in backward), what that saves and what it costs.

    Attributes:
        modules: the chosen paths (an antichain of the component tree), sorted.
        saved_bytes: activation bytes no longer held from the forward to the backward
            (``Σ activation_mb × calls`` of the chosen).
        peak_saved_bytes: the predicted drop of the step's peak (:func:`peak_saved_bytes`,
            the peak walked along the backward: a module that runs last saves little of it).
        extra_ms: predicted added time per step (``Σ`` of the candidates' ``extra_ms``: the recomputes).
        curve: the trade-off points considered (the root's frontier), saved bytes ascending;
            the first is ``(0, 0, ())``.
        refused: path -> why that module cannot be checkpointed (every row refused, with its reason).
        candidates: path -> the figures of each module that could be.
        save_bytes: the target asked for (``None``: none).
        memory_budget_bytes: the budget asked for (``None``: none), against ``root_peak_bytes``.
        root_peak_bytes: the root's ``peak_mem_mb`` in bytes: its forward + backward's allocator
            peak above the level before it (parameters and what was allocated before the step
            excluded); ``None`` when the report has none.
        reached: whether the chosen point meets every target (without one: True, nothing chosen).
        exact: whether no frontier was thinned: a ``save_bytes`` choice is then optimal (see the
            module docstring); a budget's choice is the best the search found, never proven optimal.
        limits: what the prediction cannot know.
    """

    modules: tuple[str, ...]
    saved_bytes: int
    peak_saved_bytes: int
    extra_ms: float
    curve: list[CurvePoint]
    refused: dict[str, str]
    candidates: dict[str, Candidate]
    save_bytes: int | None = None
    memory_budget_bytes: int | None = None
    root_peak_bytes: int | None = None
    reached: bool = True
    exact: bool = True
    limits: tuple[str, ...] = field(default=LIMITS)

    @property
    def predicted_peak_bytes(self) -> int | None:
        """The root's peak after checkpointing (``root_peak_bytes − peak_saved_bytes``); ``None`` without a peak."""
        return None if self.root_peak_bytes is None else self.root_peak_bytes - self.peak_saved_bytes

    def apply(self, model: nn.Module) -> CheckpointHandle:
        """Wrap the chosen modules of ``model`` in non-reentrant checkpoints; the handle's ``remove()`` undoes it.

        Raises:
            ValueError: see :func:`cb_callback._whatif.checkpoint_wrap.wrap_modules` (a path the model
                lacks, a BatchNorm in training mode inside a chosen module ...); nothing is wrapped then.
        """
        from cb_callback._whatif.checkpoint_wrap import wrap_modules

        return wrap_modules(model, self.modules)

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-safe data (what report.html's trade-off chart draws)."""
        return {
            "modules": list(self.modules),
            "saved_bytes": self.saved_bytes,
            "peak_saved_bytes": self.peak_saved_bytes,
            "extra_ms": self.extra_ms,
            "curve": [
                {"saved_bytes": p.saved_bytes, "extra_ms": p.extra_ms, "modules": list(p.modules)} for p in self.curve
            ],
            "save_bytes": self.save_bytes,
            "memory_budget_bytes": self.memory_budget_bytes,
            "root_peak_bytes": self.root_peak_bytes,
            "reached": self.reached,
            "exact": self.exact,
            "refused": dict(self.refused),
        }

    def _target_line(self) -> str:
        asked = []
        if self.save_bytes is not None:
            asked.append(f"save >= {_mib(self.save_bytes)} of activations")
        if self.memory_budget_bytes is not None:
            root = "unknown" if self.root_peak_bytes is None else _mib(self.root_peak_bytes)
            asked.append(f"peak <= {_mib(self.memory_budget_bytes)} (the root's peak_mem_mb: {root})")
        if not asked:
            return "checkpointing plan: no target (the trade-off curve only)"
        return f"checkpointing plan: {' and '.join(asked)}: {self._verdict()}"

    def _verdict(self) -> str:
        if self.reached:
            return "reached"
        most = max((p.saved_bytes for p in self.curve), default=0)
        if self.memory_budget_bytes is None or self.predicted_peak_bytes is None:
            return f"NOT reached: the most the candidates save ({_mib(most)}) is shown"
        if self.predicted_peak_bytes <= self.memory_budget_bytes:  # the peak fits: the saving asked is the miss
            return f"NOT reached: the candidates save at most {_mib(most)}; shown: the set found that fits the budget"
        return (
            "NOT reached: no plan found that reaches it (the budget's search is not exhaustive: a set that fits may "
            f"exist); shown: the curve's point that takes most off the peak (the most any set saves: {_mib(most)})"
        )

    def table(self) -> str:
        """The plan as text: the target, the chosen modules, the totals, the refusals and the limits."""
        lines = [self._target_line()]
        rows = [("path", "type", "calls", "saved", "added ms")]
        rows += [
            (c.path, c.module_type, str(c.calls), _mib(c.saved_bytes), sig(c.extra_ms))
            for c in (self.candidates[p] for p in self.modules)
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        for r in rows:
            cells = (v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths, strict=True)))
            lines.append("  " + "  ".join(cells))
        peak = self.predicted_peak_bytes
        lines.append(
            f"  total: {len(self.modules)} modules, saves {_mib(self.saved_bytes)} held to the backward "
            f"({_mib(self.peak_saved_bytes)} off the peak"
            + ("" if peak is None else f": {_mib(self.root_peak_bytes or 0)} -> {_mib(peak)}")
            + f"), adds {sig(self.extra_ms)} ms per step"
        )
        lines.append(f"  {len(self.curve)} trade-off points considered" + ("" if self.exact else " (thinned)"))
        if self.refused:
            lines.append(f"  refused ({len(self.refused)}):")
            lines += [f"    {p or '(root)'}: {why}" for p, why in self.refused.items()]
        lines.append("  limits:")
        lines += [f"    - {s}" for s in self.limits]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _root_peak(report: Report) -> int | None:
    root = next((r for r in report.rows if r.parent is None), None)
    if root is None or not math.isfinite(root.peak_mem_mb):
        return None
    return round(root.peak_mem_mb * _MIB)  # a peak, per call: never multiplied by calls


def _cheapest(curve: list[CurvePoint], need: int) -> CurvePoint | None:
    """The first (cheapest) point of ``curve`` that saves at least ``need`` bytes."""
    return next((p for p in curve if p.saved_bytes >= need), None)


def _choose_for_peak(
    report: Report, candidates: Mapping[str, Candidate], curve: list[CurvePoint], need: tuple[int, int]
) -> tuple[CurvePoint | None, bool]:
    """The cheapest set found saving ``need[0]`` bytes and ``need[1]`` off the peak; whether no frontier was thinned.

    The peak figure (:func:`peak_saved_bytes`) does not add up, so no frontier is exact for it;
    it is never above the saved bytes. Searched: ``curve``, and for each threshold ``m`` (a
    candidate's call bytes) the frontier of the candidates whose calls hold at most ``m`` (a
    recompute holds one call again: sets of small calls lose least to it), each cheapest
    first up to its first point that meets both needs. With more than :data:`_THRESHOLDS`
    distinct call sizes, that many evenly spread ones are tried; and the set built by greedy
    additions (:func:`_greedy`). Each point found is pruned of the modules it can do without
    (:func:`_pruned`); the cheapest wins. No point fitting is no proof none exists.
    """
    timeline = Timeline(report)
    sizes = sorted({c.call_bytes for c in candidates.values()})
    if len(sizes) > _THRESHOLDS:
        sizes = [sizes[round(i * (len(sizes) - 1) / (_THRESHOLDS - 1))] for i in range(_THRESHOLDS)]
    fronts, exact = [curve], True
    for m in sizes:
        front, kept_all = _frontier(report, {k: c for k, c in candidates.items() if c.call_bytes <= m}, FRONTIER_CAP)
        fronts.append(front)
        exact = exact and kept_all
    found = []
    for front in fronts:  # ascending time: the first that fits is the front's cheapest
        fits = (
            p for p in front
            if p.saved_bytes >= max(need) and peak_saved_bytes(p, candidates, timeline) >= need[1]
        )  # fmt: skip
        first = next(fits, None)
        found += [] if first is None else [_pruned(first, candidates, timeline, need)]
    greedy = _greedy(candidates, timeline, need)
    if greedy is not None:
        found.append(_pruned(greedy, candidates, timeline, need))
    return min(found, key=lambda p: (p.extra_ms, -p.saved_bytes), default=None), exact


def _point(modules: Sequence[str], candidates: Mapping[str, Candidate]) -> CurvePoint:
    kept = tuple(sorted(modules))
    return CurvePoint(sum(candidates[p].saved_bytes for p in kept), sum(candidates[p].extra_ms for p in kept), kept)


def _greedy(candidates: Mapping[str, Candidate], timeline: Timeline, need: tuple[int, int]) -> CurvePoint | None:
    """Candidates added one at a time, each the one whose addition gains most per added ms (off the peak while
    ``need[1]`` is unmet, else or when no addition gains off it alone, saved bytes), until both needs hold;
    ``None`` when they never do, or with more than :data:`_GREEDY_MOST` candidates."""
    if len(candidates) > _GREEDY_MOST:
        return None
    chosen: list[str] = []
    now = _point(chosen, candidates)
    peak = 0
    while now.saved_bytes < need[0] or peak < need[1]:
        best: tuple[tuple[float, float], CurvePoint, int] | None = None
        for path, c in candidates.items():
            if any(path == q or path.startswith(q + ".") or q.startswith(path + ".") for q in chosen):
                continue
            pt = _point([*chosen, path], candidates)
            got = peak_saved_bytes(pt, candidates, timeline)
            gain = got - peak if peak < need[1] else 0
            # no addition gains off the peak alone (two may together): the most saved bytes per ms then
            score = (gain / max(c.extra_ms, 1e-9), c.saved_bytes / max(c.extra_ms, 1e-9))
            if (gain > 0 or pt.saved_bytes > now.saved_bytes) and (best is None or score > best[0]):
                best = (score, pt, got)
        if best is None:
            return None
        _, now, peak = best
        chosen = list(now.modules)
    return now


def _pruned(
    point: CurvePoint, candidates: Mapping[str, Candidate], timeline: Timeline, need: tuple[int, int]
) -> CurvePoint:
    """``point`` less the modules it can do without: the costliest first, while both needs still hold.

    A point of more than :data:`_PRUNE_MOST` modules is kept as it is (each try walks the whole backward).
    """
    while len(point.modules) <= _PRUNE_MOST:
        for path in sorted(point.modules, key=lambda p: -candidates[p].extra_ms):
            kept = tuple(p for p in point.modules if p != path)
            rest = CurvePoint(
                sum(candidates[p].saved_bytes for p in kept), sum(candidates[p].extra_ms for p in kept), kept
            )
            if rest.saved_bytes >= need[0] and peak_saved_bytes(rest, candidates, timeline) >= need[1]:
                point = rest
                break
        else:
            return point
    return point


def _check_bytes(name: str, value: object) -> None:
    """Raise unless ``value`` is ``None`` or a finite number of bytes >= 0 (``name``: the argument, for the message)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}={value!r}: expected a number of bytes (int or float), got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}={value}: expected a finite number of bytes >= 0")


def page_data(data: dict[str, Any]) -> dict[str, Any]:
    """What report.html's checkpointing section draws, from a report's dict: the plan without a target."""
    return plan_checkpointing(Report.from_dict(data)).to_dict()


def plan_checkpointing(
    report: Report | str | Path, save_bytes: int | None = None, memory_budget_bytes: int | None = None
) -> CheckpointPlan:
    """Choose the components to checkpoint, at the least added time, from a report's measurements.

    Args:
        report: a report whose rows were replayed (``activation_mb``, ``fwd_ms``; ``descend="all"``
            measures every row, the default triage only the hotspots: the others are refused): a
            :class:`~cb_callback.Report`, or a location as :meth:`Report.load
            <cb_callback.Report.load>` accepts (a directory, a ``report.json``, ``DIR@N``), as
            :func:`cb_callback.testing.assert_no_regression` takes it.
        save_bytes: save at least this many bytes of activations held from the forward to the
            backward (:attr:`CheckpointPlan.saved_bytes`).
        memory_budget_bytes: bring the root's peak (its ``peak_mem_mb``: its forward and
            backward's allocator peak above the level before it) to at most this
            (:attr:`CheckpointPlan.predicted_peak_bytes`). Both given: both must hold.
            Neither: nothing is chosen, the plan holds the curve.

    Returns:
        The plan: the chosen modules, their predicted saving and added time, the curve,
        the refusals. :attr:`CheckpointPlan.reached` is False when no antichain of the
        candidates reaches the target (the plan then holds the point that saves most).

    Raises:
        TypeError: a target that is not a number (a string, a bool), naming the argument; a ``report``
            neither a :class:`~cb_callback.Report` nor a location.
        ValueError: a negative, NaN or infinite target (naming the argument), or a budget on a report
            whose root has no ``peak_mem_mb``; a location's report that cannot be read (as
            :meth:`Report.load <cb_callback.Report.load>` raises it).
        FileNotFoundError: a location holds no report.

    Notes:
        Optimal (least ``extra_ms`` over every antichain of the candidates) for ``save_bytes``
        when :attr:`CheckpointPlan.exact`: the curve's cheapest point that reaches it. A budget's
        figure (:func:`peak_saved_bytes`: the peak along the backward) does not add up: the
        plan is the cheapest of the curve's points and of a search by the size of the largest
        call (:func:`_choose_for_peak`) that fits, and may lie off :attr:`CheckpointPlan.curve`;
        a cheaper set that fits may exist. See
        :data:`LIMITS` for what the figures cannot know.
    """
    _check_bytes("save_bytes", save_bytes)
    _check_bytes("memory_budget_bytes", memory_budget_bytes)
    if isinstance(report, (str, Path)):
        report = Report.load(report)
    elif not isinstance(report, Report):
        raise TypeError(
            f"report={type(report).__name__!r}: expected a Report or a report's location (a directory, a "
            "report.json, DIR@N)"
        )
    root_peak = _root_peak(report)
    if memory_budget_bytes is not None and root_peak is None:
        raise ValueError("a memory budget needs the root's peak_mem_mb, which this report does not have")
    candidates, refused = _candidates(report)
    curve, exact = _frontier(report, candidates, FRONTIER_CAP)
    timeline = Timeline(report)
    need_peak = 0 if memory_budget_bytes is None else max(0, (root_peak or 0) - memory_budget_bytes)
    point, reached = curve[0], True  # no target, or a budget already met: nothing chosen
    if need_peak > 0:
        found, exact_peak = _choose_for_peak(report, candidates, curve, (save_bytes or 0, need_peak))
        exact = exact and exact_peak
        most = max(curve, key=lambda p: (peak_saved_bytes(p, candidates, timeline), -p.extra_ms))
        point, reached = (found, True) if found is not None else (most, False)
    elif save_bytes is not None:
        found = _cheapest(curve, save_bytes)
        point, reached = (found, True) if found is not None else (curve[-1], False)
    return CheckpointPlan(
        modules=point.modules, saved_bytes=point.saved_bytes,
        peak_saved_bytes=peak_saved_bytes(point, candidates, timeline), extra_ms=point.extra_ms, curve=curve,
        refused=refused, candidates=candidates, save_bytes=save_bytes, memory_budget_bytes=memory_budget_bytes,
        root_peak_bytes=root_peak, reached=reached, exact=exact,
    )  # fmt: skip
