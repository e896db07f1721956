"""Issue 23 §6: ``cb diff`` a person reads at a glance.

The ``B/A`` (ratio) and ``sig`` columns print different things (``1.50×`` / ``slower``, ``1.10×`` /
``noise``: the measured ratio always, the word alone saying it is not significant), a legend under
the table says what they mean, equal values read ``unchanged`` (MFU 0 -> 0
too, not "within noise"), no non-zero value prints as 0, and ``diff.html``'s header shows both runs'
quality, each labelled.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from cb_callback import ComponentRow, Report
from cb_callback._cli import main
from cb_callback._report.diff import compare_reports, format_diff
from cb_callback._report.html import write_diff_html
from tests._browser import new_page, show, until


def _net(total: dict[str, float], mfu: dict[str, float] | None = None, quality: dict | None = None) -> Report:
    """A root ``""`` (Net) and Linear children by path: ``total_ms`` per call, noise 0.1 (±20 % is noise)."""
    rows = [
        ComponentRow(
            path,
            "Net" if path == "" else "Linear",
            0 if path == "" else 1,
            None if path == "" else "",
            "ok",
            calls=1,
            total_ms=ms,
            noise=0.1,
            mfu=(mfu or {}).get(path, float("nan")),
        )
        for path, ms in total.items()
    ]
    return Report(rows, {"device_name": "cpu", "dtype": "fp32", **({"quality": quality} if quality else {})})


def _cells(lines: list[str], path: str) -> list[str]:
    """A table line's cells: columns are 2 spaces apart, a cell (``25.0 %``, ``54.2 MB``) holds at most 1."""
    return re.split(r" {2,}", next(ln for ln in lines if ln.split()[0] == (path or "(root)")).strip())


def test_mfu_zero_in_both_reads_unchanged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    zero = {"": 0.0, "fc": 0.0}
    _net({"": 2.0, "fc": 1.0}, mfu=zero).save(tmp_path / "a", html=False)
    _net({"": 2.0, "fc": 1.0}, mfu=zero).save(tmp_path / "b", html=False)
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--metric", "mfu"]) == 0
    out = capsys.readouterr().out.splitlines()
    # was "(- %, within noise)" and a "~" in the row: 0 -> 0 is no change at all
    assert out[2] == "whole model: A 0 % -> B 0 % (unchanged)"  # numbers.percent(0)
    # an equal value's change is 0 (was "+0.000"); B/A of 0 / 0 undefined: -
    assert _cells(out, "fc")[2:] == ["0 %", "0 %", "0", "-", "unchanged"]
    # a timed metric exactly equal (3.0 -> 3.0 ms) is unchanged too, its ratio 1.00×
    lines = format_diff(compare_reports(_net({"": 3.0}), _net({"": 3.0})))
    assert lines[0] == "whole model: A 3.00 ms -> B 3.00 ms (unchanged)"
    assert _cells(lines, "")[2:] == ["3.00", "3.00", "0", "1.00×", "unchanged"]


def test_ratio_and_sig_columns_print_different_things() -> None:
    a = _net({"": 10.0, "fast": 4.0, "slow": 2.0, "same": 1.0})
    # fast 4 -> 2 (-2, noise bound 2 x 0.1 x 4 = 0.8), slow 2 -> 3 (+1 > 0.6), same 1 -> 1.1 (+0.1 <= 0.22)
    b = _net({"": 10.5, "fast": 2.0, "slow": 3.0, "same": 1.1})
    lines = format_diff(compare_reports(a, b))
    header = next(ln for ln in lines if ln.startswith("path"))
    assert header.split()[-2:] == ["B/A", "sig"]
    assert _cells(lines, "fast")[-2:] == ["0.500×", "faster"]  # 2 / 4
    assert _cells(lines, "slow")[-2:] == ["1.50×", "slower"]  # 3 / 2
    # within noise: the measured ratio still shows (it was "≈1×", hiding it); sig alone says "noise"
    assert _cells(lines, "same")[-2:] == ["1.10×", "noise"]  # 1.1 / 1; was "~" and "~": the two columns alike
    assert _cells(lines, "")[-2:] == ["1.05×", "noise"]  # 10 -> 10.5 within 2 x 0.1 x 10.5 = 2.1
    assert "slower" not in _cells(lines, "same") and "faster" not in _cells(lines, "")  # never a speed-up
    assert lines[0] == "whole model: A 10.0 ms -> B 10.5 ms (+5.00 %, within noise)"
    assert lines[-1] == (
        "(B/A: B ÷ A as measured; sig: slower / faster beyond the two runs' noise "
        "(2 × the larger IQR), noise within it: not significant, unchanged: the same value in A and B)"
    )
    # a throughput up is faster; a rate that is not one (share) and a count are higher / lower
    a.row("slow").mfu, b.row("slow").mfu = 0.1, 0.3
    assert _cells(format_diff(compare_reports(a, b, "mfu")), "slow")[-2:] == ["3.00×", "faster"]  # 30 / 10 %
    a.row("slow").share, b.row("slow").share = 0.5, 0.1
    assert _cells(format_diff(compare_reports(a, b, "share")), "slow")[-2:] == ["0.200×", "lower"]
    a.row("slow").fwd_flops, b.row("slow").fwd_flops = 100.0, 500.0
    flops = format_diff(compare_reports(a, b, "fwd_flops"))
    assert _cells(flops, "slow")[-2:] == ["5.00×", "higher"]
    assert flops[-1].startswith("(fwd_flops is a count or a size, not a time: any difference is a change; B/A")


