"""The regression gate: which components that matter got worse by more than a threshold and the noise.

One rule, shared by ``cb diff --fail-over`` and :func:`cb_callback.testing.assert_no_regression`
(docs/explore.md, "A regression gate in CI"). Each component of the baseline and the new
report gets one :data:`Verdict`, decided in this order:

1. ``only_in_base`` / ``only_in_new``: its path is in one report only, and it is not a rename
   (:func:`cb_callback._report.renames.rename_pairs`).
2. ``not_gated``: its metric is not trustworthy in either report: the row is not ``ok`` or
   ``estimated`` (``failed``, ``skipped``, ``not_run``), the value is missing (NaN), or, for a
   timed metric, the row is at the harness floor: flagged ``at_floor`` with a pass whose raw
   median is within ``NOISE_FACTOR ×`` the floor's own IQR of the floor (:func:`floor_paths`;
   the engine's flag also counts the pass's own IQR, and the gate judges such a noisy pass with
   its noise bound instead). The ``reason`` says which, and in which report.
3. ``below_min_share``: it holds less than ``min_share`` of the step in *both* reports (a
   component that grew from 0.5 % to 30 % of the step is gated). The share is the metric over
   the step, ``metric × calls`` where it adds up (:data:`cb_callback._report.diff.OVER_STEP_METRICS`),
   over the root's; for a rate (``mfu``, ``tflops``, ...) the row's time ``share``. Unknown
   (no root) counts as held: the component is gated.
4. ``unchanged``: the same value in both.
5. ``within_noise``: the change is not beyond the two runs' noise: the larger value is at most
   ``1 + NOISE_FACTOR × the larger relative IQR`` (``noise``: IQR ÷ median) times the smaller, or
   ``1 + UNKNOWN_NOISE`` where neither row has a noise. An estimated row (a parent summed from its
   children) takes the largest noise of its children (:func:`estimated_noise`). This is the rule of
   ``cb diff`` (:attr:`cb_callback._report.diff.Change.significant`) taken relative
   (:func:`relative_bound`): ``cb diff`` bounds the difference by ``NOISE_FACTOR × max(noise × value)``,
   which grows with the slowdown it judges (a 4× slower row of noise 0.5 would never be beyond it);
   the two agree for small changes. An exact metric (FLOPs, bytes, memory) has no noise: any
   difference is real.
6. ``regressed`` / ``improved``: a real change worse / better than ``fail_over`` of the base
   (worse is higher, except for throughputs — ``tflops``, ``gbps``, ``mfu``, ``bw_util`` — where it is
   lower); ``within_threshold``: a real change of at most ``fail_over``.

Before steps 5 and 6, a timed metric's new values are divided by the **common shift**
(:func:`common_shift`): the median ``new / base`` of the leaf-most components below the root
that would be gated and did the same work (a parent repeats its children's change: its vote
would count a slower leaf twice). Two runs of one model on a shared machine differ by 20–30 % on every component alike
when the machine got busier between them, while each run's own IQR is a few percent: the noise
of one run cannot see that, and the component that slowed stands out of the median while the
machine does not. ``shift=False`` judges every value as measured (it then also catches a
slowdown of every component alike, which the shift discounts). Counts and sizes are never
shifted. A row's ``change`` and ``noise_bound`` are the judged ones; ``base`` and ``new`` as measured.

``unconfirmed`` (a time only): a parent that regressed by the rule above while none of its
components did, only when every child in either report is paired and trusted (none in one
report only or not gated; a child below ``min_share`` counts, in the sums too; at least two),
their new sum divided by the common shift, over the base's, is worse by at most ``fail_over``,
and the parent's own part (itself less its children, after the shift) grew by at most
``fail_over`` of the parent's base; else it stays ``regressed``. One replay of
a whole parent lasts several scheduling quanta where its parts last a fraction of one: on a
busy machine its median jumps by whole quanta between runs while its IQR stays small, and its
components are the better witnesses. It is listed, and does not fail the gate.

A renamed component is compared across its two paths; its verdict is ``renamed`` (with
``renamed_from``) unless it is ``regressed``: a rename never hides a regression.

The outcome (:attr:`GateResult.outcome`): ``inconclusive`` (``cb diff`` exit 2) when the
reports cannot be compared — either has no rows or no root, they look like different models
(unless ``allow_mismatch``), or no component was judged (:data:`JUDGED`) — else ``failed`` when
a component is ``regressed``, else ``passed``.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from cb_callback._report.diff import (
    NOISE_FACTOR,
    RATE_METRICS,
    THROUGHPUT_METRICS,
    UNKNOWN_NOISE,
    Change,
    Comparison,
    compare_reports,
    metric_kind,
    pair_change,
)
from cb_callback._report.model import ComponentRow, Report
from cb_callback._report.renames import rename_pairs

__all__ = [
    "DEFAULT_MIN_SHARE",
    "GATE_SCHEMA",
    "JUDGED",
    "SHIFT_MIN_COMPONENTS",
    "VERDICTS",
    "GateResult",
    "GateRow",
    "Verdict",
    "common_shift",
    "gate_reports",
    "parse_percent",
    "relative_bound",
]

#: A component holding less of the step than this in both reports is not gated (1 %).
DEFAULT_MIN_SHARE = 0.01

#: The common shift (:func:`common_shift`) needs at least this many components below the root.
SHIFT_MIN_COMPONENTS = 3

#: The ``schema`` key of the gate's JSON (``cb diff --format json``): its layout's name and version.
GATE_SCHEMA = "cb_callback.gate/1"

#: One component's verdict (see the module docstring for the order they are decided in).
Verdict = Literal[
    "regressed",
    "unconfirmed",
    "improved",
    "within_threshold",
    "within_noise",
    "unchanged",
    "below_min_share",
    "not_gated",
    "only_in_base",
    "only_in_new",
    "renamed",
]

#: Every verdict, in the order the tables list them.
VERDICTS: tuple[Verdict, ...] = get_args(Verdict)


@dataclass(frozen=True)
class GateRow:
    """One component's verdict.

    Attributes:
        path: its path in the new report (in the base for ``only_in_base``); ``""`` the root.
        module_type: its class name.
        verdict: see :data:`Verdict`.
        depth: its depth (the root 0).
        base: the metric in the base, over the step where it adds up (NaN when missing).
        new: the same in the new report.
        change: ``(new - base) / base``, signed (``inf`` from 0; NaN when either is missing).
        noise_bound: the change the two runs' noise explains, a fraction: the values are within
            noise while the larger is at most ``1 + noise_bound`` times the smaller
            (:func:`relative_bound`); 0 for an exact metric; NaN where it was not compared.
        share: the larger of its shares of the step in the two reports (NaN when unknown).
        renamed_from: its path in the base when it was renamed, else ``None``.
        reason: why it is ``not_gated`` (``"at the harness floor in new"``), else ``None``.
    """

    path: str
    module_type: str
    verdict: Verdict
    depth: int
    base: float
    new: float
    change: float
    noise_bound: float
    share: float
    renamed_from: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class GateResult:
    """Every component's verdict and the options they were decided with.

    Attributes:
        metric: the compared column.
        fail_over: the threshold, a fraction of the base (0.10: worse by more than 10 % fails).
        min_share: the share of the step below which a component is not gated.
        rows: one per component (the base's order, then the new report's own components).
        mismatch: why the reports look like different models
            (:func:`cb_callback._report.diff.model_mismatch`), or ``None``.
        quality: each report's ``metadata["quality"]`` (``{"base": ..., "new": ...}``).
        shift: the common shift the new values were divided by (:func:`common_shift`; 1.0: none).
        shifted: whether the gate was asked to discount a common shift (``shift=`` of :func:`gate_reports`).
    """

    metric: str
    fail_over: float
    min_share: float
    rows: list[GateRow]
    mismatch: str | None = None
    quality: Mapping[str, Mapping[str, Any] | None] = field(default_factory=dict)
    shift: float = 1.0
    shifted: bool = True
    problem: str | None = None
    allow_mismatch: bool = False
    step_change: float = math.nan

    @property
    def judged(self) -> list[GateRow]:
        """The components whose value was judged against the base (any verdict of :data:`JUDGED`)."""
        return [r for r in self.rows if r.verdict in JUDGED]

    @property
    def inconclusive(self) -> str | None:
        """Why the reports could not be compared (the gate neither passed nor failed), or ``None``.

        A report without rows or without its root (``problem``), two different models (``mismatch``,
        unless ``allow_mismatch``), or no component judged at all (each not gated, below
        ``min_share``, or in one report only): "passed" would then say nothing.
        """
        if self.problem:
            return self.problem
        if self.mismatch and not self.allow_mismatch:
            why = f"base and new look like different models: {self.mismatch}"
            return why + " (allow_mismatch / --allow-mismatch gates them anyway)"
        if not self.judged:
            counts = ", ".join(f"{len(self.having(v))} {v.replace('_', ' ')}" for v in VERDICTS if self.having(v))
            return f"no component could be judged ({counts or 'no components'})"
        return None

    @property
    def outcome(self) -> Literal["passed", "failed", "inconclusive"]:
        """``failed`` when a component regressed (and the reports could be compared), ``inconclusive``
        when they could not (:attr:`inconclusive`), else ``passed``; ``cb diff`` exits 1, 2, 0."""
        if self.inconclusive:
            return "inconclusive"
        return "failed" if self.regressed else "passed"

    @property
    def passed(self) -> bool:
        """The reports could be compared and no component regressed."""
        return self.outcome == "passed"

    @property
    def shift_hides_step(self) -> bool:
        """Whether the whole step got worse by more than ``fail_over`` as measured while the common shift
        explains it: then the shift is the finding to check (a slower machine, or everything slower)."""
        return (
            self.shift != 1.0
            and self.step_change > self.fail_over
            and not any(r.path == "" and r.verdict in ("regressed", "unconfirmed") for r in self.rows)
        )

    @property
    def regressed(self) -> list[GateRow]:
        """The components that failed the gate, deepest first (the one that slowed before its parents)."""
        return sorted((r for r in self.rows if r.verdict == "regressed"), key=lambda r: -r.depth)

    def having(self, *verdicts: Verdict) -> list[GateRow]:
        """The rows with one of ``verdicts``, in the result's order."""
        return [r for r in self.rows if r.verdict in verdicts]

    @property
    def options(self) -> dict[str, Any]:
        """The options the verdicts were decided with, as the JSON's ``options`` holds them."""
        exact, over_step = metric_kind(self.metric)
        return {
            "metric": self.metric,
            "fail_over": self.fail_over,
            "min_share": self.min_share,
            "over_step": over_step,
            "exact": exact,
            "noise_factor": NOISE_FACTOR,
            "unknown_noise": UNKNOWN_NOISE,
            "common_shift": self.shifted,
            "allow_mismatch": self.allow_mismatch,
        }


