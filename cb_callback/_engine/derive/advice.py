"""The quality verdict's advice sentences: each names its rows and the option to set.

Every sentence built here starts with how many rows it is about (``1 component``,
``3 components``, plural right), names the first :data:`SHOWN` of them (the root
as ``root``, the worst first where there is a worst; ``and N more`` for the rest)
with the figure that flagged each, and, where an option would change the outcome,
names it with its unit or a value (``peak_bandwidth=<bytes/s, at least 3.42e10,
i.e. 34.2 GB/s>``, ``min_run_time_s (now 0.1 s)``). Ratios read as ratios
(``2.40×``), fractions as percentages. The machine's own sentence (the
``contended`` verdict) is :func:`cb_callback._engine.derive.quality._advice`'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from cb_callback._engine.clocks.timing import SampleSet
from cb_callback._engine.run.config import BenchmarkConfig
from cb_callback._report.model import ComponentRow

__all__ = [
    "SHOWN",
    "at_least",
    "count",
    "figure",
    "insitu_advice",
    "label",
    "method_advice",
    "named",
    "noisy_advice",
    "parent_advice",
    "peak_advice",
    "times",
]

#: How many rows a sentence names before ``and N more``.
SHOWN = 3

#: The median-uncertainty criterion of :func:`cb_callback._engine.derive.quality.is_noisy`:
#: ``1.57 · noise / √runs`` at most this for a sure median.
_NOTCH = 1.57


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``"1 component"``, ``"3 components"`` (``plural`` where it is not ``noun + "s"``)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def _pick(n: int, one: str, many: str) -> str:
    """``one`` for a single row, ``many`` otherwise (a verb or pronoun agreeing with :func:`count`)."""
    return one if n == 1 else many


def label(path: str) -> str:
    """A row's path as a sentence names it: the root (path ``""``) is ``root``."""
    return path or "root"


def named(items: Sequence[str], most: int = SHOWN) -> str:
    """The first ``most`` items joined with ``", "``, then ``" and N more"``: ``"a, b, c and 2 more"``."""
    shown = ", ".join(items[:most])
    rest = len(items) - most
    return f"{shown} and {rest} more" if rest > 0 else shown


def times(x: float) -> str:
    """A ratio as a ratio, to about 3 significant figures: ``"1.20×"``, ``"48.4×"``, ``"4837×"``."""
    if not math.isfinite(x):
        return f"{x}×"
    return f"{x:.2f}×" if x < 10 else f"{x:.1f}×" if x < 100 else f"{x:.0f}×"


def figure(x: float) -> str:
    """A positive measurement to 3 significant figures without an exponent: ``0.0412``, ``1.20``, ``34.1``, ``1234``."""
    if not math.isfinite(x) or x == 0:
        return f"{x:g}"
    decimals = max(0, 2 - math.floor(math.log10(abs(x))))
    return f"{x:.{decimals}f}"


def at_least(x: float, up: bool = True) -> tuple[str, float]:
    """Positive ``x`` to 3 significant figures, as a Python literal (``"3.42e10"``) and as a float.

    ``up``: rounded up, so that a figure offered as "at least" stays above every row's rate;
    else to the nearest.
    """
    exp = math.floor(math.log10(x))
    scaled = x / 10.0 ** (exp - 2)  # 100 ... 1000
    mantissa = math.ceil(scaled - 1e-9) if up else round(scaled)
    if mantissa >= 1000:
        mantissa, exp = mantissa // 10, exp + 1
    return f"{mantissa / 100:.2f}e{exp}", mantissa * 10.0 ** (exp - 2)


def _now(config: BenchmarkConfig | None, name: str, unit: str = "") -> str:
    """``" (now 0.1 s)"``: the option's value in this run, when the config is known."""
    value = getattr(config, name, None)
    if value is None:
        return ""
    return f" (now {value:g} {unit})" if unit and isinstance(value, (int, float)) else f" (now {value})"


