"""Tests of the plain-text summary and the markdown table."""

from __future__ import annotations

import math
import re

from cb_callback._report.model import ComponentRow, Report
from cb_callback._report.table import (
    MARKDOWN_HEADERS,
    SUMMARY_HEADERS,
    format_summary,
    markdown_table,
)

NAN = math.nan
NB2 = "\u00a0\u00a0"  # two non-breaking spaces: one depth level


def _report() -> Report:
    rows = [
        ComponentRow(
            "", "Net", 0, None, "ok", calls=1, fwd_ms=4.0, bwd_ms=6.0, total_ms=10.0,
            fwd_flops=2e9, bwd_flops=4e9, tflops=0.6, mfu=0.125, peak_mem_mb=12.5,
            gbps=50.0, bound="compute", share=1.0,
        ),
        ComponentRow("a", "Block", 1, "", "ok", calls=1, total_ms=6.0, mfu=0.2),
        ComponentRow(
            "b", "Seq", 1, "", "estimated", error="b could not run whole", calls=1,
            total_ms=3.0,
        ),
        ComponentRow(
            "a.x", "Linear", 2, "a", "ok", calls=2, fwd_ms=0.5, bwd_ms=1.5, total_ms=2.0,
            fwd_flops=1e9, bwd_flops=2e9, tflops=1.5, mfu=0.25, peak_mem_mb=3.5,
            gbps=20.0, bound="compute", share=0.4,
        ),
        ComponentRow("b.0", "Dropout", 2, "b", "failed", error="RuntimeError: boom\nline 2"),
        ComponentRow(
            "b.1", "My|Mod", 2, "b", "ok", calls=1, fwd_ms=1.5, total_ms=1.5,
            fwd_flops=5e8, bound="memory",
        ),
    ]  # fmt: skip
    metadata = {
        "device_name": "NVIDIA H200",
        "dtype": "bfloat16",
        "peaks": {
            "flops": 989e12, "bandwidth": 4.8e12,
            "flops_source": "datasheet", "bandwidth_source": "datasheet HBM3e",
        },
    }  # fmt: skip
    return Report(rows, metadata)


def test_markdown_headers_and_one_line_per_row() -> None:
    report = _report()
    lines = markdown_table(report).split("\n")
    assert lines[0] == (
        "| path | type | status | calls | fwd ms | bwd ms | total ms | share % | TFLOP/s | MFU % | MB | bound |"
    )
    assert MARKDOWN_HEADERS == (
        "path", "type", "status", "calls", "fwd ms", "bwd ms", "total ms", "share %", "TFLOP/s", "MFU %", "MB", "bound",
    )  # fmt: skip
    # names left-aligned, numbers right-aligned
    assert lines[1] == "|:---|:---|:---|" + "---:|" * 9
    assert len(lines) == 2 + len(report)


def test_markdown_values() -> None:
    lines = markdown_table(_report()).split("\n")
    # root: 1 call, 4 + 6 = 10 ms, share 1.0 -> 100 %, 0.6 TFLOP/s, mfu 0.125 -> 12.5 %, 12.5 MiB
    # (3 significant figures, trailing zeros kept: 4.00, 10.0, 100)
    assert lines[2] == "| (root) | Net | ok | 1 | 4.00 | 6.00 | 10.0 | 100 | 0.600 | 12.5 | 12.5 | compute |"
    # a.x: depth 2 -> 4 non-breaking spaces; 2 calls; share 2 ms x 2 / 10 ms = 0.4 -> 40.0 %; mfu 0.25 -> 25.0 %
    assert lines[5] == (
        f"| {NB2 * 2}a.x | Linear | ok | 2 | 0.500 | 1.50 | 2.00 | 40.0 | 1.50 | 25.0 | 3.50 | compute |"
    )
    # failed row: never called in the replay (0 calls), every number missing
    assert lines[6] == f"| {NB2 * 2}b.0 | Dropout | failed | 0 | - | - | - | - | - | - | - | - |"
    # the pipe in the type is escaped, so the row keeps 12 cells; no backward, no share
    assert lines[7] == f"| {NB2 * 2}b.1 | My\\|Mod | ok | 1 | 1.50 | - | 1.50 | - | - | - | - | memory |"