def parse_percent(text: str | float) -> float:
    """A percent as the command line writes it, as a fraction: ``10`` and ``10%`` are 0.10, ``2.5 %`` 0.025.

    Raises:
        ValueError: not a number, negative, or not finite.
    """
    raw = str(text).strip()
    body = raw[:-1].strip() if raw.endswith("%") else raw
    try:
        value = float(body)
    except ValueError:
        raise ValueError(f"expected a percent such as 10 or 10%, got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"expected a percent >= 0 such as 10 or 10%, got {raw!r}")
    return value / 100.0


def _pass_at_floor(floor: Mapping[str, Any], name: str) -> bool:
    """Whether pass ``name``'s raw median is within the floor's own noise (``raw - floor <= NOISE_FACTOR x IQR``)."""
    raw, low, iqr = (floor.get(k) for k in (f"raw_{name}_ms", name, f"{name}_iqr_ms"))
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (raw, low, iqr)):
        return True  # the engine flagged it and says no more: trust the flag
    return float(raw) - float(low) <= NOISE_FACTOR * float(iqr)  # type: ignore[arg-type]


def floor_paths(report: Report) -> set[str]:
    """The rows whose time the gate does not trust: at the harness floor within the floor's *own* noise.

    The engine flags a pass ``at_floor`` when ``raw - floor <= floor IQR + the pass's own IQR``
    (``details["floor_ms"]``): a pass of 2 ms whose own IQR is 3 ms is flagged, though it is far
    above a floor of 0.005 ms, and a gate that dropped it would drop a noisy component's real
    slowdown. The gate counts a pass at the floor only when ``raw - floor <= NOISE_FACTOR x the
    floor's IQR``; such a pass is not gated, any other is judged with its own (large) noise bound.
    An estimate the engine flags for its children (``at_floor: ["children"]``) is at the floor when
    every child it names is. A row flagged ``at_floor`` without ``floor_ms`` details is at the floor.
    """
    out: set[str] = set()
    for row in sorted(report.rows, key=lambda r: -r.depth):
        if "at_floor" not in (row.details.get("flags") or []):
            continue
        floor = row.details.get("floor_ms")
        if not isinstance(floor, Mapping):
            out.add(row.path)
            continue
        passes = list(floor.get("at_floor") or [])
        kids = floor.get("children")
        if passes == ["children"]:
            if isinstance(kids, list) and kids and all(k in out for k in kids):
                out.add(row.path)
        elif any(_pass_at_floor(floor, name) for name in passes if name in ("fwd", "bwd")):
            out.add(row.path)
    return out


