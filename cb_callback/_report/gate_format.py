"""The regression gate's verdicts as text, as a pull-request comment (markdown) and as JSON.

The JSON (``cb diff --format json``, :func:`gate_dict`) is a contract, documented in
docs/explore.md ("A regression gate in CI")::

    {"schema": "cb_callback.gate/1", "passed": false,
     "outcome": "failed",                             # "passed" | "failed" | "inconclusive" (exit 0, 1, 2)
     "inconclusive": null,                            # why the reports could not be compared, else null
     "judged": 12,                                    # components judged, of len(components)
     "options": {"metric": "total_ms", "fail_over": 0.1, "min_share": 0.01, "over_step": true,
                 "exact": false, "noise_factor": 2.0, "unknown_noise": 0.05,
                 "common_shift": true,                # whether a common shift was discounted (--absolute: false)
                 "allow_mismatch": false},
     "base": "runs/main", "new": "runs/pr",          # the locations given (null from Python)
     "mismatch": null, "quality": {"base": {"verdict": "clean", "advice": []} | null, "new": ...},
     "counts": {"regressed": 1, "unconfirmed": 0, ...},  # every verdict, 0 included
     "shift": 1.08,                                   # the common shift the new times were divided by (1.0: none)
     "step_change": 0.31,                             # the root's change as measured, worse > 0 (null: within noise)
     "regressed": ["b.fc", "b", ""],                  # deepest first
     "components": [{"path": "b.fc", "module_type": "Linear", "verdict": "regressed",
                     "base": 1.17, "new": 2.37, "change": 1.03, "noise_bound": 0.3,
                     "share": 0.31, "renamed_from": null, "reason": null}, ...]}

Numbers are the metric's own units (``base``, ``new``: ms for a time, over the step where it
adds up), ``change``, ``noise_bound`` and ``share`` fractions (``change`` after the common
``shift``, ``noise_bound`` the ratio the noise explains: within it while the larger value is at
most ``1 + noise_bound`` times the smaller); a missing number is ``null``
(and an infinite ``change``, from 0, is ``null`` with ``base`` 0).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from cb_callback._report.diff import aligned_lines, format_value, metric_kind
from cb_callback._report.gate import GATE_SCHEMA, VERDICTS, GateResult, GateRow, Verdict
from cb_callback._report.numbers import percent

__all__ = ["format_gate_markdown", "format_gate_table", "format_gate_text", "gate_dict", "gate_json"]

#: The table's columns, as the text and the markdown show them.
_HEADER = ("component", "type", "base", "new", "change", "noise bound", "verdict")

#: What the tables show besides the gated components: the ones a reviewer must see.
_LISTED: tuple[Verdict, ...] = ("unconfirmed", "only_in_base", "only_in_new", "renamed", "not_gated")


def _value(v: float, metric: str) -> str:
    text = format_value(v, metric)
    if text == "-":
        return text
    if metric.endswith("_ms"):
        return text + " ms"
    return text + (" MB" if metric.endswith("_mb") else "")


def _change(r: GateRow) -> str:
    if math.isinf(r.change):
        return "from 0"
    if not math.isfinite(r.change):
        return "-"
    return "0" if r.change == 0 else _signed(r.change)


def _bound(r: GateRow, exact: bool) -> str:
    if not math.isfinite(r.noise_bound):
        return "-"
    if exact:
        return "exact"
    return "\u00b1" + percent(r.noise_bound)


def _verdict(r: GateRow) -> str:
    word = r.verdict.replace("_", " ")
    if r.renamed_from is not None:
        old = r.renamed_from or "(root)"
        word = f"renamed from {old}" if r.verdict == "renamed" else f"{word} (renamed from {old})"
    return word + (f": {r.reason}" if r.reason else "")


def _cells(r: GateRow, metric: str) -> tuple[str, ...]:
    exact = metric_kind(metric)[0]
    return (
        r.path or "(root)",
        r.module_type,
        _value(r.base, metric),
        _value(r.new, metric),
        _change(r),
        _bound(r, exact),
        _verdict(r),
    )


def format_gate_table(rows: Sequence[GateRow], metric: str) -> list[str]:
    """A header, a rule, and one aligned line per row (names left, numbers right, the verdict left)."""
    return aligned_lines([_HEADER, *(_cells(r, metric) for r in rows)])


def _option(fraction: float) -> str:
    """An option's percent as it was most likely written: ``0.1`` is ``10 %``, ``0.025`` ``2.5 %``."""
    return f"{fraction * 100:.6g} %"


def _what(g: GateResult) -> str:
    """``total_ms over the step, fail over 10 %, components holding at least 1 % of the step``."""
    over_step = metric_kind(g.metric)[1]
    what = f"{g.metric} over the step" if over_step else g.metric
    return f"{what}, fail over {_option(g.fail_over)}, components holding at least {_option(g.min_share)} of the step"


def _judged(g: GateResult) -> str:
    """``judged 12 of 14 components``."""
    return f"judged {len(g.judged)} of {len(g.rows)} component{'s' * (len(g.rows) != 1)}"


def _headline(g: GateResult) -> str:
    why = g.inconclusive
    if why:
        return f"gate: could not compare ({_what(g)}; {_judged(g)}): {why}"
    if g.passed:
        return (
            f"gate: passed ({_what(g)}; {_judged(g)}): no component got worse by more than "
            f"{_option(g.fail_over)} beyond the noise"
        )
    names = ", ".join(r.path or "(root)" for r in g.regressed)
    n = len(g.regressed)
    many = "s" * (n != 1)
    return (
        f"gate: FAILED ({_what(g)}; {_judged(g)}): {n} component{many} got worse beyond the threshold and the "
        f"noise: {names}"
    )


