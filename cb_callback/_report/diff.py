"""What changed between two reports: per component, over the step, with the noise in mind.

Each metric is judged by what it is (:func:`metric_kind`):

- **Exact** (:data:`EXACT_METRICS`: ``fwd_flops``, ``bwd_flops``, ``bytes``,
  ``params_mb``, ``activation_mb``, ``peak_mem_mb``, ``intensity``, ``calls``):
  counted or sized, not timed; the same component on the same inputs gives the
  same value every run. Equal values are *unchanged* (``0 -> 0`` included) and
  any difference is a change: ``1e9 -> 1.2e9`` FLOPs is ``B/A = 1.2``, never
  "within noise".
- **Timed** (every ``*_ms`` column, and the rates derived from a time,
  :data:`RATE_METRICS`: ``tflops``, ``mfu``, ``gbps``, ``bw_util``, ``share``,
  ``compile_speedup``): a change smaller than the runs' own spread is *within
  noise*: the larger of the two rows' ``noise × value``, times
  :data:`NOISE_FACTOR`, bounds what two runs of the same model differ by.
  Equal values are *unchanged* here too (``MFU 0 -> 0``: nothing moved, not
  "within noise").

Whether ``× calls`` applies (:data:`OVER_STEP_METRICS`): what adds up over the
step's calls is compared over the step, ``metric × calls`` (time, FLOPs, bytes,
and ``activation_mb``, since every call's saved activations are held until the
backward), so a component that got faster per call but is called twice as often
reads as slower. Sizes and peaks (``params_mb``: the same parameters whatever
the call count; ``peak_mem_mb``: one call's peak), rates, fractions,
``intensity`` and ``calls`` are compared per call as the row holds them.

Two reports that look like different models (:func:`model_mismatch`: the root
modules' types differ, or fewer than half of the smaller report's components
match the other's by path and type) are still compared, under a warning line.
The text also shows both reports' quality verdicts and advice
(``metadata["quality"]``), as the html page does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cb_callback._report.finite import ratio
from cb_callback._report.model import ComponentRow, Report
from cb_callback._report.numbers import percent, si, sig

__all__ = [
    "EXACT_METRICS",
    "MATCH_FRACTION",
    "NOISE_FACTOR",
    "OVER_STEP_METRICS",
    "RATE_METRICS",
    "THROUGHPUT_METRICS",
    "UNKNOWN_NOISE",
    "Change",
    "Comparison",
    "aligned_lines",
    "cell_texts",
    "change_word",
    "compare_reports",
    "format_diff",
    "format_value",
    "metric_kind",
    "model_mismatch",
    "pair_change",
    "ratio_text",
]

#: A change within this many times the larger IQR of the two rows is not significant.
NOISE_FACTOR = 2.0

#: Without a measured noise (estimated rows), a change within this fraction of the larger
#: value is not significant (timed metrics only).
UNKNOWN_NOISE = 0.05

#: Counted or sized, not timed: judged exactly (equal is unchanged, any difference a change).
EXACT_METRICS = frozenset(
    {"fwd_flops", "bwd_flops", "bytes", "params_mb", "activation_mb", "peak_mem_mb", "intensity", "calls", "comm_bytes"}
)

#: Rates and fractions of a timed run: compared per call (a rate times a call count means
#: nothing), judged by the timing noise.
RATE_METRICS = frozenset({"mfu", "bw_util", "tflops", "gbps", "share", "compile_speedup"})

#: Besides every ``*_ms`` column, what adds up over the step's calls: compared as ``metric × calls``.
OVER_STEP_METRICS = frozenset({"fwd_flops", "bwd_flops", "bytes", "activation_mb", "comm_bytes"})

#: Fractions, shown in percent.
_PERCENT = frozenset({"mfu", "bw_util", "share"})

#: Counts, shown with an SI prefix (:func:`cb_callback._report.numbers.si`) and this unit.
_COUNT_UNITS = {"fwd_flops": "FLOP", "bwd_flops": "FLOP", "bytes": "B", "comm_bytes": "B", "calls": ""}

#: A report pair whose matching components are fewer than this fraction of the smaller
#: report's looks like two different models.
MATCH_FRACTION = 0.5


def metric_kind(metric: str) -> tuple[bool, bool]:
    """``(exact, over_step)`` of a metric: judged exactly?, multiplied by ``calls``?

    Raises:
        ValueError: ``metric`` is not a column :func:`compare_reports` can compare.
    """
    timed = metric.endswith("_ms") or metric in RATE_METRICS
    if not timed and metric not in EXACT_METRICS:
        known = [*sorted(EXACT_METRICS | RATE_METRICS), "*_ms"]
        raise ValueError(f"metric={metric!r} cannot be compared; one of {', '.join(known)}")
    return metric in EXACT_METRICS, metric.endswith("_ms") or metric in OVER_STEP_METRICS


@dataclass(frozen=True)
class Change:
    """One component in A and/or B.

    Attributes:
        path: the dotted path (``""`` the root).
        module_type: its class name.
        depth: its depth.
        a: the metric in A, ``× calls`` where it adds up over the step (see the
            module docstring; NaN when missing or not measured).
        b: the same in B.
        change: ``b - a`` (NaN unless both are known).
        ratio: ``b / a`` (NaN when ``a`` is 0).
        noise: the change two runs of the same component may show: ``NOISE_FACTOR
            × max(noise_a × a, noise_b × b)`` for a timed metric (NaN when neither
            row has a noise); 0 for an exact one.
        only_in: ``"A"`` or ``"B"`` when the component is in one report only.
        exact: the metric is counted, not timed (:data:`EXACT_METRICS`).
    """

    path: str
    module_type: str
    depth: int
    a: float
    b: float
    change: float
    ratio: float
    noise: float
    only_in: str | None
    exact: bool = False

    @property
    def effective(self) -> float:
        """The change over the step, counting a component only in A as ``-a`` and only in B as ``+b``."""
        if math.isfinite(self.change):
            return self.change
        if self.only_in == "A" and math.isfinite(self.a):
            return -self.a
        if self.only_in == "B" and math.isfinite(self.b):
            return self.b
        return math.nan

    @property
    def unchanged(self) -> bool:
        """The same value in A and B (``0 -> 0`` included), for any metric, timed or exact."""
        return math.isfinite(self.change) and self.a == self.b

    @property
    def significant(self) -> bool:
        """Whether the change is real.

        An exact metric: any difference. A timed one: a change beyond what noise
        explains, the bound :attr:`noise` or, where neither row measured one (an
        estimated parent), :data:`UNKNOWN_NOISE` of the larger value.
        """
        if not math.isfinite(self.change):
            return self.only_in is not None
        if self.exact:
            return self.a != self.b
        bound = self.noise if math.isfinite(self.noise) else UNKNOWN_NOISE * max(abs(self.a), abs(self.b))
        return abs(self.change) > bound


@dataclass(frozen=True)
class Comparison:
    """Every component's change, and the whole model's.

    Attributes:
        metric: the compared column.
        changes: one per path in A or B (A's order, then B's new paths).
        mismatch: why A and B look like different models (:func:`model_mismatch`), or ``None``.
        quality: ``{"A": ..., "B": ...}``, each report's ``metadata["quality"]``
            (``verdict`` and ``advice``), ``None`` where it has none.
    """

    metric: str
    changes: list[Change]
    mismatch: str | None = None
    quality: Mapping[str, Mapping[str, Any] | None] = field(default_factory=dict)

    @property
    def root(self) -> Change | None:
        return next((c for c in self.changes if c.path == ""), None)

    @property
    def exact(self) -> bool:
        """The metric is counted, not timed."""
        return metric_kind(self.metric)[0]


def model_mismatch(a: Report, b: Report) -> str | None:
    """Why ``a`` and ``b`` look like different models, or ``None``.

    They do when their roots (path ``""``) are of different types, or when fewer
    than :data:`MATCH_FRACTION` of the smaller report's components match a
    component of the other by path *and* type (a report profiled deeper than
    the other, or a model with one component re-authored, still matches).

    Returns:
        ``"root Foo vs Bar; 3 of 12 components match by path and type (A has
        40, B 12)"`` (the root part only when the types differ).
    """
    types_a = {r.path: r.module_type for r in a.rows}
    types_b = {r.path: r.module_type for r in b.rows}
    if not types_a or not types_b:
        return None
    matching = sum(1 for p, t in types_a.items() if types_b.get(p) == t)
    smaller = min(len(types_a), len(types_b))
    root_a, root_b = types_a.get(""), types_b.get("")
    roots_differ = root_a is not None and root_b is not None and root_a != root_b
    if not roots_differ and matching >= MATCH_FRACTION * smaller:
        return None
    parts = [f"root {root_a} vs {root_b}"] if roots_differ else []
    parts.append(f"{matching} of {smaller} components match by path and type (A has {len(types_a)}, B {len(types_b)})")
    return "; ".join(parts)


def _value(row: ComponentRow | None, metric: str, over_step: bool) -> float:
    if row is None or row.status not in ("ok", "estimated"):
        return math.nan
    v = float(getattr(row, metric))
    if not math.isfinite(v):
        return math.nan
    return v * max(row.calls, 1) if over_step else v


def _quality(report: Report) -> Mapping[str, Any] | None:
    """``metadata["quality"]`` with a verdict, its ``advice`` a list of strings whatever a hand-edited
    report.json holds there (one string: that advice; another value: none); ``None`` without a verdict."""
    q = report.metadata.get("quality")
    if not isinstance(q, Mapping) or q.get("verdict") is None:
        return None
    advice = q.get("advice")
    if isinstance(advice, str):
        return {**q, "advice": [advice]}
    return {**q, "advice": [str(a) for a in advice] if isinstance(advice, (list, tuple)) else []}


def pair_change(ra: ComponentRow | None, rb: ComponentRow | None, metric: str) -> Change:
    """The :class:`Change` of ``metric`` from row ``ra`` (in A) to row ``rb`` (in B), as :func:`compare_reports` pairs.

    The two rows are usually the same path; the regression gate also pairs a renamed
    component's rows (:mod:`cb_callback._report.gate`): the change carries ``rb``'s path
    then (``ra``'s when ``rb`` is ``None``), and ``ra``'s type and depth where both are given.

    Raises:
        ValueError: ``metric`` is not a comparable column, or both rows are ``None``.
    """
    exact, over_step = metric_kind(metric)
    either = ra if ra is not None else rb  # A's type and depth where both have the path (as cb diff shows it)
    if either is None:
        raise ValueError("pair_change needs a row in A or in B")
    path = rb.path if rb is not None else either.path
    va, vb = _value(ra, metric, over_step), _value(rb, metric, over_step)
    spreads = [
        r.noise * v for r, v in ((ra, va), (rb, vb)) if r is not None and math.isfinite(r.noise) and math.isfinite(v)
    ]
    both = math.isfinite(va) and math.isfinite(vb)
    return Change(
        path=path,
        module_type=either.module_type,
        depth=either.depth,
        a=va,
        b=vb,
        change=vb - va if both else math.nan,
        ratio=ratio(vb, va),
        noise=0.0 if exact else (NOISE_FACTOR * max(spreads) if spreads else math.nan),
        only_in=None if (ra is not None and rb is not None) else ("A" if ra is not None else "B"),
        exact=exact,
    )


def compare_reports(a: Report, b: Report, metric: str = "total_ms") -> Comparison:
    """The per-component changes of ``metric`` from ``a`` to ``b``.

    ``metric × calls`` where the metric adds up over the step (times, FLOPs,
    bytes, activations), the row's value otherwise (sizes, peaks, rates,
    fractions); exact metrics judged exactly, timed ones by the noise: see the
    module docstring.

    Raises:
        ValueError: ``metric`` is not a comparable column.
    """
    metric_kind(metric)  # an unknown metric raises before anything else
    rows_a = {r.path: r for r in a.rows}
    rows_b = {r.path: r for r in b.rows}
    paths = [r.path for r in a.rows] + [r.path for r in b.rows if r.path not in rows_a]
    out = [pair_change(rows_a.get(path), rows_b.get(path), metric) for path in paths]
    return Comparison(metric, out, model_mismatch(a, b), {"A": _quality(a), "B": _quality(b)})


def format_value(v: float, metric: str, *, sign: bool = False) -> str:
    """``v`` of ``metric`` as a person reads it (:mod:`cb_callback._report.numbers`); ``-`` when missing.

    A count with an SI prefix and its unit (``54242288`` bytes is ``54.2 MB``, ``6e9`` FLOP
    ``6.00 GFLOP``; a whole count under 1000 as it is: ``3`` calls, ``+1 B``), a fraction as a
    percent (``mfu`` ``0.25`` is ``25.0 %``), anything else
    (times in ms, rates, sizes in MB) to 3 significant figures (``0.000728``, ``12.3``).
    ``sign``: a ``+`` before a positive value (a change); exactly 0 is ``0`` (``0 B``, ``0 %``).
    """
    if not math.isfinite(v):
        return "-"
    unit = _COUNT_UNITS.get(metric)
    if unit is not None and abs(v) < 1000 and v == int(v):  # a whole count under 1 k: every digit (3 calls, 1 B)
        text = f"{int(v)} {unit}".rstrip()
    elif unit is not None:
        text = si(v, unit)
    elif metric in _PERCENT:
        text = percent(v)
    else:
        text = sig(v)
    return ("+" if sign and v > 0 else "") + text


def cell_texts(c: Change, metric: str) -> dict[str, str]:
    """The ``A``, ``B``, ``change``, ``B/A`` and ``sig`` cells of a change, as ``cb diff`` and diff.html show them.

    ``change`` is ``0`` for an equal value (``sig`` then says ``unchanged``); a component in one
    report only counts as its whole value (:attr:`Change.effective`).
    """
    change = "0" if c.unchanged else format_value(c.effective, metric, sign=True)
    return {
        "a": format_value(c.a, metric),
        "b": format_value(c.b, metric),
        "change": change,
        "ratio": ratio_text(c),
        "sig": change_word(c, metric),
    }


#: Rates of work done per time: higher is faster (for the same work).
THROUGHPUT_METRICS = frozenset({"tflops", "gbps", "mfu", "bw_util"})


def _directions(metric: str) -> tuple[str, str]:
    """What the ``sig`` column calls a significant change of ``metric``: ``(B larger, B smaller)``."""
    if metric.endswith("_ms"):
        return "slower", "faster"
    if metric in THROUGHPUT_METRICS:
        return "faster", "slower"
    return "higher", "lower"


def change_word(c: Change, metric: str) -> str:
    """The ``sig`` cell of a change: what a person reads of it at a glance.

    ``unchanged`` (the same value in A and B); ``slower`` / ``faster`` for a time or a
    throughput rate, ``higher`` / ``lower`` for a count, size or other rate, when the change
    is significant (:attr:`Change.significant`); ``noise`` when it is within the two runs'
    noise; ``only in A`` / ``only in B``; ``""`` when A or B did not measure it (nothing to judge).
    """
    if c.only_in:
        return f"only in {c.only_in}"
    if not math.isfinite(c.change):
        return ""
    if c.unchanged:
        return "unchanged"
    if not c.significant:
        return "noise"
    up, down = _directions(metric)
    return up if c.change > 0 else down


def ratio_text(c: Change) -> str:
    """The ``B/A`` cell: the measured ratio B ÷ A to 3 significant figures (``2.88×``, ``0.500×``,
    ``4837×``), within noise or not: the ``sig`` cell alone says whether it is significant
    (:func:`change_word`: ``noise``); ``-`` where the ratio is undefined (A is 0, or either missing).
    """
    if not math.isfinite(c.ratio):
        return "-"
    return sig(c.ratio) + "\u00d7"


def _legend(metric: str, exact: bool) -> str:
    """The line under the table saying what the ``B/A`` and ``sig`` cells mean."""
    up, down = _directions(metric)
    if exact:
        return (
            f"({metric} is a count or a size, not a time: any difference is a change; B/A: B \u00f7 A; "
            f"sig: {up} / {down} in B, unchanged: the same value in A and B)"
        )
    return (
        f"(B/A: B \u00f7 A as measured; sig: {up} / {down} beyond the two runs' noise "
        "(2 \u00d7 the larger IQR), noise within it: not significant, unchanged: the same value in A and B)"
    )


def _sort_key(sort: str) -> Callable[[Change], Any]:
    if sort == "path":
        return lambda c: c.path
    if sort in ("a", "b"):
        return lambda c: -getattr(c, sort) if math.isfinite(getattr(c, sort)) else math.inf
    if sort == "ratio":
        return lambda c: -abs(math.log(c.ratio)) if math.isfinite(c.ratio) and c.ratio > 0 else math.inf
    return lambda c: -abs(c.effective) if math.isfinite(c.effective) else math.inf


def _quality_lines(d: Comparison) -> list[str]:
    """``quality: A clean, B contended (...)`` and each report's advice; none when neither has a quality."""
    if not any(d.quality.get(k) for k in ("A", "B")):
        return []
    verdicts = {k: (q.get("verdict") if q else None) for k, q in ((k, d.quality.get(k)) for k in ("A", "B"))}
    line = "quality: " + ", ".join(f"{k} {v if v is not None else 'not measured'}" for k, v in verdicts.items())
    if not d.exact and any(v not in ("clean", None) for v in verdicts.values()):
        line += " (a timed change may be the machine's, not the model's)"
    lines = [line]
    for k in ("A", "B"):
        q = d.quality.get(k)
        for advice in (q.get("advice") if q else None) or []:
            lines.append(f"  {k}: {advice}")
    return lines