def _more_runs(config: BenchmarkConfig | None) -> str:
    """``min_run_time_s (now 0.1 s) or rounds (now 5)``; with no config, the options with their units."""
    if config is None:
        return "min_run_time_s=<s> or rounds=<count>"
    return f"min_run_time_s{_now(config, 'min_run_time_s', 's')} or rounds{_now(config, 'rounds')}"


def noisy_advice(noisy: Mapping[str, SampleSet], threshold: float, config: BenchmarkConfig | None) -> list[str]:
    """The ``noisy`` rows, the most spread first, each with its noise (IQR ÷ median) and runs.

    The runs a sure median needs at the worst row's spread, ``(1.57 · noise / 0.05)²`` (see
    :func:`cb_callback._engine.derive.quality.is_noisy`), are the value offered for ``min_repeats``.
    """
    if not noisy:
        return []
    order = sorted(noisy.items(), key=lambda kv: -kv[1].noise)
    shown = [f"{label(p)} {s.noise:.0%} over {count(len(s.samples), 'run')}" for p, s in order]
    worst, spread = order[0]
    needed = math.ceil((_NOTCH * spread.noise / 0.05) ** 2)
    cap = getattr(config, "max_repeats", None)
    if cap is not None and cap < needed:
        raise_ = f"min_repeats{_now(config, 'min_repeats')} and max_repeats{_now(config, 'max_repeats')} to {needed}"
    else:
        raise_ = f"min_repeats to {needed}{_now(config, 'min_repeats')}"
    n = len(noisy)
    return [
        f"{count(n, 'component')} {_pick(n, 'varies', 'vary')} by more than {threshold:.0%} between runs, too much "
        f"for {_pick(n, 'its', 'their')} few runs (noisy: {named(shown)}): raise {raise_}, the runs a sure median "
        f"needs at {label(worst)}'s {spread.noise:.0%} spread, or {_more_runs(config)}"
    ]


def parent_advice(
    pairs: Sequence[tuple[str, str]], rows: Mapping[str, ComponentRow], config: BenchmarkConfig | None
) -> list[str]:
    """The ``slower_than_parent`` pairs, each as ``child R× parent`` (the child's ``total_ms × calls``
    per call of the parent over the parent's ``total_ms``; just ``child > parent`` where the rows'
    medians do not show it, as when the engine compared them batch by batch)."""
    if not pairs:
        return []
    shown = []
    for child, parent in pairs:
        c, p = rows.get(child), rows.get(parent)
        ratio = math.nan
        if c is not None and p is not None and math.isfinite(c.total_ms) and math.isfinite(p.total_ms):
            ratio = c.total_ms * max(c.calls, 1) / max(p.calls, 1) / p.total_ms if p.total_ms > 0 else math.nan
        how = f" {times(ratio)} " if math.isfinite(ratio) and ratio > 1 else " > "
        shown.append((ratio if math.isfinite(ratio) else 0.0, f"{label(child)}{how}{label(parent)}"))
    shown.sort(key=lambda x: -x[0])
    n = len(pairs)
    return [
        f"{count(n, 'child', 'children')} measured slower than {_pick(n, 'its parent', 'their parents')} "
        f"(slower_than_parent: {named([s for _, s in shown])}): noise or isolation overhead; treat both rows' "
        f"times as uncertain; if it is noise, raising {_more_runs(config)} settles it"
    ]


def insitu_advice(rows: Sequence[ComponentRow]) -> list[str]:
    """The ``insitu_mismatch`` rows, the farthest apart first, each with its isolated and in-situ forward."""
    if not rows:
        return []

    def apart(r: ComponentRow) -> float:
        lo, hi = sorted((r.fwd_ms, r.insitu_ms))
        return hi / lo if lo > 0 else math.inf

    order = sorted(rows, key=lambda r: -apart(r))
    shown = [f"{label(r.path)} {figure(r.fwd_ms)} ms alone vs {figure(r.insitu_ms)} ms in the step" for r in order]
    n = len(rows)
    their = _pick(n, "its", "their")
    return [
        f"{count(n, 'component')} {_pick(n, 'runs', 'run')} differently alone than in the step (insitu_mismatch: "
        f"{named(shown)}): {their} isolated fwd_ms and in-situ insitu_ms disagree beyond both rows' noise; "
        f"isolation misses what {their} neighbours leave (caches, lazy initialisation) or the replay takes "
        "another path"
    ]