def _shift_line(g: GateResult) -> list[str]:
    """``common shift: +26.0 % on every component alike ...``; none when there is none."""
    if g.shift == 1.0:
        return []
    lines = []
    if g.shift_hides_step:
        lines.append(
            f"warning: the whole step got {_signed(g.step_change)} worse as measured, and the common shift "
            f"({_signed(g.shift - 1)}) explains it: a busier machine, or every component slower alike; "
            "--absolute judges it as measured"
        )
    return [
        *lines,
        f"common shift: {_signed(g.shift - 1)} on the components alike (the median change of the leaf-most "
        "components below the root: the machine's, not a component's); each change is judged after it "
        "(--absolute: as measured)",
    ]


def _signed(fraction: float) -> str:
    return ("+" if fraction > 0 else "") + percent(fraction)


def format_gate_text(g: GateResult) -> list[str]:
    """The gate's lines for ``cb diff --fail-over`` (text): the verdict, then the table of the regressed
    and of the components a reviewer must see (only in one report, renamed, not gated)."""
    lines = [_headline(g), *_shift_line(g)]
    if g.mismatch and g.allow_mismatch:  # else the headline says it
        lines.append(f"warning: base and new look like different models: {g.mismatch}")
    shown = g.regressed + g.having(*_LISTED)
    if shown:
        lines += format_gate_table(shown, g.metric)
    counts = {v: len(g.having(v)) for v in VERDICTS}
    lines.append("verdicts: " + ", ".join(f"{n} {v.replace('_', ' ')}" for v, n in counts.items() if n))
    return lines


def _md(text: str) -> str:
    """A table cell's text: ``|`` escaped (GFM splits cells on it even inside a code span), newlines as spaces."""
    return " ".join(text.replace("|", "\\|").split("\n")).replace("\r", " ")


def _code(text: str, *, cell: bool = True) -> str:
    """``text`` as a code span: a fence longer than any run of backticks in it; in a table ``cell``, ``|`` escaped."""
    text = " ".join(text.replace("\r", " ").split("\n"))
    run = longest = 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    body = text.replace("|", "\\|") if cell else text
    return f"{fence}{pad}{body}{pad}{fence}"


def format_gate_markdown(g: GateResult, *, labels: tuple[str, str] | None = None) -> str:
    """A table fit for a pull-request comment: every gated component and the ones a reviewer must see.

    The components below ``min_share`` (and those unchanged) are counted under the table, not listed.
    """
    status = {"passed": "passed", "failed": "FAILED", "inconclusive": "could not compare"}[g.outcome]
    lines = [f"### cb diff gate: {status}", ""]
    if g.inconclusive:
        lines += [f"> {_md(g.inconclusive)}", ""]
    if labels:
        lines += [f"base {_code(labels[0], cell=False)}, new {_code(labels[1], cell=False)}", ""]
    lines += [f"Compared: {_what(g)}; {_judged(g)}.", ""]
    lines += [line + "." for line in _shift_line(g)] + ([""] if g.shift != 1.0 else [])
    if g.mismatch and g.allow_mismatch:  # else the line above says it
        lines += [f"> warning: base and new look like different models: {_md(g.mismatch)}", ""]
    quiet: tuple[Verdict, ...] = ("below_min_share", "unchanged")
    rows = g.regressed + [r for r in g.rows if r.verdict not in ("regressed", *quiet)]
    lines.append("| " + " | ".join(_HEADER) + " |")
    lines.append("|---|---|--:|--:|--:|--:|---|")
    for r in rows:
        cells = [_md(c) for c in _cells(r, g.metric)]
        cells[0] = _code(r.path or "(root)")
        if r.verdict == "regressed":
            cells[6] = f"**{cells[6]}**"
        lines.append("| " + " | ".join(cells) + " |")
    hidden = {v: len(g.having(v)) for v in quiet if g.having(v)}
    if hidden:
        lines += ["", "Not listed: " + ", ".join(f"{n} {v.replace('_', ' ')}" for v, n in hidden.items()) + "."]
    return "\n".join(lines) + "\n"


def _number(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def gate_dict(g: GateResult, *, labels: tuple[str, str] | None = None) -> dict[str, Any]:
    """The gate as the JSON holds it (the module docstring's schema); no NaN, no infinity."""
    return {
        "schema": GATE_SCHEMA,
        "passed": g.passed,
        "outcome": g.outcome,
        "inconclusive": g.inconclusive,
        "judged": len(g.judged),
        "options": g.options,
        "base": labels[0] if labels else None,
        "new": labels[1] if labels else None,
        "mismatch": g.mismatch,
        "quality": {
            k: ({"verdict": v.get("verdict"), "advice": list(v.get("advice") or [])} if v else None)
            for k, v in g.quality.items()
        },
        "counts": {v: len(g.having(v)) for v in VERDICTS},
        "shift": g.shift,
        "step_change": _number(g.step_change),
        "regressed": [r.path for r in g.regressed],
        "components": [
            {
                "path": r.path,
                "module_type": r.module_type,
                "verdict": r.verdict,
                "base": _number(r.base),
                "new": _number(r.new),
                "change": _number(r.change),
                "noise_bound": _number(r.noise_bound),
                "share": _number(r.share),
                "renamed_from": r.renamed_from,
                "reason": r.reason,
            }
            for r in g.rows
        ],
    }


def gate_json(g: GateResult, *, labels: tuple[str, str] | None = None) -> str:
    """:func:`gate_dict` as JSON text (indented, ``allow_nan=False``)."""
    return json.dumps(gate_dict(g, labels=labels), indent=2, allow_nan=False)