def _untrusted(
    row: ComponentRow, value: float, side: str, metric: str, exact: bool, floor: frozenset[str]
) -> str | None:
    """Why ``row``'s ``metric`` cannot be gated (``"failed in new: ..."``), or ``None``."""
    if row.status not in ("ok", "estimated"):
        why = f"{row.status} in {side}"
        return why + (f": {row.error[:80]}" if row.status == "failed" and row.error else "")
    if not math.isfinite(value):
        return f"no {metric} in {side}"
    if not exact and row.path in floor:
        return f"at the harness floor in {side}"
    return None


def _share(report_root: ComponentRow | None, row: ComponentRow, value: float, metric: str) -> float:
    """``row``'s share of the step in its report (see the module docstring, step 3)."""
    over_root = math.nan
    if metric not in RATE_METRICS and metric not in ("intensity", "calls") and report_root is not None:
        over_step = metric_kind(metric)[1]
        root = float(getattr(report_root, metric)) * (max(report_root.calls, 1) if over_step else 1)
        if math.isfinite(root) and root > 0 and math.isfinite(value):
            over_root = value / root
    return over_root if math.isfinite(over_root) else float(row.share)


def _relative(c: Change) -> float:
    """``(b - a) / a``: ``±inf`` from 0, NaN when either is missing."""
    if not (math.isfinite(c.a) and math.isfinite(c.b)):
        return math.nan
    if c.a == 0:
        return 0.0 if c.b == 0 else math.copysign(math.inf, c.b)
    return (c.b - c.a) / abs(c.a)