#: What a row's own flag means, for one row and for several (:data:`cb_callback._engine.derive.quality.OWN_FLAGS`).
_OWN_ADVICE = {
    "hash_reduced": (
        "is timed on a hash-size-reduced table: its times come from the shrunk table",
        "are timed on a hash-size-reduced table: their times come from the shrunk table",
        " (the row's details say which columns are the real table's)",
    ),
    "hash_collapsed": (
        "had distinct ids collapsed onto one row by the hash-size remap: its lookups touch",
        "had distinct ids collapsed onto one row by the hash-size remap: their lookups touch",
        " fewer rows than the real step's",
    ),
    "derived_negative": (
        "has a value derived by subtraction that would go below zero",
        "have a value derived by subtraction that would go below zero",
        " (two separately measured times): it is not a measurement of either; read the row's details",
    ),
}


def method_advice(
    at_floor: Sequence[str], above: Sequence[tuple[str, str, float]], own: Mapping[str, Sequence[str]]
) -> list[str]:
    """Advice on what the method (not the machine) limits: rows at the floor, estimates above their
    parent (each as ``estimate R× parent``, the largest first), and the flags rows carried themselves."""
    out = []
    if at_floor:
        n = len(at_floor)
        out.append(
            f"{count(n, 'component')} {_pick(n, 'runs', 'run')} within the harness floor's noise (at_floor: "
            f"{named([label(p) for p in at_floor])}): isolation cannot tell {_pick(n, 'its', 'their')} time from "
            "a replay that does nothing, so it is at most the floor's spread (details['floor_ms']) and no "
            "TFLOP/s, GB/s, MFU or bound is derived from it"
        )
    if above:
        n = len(above)
        shown = [f"{label(p)} {times(x)} {label(q)}" for p, q, x in sorted(above, key=lambda t: -t[2])]
        out.append(
            f"{count(n, 'estimated component')} {_pick(n, 'exceeds its', 'exceed their')} measured parent "
            f"(above_parent: {named(shown)}): an estimate sums its children's isolated replays, each paying "
            "isolation's per-replay cost that the parent's one replay pays once; read the parent's time, the "
            "estimate is no lower bound here"
        )
    for name, paths in own.items():
        if paths:
            one, many, rest = _OWN_ADVICE[name]
            n = len(paths)
            out.append(
                f"{count(n, 'component')} ({name}: {named([label(p) for p in paths])}) {_pick(n, one, many)}{rest}"
            )
    return out


def _ceiling(row: ComponentRow) -> tuple[float, str]:
    """The GB/s a row is judged against and its name: its working set's level (``details["bw_ceiling"]``),
    else the device's peak (``gbps / bw_util``)."""
    own = row.details.get("bw_ceiling")
    if isinstance(own, Mapping) and isinstance(own.get("gbps"), (int, float)):
        return float(own["gbps"]), str(own.get("level") or "ceiling")
    return (row.gbps / row.bw_util if row.bw_util > 0 else math.nan), ""