def test_mfu_is_a_percent_in_text_a_fraction_in_data() -> None:
    report = _report()
    assert report.row("a.x").mfu == 0.25  # the data: a fraction of the peak
    table = markdown_table(report).split("\n")
    summary = format_summary(report).split("\n")
    mfu_column = MARKDOWN_HEADERS.index("MFU %")
    assert table[5].split(" | ")[mfu_column] == "25.0"
    assert "MFU %" in summary[summary.index("whole model:") + 1]
    assert (
        "25.0"
        in summary[
            summary.index("top 2 hotspots (leaf-most: measured, no child measured; by total ms x calls):") + 3
        ].split()
    )


def test_markdown_empty_report() -> None:
    assert len(markdown_table(Report([])).split("\n")) == 2


def test_summary_metadata_and_counts() -> None:
    text = format_summary(_report())
    lines = text.split("\n")
    assert lines[0] == "cb_callback component benchmark"
    assert lines[1] == "device: NVIDIA H200  dtype: bfloat16"
    # 989e12 FLOP/s -> 989 TFLOP/s; 4.8e12 B/s -> 4800 GB/s (3 significant figures, no exponent)
    assert lines[2] == "peak: 989 TFLOP/s (datasheet), 4800 GB/s (datasheet HBM3e)"
    assert lines[3] == "components: 6 (4 ok, 1 estimated, 1 failed)"


def test_summary_root_then_hotspots_in_order() -> None:
    lines = format_summary(_report()).split("\n")
    header = lines.index("whole model:")
    root = lines[header + 3].split()
    # share % = 1.0 * 100; FLOP = 2e9 + 4e9 = 6.00 G (an SI prefix: a cell of two words); MFU % = 0.125 * 100
    assert root == [
        "(root)", "Net", "ok", "1", "4.00", "6.00", "10.0", "100",
        "6.00", "G", "0.600", "12.5", "12.5", "50.0", "compute",
    ]  # fmt: skip
    hot = lines.index("top 2 hotspots (leaf-most: measured, no child measured; by total ms x calls):")
    # a.x costs 2 ms x 2 calls = 4 ms, b.1 1.5 ms x 1; a and b are containers
    first, second = lines[hot + 3].split(), lines[hot + 4].split()
    # share 0.4 -> "40.0" (%)
    # FLOP 1e9 + 2e9 = 3.00 G
    assert first == [
        "a.x", "Linear", "ok", "2", "0.500", "1.50", "2.00", "40.0",
        "3.00", "G", "1.50", "25.0", "3.50", "20.0", "compute",
    ]  # fmt: skip
    # no backward flops: FLOP is the forward's 5e8 = 500 M; NaN (share too) shows as "-"
    assert second == [
        "b.1", "My|Mod", "ok", "1", "1.50", "-", "1.50", "-",
        "500", "M", "-", "-", "-", "-", "memory",
    ]  # fmt: skip
    assert lines[hot + 5] == ""


def test_summary_top_limits_hotspots() -> None:
    text = format_summary(_report(), top=1)
    assert "top 1 hotspots" in text
    assert "\nb.1 " not in text


def test_summary_lists_errors() -> None:
    lines = format_summary(_report()).split("\n")
    start = lines.index("errors:")
    assert lines[start + 1 :] == [
        "  b [estimated]: b could not run whole",
        "  b.0 [failed]: RuntimeError: boom line 2",
    ]


def test_summary_is_report_summary_and_handles_empty() -> None:
    report = _report()
    assert report.summary(top=3) == format_summary(report, top=3)
    assert format_summary(Report([])).split("\n") == [
        "cb_callback component benchmark",
        "components: 0",
    ]