def relative_bound(ra: ComponentRow, rb: ComponentRow, exact: bool, noises: tuple[float, float] | None = None) -> float:
    """The relative change the two runs' noise explains: ``NOISE_FACTOR`` × the larger relative IQR.

    ``noise`` is each row's IQR ÷ median, or ``noises`` where given (an estimate's, :func:`estimated_noise`);
    without one in either row :data:`UNKNOWN_NOISE`; 0 for an exact metric.
    """
    if exact:
        return 0.0
    given = noises or (float(ra.noise), float(rb.noise))
    known = [n for n in given if math.isfinite(n)]
    return NOISE_FACTOR * max(known) if known else UNKNOWN_NOISE


def estimated_noise(report: Report) -> dict[str, float]:
    """Each row's relative noise as the gate takes it: its own ``noise``, or, for a row without one
    (an ``estimated`` parent, the sum of its children), the largest noise of its children (theirs in
    turn where they are estimates too); NaN when none of them measured one.

    A sum of noisy children is as noisy as its noisiest part at most; a fixed :data:`UNKNOWN_NOISE`
    would call a sum of children each well within their noise a regression.
    """
    kids: dict[str, list[ComponentRow]] = {}
    for r in report.rows:
        if r.parent is not None:
            kids.setdefault(r.parent, []).append(r)
    out: dict[str, float] = {}
    for r in sorted(report.rows, key=lambda r: -r.depth):
        own = float(r.noise)
        if not math.isfinite(own):
            known = [out[k.path] for k in kids.get(r.path, ()) if math.isfinite(out.get(k.path, math.nan))]
            own = max(known) if known else math.nan
        out[r.path] = own
    return out


