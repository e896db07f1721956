"""report.html's roofline in a real browser: a click on a point selects its component, the table's filters hide points.

The report is :mod:`tests._roofline_report`'s (hand-built: the points sit at known, well-separated places).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cb_callback._report.html import write_html
from tests._browser import browser, new_page
from tests._roofline_report import EXPECTED, roofline_report

__all__ = ["browser"]  # the fixture

ALL = [f"{path}:{name}" for path, name in EXPECTED]  # ":fwd", ":bwd", "mlp:fwd", "tiny:bwd"
#: The markers drawn for components (the ridges' markers carry no component).
DRAWN = "document.getElementById('roofline').data.filter(t => t.customdata).reduce((n, t) => n + t.x.length, 0)"


@pytest.fixture(scope="module")
def page_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("roofline")
    return write_html(roofline_report(), out)


def _until(page: Any, js: str) -> None:
    """Wait (up to 5 s) until ``js`` is true: polled from here, as the page's CSP refuses the ``eval``
    that ``wait_for_function``'s polling of an expression needs."""
    for _ in range(100):
        if page.evaluate(js):
            return
        page.wait_for_timeout(50)
    raise AssertionError(f"not true after 5 s: {js}")


HOVER = "(document.querySelector('#roofline .hovertext') || {textContent: ''}).textContent"


def _click(page: Any, path: str, pass_name: str) -> None:
    """Point at ``path``'s ``pass_name`` point until plotly hovers it, then click it."""
    where = page.evaluate(f"window.cbRoofline.where({path!r}, {pass_name!r})")
    page.mouse.move(where["x"], where["y"])
    _until(page, f"{HOVER}.startsWith({path!r} + ' (')")
    page.mouse.click(where["x"], where["y"])
    _until(page, f"window.cbViewer.state.selected === {path!r}")


def _open(page: Any, path: Path) -> None:
    page.goto(path.as_uri())
    _until(page, "window.cbRoofline !== undefined && document.querySelectorAll('#roofline .point').length > 0")


def test_clicking_a_point_selects_its_component(browser: object, page_file: Path, tmp_path: Path) -> None:
    with new_page(browser, height=1400) as (page, log):
        _open(page, page_file)
        assert log.errors == []
        assert page.evaluate("window.cbRoofline.shown()") == ALL
        assert page.evaluate(DRAWN) == len(ALL)
        note = page.inner_text("#roofline-note")
        assert note.startswith("4 of 4 points shown") and "left out: 3 components (1 estimated" in note
        page.locator("#roofline").scroll_into_view_if_needed()
        _click(page, "mlp", "fwd")
        assert "mlp (Linear), forward" in page.evaluate(HOVER)  # the hover names the path and the pass
        assert page.inner_text("#details h2") == "mlp"  # the details pane the icicle and the table fill
        assert page.locator('#table tr.selected[data-path="mlp"]').count() == 1
        page.screenshot(path=str(tmp_path / "roofline_page.png"), full_page=True)
        page.locator("#roofline").scroll_into_view_if_needed()  # selecting scrolled the table's row into view
        _click(page, "tiny", "bwd")
        assert page.inner_text("#details h2") == "tiny"


def test_the_table_filters_remove_points(browser: object, page_file: Path) -> None:
    with new_page(browser) as (page, _log):
        _open(page, page_file)
        page.select_option("#f-type", "Linear")  # mlp alone of the drawn components is a Linear
        assert page.evaluate("window.cbRoofline.shown()") == ["mlp:fwd"]
        assert page.evaluate(DRAWN) == 1
        assert page.inner_text("#roofline-note").startswith("1 of 4 points shown")
        page.select_option("#f-type", "")
        page.fill("#f-path", "tiny")
        assert page.evaluate("window.cbRoofline.shown()") == ["tiny:bwd"]
        page.fill("#f-path", "")
        page.select_option("#f-depth", "0")  # the root alone: both its passes
        assert page.evaluate("window.cbRoofline.shown()") == [":fwd", ":bwd"]
        assert page.evaluate(DRAWN) == 2