def test_summary_errors_are_errors_not_notes() -> None:
    rows = [
        # a normal container: estimated, with a note and no error
        ComponentRow(
            "", "Net", 0, None, "estimated", note="never called itself (a container); estimated from 2 of 2 children",
            total_ms=3.0,
        ),
        # a real failure, estimated from its children: its error is listed, its note is not
        ComponentRow(
            "a", "Block", 1, "", "estimated", error="replay raised RuntimeError: boom",
            note="estimated from 1 of 1 children", calls=1, total_ms=2.0,
        ),
        ComponentRow("a.0", "Linear", 2, "a", "ok", calls=1, total_ms=2.0),
        ComponentRow("b", "Linear", 1, "", "ok", calls=1, total_ms=1.0, note="a note on a measured row"),
        ComponentRow("c", "Dropout", 1, "", "skipped", error="excluded by exclude=['c']"),  # a reason, not a failure
    ]  # fmt: skip
    lines = format_summary(Report(rows)).split("\n")
    start = lines.index("errors:")
    assert lines[start + 1 :] == ["  a [estimated]: replay raised RuntimeError: boom"]
    only_notes = [rows[0], ComponentRow("a", "Block", 1, "", "estimated", note="a container", total_ms=3.0)]
    assert "errors:" not in format_summary(Report(only_notes)).split("\n")


# --- issue 14 §5: share in the summary, and a hotspots header that says what it lists -------------


def _columns(line: str) -> list[str]:
    """The cells of an aligned summary line (columns are two or more spaces apart)."""
    return re.split(r"\s{2,}", line.strip())


def test_the_summary_has_a_share_column_beside_the_times() -> None:
    lines = format_summary(_report()).split("\n")
    whole = lines.index("whole model:")
    assert _columns(lines[whole + 1])[6:8] == ["total ms", "share %"]
    assert SUMMARY_HEADERS.index("share %") == SUMMARY_HEADERS.index("total ms") + 1
    # the root's share 1.0 -> "100"; a.x's 0.4 (2 ms x 2 calls / 10 ms) -> "40.0"
    assert _columns(lines[whole + 3])[6:8] == ["10.0", "100"]
    hot = next(i for i, line in enumerate(lines) if line.startswith("top 2 hotspots"))
    assert _columns(lines[hot + 3])[:8] == ["a.x", "Linear", "ok", "2", "0.500", "1.50", "2.00", "40.0"]
    # with several batches the p90 comes after total ms, then the share
    multi = format_summary(Report(_report().rows, {"batches": 2})).split("\n")
    assert _columns(multi[multi.index("whole model:") + 1])[6:9] == ["total ms", "p90 ms", "share %"]


def test_the_hotspots_header_says_it_lists_the_leaf_most_measured_rows() -> None:
    rows = [
        ComponentRow("", "Net", 0, None, "ok", calls=1, total_ms=10.0, share=1.0),
        # "a" was measured, its only child skipped: leaf-most, so a hotspot although not a leaf
        ComponentRow("a", "Block", 1, "", "ok", calls=1, total_ms=6.0, share=0.6),
        ComponentRow("a.0", "Linear", 2, "a", "skipped", error="below descend_share"),
        # "b" has a measured child: not a hotspot; its child "b.0" is
        ComponentRow("b", "Block", 1, "", "ok", calls=1, total_ms=3.0, share=0.3),
        ComponentRow("b.0", "Linear", 2, "b", "ok", calls=1, total_ms=2.5, share=0.25),
    ]  # fmt: skip
    report = Report(rows)
    assert [r.path for r in report.hotspots()] == ["a", "b.0"]  # 6 ms, then 2.5 ms
    lines = format_summary(report).split("\n")
    assert "top 2 hotspots (leaf-most: measured, no child measured; by total ms x calls):" in lines