def _significant(c: Change, bound: float) -> bool:
    """A ratio beyond ``1 + bound`` either way: ``b > a (1 + bound)`` or ``a > b (1 + bound)``.

    diff.py's bound (:attr:`Change.significant`) taken relative: the larger IQR over its
    median, applied to the smaller of the two values, so the bound does not grow with the
    slowdown it judges (``2 × noise × b`` could never call a 4× slowdown real at noise 0.5).
    """
    if c.exact:
        return c.a != c.b
    low, high = sorted((c.a, c.b))
    return high - low > bound * abs(low)


@dataclass(frozen=True)
class _Rule:
    """The gate's options, each report's root (for the shares) and the common shift the new times are divided by."""

    metric: str
    fail_over: float
    min_share: float
    root_a: ComponentRow | None
    root_b: ComponentRow | None
    shift: float = 1.0
    floor_a: frozenset[str] = frozenset()
    floor_b: frozenset[str] = frozenset()
    noise_a: Mapping[str, float] = field(default_factory=dict)
    noise_b: Mapping[str, float] = field(default_factory=dict)

    def bound(self, ra: ComponentRow, rb: ComponentRow, exact: bool) -> float:
        """:func:`relative_bound` with each row's noise from :func:`estimated_noise`."""
        noises = (self.noise_a.get(ra.path, float(ra.noise)), self.noise_b.get(rb.path, float(rb.noise)))
        return relative_bound(ra, rb, exact, noises)


def _share_of(c: Change, ra: ComponentRow, rb: ComponentRow, rule: _Rule) -> float:
    """The larger of the two rows' shares of the step (NaN when neither is known)."""
    shares = [_share(rule.root_a, ra, c.a, rule.metric), _share(rule.root_b, rb, c.b, rule.metric)]
    known = [s for s in shares if math.isfinite(s)]
    return max(known) if known else math.nan


def _reason(c: Change, ra: ComponentRow, rb: ComponentRow, rule: _Rule) -> str | None:
    sides = ((ra, c.a, "base", rule.floor_a), (rb, c.b, "new", rule.floor_b))
    reasons = [_untrusted(r, v, side, rule.metric, c.exact, floor) for r, v, side, floor in sides]
    return "; ".join(r for r in reasons if r) or None


def _scaled(rb: ComponentRow, metric: str, shift: float) -> ComponentRow:
    """``rb`` with its ``metric`` divided by the common shift (a copy; the report is not changed)."""
    if shift == 1.0:
        return rb
    scaled: dict[str, Any] = {metric: float(getattr(rb, metric)) / shift}
    return dataclasses.replace(rb, **scaled)


def _verdict(c: Change, ra: ComponentRow, rb: ComponentRow, rule: _Rule) -> tuple[Verdict, float, str | None, Change]:
    """``(verdict, share, reason, the change judged)`` of one pair of rows found in both reports.

    The change judged is ``c`` with the new value divided by the common shift (a timed metric).
    """
    share = _share_of(c, ra, rb, rule)
    reason = _reason(c, ra, rb, rule)
    if reason:
        return "not_gated", share, reason, c
    if math.isfinite(share) and share < rule.min_share:
        return "below_min_share", share, None, c
    if c.unchanged:
        return "unchanged", share, None, c
    if not c.exact and rule.shift != 1.0:
        c = pair_change(ra, _scaled(rb, rule.metric, rule.shift), rule.metric)
    if not _significant(c, rule.bound(ra, rb, c.exact)):
        return "within_noise", share, None, c
    rel = _relative(c)
    worse = -rel if rule.metric in THROUGHPUT_METRICS else rel
    if worse > rule.fail_over:
        return "regressed", share, None, c
    if worse < -rule.fail_over:
        return "improved", share, None, c
    return "within_threshold", share, None, c