def _suffix(metric: str) -> str:
    """What follows a value in a line of text: `` ms`` for a time (a count's and a percent's unit is in the value)."""
    return " ms" if metric.endswith("_ms") else ""


def _whole_model_line(d: Comparison) -> list[str]:
    """``whole model: A 10.000 ms -> B 8.000 ms (-20.0 %)`` (``unchanged``, ``within noise``); none without a root."""
    root = d.root
    if root is None or not (math.isfinite(root.a) and math.isfinite(root.b)):
        return []
    suffix = _suffix(d.metric)
    if root.unchanged:
        how = "unchanged"
    else:
        rel = (root.b - root.a) / root.a * 100 if root.a else math.nan
        pct = ("+" if rel > 0 else "") + f"{sig(rel)} %" if root.a else "from 0"
        how = pct + ("" if root.significant else ", within noise")
    a_text, b_text = format_value(root.a, d.metric) + suffix, format_value(root.b, d.metric) + suffix
    return [f"whole model: A {a_text} -> B {b_text} ({how})"]


def _movers_line(d: Comparison) -> list[str]:
    """``biggest movers: b -3.000 ms, a +1.000 ms``: the three largest significant changes below the root."""
    suffix = _suffix(d.metric)
    movers = sorted(
        (c for c in d.changes if c.path != "" and c.significant and math.isfinite(c.effective)),
        key=lambda c: -abs(c.effective),
    )[:3]
    if not movers:
        return []
    return [
        "biggest movers: "
        + ", ".join(
            f"{c.path} {format_value(c.effective, d.metric, sign=True)}{suffix}"
            + (f" (only in {c.only_in})" if c.only_in else "")
            for c in movers
        )
    ]