def test_the_hotspots_header_names_the_ranking_hotspots_used() -> None:
    # Two batches, but "y" has no share: Report.hotspots ranks every candidate by total ms x calls
    # (x: 5 ms, y: 1 ms). The header used to look only at the top rows shown ([x], with a share)
    # and said "by share over the batches".
    rows = [
        ComponentRow("", "Net", 0, None, "ok", calls=1, total_ms=6.0, share=1.0),
        ComponentRow("x", "Linear", 1, "", "ok", calls=1, total_ms=5.0, share=0.5),
        ComponentRow("y", "Linear", 1, "", "ok", calls=1, total_ms=1.0),
    ]  # fmt: skip
    report = Report(rows, {"batches": 2})
    assert report.hotspot_ranking() == "total_ms x calls"
    lines = format_summary(report, top=1).split("\n")
    assert "top 1 hotspots (leaf-most: measured, no child measured; by total ms x calls):" in lines
    rows[2].share = 0.1  # every candidate has a share: by share
    assert report.hotspot_ranking() == "share"
    assert "top 1 hotspots (leaf-most: measured, no child measured; by share over the batches):" in (
        format_summary(report, top=1).split("\n")
    )


def test_the_summary_folds_rows_taken_from_a_representative_into_it() -> None:
    Row, Rep = ComponentRow, Report

    def row(path: str, share: float, **details: object) -> Row:
        parent = path.rpartition(".")[0] if path else None
        r = Row(path=path, module_type="Linear", depth=path.count(".") + 1 if path else 0, parent=parent,
                status="ok", calls=1, fwd_ms=share * 10, bwd_ms=0.0, total_ms=share * 10, share=share)  # fmt: skip
        r.details.update(details)
        return r

    rows = [
        Row(path="", module_type="Net", depth=0, parent=None, status="ok", calls=1, fwd_ms=10.0, bwd_ms=0.0,
            total_ms=10.0, share=1.0),
        Row(path="h", module_type="ModuleList", depth=1, parent="", status="estimated", calls=0, total_ms=8.0),
        row("head", 0.2),
        *(row(f"h.{i}", 0.25, **({"as": "representative", "from": "h.0"} if i else {})) for i in range(4)),
    ]  # fmt: skip
    text = Rep(rows, {}).summary(top=3)
    # h.1-h.3 took h.0's row: one line ×4, their shares summed (4 × 25 % = 100 %), ranked first.
    hot = text.split("top ")[1].splitlines()
    assert "×N: N rows of repeated structure" in hot[0]
    assert hot[3].startswith("h.0 ×4 ") and " 100 " in hot[3]  # 1.0 -> "100" (3 significant figures)
    assert hot[4].startswith("head ")
    assert not any(line.startswith("h.1") for line in hot)


def test_a_malformed_metadata_value_is_named_and_the_rest_of_the_summary_prints() -> None:
    # a hand-edited report.json: Report.load takes any JSON there, the summary must not crash on it
    report = _report()
    good = format_summary(report).splitlines()
    report.metadata["quality"] = {"verdict": "noisy", "flags": "x"}  # flags: {flag: count}
    lines = format_summary(report).splitlines()
    assert lines[-2:] == [
        "",
        "(metadata['quality'] not shown: a value of the wrong kind, AttributeError: 'str' object has no attribute "
        "'items')",
    ]
    assert lines[:-2] == good  # everything before the quality section as it was
    report.metadata.update(quality={"verdict": "noisy", "advice": 5}, cost="x")
    lines = format_summary(report).splitlines()
    assert (
        "(metadata['cost'] not shown: a value of the wrong kind, AttributeError: 'str' object has no attribute 'get')"
        in lines
    )
    assert (
        lines[-1]
        == "(metadata['quality'] not shown: a value of the wrong kind, TypeError: 'int' object is not iterable)"
    )
    report.metadata.update(quality="noisy", cost={})  # a verdict alone, where an object goes
    assert format_summary(report).splitlines()[-1] == (
        "(metadata['quality'] not shown: a value of the wrong kind, TypeError: expected an object such as "
        "{'verdict': 'clean', ...}, got str)"
    )
