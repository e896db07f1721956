"""report.html's roofline in a real browser: a click on a point selects its component, the table's filters hide points.

The report is :mod:`tests._roofline_report`'s (hand-built: the points sit at known, well-separated places).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cb_callback import ComponentRow, Report
from cb_callback._report.html import write_html
from tests._browser import new_page, show, until
from tests._roofline_report import EXPECTED, roofline_report

#: ":fwd", ":bwd", "mlp:fwd", "tiny:bwd", then the bandwidth panel's "act:fwd" (no FLOPs counted)
ALL = [f"{path}:{name}" for path, name in EXPECTED] + ["act:fwd"]
#: The markers drawn for components (the ridges' markers carry no component).
DRAWN = "document.getElementById('roofline').data.filter(t => t.customdata).reduce((n, t) => n + t.x.length, 0)"


@pytest.fixture(scope="module")
def page_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("roofline")
    return write_html(roofline_report(), out)


HOVER = "(document.querySelector('#roofline .hovertext') || {textContent: ''}).textContent"


def _click(page: Any, path: str, pass_name: str) -> str:
    """Point at ``path``'s ``pass_name`` point until plotly hovers it, then click it: up to three times, each
    from the point's position read again (on a busy machine the page may still be scrolling the previous
    selection's table row into view when the first position is read, and that click lands elsewhere)."""
    selected = f"window.cbViewer.state.selected === {path!r}"
    for _ in range(3):
        where = page.evaluate(f"window.cbRoofline.where({path!r}, {pass_name!r})")
        page.mouse.move(where["x"], where["y"])
        until(page, f"{HOVER}.startsWith({path!r} + ' (')")
        hover = str(page.evaluate(HOVER))  # read before the click: the selection's redraw may clear it
        page.mouse.click(where["x"], where["y"])
        for _ in range(40):
            if page.evaluate(selected):
                return hover
            page.wait_for_timeout(50)
    raise AssertionError(f"three clicks did not select {path!r}")


def _open(browser: Any, page: Any, path: Path) -> None:
    show(browser, page, path)  # from the browser's stage: the page links no artifact
    until(page, "window.cbRoofline !== undefined && document.querySelectorAll('#roofline .point').length > 0")


def test_clicking_a_point_selects_its_component(browser: object, page_file: Path, tmp_path: Path) -> None:
    with new_page(browser, height=1400) as (page, log):
        _open(browser, page, page_file)
        assert log.errors == []
        assert page.evaluate("window.cbRoofline.shown()") == ALL
        assert page.evaluate(DRAWN) == len(ALL)
        note = page.inner_text("#roofline-note")
        assert note.startswith("4 of 4 points and 1 of 1 passes with no FLOPs counted (the bandwidth panel) shown")
        assert "left out: 3 components (1 estimated" in note and "roof above it is its headroom" in note
        page.locator("#roofline").scroll_into_view_if_needed()
        hover = _click(page, "mlp", "fwd")
        assert "mlp (Linear), forward" in hover  # the hover names the path and the pass
        assert page.inner_text("#details h2") == "mlp"  # the details pane the icicle and the table fill
        assert page.locator('#table tr.selected[data-path="mlp"]').count() == 1
        page.screenshot(path=str(tmp_path / "roofline_page.png"), full_page=True)
        page.locator("#roofline").scroll_into_view_if_needed()  # selecting scrolled the table's row into view
        _click(page, "tiny", "bwd")
        assert page.inner_text("#details h2") == "tiny"
        page.locator("#roofline").scroll_into_view_if_needed()
        hover = _click(page, "act", "fwd")  # the bandwidth panel's pass: hover and select as on the roofline
        # 1e6 B in 0.5 ms = 2 GB/s of DRAM's 100 (2 %); no share in the fixture: "-", not "0 %"
        assert hover == (
            "act (ReLU), forwardno FLOPs counted; 2 GB/s of DRAM's 100 GB/s (2 %)0.5 ms per call; 1 MB"
            "share of the step -; headroom 0.49 ms per call (both passes)"
        )
        assert page.inner_text("#details h2") == "act"


def test_the_table_filters_remove_points(browser: object, page_file: Path) -> None:
    with new_page(browser) as (page, _log):
        _open(browser, page, page_file)
        page.select_option("#f-type", "Linear")  # mlp alone of the drawn components is a Linear
        assert page.evaluate("window.cbRoofline.shown()") == ["mlp:fwd"]
        assert page.evaluate(DRAWN) == 1
        assert page.inner_text("#roofline-note").startswith("1 of 4 points and 0 of 1 passes")
        page.select_option("#f-type", "")
        page.fill("#f-path", "tiny")
        assert page.evaluate("window.cbRoofline.shown()") == ["tiny:bwd"]
        page.fill("#f-path", "")
        page.select_option("#f-depth", "0")  # the root alone: both its passes
        assert page.evaluate("window.cbRoofline.shown()") == [":fwd", ":bwd"]
        assert page.evaluate(DRAWN) == 2