def _table_lines(d: Comparison, changes: list[Change], sort: str) -> list[str]:
    """The header, a rule, then one aligned line per component (names left, numbers right, ``sig`` left)."""
    label = f"{d.metric}×calls" if metric_kind(d.metric)[1] else d.metric
    header = ("path", "type", f"A {label}", f"B {label}", "change", "B/A", "sig")
    table = [header]
    for c in sorted(changes, key=_sort_key(sort)):
        t = cell_texts(c, d.metric)
        table.append((c.path or "(root)", c.module_type, t["a"], t["b"], t["change"], t["ratio"], t["sig"]))
    return aligned_lines(table)


def aligned_lines(table: Sequence[Sequence[str]]) -> list[str]:
    """Seven-column rows as aligned text: the first row a header with a rule under it; the two name
    columns left, the four numbers right, the verdict left (``cb diff``'s table and the gate's)."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = []
    for i, row in enumerate(table):
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
        cells += [v.rjust(w) for v, w in zip(row[2:6], widths[2:6], strict=True)]
        cells.append(row[6].ljust(widths[6]))
        lines.append("  ".join(cells).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def format_diff(d: Comparison, *, sort: str = "change", paths: Iterable[str] | None = None) -> list[str]:
    """The warnings, a one-line summary, then one aligned line per component, then a legend.

    Args:
        d: the comparison.
        sort: ``change`` (largest absolute change first, a component in one
            report only counting as its whole value), ``path``, ``a``, ``b``, ``ratio``.
        paths: only these components (all by default).

    Returns:
        Lines: ``warning: A and B look like different models: ...`` when they
        do (:func:`model_mismatch`); ``quality: A <verdict>, B <verdict>`` and
        each report's advice when either has a quality; ``whole model: A … -> B …
        (±x %)`` (3 significant figures; ``unchanged`` when equal, ``, within noise`` when not
        significant); ``biggest movers: …``; a header (``path type A … B … change
        B/A sig``), then the components, then one legend line.

        The ``A``, ``B`` and ``change`` cells are :func:`format_value`'s (``0``
        for an equal value). ``B/A`` is the measured ratio (:func:`ratio_text`:
        ``1.20×``, within noise too: ``sig`` says ``noise`` then, never a
        speed-up or slow-down; ``-`` when undefined). ``sig`` says what the change is
        (:func:`change_word`): ``slower`` / ``faster`` (a time or a throughput),
        ``higher`` / ``lower`` (a count, a size, another rate), ``noise`` (within
        the two runs' noise, timed metrics only), ``unchanged`` (the same value
        in A and B, any metric: MFU 0 -> 0 too), ``only in A`` / ``only in B``,
        or nothing when A or B did not measure it. The legend (first words
        ``(B/A: B ÷ A`` for a timed metric, ``(<metric> is a count or a size,
        not a time`` for an exact one) says so.
    """
    exact = metric_kind(d.metric)[0]
    keep = set(paths) if paths is not None else None
    changes = [c for c in d.changes if keep is None or c.path in keep]
    lines = []
    if d.mismatch:
        lines.append(
            f"warning: A and B look like different models: {d.mismatch}; the changes below pair unrelated components"
        )
    lines += _quality_lines(d)
    lines += _whole_model_line(d)
    lines += _movers_line(d)
    lines += _table_lines(d, changes, sort)
    lines.append(_legend(d.metric, exact))
    return lines