def _flops_advice(over: Sequence[ComponentRow], peaks: Mapping[str, Any]) -> list[str]:
    """Rows above the FLOP/s peak (the highest MFU first); ``peak_flops`` at least their fastest rate."""
    if not over:
        return []
    order = sorted(over, key=lambda r: -r.mfu)
    rates = [r.tflops * 1e12 if math.isfinite(r.tflops) and r.tflops > 0 else math.nan for r in order]
    peak = peaks.get("flops")
    if isinstance(peak, (int, float)) and peak > 0:
        rates = [x if math.isfinite(x) else peak * r.mfu for x, r in zip(rates, order, strict=True)]
    known = [x for x in rates if math.isfinite(x) and x > 0]
    value = f"<FLOP/s, at least {at_least(max(known))[0]}>" if known else "<FLOP/s>"
    n = len(over)
    shown = named([f"{label(r.path)} at {r.mfu:.0%} MFU" for r in order])
    if peaks.get("flops_source") == "measured":
        notes = peaks.get("calibration") or {}
        note: Mapping[str, Any] = next((v for k, v in notes.items() if k.startswith("gemm")), {})
        busy = " (the machine was busy while it calibrated)" if note.get("machine") == "busy" else ""
        return [
            f"{count(n, 'component')} {_pick(n, 'runs', 'run')} above the measured CPU peak ({shown}): the GEMM "
            f"calibration read low{busy}; the best figure is kept per machine, so a run on a quiet machine raises "
            f"it (CB_CACHE_DIR), or pass peak_flops={value}"
        ]
    return [
        f"{count(n, 'component')} {_pick(n, 'runs', 'run')} above the device's FLOP/s peak ({shown}): the peak "
        f"is too low for this dtype (see metadata['peaks']); pass peak_flops={value}"
    ]


def _bandwidth_advice(over: Sequence[ComponentRow]) -> list[str]:
    """Rows above their bandwidth ceiling (the most above it first), each with its GB/s and ceiling;
    ``peak_bandwidth`` (bytes/s) at least their fastest rate."""
    if not over:
        return []
    ceilings = {r.path: _ceiling(r) for r in over}

    def above(r: ComponentRow) -> float:
        ratio = r.gbps / ceilings[r.path][0]
        return ratio if math.isfinite(ratio) else 0.0

    order = sorted(over, key=lambda r: -above(r))
    shown = []
    for r in order:
        ceiling, level = ceilings[r.path]
        over_what = f"{level}'s {figure(ceiling)} GB/s" if level else f"the device's {figure(ceiling)} GB/s peak"
        shown.append(f"{label(r.path)} at {figure(r.gbps)} GB/s over {over_what}")
    literal, rate = at_least(max(r.gbps for r in over) * 1e9)
    levels = any(level for _, level in ceilings.values())
    replaces = " (it replaces every row's per-level ceiling measured on this CPU)" if levels else ""
    n = len(over)
    return [
        f"{count(n, 'component')} {_pick(n, 'moves', 'move')} bytes faster than {_pick(n, 'its', 'their')} "
        f"bandwidth ceiling (the memory level {_pick(n, 'its', 'their')} data fit, details['bw_ceiling'], else "
        f"the device's peak): {named(shown)}; the ceiling is too low or the time too short to be true; pass "
        f"peak_bandwidth=<bytes/s, at least {literal}, i.e. {figure(rate / 1e9)} GB/s>{replaces}"
    ]


def peak_advice(
    over_flops: Sequence[ComponentRow], over_bandwidth: Sequence[ComponentRow], peaks: Mapping[str, Any]
) -> list[str]:
    """What to do about rows above a peak, and about a CPU peak calibrated on a busy machine."""
    out = _flops_advice(over_flops, peaks)
    notes = peaks.get("calibration") or {}
    note: Mapping[str, Any] = next((v for k, v in notes.items() if k.startswith("gemm")), {})
    calibrated_busy = note.get("machine") == "busy" and note.get("used") == "measured"
    if not over_flops and peaks.get("flops_source") == "measured" and calibrated_busy:
        peak = peaks.get("flops")
        measured = f" (measured: {at_least(peak, up=False)[0]})" if isinstance(peak, (int, float)) and peak > 0 else ""
        out.append(
            "the CPU FLOP/s peak was calibrated on a busy machine with no better figure kept for it: MFU may read "
            f"too high; profile once on a quiet machine (the best calibration is kept) or pass "
            f"peak_flops=<FLOP/s>{measured}"
        )
    return out + _bandwidth_advice(over_bandwidth)
