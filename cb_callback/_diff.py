"""What changed between two reports: per component, over the step, with the noise in mind.

A change is compared on ``metric × calls`` (time over the step for ``total_ms``),
so a component that got faster per call but is called twice as often reads as
slower. A change smaller than the runs' own spread is *within noise*: the
larger of the two rows' ``noise × value``, times :data:`NOISE_FACTOR`, bounds
what two runs of the same model differ by.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from cb_callback._report import ComponentRow, Report

__all__ = ["NOISE_FACTOR", "UNKNOWN_NOISE", "Change", "Comparison", "compare_reports", "format_diff"]

#: A change within this many times the larger IQR of the two rows is not significant.
NOISE_FACTOR = 2.0

#: Without a measured noise (estimated rows), a change within this fraction of the larger
#: value is not significant.
UNKNOWN_NOISE = 0.05


@dataclass(frozen=True)
class Change:
    """One component in A and/or B.

    Attributes:
        path: the dotted path (``""`` the root).
        module_type: its class name.
        depth: its depth.
        a: ``metric × calls`` in A (NaN when missing or not measured).
        b: the same in B.
        change: ``b - a`` (NaN unless both are known).
        ratio: ``b / a``.
        noise: the change two runs of the same component may show: ``NOISE_FACTOR
            × max(noise_a × a, noise_b × b)`` (NaN when neither row has a noise).
        only_in: ``"A"`` or ``"B"`` when the component is in one report only.
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
    def significant(self) -> bool:
        """Whether the change exceeds what noise explains.

        The bound is :attr:`noise`; where neither row measured one (an estimated
        parent), :data:`UNKNOWN_NOISE` of the larger value.
        """
        if not math.isfinite(self.change):
            return self.only_in is not None
        bound = self.noise if math.isfinite(self.noise) else UNKNOWN_NOISE * max(abs(self.a), abs(self.b))
        return abs(self.change) > bound


@dataclass(frozen=True)
class Comparison:
    """Every component's change, and the whole model's."""

    metric: str
    changes: list[Change]

    @property
    def root(self) -> Change | None:
        return next((c for c in self.changes if c.path == ""), None)


#: Rates and fractions: compared per call (a rate times a call count means nothing).
RATE_METRICS = frozenset({"mfu", "bw_util", "tflops", "gbps", "intensity"})
#: Fractions, shown in percent.
_PERCENT = frozenset({"mfu", "bw_util"})


def _over_step(row: ComponentRow | None, metric: str) -> float:
    if row is None or row.status not in ("ok", "estimated"):
        return math.nan
    v = float(getattr(row, metric))
    if not math.isfinite(v):
        return math.nan
    return v if metric in RATE_METRICS else v * max(row.calls, 1)


def compare_reports(a: Report, b: Report, metric: str = "total_ms") -> Comparison:
    """The per-component changes of ``metric × calls`` from ``a`` to ``b``.

    Rates and fractions (:data:`RATE_METRICS`: MFU, bandwidth utilisation,
    TFLOP/s, GB/s, intensity) are compared per call.
    """
    rows_a = {r.path: r for r in a.rows}
    rows_b = {r.path: r for r in b.rows}
    paths = [r.path for r in a.rows] + [r.path for r in b.rows if r.path not in rows_a]
    out = []
    for path in paths:
        ra, rb = rows_a.get(path), rows_b.get(path)
        va, vb = _over_step(ra, metric), _over_step(rb, metric)
        spreads = [
            r.noise * v for r, v in ((ra, va), (rb, vb)) if r is not None and math.isfinite(r.noise) and math.isfinite(v)
        ]
        either = ra if ra is not None else rb
        assert either is not None
        both = math.isfinite(va) and math.isfinite(vb)
        out.append(Change(
            path=path,
            module_type=either.module_type,
            depth=either.depth,
            a=va,
            b=vb,
            change=vb - va if both else math.nan,
            ratio=vb / va if both and va != 0 else math.nan,
            noise=NOISE_FACTOR * max(spreads) if spreads else math.nan,
            only_in=None if (ra is not None and rb is not None) else ("A" if ra is not None else "B"),
        ))
    return Comparison(metric, out)


def _num(v: float, digits: int = 3, sign: bool = False) -> str:
    if not math.isfinite(v):
        return "-"
    return f"{v:+.{digits}f}" if sign else f"{v:.{digits}f}"


def _sort_key(sort: str) -> Callable[[Change], Any]:
    if sort == "path":
        return lambda c: c.path
    if sort in ("a", "b"):
        return lambda c: -getattr(c, sort) if math.isfinite(getattr(c, sort)) else math.inf
    if sort == "ratio":
        return lambda c: -abs(math.log(c.ratio)) if math.isfinite(c.ratio) and c.ratio > 0 else math.inf
    return lambda c: -abs(c.effective) if math.isfinite(c.effective) else math.inf


def format_diff(d: Comparison, *, sort: str = "change", paths: Iterable[str] | None = None) -> list[str]:
    """A one-line summary, then one aligned line per component.

    Args:
        d: the comparison.
        sort: ``change`` (largest absolute change first, a component in one
            report only counting as its whole time), ``path``, ``a``, ``b``, ``ratio``.
        paths: only these components (all by default).

    Returns:
        Lines: ``whole model: A … -> B … (±x %); biggest movers: …``, a header,
        then the components; a change within noise is marked ``~`` in the
        ``sig`` column (not significant) and its ratio is not printed as a
        speed-up or slow-down.
    """
    unit = "ms" if d.metric.endswith("_ms") else ("%" if d.metric in _PERCENT else "")
    scale = 100.0 if d.metric in _PERCENT else 1.0
    label = d.metric if d.metric in RATE_METRICS else f"{d.metric}×calls"
    if d.metric in _PERCENT:
        label = f"{d.metric} %"
    keep = set(paths) if paths is not None else None
    changes = [c for c in d.changes if keep is None or c.path in keep]
    lines = []
    root = d.root
    if root is not None and math.isfinite(root.a) and math.isfinite(root.b):
        pct = (root.b - root.a) / root.a * 100 if root.a else math.nan
        verdict = "" if root.significant else ", within noise"
        lines.append(
            f"whole model: A {_num(root.a * scale)} {unit} -> B {_num(root.b * scale)} {unit} "
            f"({_num(pct, 1, True)} %{verdict})"
        )
    movers = sorted(
        (c for c in d.changes if c.path != "" and c.significant and math.isfinite(c.effective)),
        key=lambda c: -abs(c.effective),
    )[:3]
    if movers:
        lines.append("biggest movers: " + ", ".join(
            f"{c.path} {_num(c.effective * scale, 3, True)} {unit}".rstrip()
            + (f" (only in {c.only_in})" if c.only_in else "")
            for c in movers
        ))
    header = ("path", "type", f"A {label}", f"B {label}", "change", "B/A", "sig")
    table = [header]
    for c in sorted(changes, key=_sort_key(sort)):
        note = f"only in {c.only_in}" if c.only_in else ("" if c.significant else "~")
        ratio = _num(c.ratio) if c.significant else "~"
        table.append((
            c.path or "(root)", c.module_type, _num(c.a * scale), _num(c.b * scale),
            _num(c.effective * scale, 3, True), ratio, note,
        ))
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for i, row in enumerate(table):
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
        cells += [v.rjust(w) for v, w in zip(row[2:6], widths[2:6], strict=True)]
        cells.append(row[6].ljust(widths[6]))
        lines.append("  ".join(cells).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append("(~: the change is within the two runs' noise, 2 x the larger IQR: not significant)")
    return lines