def test_no_non_zero_value_prints_as_zero() -> None:
    # 0.0004 ms -> 0.0002 ms with 3 decimals read 0.000 -> 0.000 (a change of -0.000); 3 significant figures
    a = _net({"": 1.0, "tiny": 0.0004})
    b = _net({"": 1.0, "tiny": 0.0002})
    lines = format_diff(compare_reports(a, b))
    assert _cells(lines, "tiny")[2:5] == ["0.000400", "0.000200", "-0.000200"]  # numbers.sig, 3 figures
    assert _cells(lines, "")[2:5] == ["1.00", "1.00", "0"]  # an equal value's change: 0 (was "+0.000")


def test_a_big_change_within_a_big_noise_shows_its_ratio() -> None:
    # the reviewer's row: features.4 5.554 -> 16.011 ms, noise 1.0 (100 %): bound 2 x 1.0 x 16.011 = 32.0 > 10.457
    a, b = _net({"": 20.0, "f": 5.554}), _net({"": 30.0, "f": 16.011})
    a.row("f").noise = b.row("f").noise = 1.0
    # B/A 16.011 / 5.554 = 2.8828 (was "≈1×"); change +10.457 to 3 figures; sig alone says noise
    assert _cells(format_diff(compare_reports(a, b)), "f")[2:] == ["5.55", "16.0", "+10.5", "2.88×", "noise"]


def test_numbers_use_significant_figures_and_si_prefixes() -> None:
    a, b = _net({"": 1.0, "fc": 1.0}), _net({"": 1.0, "fc": 1.0})
    a.row("fc").tflops, b.row("fc").tflops = 0.000728, 3.14e-6
    # was "0.001" beside "3.14e-06"; now both 3 significant figures (numbers.sig), never an exponent from 1e-6 up
    # change 3.14e-6 - 0.000728 = -0.00072486
    assert _cells(format_diff(compare_reports(a, b, "tflops")), "fc")[2:5] == ["0.000728", "0.00000314", "-0.000725"]
    a.row("fc").bytes, b.row("fc").bytes = 54242288.0, 54242289.0
    # was "54242288": bytes with an SI prefix; the change by one byte still shows (+1 B)
    assert _cells(format_diff(compare_reports(a, b, "bytes")), "fc")[2:5] == ["54.2 MB", "54.2 MB", "+1 B"]
    a.row("fc").fwd_flops, b.row("fc").fwd_flops = 6e9, 6e9
    assert _cells(format_diff(compare_reports(a, b, "fwd_flops")), "fc")[2:] == [
        "6.00 GFLOP",
        "6.00 GFLOP",
        "0",  # equal: 0 (was "+0")
        "1.00×",
        "unchanged",
    ]
    a.row("fc").mfu, b.row("fc").mfu = 0.0219, 0.25
    # fractions in percent (numbers.percent): 2.19 % -> 25.0 %, change +22.81 percentage points
    mfu = format_diff(compare_reports(a, b, "mfu"))
    assert _cells(mfu, "fc")[2:5] == ["2.19 %", "25.0 %", "+22.8 %"]