def common_shift(
    pairs: Sequence[tuple[ComponentRow, ComponentRow]],
    metric: str,
    min_share: float,
    *,
    floors: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset()),
) -> float:
    """The change every component shares: the median ``new / base`` of the leaf-most witnesses below the root.

    A witness is a pair that would be gated (both trusted, holding at least ``min_share`` of the
    step in either report, ``base`` > 0) and did the same work in both (FLOPs, bytes and calls
    equal: a component given other work is no witness of the machine). Only the leaf-most
    witnesses count: those none of whose descendants (in the new report's tree) is a witness.
    A parent repeats its children's change (a leaf 2x slower under two wrappers makes three
    rows 2x slower), so the ancestors would outvote the siblings and hide the slowdown as
    the machine's. At least :data:`SHIFT_MIN_COMPONENTS` of them; 1.0 (no shift) with fewer, and
    for an exact metric (a count has no machine in it). ``floors``: each report's rows at the
    harness floor (:func:`floor_paths`).
    """
    if metric_kind(metric)[0]:
        return 1.0
    roots = next(((ra, rb) for ra, rb in pairs if ra.path == "" and rb.path == ""), (None, None))
    rule = _Rule(metric, 0.0, min_share, roots[0], roots[1], floor_a=floors[0], floor_b=floors[1])
    parent_of = {rb.path: rb.parent for _, rb in pairs}
    witnesses: dict[str, float] = {}
    for ra, rb in pairs:
        if ra.path == "" or rb.path == "":
            continue
        c = pair_change(ra, rb, metric)
        share = _share_of(c, ra, rb, rule)
        held = not math.isfinite(share) or share >= min_share
        if held and _reason(c, ra, rb, rule) is None and c.a > 0 and c.b > 0 and _same_work(ra, rb):
            witnesses[rb.path] = c.b / c.a
    above: set[str] = set()  # the witnesses' ancestors
    for path in witnesses:
        up = parent_of.get(path)
        while up is not None and up not in above:
            above.add(up)
            up = parent_of.get(up)
    ratios = [v for p, v in witnesses.items() if p not in above]
    if len(ratios) < SHIFT_MIN_COMPONENTS:
        return 1.0
    return statistics.median(ratios)


#: The counts that say what a component did: a component whose counts changed did other work, so its
#: change in time has a cause of its own and is no witness of the machine's.
_WORK = ("fwd_flops", "bwd_flops", "bytes", "calls")


def _same_work(a: ComponentRow, b: ComponentRow) -> bool:
    """Whether the two rows did the same work (:data:`_WORK` equal where both know it)."""
    for name in _WORK:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, float) and isinstance(y, float) and not (math.isfinite(x) and math.isfinite(y)):
            continue
        if x != y:
            return False
    return True


def _row(
    c: Change,
    verdict: Verdict,
    share: float,
    judged: Change | None = None,
    bound: float = math.nan,
    **extra: str | None,
) -> GateRow:
    judged = judged or c
    return GateRow(
        path=c.path,
        module_type=c.module_type,
        verdict=verdict,
        depth=c.depth,
        base=c.a,
        new=c.b,
        change=_relative(judged),
        noise_bound=bound,
        share=share,
        **extra,
    )


#: The verdicts of a component whose value was judged against the base.
JUDGED = frozenset({"regressed", "unconfirmed", "improved", "within_threshold", "within_noise", "unchanged"})


def _children(
    rows: list[GateRow], parents_b: Mapping[str, str | None], parents_a: Mapping[str, str | None]
) -> dict[str, list[GateRow]]:
    """Each row's children in either report: the new tree's, and the base's only in the base (by the base path)."""
    out: dict[str, list[GateRow]] = {}
    for r in rows:
        parent = parents_a.get(r.path) if r.verdict == "only_in_base" else parents_b.get(r.path)
        if parent is not None:
            out.setdefault(parent, []).append(r)
    return out


#: The verdicts of a child that lets its parent read ``unconfirmed``: paired and trusted.
_PAIRED = JUDGED | {"below_min_share", "renamed"}


