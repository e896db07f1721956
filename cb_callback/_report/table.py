"""Plain-text and markdown tables of a :class:`~cb_callback._report.model.Report`.

A renderer: it reads rows and metadata only (``Report`` is imported for types).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cb_callback._report.distributed import distributed_lines
from cb_callback._report.finite import finite
from cb_callback._report.numbers import si, sig
from cb_callback._report.reduced import reduced_lines
from cb_callback._report.roofline import headroom_lines
from cb_callback._report.schema import STATUSES

if TYPE_CHECKING:
    from cb_callback._report.model import ComponentRow, Report

__all__ = [
    "HOTSPOTS_ARE",
    "MARKDOWN_HEADERS",
    "P90_HEADER",
    "SUMMARY_HEADERS",
    "format_rows",
    "format_summary",
    "format_table",
    "format_text_table",
    "markdown_table",
    "quality_lines",
]

_P90 = 7  # where P90_HEADER goes: after "total ms" in both tables

#: Columns of :func:`format_table`, in order (a contract: TensorBoard shows them).
MARKDOWN_HEADERS: tuple[str, ...] = (
    "path", "type", "status", "calls", "fwd ms", "bwd ms", "total ms",
    "share %", "TFLOP/s", "MFU %", "MB", "bound",
)  # fmt: skip

#: Columns of the component lines of :func:`format_summary`, in order.
SUMMARY_HEADERS: tuple[str, ...] = (
    "path", "type", "status", "calls", "fwd ms", "bwd ms", "total ms", "share %",
    "FLOP", "TFLOP/s", "MFU %", "peak MB", "GB/s", "bound",
)  # fmt: skip

#: What the hotspots of :func:`format_summary` are (:meth:`Report.hotspots`): measured
#: (``ok``/``estimated``) rows none of whose children was measured.
HOTSPOTS_ARE = "leaf-most: measured, no child measured"

_RANKINGS = {"share": "share over the batches", "total_ms x calls": "total ms x calls"}

#: With several captured batches a column after ``total ms``: the 90th percentile of the
#: row's per-batch ``fwd_ms + bwd_ms`` (``details["p90_ms"]``); ``total ms`` is then a median.
P90_HEADER = "p90 ms"

_MISSING = "-"
_ROOT_LABEL = "(root)"
_NBSP = "\u00a0"
_ERROR_CHARS = 120


def _num(value: object, scale: float = 1.0) -> str:
    """``value * scale`` to 3 significant figures (:func:`~cb_callback._report.numbers.sig`: a value
    that is not 0 never shows as 0); ``"-"`` for None, NaN and inf."""
    return sig(value, scale=scale, missing=_MISSING)


def _total_flops(row: ComponentRow) -> float:
    """Forward plus backward FLOPs per call; a missing pass counts 0, both missing is NaN."""
    passes = [v for v in (row.fwd_flops, row.bwd_flops) if math.isfinite(v)]
    return math.fsum(passes) if passes else math.nan


def _path_label(row: ComponentRow) -> str:
    return row.path if row.path else _ROOT_LABEL


def _roots(report: Report) -> list[ComponentRow]:
    """Rows with no parent in the report (normally the single root, path ``""``)."""
    paths = {r.path for r in report.rows}
    return [r for r in report.rows if r.parent is None or r.parent not in paths]


def _positive(value: object) -> bool:
    """Whether ``value`` is a :func:`finite` number above 0 (a time to show, or to divide by)."""
    return finite(value) and value > 0


def _multi(report: Report) -> bool:
    """Whether the report measured several batches (``metadata["batches"] > 1``)."""
    n = report.metadata.get("batches")
    return isinstance(n, int) and n > 1


def _p90(row: ComponentRow) -> str:
    value = row.details.get("p90_ms")
    return _num(value) if isinstance(value, (int, float)) else _MISSING


def _with_p90(cells: list[str], row: ComponentRow | None, multi: bool) -> list[str]:
    """``cells`` with the p90 cell (or :data:`P90_HEADER`, for ``row=None``) inserted when ``multi``."""
    if not multi:
        return cells
    return [*cells[:_P90], P90_HEADER if row is None else _p90(row), *cells[_P90:]]


def _status(row: ComponentRow) -> str:
    """The status, marked ``(as rep)`` on a row taken from a representative of its repeated structure and
    ``(in situ)`` on a row not replayed whose numbers are the step's own (its in-situ time, the census's
    FLOPs and bytes)."""
    mark = {"representative": " (as rep)", "insitu": " (in situ)"}.get(row.details.get("as") or "", "")
    return row.status + mark


def _summary_cells(row: ComponentRow) -> list[str]:
    return [
        _path_label(row),
        row.module_type,
        _status(row),
        str(row.calls),
        _num(row.fwd_ms),
        _num(row.bwd_ms),
        _num(row.total_ms),
        _num(row.share, 100.0),
        si(_total_flops(row), missing=_MISSING),
        _num(row.tflops),
        _num(row.mfu, 100.0),
        _num(row.peak_mem_mb),
        _num(row.gbps),
        row.bound or _MISSING,
    ]


def _aligned(header: Sequence[str], lines: Sequence[Sequence[str]]) -> list[str]:
    """Left-align the first three columns (names), right-align the numbers."""
    widths = [max(len(c) for c in col) for col in zip(header, *lines, strict=True)]

    def one(cells: Sequence[str]) -> str:
        out = [c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return "  ".join(out).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return [one(header), rule, *(one(cells) for cells in lines)]


def _budget_lines(metadata: dict[str, Any]) -> list[str]:
    """What ``budget_s`` left unreplayed (``metadata["cost"]["budget"]``), one line; none without it."""
    budget = (metadata.get("cost") or {}).get("budget")
    if not isinstance(budget, dict) or not budget.get("unreplayed"):
        return []
    n, share = budget["unreplayed"], budget.get("largest_unreplayed_share")
    largest = f" (the largest in-situ share among them {sig(100 * share)} %)" if isinstance(share, float) else ""
    if budget.get("with_insitu", n):
        stand = "their in-situ times stand (skipped, details['unreplayed'], insitu_ms)"
    else:
        stand = "and no in-situ pass ran: these rows have no numbers (skipped, details['unreplayed'])"
    root = ""
    if budget.get("root_unreplayed"):
        fwd, bwd = (budget.get("root_insitu_ms") or [None, None])[:2]
        times = (
            f" in situ {sig(fwd)} ms forward" + (f" + {sig(bwd)} ms backward" if _positive(bwd) else "")
            if _positive(fwd)
            else ""
        )
        root = f"; the root too{':' if times else ''}{times}"
    components = f"{n} component{'s' if n != 1 else ''}"
    return [f"budget_s={budget['budget_s']:g} s spent: {components} not replayed{largest}, {stand}{root}"]


def _metadata_lines(metadata: dict[str, Any]) -> list[str]:
    lines = []
    device = metadata.get("device_name")
    dtype = metadata.get("dtype")
    if device is not None or dtype is not None:
        parts = []
        if device is not None:
            parts.append(f"device: {device}")
        if dtype is not None:
            parts.append(f"dtype: {dtype}")
        lines.append("  ".join(parts))
    peaks = metadata.get("peaks")
    if isinstance(peaks, dict):
        parts = []
        for key, unit, scale in (("flops", "TFLOP/s", 1e-12), ("bandwidth", "GB/s", 1e-9)):
            value = peaks.get(key)
            if value is None:
                continue
            text = f"{_num(value, scale)} {unit}"
            source = peaks.get(f"{key}_source")
            if source:
                text += f" ({source})"
            parts.append(text)
        if parts:
            lines.append("peak: " + ", ".join(parts))
    return lines


def format_summary(report: Report, top: int = 10) -> str:
    """A human plain-text summary: metadata, the whole model, then the hotspots.

    Args:
        report: the report to summarise.
        top: how many hotspots (:meth:`Report.hotspots`) to list.

    Returns:
        Lines of text: device, dtype and peaks (with their sources) when the
        metadata has them; the row counts by status; the root row; the ``top``
        hotspots (:meth:`Report.hotspots`: the leaf-most measured rows, those
        none of whose children was measured, their header says so and by what
        they rank), most expensive over the step first; under ``errors:`` the
        rows that hold an ``error`` (a real failure; an ``ok`` row with one
        failed on some of several batches), one line each; the ``top`` leaf-most components by
        ``headroom_ms × calls`` under "where optimisation pays most"
        (:func:`cb_callback._report.roofline.headroom_lines`, none without peaks); and, when any row is flagged or
        the verdict is not clean, the quality section (:func:`quality_lines`).
        Missing values show as ``"-"``. With several captured batches a
        ``batches:`` line says so and the component tables gain
        :data:`P90_HEADER` after ``total ms``.

    Notes:
        Times, FLOPs, memory and bandwidth are per call; ``calls`` says how many
        calls the real step made (a hotspot's rank is ``total ms * calls``).
        ``share %`` is the row's time over the step in percent of the root's
        (``share``, what to compare first; over every batch with several).
        ``FLOP`` is forward plus backward, with an SI prefix (``134 k``, ``6.00 G``);
        ``MFU %`` is percent of the peak. Numbers show 3 significant figures
        (:mod:`cb_callback._report.numbers`): a value that is not 0 never shows as 0.
        A row's ``note`` (how an estimate was built, "a container") is not an
        error: a container estimated from its children is not listed.
        With ``compile=True`` a compile what-if section follows
        (:func:`compile_lines`); over several ranks, or with a planner's
        estimate, the ranks' spread, the components that communicate and the
        measured-vs-planned split follow
        (:func:`cb_callback._report.distributed.distributed_lines`).
    """
    multi = _multi(report)
    meta = report.metadata
    lines = [
        "cb_callback component benchmark",
        *_readable(("device_name", "dtype", "peaks"), lambda: _metadata_lines(meta)),
        _counts_line(report),
        *_readable(("triage", "cost"), lambda: _triage_lines(meta)),
        *_insitu_lines(report),
        *_readable(("cost",), lambda: _budget_lines(meta)),
        *_batches_lines(report, multi),
        *_component_tables(report, top, multi),
        *_headroom_lines(report, top),
        *_error_lines(report),
    ]
    what_if = compile_lines(report)
    if what_if:
        lines += ["", *what_if]
    lines += distributed_lines(report)
    reduced = reduced_lines(report)
    lines += ["", *reduced] if reduced else []
    lines += _readable(("quality",), lambda: _quality_section(report), blank=True)
    return "\n".join(lines)


def _quality_section(report: Report) -> list[str]:
    """:func:`quality_lines`, once ``metadata["quality"]`` is an object or absent (a verdict written alone,
    ``"quality": "noisy"``, is a value of the wrong kind, not a report without quality)."""
    quality = report.metadata.get("quality")
    if quality is not None and not isinstance(quality, dict):
        raise TypeError(f"expected an object such as {{'verdict': 'clean', ...}}, got {type(quality).__name__}")
    return quality_lines(report)


def _readable(keys: Sequence[str], section: Callable[[], list[str]], blank: bool = False) -> list[str]:
    """``section()``, the summary's lines from ``metadata[keys]``; one line naming them instead when a value
    there is not of its kind (a hand-edited report.json: ``"quality": {"flags": "x"}``), so the rest still
    prints. ``blank``: the line opens with an empty one, as the section would."""
    try:
        return section()
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as e:
        named = " or ".join(f"metadata[{k!r}]" for k in keys)
        line = f"({named} not shown: a value of the wrong kind, {type(e).__name__}: {e})"
        return ["", line] if blank else [line]


def _counts_line(report: Report) -> str:
    """``components: N (n ok, n failed, ...)``: the rows by status, in :data:`STATUSES` order, unknown ones after."""
    counts = Counter(r.status for r in report.rows)
    order = [s for s in STATUSES if counts[s]] + sorted(s for s in counts if s not in STATUSES)
    return f"components: {len(report.rows)}" + (
        " (" + ", ".join(f"{counts[s]} {s}" for s in order) + ")" if order else ""
    )


def _triage_lines(metadata: dict[str, Any]) -> list[str]:
    """The in-situ triage's line (replayed, copied from a representative, not descended into); none without one."""
    triage = metadata.get("triage")
    if not isinstance(triage, dict):
        return []
    left = ((metadata.get("cost") or {}).get("budget") or {}).get("replays_left") or 0
    planned = triage.get("replayed")
    replayed = f"{planned} to replay, {left} of them left by budget_s" if left else f"{planned} replayed"
    return [
        f"triage (in situ): {replayed}, {triage.get('copied')} taken from a "
        f"representative ({triage.get('groups')} {'group' if triage.get('groups') == 1 else 'groups'} of "
        "repeated structure), "
        f"{triage.get('not_descended')} not descended into"
    ]


def _insitu_lines(report: Report) -> list[str]:
    """The line on the rows kept with the step's own numbers (not replayed); none without such rows."""
    insitu = [r for r in report.rows if r.details.get("as") == "insitu"]
    if not insitu:
        return []
    counted = sum(1 for r in insitu if (r.details.get("insitu") or {}).get("counted") == "census")
    backward = sum(1 for r in insitu if finite(bwd := (r.details.get("insitu") or {}).get("bwd_ms")) and bwd >= 0)
    return [
        f"in situ: {len(insitu)} rows not replayed keep the step's own numbers (skipped (in situ): "
        f"insitu_ms; the backward in the step on {backward} of them (details['insitu']['bwd_ms']); "
        f"FLOPs and bytes from the census on {counted}; no isolated time or memory)"
    ]


def _batches_lines(report: Report, multi: bool) -> list[str]:
    """With several captured batches, the ``batches:`` line saying what a row and :data:`P90_HEADER` are."""
    if not multi:
        return []
    return [
        f"batches: {report.metadata['batches']} (each row is its median batch by fwd + bwd; "
        f"{P90_HEADER}: the 90th percentile of its per-batch fwd + bwd)"
    ]


def _component_tables(report: Report, top: int, multi: bool) -> list[str]:
    """The ``whole model:`` table (the roots) and the ``top`` hotspots' table, each after a blank line."""
    lines: list[str] = []
    header = _with_p90(list(SUMMARY_HEADERS), None, multi)
    roots = _roots(report)
    if roots:
        lines += [
            "",
            "whole model:",
            *_aligned(header, [_with_p90(_summary_cells(r), r, multi) for r in roots]),
        ]
    hot = _collapsed(report.hotspots(len(report.rows)), top)
    if hot:
        ranking = report.hotspot_ranking()
        lines += [
            "",
            f"top {len(hot)} hotspots ({HOTSPOTS_ARE}; by {_RANKINGS.get(ranking, ranking)}"
            + (
                "; ×N: N rows of repeated structure, the share theirs together, calls each one's (a+b+…: unequal)"
                if any(n > 1 for _, n, _, _ in hot)
                else ""
            )
            + "):",
            *_aligned(header, [_with_p90(_hot_cells(r, n, share, calls), r, multi) for r, n, share, calls in hot]),
        ]
    return lines


def _headroom_lines(report: Report, top: int) -> list[str]:
    """After a blank line, the ``top`` components by ``headroom_ms × calls`` (:func:`headroom_lines`), if any."""
    lines = headroom_lines(report, top)
    return ["", *lines] if lines else []


def _error_lines(report: Report) -> list[str]:
    """``errors:`` and one line per row holding an ``error``, cut to :data:`_ERROR_CHARS`; none without such rows.

    Only ``error`` counts: a row that has just a note is a normal container, not a
    failure. An ``ok`` row with an error was measured on some batches and failed on others.
    """
    troubled = [r for r in report.rows if r.status in ("failed", "estimated", "ok") and r.error]
    if not troubled:
        return []
    lines = ["", "errors:"]
    for r in troubled:
        error = " ".join(str(r.error).split())
        if len(error) > _ERROR_CHARS:
            error = error[: _ERROR_CHARS - 3] + "..."
        lines.append(f"  {_path_label(r)} [{r.status}]: {error}")
    return lines


def _saved(r: ComponentRow) -> tuple[int, float]:
    """The sort key of a compiled row, most saved first: ``share × (1 − compiled ÷ eager)``, the
    eager time its what-if's own rounds' (else ``total_ms``); rows without a share after those
    with one, by ms saved over the step."""
    info = r.details["compile"]
    same = info.get("eager_ms_same_rounds", math.nan)
    eager = same if _positive(same) else r.total_ms
    if math.isfinite(r.share):
        return (0, -r.share * (1.0 - r.compiled_ms / eager))
    return (1, -(eager - r.compiled_ms) * max(r.calls, 1))


def _g(value: object) -> str:
    """``value`` to 3 significant figures; ``"-"`` when missing (a saved report's NaN is ``None``)."""
    return sig(value, missing=_MISSING)


def compile_lines(report: Report, top: int = 5) -> list[str]:
    """The summary's compile what-if: the ``top`` components by time saved over the step.

    Saved time over the step is ``share × (1 − compiled_ms ÷ eager)``, the eager
    time being the one measured in the what-if's own rounds (robust to load that
    came and went between the eager timing and the what-if), else ``total_ms``;
    with several batches ``share`` counts every batch.

    One line each: ``compiling <path> whole: A → B ms (×s; ×p against eager in
    the same rounds)``, for a parent ``; its children separately: A → C ms``,
    then graph breaks, recompiles and ``outputs differ`` when the compiled
    forward did not match the eager one; then each component that could not
    compile with its error. Empty when nothing was compiled.
    """
    tried = [r for r in report.rows if isinstance(r.details.get("compile"), Mapping)]
    if not tried:
        return []
    done = [r for r in tried if _positive(r.compiled_ms) and _positive(r.total_ms)]
    done.sort(key=_saved)
    out = [
        f"compile what-if (torch.compile per component, alone; top {min(top, len(done))} by time saved over "
        "the step; x below 1: slower compiled):"
    ]
    for r in done[:top]:
        info = r.details["compile"]
        same = info.get("eager_ms_same_rounds", math.nan)
        paired = f"; x{_g(same / r.compiled_ms)} against eager in the same rounds" if _positive(same) else ""
        line = (
            f"  compiling {r.path or 'root'} whole: {_g(r.total_ms)} -> {_g(r.compiled_ms)} ms "
            f"(x{_g(r.total_ms / r.compiled_ms)}{paired})"
        )
        if "children_separately_ms" in info:
            line += (
                f"; its children separately: {_g(r.total_ms)} -> {_g(info['children_separately_ms'])} ms "
                f"({info.get('children_compiled')} compiled)"
            )
        if info.get("graph_breaks"):
            line += f"; {info['graph_breaks']} graph break(s)"
        if info.get("recompiles"):
            line += f"; {info['recompiles']} recompile(s)"
        if info.get("outputs_close") is False:
            line += f"; outputs differ from eager (max abs error {_g(info.get('max_abs_error'))})"
        out.append(line)
    failed = [r for r in tried if "error" in r.details["compile"]]
    for r in failed[:5]:
        error = " ".join(str(r.details["compile"]["error"]).split())
        error = error if len(error) <= _ERROR_CHARS else error[: _ERROR_CHARS - 3] + "..."
        out.append(f"  could not compile {r.path or 'root'}: {error}")
    if len(failed) > 5:
        out.append(f"  ... and {len(failed) - 5} more that could not compile (details['compile']['error'])")
    return out


def format_rows(rows: Sequence[ComponentRow]) -> str:
    """The component lines of :func:`format_summary` (same columns) for any ``rows``, aligned."""
    return "\n".join(_aligned(SUMMARY_HEADERS, [_summary_cells(r) for r in rows]))


_QUALITY_ROWS_SHOWN = 5


def quality_lines(report: Report) -> list[str]:
    """The "quality" section: what was flagged, the machine's load, what to do.

    Empty on a clean run (verdict ``"clean"`` and no row flagged) and for
    reports written before quality was measured.
    """
    quality = report.metadata.get("quality")
    flagged = [r for r in report.rows if r.details.get("flags")]
    if not isinstance(quality, dict) or (quality.get("verdict") in (None, "clean") and not flagged):
        return []
    counts = quality.get("flags") or {}
    shown = ", ".join(f"{n} {flag}" for flag, n in counts.items() if n)
    lines = ["", f"quality: {quality.get('verdict')}" + (f" ({shown})" if shown else "")]
    machine = []
    before, after = quality.get("load_before"), quality.get("load_after")
    if before is not None or after is not None:
        machine.append(f"load average {_num(before)} -> {_num(after)} on {quality.get('cpus')} CPUs")
    if isinstance(quality.get("others"), (int, float)):  # other processes' CPU share (/proc), ours not counted
        machine.append(f"other processes {_num(float(quality['others']), 100.0)} % of the CPU time")
    if isinstance(quality.get("children"), (int, float)) and quality["children"] > 0:  # ours: dataloader workers
        machine.append(f"own child processes {_num(float(quality['children']), 100.0)} %")
    rate = quality.get("switches_per_s")
    if rate is not None and math.isfinite(float(rate)):
        machine.append(f"{float(rate):.0f} involuntary context switches/s per thread")
    if quality.get("quantum_ms") is not None:
        machine.append(f"runs quantised at {quality['quantum_ms']:g} ms")
    if machine:
        lines.append("  machine: " + "; ".join(machine))
    for r in flagged[:_QUALITY_ROWS_SHOWN]:
        noise = f" (noise {_num(r.noise, 100.0)} %)" if math.isfinite(r.noise) else ""
        flags = r.details["flags"]
        shown_flags = ", ".join(map(str, flags)) if isinstance(flags, (list, tuple)) else str(flags)
        lines.append(f"  {_path_label(r)}: {shown_flags}{noise}")
    if len(flagged) > _QUALITY_ROWS_SHOWN:
        lines.append(f"  ... and {len(flagged) - _QUALITY_ROWS_SHOWN} more flagged rows")
    for advice in quality.get("advice") or []:
        lines.append(f"  what to do: {advice}")
    return lines


def _collapsed(hot: list[ComponentRow], top: int) -> list[tuple[ComponentRow, int, float, list[int]]]:
    """The top ``top`` hotspots with each row taken from a representative folded into the row it
    was taken from: ``(row, rows folded in, their shares summed, each one's calls)``, ranked by that
    sum (by the hotspots' own order when a share is unknown)."""
    out: dict[str, list[Any]] = {}
    for r in hot:
        source = r.details.get("from") if r.details.get("as") == "representative" else None
        key = source if isinstance(source, str) else r.path
        if key in out:
            out[key][1] += 1
            out[key][2] += r.share if math.isfinite(r.share) else 0.0
            if r.path == key:  # the measured row itself, met after a row taken from it: shown instead
                out[key][0] = r
                out[key][3].insert(0, r.calls)
            else:
                out[key][3].append(r.calls)
        else:
            out[key] = [r, 1, r.share if math.isfinite(r.share) else math.nan, [r.calls]]
    folded = list(out.values())
    if all(math.isfinite(item[2]) for item in folded):  # a group ranks by what it costs together
        folded.sort(key=lambda item: -item[2])
    return [(r, n, share, calls) for r, n, share, calls in folded[:top]]


def _folded_calls(calls: list[int]) -> str:
    """The ``calls`` cell of a folded line: each member's, ``3+1+1`` when they differ (``1`` when every
    member was called once); past 6 members ``1–3 (Σ 40)``."""
    if len(set(calls)) == 1:
        return str(calls[0])
    if len(calls) <= 6:
        return "+".join(str(c) for c in calls)
    return f"{min(calls)}–{max(calls)} (Σ {sum(calls)})"


def _hot_cells(row: ComponentRow, n: int, share: float, calls: list[int] | None = None) -> list[str]:
    """A hotspot's cells; with ``n`` rows of repeated structure folded in, ``path ×n``, their share
    and each one's calls (:func:`_folded_calls`)."""
    cells = _summary_cells(row)
    if n > 1:
        cells[0] = f"{cells[0]} ×{n}"
        cells[SUMMARY_HEADERS.index("share %")] = _num(share, 100.0)
        if calls:
            cells[SUMMARY_HEADERS.index("calls")] = _folded_calls(calls)
    return cells


def _md_cell(text: str) -> str:
    """One markdown table cell: pipes escaped, line breaks folded."""
    return " ".join(text.split("\n")).replace("|", "\\|")


_MARKDOWN_CELLS: tuple[Callable[[ComponentRow], str], ...] = (
    lambda r: _NBSP * (2 * r.depth) + _path_label(r),
    lambda r: r.module_type,
    lambda r: _status(r),
    lambda r: str(r.calls),
    lambda r: _num(r.fwd_ms),
    lambda r: _num(r.bwd_ms),
    lambda r: _num(r.total_ms),
    lambda r: _num(r.share, 100.0),
    lambda r: _num(r.tflops),
    lambda r: _num(r.mfu, 100.0),
    lambda r: _num(r.peak_mem_mb),
    lambda r: r.bound or _MISSING,
)


def format_table(report: Report) -> str:
    """A markdown table of every row, in report order.

    Args:
        report: the report to show.

    Returns:
        A header line with :data:`MARKDOWN_HEADERS`, a separator, then one line
        per row: the full dotted path (``(root)`` for the root) indented by two
        non-breaking spaces per depth level, the module type, the status,
        ``calls``, ``fwd_ms``, ``bwd_ms`` and ``total_ms``, ``share`` in
        percent, ``tflops``, ``mfu`` in percent (``12.5`` under ``MFU %``),
        ``peak_mem_mb`` and ``bound``, each number to 3 significant figures
        (:func:`~cb_callback._report.numbers.sig`: ``4.00``, ``0.0420``; a value
        that is not 0 never shows as 0). Missing values show as ``"-"``; ``|`` in a
        cell is escaped as ``\\|``. With several captured batches
        (``metadata["batches"] > 1``) :data:`P90_HEADER` follows ``total ms``.

    Notes:
        Times, FLOP/s and memory are per call; ``calls`` is how often the real
        step called the component and ``share %`` its time over the step
        (``total_ms * calls``) in percent of the root's. The data keeps ``mfu``
        and ``share`` as fractions; only this text shows percents, as
        :func:`format_summary` does.
    """
    multi = _multi(report)
    header = _with_p90(list(MARKDOWN_HEADERS), None, multi)
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(":---" if i < 3 else "---:" for i in range(len(header))) + "|",
    ]
    for row in report.rows:
        cells = _with_p90([cell(row) for cell in _MARKDOWN_CELLS], row, multi)
        lines.append("| " + " | ".join(_md_cell(c) for c in cells) + " |")
    return "\n".join(lines)


#: The former name of :func:`format_table`.
markdown_table = format_table


def format_text_table(report: Report) -> str:
    """The rows of :func:`format_table` as aligned plain text: the same columns and cells, names
    left-aligned and numbers right-aligned, the path indented by two spaces per depth level.

    What TensorBoard's Text tab shows as a preformatted block
    (:func:`cb_callback._report.tensorboard.log_report`): a markdown table wraps inside its
    cells there (``136.0`` over ``29``), a ``<pre>`` block scrolls instead.
    """
    multi = _multi(report)
    header = _with_p90(list(MARKDOWN_HEADERS), None, multi)
    lines = []
    for row in report.rows:
        cells = [" ".join(cell(row).split()) for cell in _MARKDOWN_CELLS]  # line breaks folded
        cells[0] = "  " * row.depth + _path_label(row)
        lines.append(_with_p90(cells, row, multi))
    return "\n".join(_aligned(header, lines))