def test_the_hover_shows_a_quote_as_itself_and_runs_no_markup(browser: object, tmp_path: Path) -> None:
    report = roofline_report()
    report.row("mlp").path = 'm"q'  # a quote: &quot; is no entity plotly decodes
    report.row("tiny").path = "<svg onload=alert(1)>"
    page_file = write_html(report, tmp_path)
    with new_page(browser, height=1400) as (page, log):
        dialogs: list[str] = []

        def on_dialog(d: Any) -> None:
            dialogs.append(d.message)
            d.dismiss()

        page.on("dialog", on_dialog)
        try:
            _open(browser, page, page_file)
            page.locator("#roofline").scroll_into_view_if_needed()
            for path, name in (('m"q', "fwd"), ("<svg onload=alert(1)>", "bwd")):
                where = page.evaluate("([a, b]) => window.cbRoofline.where(a, b)", [path, name])
                page.mouse.move(where["x"], where["y"])
                until(page, f"{HOVER}.startsWith({path!r} + ' (')")  # the path as written, no &quot; nor &lt;
                page.mouse.move(5, 5)
        finally:
            page.remove_listener("dialog", on_dialog)  # the tab is shared: the next test's dialogs are its own
        assert dialogs == [] and log.errors == []
        assert page.evaluate("document.querySelectorAll('#roofline svg svg, #roofline [onload]').length") == 0


def test_types_past_the_ninth_are_one_grey_group(browser: object, tmp_path: Path) -> None:
    rows = [ComponentRow("", "Net", 0, None, "ok", calls=1, fwd_ms=20.0, bwd_ms=0.0, total_ms=20.0, fwd_flops=1e10,
                         bwd_flops=0.0, share=1.0)]  # fmt: skip
    for i in range(12):  # Type0 the slowest after the root: the colours go by time over the step
        ms = 1.0 + 0.1 * (12 - i)
        row = ComponentRow(f"m{i}", f"Type{i}", 1, "", "ok", calls=1, fwd_ms=ms, bwd_ms=0.0, total_ms=ms,
                           fwd_flops=1e8 * (i + 1), bwd_flops=0.0, share=0.05)  # fmt: skip
        rows.append(row)
    for row in rows:
        row.details["fwd_bytes"] = 1e7
    page_file = write_html(Report(rows, {"device": "cpu", "peaks": {"flops": 1e12, "bandwidth": 1e11}}), tmp_path)
    with new_page(browser) as (page, _log):
        _open(browser, page, page_file)
        legend = page.evaluate(
            "document.getElementById('roofline').data.filter(t => t.customdata && t.showlegend)"
            ".map(t => [t.name, t.marker.color, t.x.length])"
        )
    # Net and Type0..Type7: nine colours (tab10 without its grey); Type8..Type11 one grey entry of 4 points
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf"]
    assert legend == [["Net", palette[0], 1], *[[f"Type{i}", palette[i + 1], 1] for i in range(8)],
                      ["other types", "#9e9e9e", 4]]  # fmt: skip


def test_without_peaks_the_note_claims_no_roof(browser: object, tmp_path: Path) -> None:
    report = roofline_report()
    del report.metadata["peaks"]
    with new_page(browser) as (page, _log):
        _open(browser, page, write_html(report, tmp_path))
        note = page.inner_text("#roofline-note")
    assert "roof above it" not in note and note.endswith("No peaks in this report: no roof is drawn, no headroom; "
                                                         "click a point to select its component.")  # fmt: skip


CELLS = (
    "(() => { const i = [...document.querySelectorAll('#table thead th')].findIndex(h => h.textContent"
    " === 'headroom ms'); return [...document.querySelectorAll('#table tbody tr')]"
    ".map(r => [r.dataset.path, r.children[i].textContent]); })()"
)


def test_the_table_shows_headroom_after_bound_and_sorts_by_it(browser: object, page_file: Path) -> None:
    """The column the summary ranks by, in the table: per call, as report.json has it. The fixture's values
    (tests/_roofline_report.py): root (8 - 4) + (16 - 8) = 12, mlp 2 - 1 = 1, tiny's backward 1 - 0.01 = 0.99,
    act 0.5 - 0.01 = 0.49 ms; nob (no bytes), the estimated, failed and skipped rows none ("-")."""
    with new_page(browser) as (page, log):
        _open(browser, page, page_file)
        headers = page.locator("#table thead th").all_text_contents()
        assert headers.index("headroom ms") == headers.index("bound") + 1
        cells = dict(page.evaluate(CELLS))
        assert cells == {"": "12.0", "mlp": "1.00", "tiny": "0.990", "act": "0.490", "nob": "-", "blocks": "-",
                         "bad": "-", "skip": "-"}  # fmt: skip
        page.click("#table thead th:text-is('headroom ms')")  # a number column sorts largest first
        order = [path for path, _ in page.evaluate(CELLS)]
        assert order[:4] == ["", "mlp", "tiny", "act"] and sorted(order[4:]) == ["bad", "blocks", "nob", "skip"]
        assert log.errors == []
