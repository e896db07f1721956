"""report.html's activation-checkpointing section: the plan's curve, the chosen point, one line without a candidate."""

from __future__ import annotations

import json
import re
from pathlib import Path

from cb_callback import Report
from cb_callback._report.html import HTML_FILE, render_html, write_html
from tests._browser import new_page, show, until
from tests.whatif.test_checkpoint_plan import _row, _tree

MIB = 1024 * 1024


def _config(page: str) -> dict:
    found = re.search(r'<script id="cb-config" type="application/json">(.*?)</script>', page, re.S)
    assert found is not None
    return json.loads(found.group(1))


def test_the_page_carries_the_plans_curve_and_the_diff_page_none() -> None:
    # computed above the reporters (cb_callback._api installs PAGE_DATA["checkpoint"]): the page imports no what-if
    config = _config(render_html(_tree()))
    curve = config["checkpoint"]["curve"]
    assert [(p["saved_bytes"] // MIB, p["extra_ms"]) for p in curve] == [
        (0, 0.0),
        (6, 1.0),
        (8, 2.0),
        (10, 2.5),
        (14, 3.0),
        (18, 4.5),
        (19, 7.0),
        (23, 8.5),
    ]  # fmt: skip  (the frontier derived in tests/whatif/test_checkpoint_plan.py)
    assert "checkpoint" not in _config(render_html(_tree(), diff={"metric": "total_ms", "label": "x"}))


def test_a_report_it_cannot_plan_still_renders_saying_why() -> None:
    data = _tree().to_dict()
    data["rows"][1]["calls"] = "many"  # not a report Report.from_dict reads: the planner raises
    assert _config(render_html(data))["checkpoint"]["error"].startswith("ValueError")


def test_the_section_draws_the_curve_and_marks_the_cheapest_point_for_a_target(browser: object, tmp_path: Path) -> None:
    write_html(_tree(), tmp_path)
    with new_page(browser) as (page, log):
        show(browser, page, tmp_path / HTML_FILE)  # type: ignore[arg-type]
        until(page, "document.querySelectorAll('#ckpt-chart .scatterlayer .trace').length === 2")
        assert page.is_visible("#checkpoint")  # type: ignore[attr-defined]
        # the default target is half the most: 23 / 2 = 11.5 MiB -> {a.x, b} (14 MiB, 3 ms)
        assert page.input_value("#ckpt-target") == "11.5"  # type: ignore[attr-defined]
        assert page.text_content("#ckpt-summary") == "checkpoint a.x, b: saves 14.0 MiB, adds 3.00 ms per step"  # type: ignore[attr-defined]
        page.fill("#ckpt-target", "18")  # type: ignore[attr-defined]
        assert page.text_content("#ckpt-summary") == "checkpoint a, b: saves 18.0 MiB, adds 4.50 ms per step"  # type: ignore[attr-defined]
        page.fill("#ckpt-target", "30")  # type: ignore[attr-defined]
        assert page.text_content("#ckpt-summary") == "no point saves 30.0 MiB: the most is 23.0 MiB"  # type: ignore[attr-defined]
        assert log.errors == []


def test_without_a_candidate_the_section_says_why_in_one_line(browser: object, tmp_path: Path) -> None:
    # before: the section stayed hidden, silently
    report = Report([r for r in _tree().rows if r.parent is None])  # the root alone: refused, nothing to draw
    write_html(report, tmp_path)
    with new_page(browser) as (page, log):
        show(browser, page, tmp_path / HTML_FILE)  # type: ignore[arg-type]
        until(page, "window.cbViewer !== undefined")
        assert page.is_visible("#checkpoint") and not page.is_visible("#ckpt-chart")  # type: ignore[attr-defined]
        assert not page.is_visible("#ckpt-target")  # type: ignore[attr-defined]
        text = page.text_content("#ckpt-summary")  # type: ignore[attr-defined]
        assert text.startswith("nothing to checkpoint: no component saves activations it can drop (0 refused")
        assert log.errors == []


def test_the_curve_steps_up_before_a_saving_and_a_long_choice_is_truncated(browser: object, tmp_path: Path) -> None:
    # "vh": between two points the line is at the next point's time (what reaching that saving costs); "hv"
    # drew the previous, cheaper one. 30 siblings of 1 MiB, 1 ms each: a target of 20 MiB picks 20 of them,
    # listed as the first 8 and "... and 12 more" (before: all 20 names)
    rows = [r for r in _tree().rows if r.parent is None]
    rows += [_row(f"m{i:02d}", "", 1.0, 1.0, params_mb=1.0) for i in range(30)]
    write_html(Report(rows), tmp_path)
    with new_page(browser) as (page, log):
        show(browser, page, tmp_path / HTML_FILE)  # type: ignore[arg-type]
        until(page, "document.querySelectorAll('#ckpt-chart .scatterlayer .trace').length === 2")
        shape = page.evaluate("document.getElementById('ckpt-chart').data[0].line.shape")  # type: ignore[attr-defined]
        assert shape == "vh"
        page.fill("#ckpt-target", "20")  # type: ignore[attr-defined]
        names = ", ".join(f"m{i:02d}" for i in range(8))
        expected = f"checkpoint {names} \u2026 and 12 more: saves 20.0 MiB, adds 20.0 ms per step"
        assert page.text_content("#ckpt-summary") == expected  # type: ignore[attr-defined]
        assert log.errors == []