def _own_part_grew(r: GateRow, kids: list[GateRow], rule: _Rule) -> bool:
    """Whether the parent's own part (itself less its children, after the shift) or its children's sum grew
    by more than ``fail_over`` of the parent's base."""
    base_sum = sum(k.base for k in kids)
    new_sum = sum(k.new for k in kids) / rule.shift
    if not (math.isfinite(base_sum) and math.isfinite(new_sum) and base_sum > 0 and r.base > 0):
        return True
    if (new_sum - base_sum) / base_sum > rule.fail_over:
        return True
    own_base, own_new = r.base - base_sum, r.new / rule.shift - new_sum
    return own_new - own_base > rule.fail_over * r.base


def _confirmed(
    rows: list[GateRow], parents_b: Mapping[str, str | None], parents_a: Mapping[str, str | None], rule: _Rule
) -> list[GateRow]:
    """Each regressed parent confirmed by its components, or ``unconfirmed`` (a time; see the module docstring).

    A regressed row reads ``unconfirmed`` only when it has at least two children, every child in
    either report is paired and trusted (none in one report only, none not gated; a child below
    ``min_share`` counts, in the sums too), none of its descendants regressed, their sum (the new
    one divided by the common shift) got worse by at most ``fail_over``, and its own part (itself
    less its children) grew by at most ``fail_over`` of its base. Deepest first, so that a child's
    verdict is final before its parent's.
    """
    by_path = {r.path: r for r in rows}
    children = _children(rows, parents_b, parents_a)
    regressed: set[str] = set()  # paths whose subtree holds a regression, the row itself included
    for r in sorted(rows, key=lambda r: -r.depth):
        kids = [by_path.get(k.path, k) if k.verdict != "only_in_base" else k for k in children.get(r.path, ())]
        below = any(k.path in regressed for k in kids if k.verdict != "only_in_base")
        paired = all(k.verdict in _PAIRED and k.reason is None for k in kids)
        if r.verdict == "regressed" and len(kids) >= 2 and not below and paired and not _own_part_grew(r, kids, rule):
            by_path[r.path] = r = dataclasses.replace(r, verdict="unconfirmed")
        if r.verdict == "regressed" or below:
            regressed.add(r.path)
    return [by_path[r.path] for r in rows]


def _pairs(base: Report, new: Report, renamed: Mapping[str, str]) -> list[tuple[ComponentRow, ComponentRow]]:
    """The rows found in both reports (renamed ones by their two paths)."""
    rows_b = {r.path: r for r in new.rows}
    out = []
    for ra in base.rows:
        rb = rows_b.get(renamed.get(ra.path, ra.path))
        if rb is not None:
            out.append((ra, rb))
    return out


def _check_options(fail_over: float, min_share: float) -> None:
    for name, value in (("fail_over", fail_over), ("min_share", min_share)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name}={value!r}: expected a fraction (0.10 for 10 %), not {type(value).__name__}")
        if not value >= 0:  # NaN fails too
            raise ValueError(f"{name}={value!r}: expected a fraction >= 0 (0.10 for 10 %)")
    if not min_share <= 1:
        raise ValueError(f"min_share={min_share!r}: expected a fraction of the step in [0, 1] (0.01 for 1 %)")


def _problem(base: Report, new: Report) -> str | None:
    """Why the two reports cannot be compared at all: one has no rows, or no root row."""
    for side, report in (("base", base), ("new", new)):
        if not report.rows:
            return f"the {side} report has no rows"
        if not any(r.path == "" for r in report.rows):
            return f"the {side} report has no root row (path '')"
    return None


def _step_change(rule: _Rule, exact: bool) -> float:
    """The root's change as measured, the worse way (positive: worse), when it is beyond the noise; else NaN."""
    ra, rb = rule.root_a, rule.root_b
    if ra is None or rb is None or _reason(pair_change(ra, rb, rule.metric), ra, rb, rule):
        return math.nan
    c = pair_change(ra, rb, rule.metric)
    if not _significant(c, rule.bound(ra, rb, exact)):
        return math.nan
    rel = _relative(c)
    return -rel if rule.metric in THROUGHPUT_METRICS else rel