def _page_text(path: Path) -> str:
    """The text a reader sees in the HTML before any script runs (scripts and styles left out)."""

    class Text(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.parts: list[str] = []
            self.skip = 0

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            self.skip += tag in ("script", "style")

        def handle_endtag(self, tag: str) -> None:
            self.skip -= tag in ("script", "style")

        def handle_data(self, data: str) -> None:
            if not self.skip:
                self.parts.append(data)

    parser = Text()
    parser.feed(path.read_text(encoding="utf-8"))
    return " ".join(" ".join(parser.parts).split())


def test_diff_html_header_shows_both_runs_quality(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clean = {"verdict": "clean", "advice": ["A <was> quiet"]}  # "<" escaped, not markup
    contended = {"verdict": "contended", "advice": ["re-run on a quiet machine", "pin the threads"]}
    _net({"": 1.0, "fc": 0.5}, quality=clean).save(tmp_path / "a", html=False)
    _net({"": 1.0, "fc": 0.5}, quality=contended).save(tmp_path / "b", html=False)
    page = tmp_path / "diff.html"
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--html", str(page)]) == 0
    capsys.readouterr()
    text = _page_text(page)
    # was: only B's advice, and only inside the page's data (drawn by the script)
    assert (
        f"A ({tmp_path / 'a'}): quality clean A <was> quiet "
        f"B ({tmp_path / 'b'}): quality contended re-run on a quiet machine pin the threads"
    ) in text
    html = page.read_text(encoding="utf-8")
    assert '<div id="quality" class="quality contended">' in html  # styled by the worse verdict
    assert '"sig":"unchanged"' in html  # the rows' diff carries the word cb diff prints
    # neither run measured its quality: the box is there but hidden; a single report's page is unchanged
    a, b = _net({"": 1.0}), _net({"": 1.0})
    bare = write_diff_html(a, b, compare_reports(a, b), tmp_path / "bare.html")
    assert '<div id="quality" class="quality" hidden></div>' in bare.read_text(encoding="utf-8")
    from cb_callback._report.html import render_html

    assert '<div id="quality" class="quality"></div>' in render_html(a, plotly_src="p.js", viewer_src="v.js")


def test_a_hand_edited_quality_advice_is_read_as_advice_not_a_traceback() -> None:
    # advice 5 raised TypeError in cb diff (text and gate formats alike); one string was split into letters
    a = _net({"": 1.0}, quality={"verdict": "noisy", "advice": 5})
    b = _net({"": 1.0}, quality={"verdict": "clean", "advice": "quiet"})
    d = compare_reports(a, b)
    assert (d.quality["A"], d.quality["B"]) == (
        {"verdict": "noisy", "advice": []},
        {"verdict": "clean", "advice": ["quiet"]},
    )
    lines = format_diff(d)
    assert lines[:2] == [
        "quality: A noisy, B clean (a timed change may be the machine's, not the model's)",
        "  B: quiet",
    ]


def test_the_diff_page_in_a_browser_keeps_both_runs_quality_and_says_sig_in_words(browser: Any, tmp_path: Path) -> None:
    a = _net({"": 1.0, "fc": 0.5, "same": 0.2}, quality={"verdict": "noisy", "advice": ["A: pin the threads"]})
    # fc 0.5 -> 2.0: +1.5 beyond 2 x 0.1 x 2.0 = 0.4 (slower); the root 1.0 -> 1.1 within 0.22 (noise)
    b = _net({"": 1.1, "fc": 2.0, "same": 0.2}, quality={"verdict": "clean", "advice": []})
    page_file = write_diff_html(a, b, compare_reports(a, b), tmp_path / "diff.html", labels=("before", "after"))
    with new_page(browser) as (page, log):
        show(browser, page, page_file)
        until(page, "window.cbViewer !== undefined && document.querySelectorAll('#table tbody tr').length > 0")
        box = page.locator("#quality")
        assert box.is_visible()  # the script leaves the diff page's box as written (a clean B once hid it)
        assert box.inner_text().split("\n") == [
            "A (before): quality noisy",
            "A: pin the threads",
            "B (after): quality clean",
        ]
        sig = page.locator("#table thead th").all_text_contents().index("sig")
        cells = {
            path: page.locator(f'#table tbody tr[data-path="{path}"] td').nth(sig).inner_text()
            for path in ("", "fc", "same")
        }
        assert cells == {"": "noise", "fc": "slower", "same": "unchanged"}  # was "~", "", "~"
        assert log.errors == []