def _judge_all(
    d: Comparison,
    rows_a: Mapping[str, ComponentRow],
    rows_b: Mapping[str, ComponentRow],
    renamed: Mapping[str, str],
    rule: _Rule,
) -> list[GateRow]:
    """One :class:`GateRow` per change of ``d`` (renames by their base path)."""
    metric = rule.metric
    into = set(renamed.values())
    out: list[GateRow] = []
    for c in d.changes:
        if c.only_in == "B" and c.path in into:
            continue  # listed with its base path, as renamed
        if c.only_in == "A" and c.path in renamed:
            ra, rb = rows_a[c.path], rows_b[renamed[c.path]]
            pair = pair_change(ra, rb, metric)
            verdict, share, reason, judged = _verdict(pair, ra, rb, rule)
            final: Verdict = "regressed" if verdict == "regressed" else "renamed"
            bound = rule.bound(ra, rb, pair.exact)
            out.append(_row(pair, final, share, judged, bound, renamed_from=c.path, reason=reason))
        elif c.only_in is not None:
            row = rows_a[c.path] if c.only_in == "A" else rows_b[c.path]
            root = rule.root_a if c.only_in == "A" else rule.root_b
            value = c.a if c.only_in == "A" else c.b
            where: Verdict = "only_in_base" if c.only_in == "A" else "only_in_new"
            out.append(_row(c, where, _share(root, row, value, metric)))
        else:
            ra, rb = rows_a[c.path], rows_b[c.path]
            verdict, share, reason, judged = _verdict(c, ra, rb, rule)
            out.append(_row(c, verdict, share, judged, rule.bound(ra, rb, c.exact), reason=reason))
    return out


def gate_reports(
    base: Report,
    new: Report,
    fail_over: float,
    *,
    metric: str = "total_ms",
    min_share: float = DEFAULT_MIN_SHARE,
    shift: bool = True,
    allow_mismatch: bool = False,
) -> GateResult:
    """Every component's verdict from ``base`` to ``new`` (see the module docstring).

    Args:
        base: the baseline report.
        new: the report to judge.
        fail_over: the threshold, a fraction of the base value (0.10 = 10 %; 1.5 = 150 %, not 1.5 %).
        metric: the compared column (any ``cb diff --metric``: ``total_ms``, ``peak_mem_mb``, ...).
        min_share: components holding less of the step than this fraction (in [0, 1]) in both
            reports are not gated.
        shift: judge a timed metric's changes against the change every component shares
            (:func:`common_shift`); ``False``: each component's own change as measured.
        allow_mismatch: gate two reports that look like different models; by default the result
            is inconclusive (:attr:`GateResult.inconclusive`, ``passed`` false).

    Raises:
        TypeError: ``fail_over`` / ``min_share`` is not a number (a bool included).
        ValueError: ``metric`` cannot be compared, ``fail_over`` is negative or NaN, or ``min_share``
            is outside [0, 1].
    """
    _check_options(fail_over, min_share)
    d = compare_reports(base, new, metric)
    rows_a, rows_b = {r.path: r for r in base.rows}, {r.path: r for r in new.rows}
    renamed = rename_pairs(base, new)
    floors = (frozenset(floor_paths(base)), frozenset(floor_paths(new)))
    moved = common_shift(_pairs(base, new, renamed), metric, float(min_share), floors=floors) if shift else 1.0
    rule = _Rule(
        metric, float(fail_over), float(min_share), rows_a.get(""), rows_b.get(""), moved,
        floors[0], floors[1], estimated_noise(base), estimated_noise(new),
    )  # fmt: skip
    out = _judge_all(d, rows_a, rows_b, renamed, rule)
    if metric.endswith("_ms"):
        out = _confirmed(out, {r.path: r.parent for r in new.rows}, {r.path: r.parent for r in base.rows}, rule)
    quality = {"base": d.quality.get("A"), "new": d.quality.get("B")}
    return GateResult(
        metric, float(fail_over), float(min_share), out, d.mismatch, quality, moved, shift,
        problem=_problem(base, new), allow_mismatch=allow_mismatch,
        step_change=_step_change(rule, metric_kind(metric)[0]),
    )  # fmt: skip
