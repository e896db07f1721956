"""report.html in a real browser: it loads offline, zooms, recolours, filters and links artifacts."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from cb_callback import profile_components
from cb_callback._report.html import HTML_FILE, render_html, write_html
from cb_callback._report.model import ComponentRow, Report
from cb_callback._report.numbers import sig  # the page shows numbers as the text does
from tests._browser import new_page, show, until

FAST: dict[str, Any] = dict(min_run_time_s=0.0, min_repeats=2, max_repeats=3, rounds=1, warmup=1)


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.attn = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.ReLU(), nn.Linear(2 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.attn(x))


class Net(nn.Module):
    def __init__(self, d: int = 16, n: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(d) for _ in range(n)])
        self.head = nn.Linear(d, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    report = profile_components(Net(), (torch.randn(4, 16),), descend_share=0.0, **FAST)  # all replayed or copied
    out = tmp_path_factory.mktemp("viewer")
    # an artifact of blocks.1.attn, as an artifact plugin records it: a path relative to the report
    art = out / "artifacts" / "blocks.1.attn" / "ops.csv"
    art.parent.mkdir(parents=True)
    art.write_text("name,calls\naten::addmm,1\n")
    report.row("blocks.1.attn").details["artifacts"] = {"ops": "artifacts/blocks.1.attn/ops.csv"}
    report.save(out)
    write_html(report, out)
    return out


def _open(page: object, report_dir: Path) -> None:
    page.goto((report_dir / HTML_FILE).as_uri())  # type: ignore[attr-defined]
    until(page, "window.cbViewer !== undefined && document.querySelectorAll('#icicle g.slice').length > 0")


def test_the_page_loads_offline_without_errors(browser: object, report_dir: Path) -> None:
    with new_page(browser) as (page, log):
        _open(page, report_dir)
        assert log.errors == []
        # the page itself is the only request: plotly, the data, styles are all inline
        assert log.requests == [(report_dir / HTML_FILE).as_uri()]
        n = len(Report.load(report_dir))
        assert page.locator("#icicle g.slice").count() == n  # one node per component
        assert page.locator("#table tbody tr").count() == n


def test_clicking_a_node_zooms_and_the_breadcrumb_returns(browser: object, report_dir: Path) -> None:
    with new_page(browser) as (page, _log):
        _open(page, report_dir)
        level = "document.getElementById('icicle')._fullData[0].level"
        page.locator("#icicle g.slice", has_text="blocks.1").first.click()
        until(page, f"{level} === 'blocks.1'")
        assert page.evaluate("window.cbViewer.state.selected") == "blocks.1"  # and the table follows
        assert page.locator("#table tr.selected").get_attribute("data-path") == "blocks.1"
        crumbs = page.locator("#icicle g.pathbar text").all_text_contents()
        assert "(root)" in crumbs
        page.locator("#icicle g.pathbar", has_text="(root)").last.locator("path.surface").click()
        until(page, f"{level} === '(root)' || {level} === ''")


def test_switching_the_metric_recolours(browser: object, report_dir: Path) -> None:
    with new_page(browser) as (page, log):
        _open(page, report_dir)
        before = page.evaluate("window.cbViewer.colors()")
        page.select_option("#metric", "status")
        after = page.evaluate("window.cbViewer.colors()")
        assert before != after
        # the ModuleList is estimated (a container), every other row ok: the status palette
        statuses = page.evaluate("Array.from(document.querySelectorAll('#table tbody tr')).length")
        assert statuses == len(after)
        rows = Report.load(report_dir).rows
        assert after == ["#e8b62c" if r.status == "estimated" else "#5fa35a" for r in rows]
        assert "status" in page.locator("#legend").inner_text()
        assert log.errors == []


def test_filtering_the_table_hides_rows(browser: object, report_dir: Path) -> None:
    with new_page(browser) as (page, _log):
        _open(page, report_dir)
        page.fill("#f-path", "blocks.*.attn")  # a glob
        rows = page.locator("#table tbody tr")
        assert sorted(rows.evaluate_all("rs => rs.map(r => r.dataset.path)")) == [
            "blocks.0.attn",
            "blocks.1.attn",
            "blocks.2.attn",
        ]
        page.fill("#f-path", "mlp.1")  # a substring: the three ReLUs
        assert rows.count() == 3
        page.fill("#f-path", "")
        page.select_option("#f-type", "Linear")
        # per block attn, mlp.0, mlp.2 (3 x 3) and the head
        assert rows.count() == 10


def test_roll_ups_and_csv_export(browser: object, report_dir: Path) -> None:
    with new_page(browser) as (page, _log):
        _open(page, report_dir)
        page.click(".tabs button[data-view='structure']")
        groups = page.locator("#table tbody tr td:first-child").all_text_contents()
        assert "blocks.*.attn" in groups and "blocks.*" in groups
        with page.expect_download() as dl:
            page.click("#csv")
        text = Path(dl.value.path()).read_text()
        table = list(csv.DictReader(io.StringIO(text)))
        attn = next(r for r in table if r["group"] == "blocks.*.attn")
        assert attn["count"] == "3"


def test_selecting_a_row_shows_its_artifact_links_and_they_resolve(browser: object, report_dir: Path) -> None:
    with new_page(browser) as (page, _log):
        _open(page, report_dir)
        page.click('#table tr[data-path="blocks.1.attn"]')
        link = page.locator("#details a.artifact[data-kind='ops']")
        assert link.count() == 1
        href = link.evaluate("a => a.href")  # resolved against the page's URL
        assert href == (report_dir / "artifacts" / "blocks.1.attn" / "ops.csv").as_uri()
        assert Path(href.removeprefix("file://")).read_text().startswith("name,calls")


def test_rows_taken_from_a_representative_are_marked_and_say_from_where(browser: object, report_dir: Path) -> None:
    # blocks.0 gets an input that needs no gradient, blocks.1 and blocks.2 one that does: blocks.1 and
    # blocks.2 are one group, and blocks.2's rows are blocks.1's measurements.
    report = Report.load(report_dir)
    assert report.row("blocks.2.mlp.0").details["as"] == "representative"
    with new_page(browser) as (page, _log):
        _open(page, report_dir)
        headers = page.locator("#table thead th").all_text_contents()
        assert "in-situ fwd ms" in headers and headers.index("in-situ fwd ms") == headers.index("fwd ms") + 1
        marked = page.locator("#table tbody tr:has(.as-rep)").evaluate_all("rs => rs.map(r => r.dataset.path)")
        assert sorted(marked) == sorted(r.path for r in report.rows if r.details.get("as") == "representative")
        page.click('#table tr[data-path="blocks.2.mlp.0"]')
        text = page.locator("#details").inner_text()
        assert "taken from blocks.1.mlp.0, a representative of its repeated structure" in text
        assert "in situ: fwd" in text


def test_rows_not_replayed_are_marked_in_situ(browser: object, tmp_path: Path) -> None:
    # descend_share=1: no node's own share reaches it, so rows keep the step's numbers (details["as"] ==
    # "insitu") but the top hotspots (up to five leaves of >= 1/5 of the step each, timing-dependent) and the
    # copies of a replayed representative; the page marks exactly the rows the report marks, either way.
    torch.manual_seed(0)
    report = profile_components(Net(), (torch.randn(4, 16),), descend_share=1.0, **FAST)
    insitu = sorted(r.path for r in report.rows if r.details.get("as") == "insitu")
    assert insitu, [(r.path, r.status, r.details.get("as")) for r in report.rows]
    page_file = write_html(report, tmp_path)
    with new_page(browser) as (page, log):
        _open_file(browser, page, page_file)
        marked = page.locator("#table tbody tr:has(.as-insitu)").evaluate_all("rs => rs.map(r => r.dataset.path)")
        assert sorted(marked) == insitu and log.errors == []
        copies = page.locator("#table tbody tr:has(.as-rep)").evaluate_all("rs => rs.map(r => r.dataset.path)")
        assert sorted(copies) == sorted(r.path for r in report.rows if r.details.get("as") == "representative")
        title = page.locator(f'#table tr[data-path="{insitu[0]}"] .as-insitu').get_attribute("title")
        assert title is not None and "not replayed alone" in title
        # its details say what the step measured: the forward and (CPU) the backward in situ, and its share
        row = report.row(insitu[0])
        page.click(f'#table tr[data-path="{insitu[0]}"]')
        text = page.locator("#details").inner_text()
        assert f"bwd {sig(row.details['insitu']['bwd_ms'])} ms per call vs isolated - ms" in text, text
        assert f"in-situ share {sig(row.details['insitu']['share'] * 100)} %" in text, text
        page.screenshot(path=str(tmp_path / "insitu.png"), full_page=True)


def test_script_end_tags_in_the_data_cannot_break_the_page() -> None:
    report = profile_components(nn.Linear(2, 2), (torch.randn(1, 2),), **FAST)
    report.row("").details["evil"] = "</script><script>alert(1)</script>"
    html = render_html(report)
    data = html.split('<script id="cb-data" type="application/json">', 1)[1].split("</script>", 1)[0]
    assert "</script" not in data and "\\u003c/script>" in data


def test_the_diff_page_colours_by_change(browser: object, tmp_path: Path) -> None:
    from cb_callback._report.diff import compare_reports
    from cb_callback._report.html import write_diff_html

    torch.manual_seed(0)
    # descend_share=0: every row replayed (an in-situ row has no time to compare: grey)
    a = profile_components(Net(), (torch.randn(4, 16),), descend_share=0.0, **FAST)
    b = Report.from_dict(a.to_dict())
    b.row("head").total_ms = a.row("head").total_ms * 10 + 5.0  # far beyond any noise: slower
    b.row("head").noise = 0.01
    page_file = write_diff_html(a, b, compare_reports(a, b), tmp_path / "diff.html")
    with new_page(browser) as (page, log):
        _open_file(browser, page, page_file)
        assert page.evaluate("window.cbViewer.state.metric") == "change"
        colors = page.evaluate("window.cbViewer.colors()")
        paths = [r.path for r in b.rows]
        assert colors[paths.index("head")] == "rgb(178,24,43)"  # the largest slow-down: full red
        assert colors[paths.index("blocks.0.attn")] == "rgb(247,247,247)"  # unchanged: neutral
        assert "slower" in page.locator("#legend").inner_text()
        assert log.errors == []


def _open_file(browser: object, page: object, path: Path) -> Path:
    """Show the page file ``path`` from the browser's stage (it links no artifact: its place does not matter)."""
    staged = show(browser, page, path)  # type: ignore[arg-type]
    until(page, "window.cbViewer !== undefined && document.querySelectorAll('#icicle g.slice').length > 0")
    return staged


def _headers(page: object) -> list[str]:
    return page.locator("#table thead th").all_text_contents()  # type: ignore[attr-defined]


def _cell(page: object, path: str, header: str) -> str:
    """The text of ``path``'s cell in the column headed ``header``."""
    col = _headers(page).index(header)
    return page.locator(f'#table tbody tr[data-path="{path}"] td').nth(col).inner_text()  # type: ignore[attr-defined]


def _hover(page: object, path: str) -> str:
    ids = page.evaluate("document.getElementById('icicle').data[0].ids")  # type: ignore[attr-defined]
    hover = page.evaluate("document.getElementById('icicle').data[0].customdata")  # type: ignore[attr-defined]
    return hover[ids.index(path or "(root)")]


WHATIF_HEADERS = ("p90 ms", "median ms", "compiled ms", "compile \u00d7")


def test_a_report_without_batches_or_compile_has_none_of_their_columns(browser: object, report_dir: Path) -> None:
    with new_page(browser) as (page, log):
        _open(page, report_dir)
        headers = _headers(page)
        assert "total ms" in headers
        assert not set(WHATIF_HEADERS) & set(headers)
        assert "compile_speedup" not in page.evaluate(
            "Array.from(document.querySelectorAll('#metric option')).map(o => o.value)"
        )
        page.click('#table tr[data-path="blocks.1.attn"]')
        assert page.locator("#details .batches, #details .compile-whatif").count() == 0
        assert log.errors == []


def test_many_batches_show_median_p90_and_each_batch(browser: object, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU())
    report = profile_components(model, batches=[torch.randn(n, 16) for n in (2, 4, 8)], **FAST)
    assert report.metadata["batches"] == 3
    page_file = write_html(report, tmp_path)
    root = report.row("")
    with new_page(browser) as (page, log):
        _open_file(browser, page, page_file)
        headers = _headers(page)
        assert "total ms" not in headers
        assert headers.index("p90 ms") == headers.index("median ms") + 1
        assert "3 batches" in (page.locator("#table th[data-key='total_ms']").get_attribute("title") or "")
        assert _cell(page, "", "p90 ms") == sig(root.details["p90_ms"])
        assert _cell(page, "", "median ms") == sig(root.total_ms)
        assert f"p90 {sig(root.details['p90_ms'])} ms over 3 batches" in _hover(page, "")
        # sorting by p90 orders the rows by it
        page.click("#table th[data-key='p90_ms']")
        p90 = {r.path: r.details.get("p90_ms", float("-inf")) for r in report.rows}
        shown = page.evaluate("window.cbViewer.visiblePaths()")
        assert [p90[p] for p in shown] == sorted(p90.values(), reverse=True)
        # and the CSV carries it
        table = list(csv.DictReader(io.StringIO(page.evaluate("window.cbViewer.csv()"))))
        root_line = next(r for r in table if r["path"] == "(root)")
        assert float(root_line["p90 ms"]) == root.details["p90_ms"]
        assert float(root_line["median ms"]) == root.total_ms
        # the details list each batch with its input shape; none of it is dumped twice
        page.click('#table tr[data-path="0"]')
        batch_rows = page.locator("#details .batch-table tbody tr[data-batch]")
        assert batch_rows.count() == 3
        shapes = [b["shape"] for b in report.row("0").details["batches"]]
        assert shapes == ["float32[2,16]", "float32[4,16]", "float32[8,16]"]
        assert page.locator("#details .batch-table td.shape").all_inner_texts() == shapes  # one line under each batch
        dump = page.locator("#details pre").inner_text()
        assert '"p90_ms"' not in dump and '"batches"' not in dump and '"shapes"' not in dump
        assert log.errors == []


def test_the_compile_what_if_shows_compiled_times_and_speedups(browser: object, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
    report = profile_components(
        model, (torch.randn(4, 16),), compile=True, compile_options={"backend": "eager"}, **FAST
    )
    compiled = [r for r in report.rows if r.compiled_ms == r.compiled_ms]  # not NaN
    assert compiled
    page_file = write_html(report, tmp_path)
    with new_page(browser) as (page, log):
        _open_file(browser, page, page_file)
        headers = _headers(page)
        assert headers.index("compiled ms") == headers.index("noise %") + 1
        assert headers.index("compile \u00d7") == headers.index("compiled ms") + 1
        assert "total ms" in headers and "p90 ms" not in headers  # one batch
        for r in compiled:
            assert _cell(page, r.path, "compiled ms") == sig(r.compiled_ms)
            assert _cell(page, r.path, "compile \u00d7") == sig(r.compile_speedup)
        root = report.row("")
        speedup = sig(root.compile_speedup)
        assert f"compiled {sig(root.compiled_ms)} ms (\u00d7{speedup})" in _hover(page, "")
        table = list(csv.DictReader(io.StringIO(page.evaluate("window.cbViewer.csv()"))))
        assert float(next(t for t in table if t["path"] == "(root)")["compile \u00d7"]) == root.compile_speedup
        page.select_option("#metric", "compile_speedup")
        assert "compile speed-up" in page.locator("#legend").inner_text()
        page.click('#table tr[data-path=""]')
        section = page.locator("#details .compile-whatif")
        assert section.count() == 1
        text = section.inner_text()
        assert f"compiled {sig(root.compiled_ms)} ms (\u00d7{speedup})" in text
        assert "graph breaks" in text and "recompiles" in text and "outputs close" in text
        sep = root.details["compile"]["children_separately_ms"]
        assert f"\u2192 {sig(sep)} ms ({root.details['compile']['children_compiled']} children compiled)" in text
        assert '"compile"' not in page.locator("#details pre").inner_text()
        assert log.errors == []


def test_compile_errors_and_break_reasons_are_escaped(browser: object, tmp_path: Path) -> None:
    report = profile_components(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), (torch.randn(1, 2),), **FAST)
    evil = "<img id=evil src=x onerror=alert(1)>"
    ok = report.row("0")
    ok.compiled_ms, ok.compile_speedup = ok.total_ms / 2, 2.0
    ok.details["compile"] = {
        "graphs": 2,
        "graph_breaks": 1,
        "break_reasons": [{"reason": evil, "count": 2, "where": evil}],
        "recompiles": 0,
    }
    report.row("1").details["compile"] = {"error": "RuntimeError: " + evil + "x" * 200}
    report.row("1").details["batches"] = [{"batch": 0, "status": "ok", "calls": 1, "shape": evil}]
    page_file = write_html(report, tmp_path)
    with new_page(browser) as (page, log):
        staged = _open_file(browser, page, page_file)
        hover = _hover(page, "1")
        assert "compile failed: RuntimeError: &lt;img" in hover and "<img" not in hover
        assert len(hover.split("compile failed: ", 1)[1].split("<br>")[0]) < 120  # the first 80 characters, escaped
        page.click('#table tr[data-path="0"]')
        assert evil in page.locator("#details .break-reasons").inner_text()
        page.click('#table tr[data-path="1"]')
        assert "compile failed: RuntimeError: " + evil in page.locator("#details .compile-whatif").inner_text()
        assert page.locator("#details .batch-table td.shape").inner_text() == evil
        assert page.locator("#evil").count() == 0
        assert log.errors == []
        assert log.requests == [staged.as_uri()]  # the page alone (a copy of page_file)


# --- issue 14 §5: the CSV's units, the details' numbers, a report saved elsewhere ---------------


def _units_report() -> Report:
    """A hand-made report whose numbers have known percents and units."""
    rows = [
        ComponentRow("", "Net", 0, None, "ok", calls=1, fwd_ms=4.0, bwd_ms=6.0, total_ms=10.0, share=1.0,
                     mfu=0.5, bw_util=0.25, noise=0.01),
        ComponentRow("a", "Linear", 1, "", "ok", calls=2, fwd_ms=0.123456, total_ms=0.8835, share=0.1767,
                     mfu=0.17671234, bw_util=0.0303, noise=0.125, fwd_flops=2147483648.0, bytes=132096.0,
                     peak_mem_mb=12.5, tflops=0.0012346, intensity=16.2566, details={"iqr_ms": 0.0123456789}),
    ]  # fmt: skip
    return Report(rows, {"device_name": "cpu"})


def test_the_csv_holds_percents_under_percent_headers(browser: object, tmp_path: Path) -> None:
    out = _units_report().save(tmp_path)  # Report.save writes the page (issue 14)
    with new_page(browser) as (page, log):
        _open_file(browser, page, out / HTML_FILE)
        with page.expect_download() as dl:
            page.click("#csv")
        table = {r["path"]: r for r in csv.DictReader(io.StringIO(Path(dl.value.path()).read_text()))}
        # the table shows share 0.1767 as "17.7" under "share %": the CSV the same unit, every digit
        assert _cell(page, "a", "share %") == "17.7"
        assert table["a"]["share %"] == "17.67"  # 0.1767 * 100
        assert (
            table["a"]["MFU %"] == "17.671234"
        )  # 0.17671234 * 100 (the float product 17.671234000000002, rounded to 15 digits)
        assert table["a"]["BW %"] == "3.03"  # 0.0303 * 100 (3.0300000000000002 in floats)
        assert table["a"]["noise %"] == "12.5"  # 0.125 * 100
        assert table["(root)"]["share %"] == "100" and table["(root)"]["MFU %"] == "50"
        assert table["a"]["total ms"] == "0.8835" and table["a"]["ms \u00d7 calls"] == "1.767"  # not scaled
        # the roll-ups too: Linear's share is 0.8835 ms x 2 calls / 10 ms = 0.1767 -> 17.67
        page.click(".tabs button[data-view='types']")
        groups = {r["group"]: r for r in csv.DictReader(io.StringIO(page.evaluate("window.cbViewer.csv()")))}
        assert groups["Linear"]["share %"] == "17.67" and groups["Linear"]["mean MFU %"] == "17.671234"
        assert log.errors == []


def test_the_table_and_tooltip_show_numbers_to_their_significance(browser: object, tmp_path: Path) -> None:
    """Issue 23 §4: a tiny Linear's FLOP is not "0.000" (GFLOP) beside its MFU; the page's rules are the text's."""
    # Linear(32, 32) on 64 rows: forward 2 * 64 * 32 * 32 = 131072 FLOP, backward twice that: 393216 in all
    rows = [
        ComponentRow("", "Net", 0, None, "ok", calls=1, fwd_ms=4.0, bwd_ms=0.0, total_ms=4.0, share=1.0,
                     fwd_flops=6e9, mfu=0.125),
        ComponentRow("fc", "Linear", 1, "", "ok", calls=1, fwd_ms=0.02, bwd_ms=0.04, total_ms=0.06, share=0.015,
                     fwd_flops=131072.0, bwd_flops=262144.0, tflops=0.00655, mfu=0.022, bw_util=2.19e-5),
    ]  # fmt: skip
    out = Report(rows, {"device_name": "cpu"}).save(tmp_path)
    with new_page(browser) as (page, log):
        _open_file(browser, page, out / HTML_FILE)
        assert "FLOP" in _headers(page) and "GFLOP" not in _headers(page)
        assert _cell(page, "fc", "FLOP") == "393 k" and _cell(page, "fc", "MFU %") == "2.20"  # was 0.000 beside 2.2
        assert _cell(page, "", "FLOP") == "6.00 G"
        assert _cell(page, "fc", "BW %") == "0.00219"  # 2.19e-5 * 100: not "0.0"
        assert _cell(page, "fc", "TFLOP/s") == "0.00655" and _cell(page, "fc", "total ms") == "0.0600"
        assert _cell(page, "", "bwd ms") == "0"  # exactly 0
        assert _cell(page, "", "BW %") == "-"  # missing
        assert "FLOP 393 k; TFLOP/s 0.00655; MFU 2.20 %" in _hover(page, "fc")
        # the CSV keeps every digit, the count unscaled under "FLOP"
        table = {r["path"]: r for r in csv.DictReader(io.StringIO(page.evaluate("window.cbViewer.csv()")))}
        assert table["fc"]["FLOP"] == "393216"
        assert log.errors == []


def test_the_details_show_numbers_with_units_and_four_significant_figures(browser: object, tmp_path: Path) -> None:
    out = _units_report().save(tmp_path)
    with new_page(browser) as (page, log):
        _open_file(browser, page, out / HTML_FILE)
        page.click('#table tr[data-path="a"]')

        def shown(key: str) -> str:
            return page.locator(f"#details dd[data-key='{key}']").inner_text()

        assert shown("mfu") == "17.67 %"  # 0.17671234 -> 17.671234 % -> 4 significant figures
        assert page.locator("#details dd[data-key='mfu']").get_attribute("title") == "0.17671234"  # the exact value
        assert shown("share") == "17.67 %" and shown("bw_util") == "3.03 %" and shown("noise") == "12.5 %"
        assert shown("fwd_ms") == "0.1235 ms"  # 0.123456
        assert shown("total_ms") == "0.8835 ms"
        assert shown("bwd_ms") == "-"  # NaN, saved as null
        assert shown("fwd_flops") == "2.147 GFLOP"  # 2147483648 = 2.147e9
        assert shown("bytes") == "132.1 kB"  # 132096 = 1.321e5 (decimal, as GB/s)
        assert shown("peak_mem_mb") == "12.5 MiB"
        assert shown("tflops") == "0.001235 TFLOP/s"  # 0.0012346
        assert shown("intensity") == "16.26 FLOP/byte"  # 16.2566
        assert shown("calls") == "2" and shown("depth") == "1" and shown("module_type") == "Linear"
        assert '"iqr_ms": 0.01235' in page.locator("#details pre").inner_text()  # 0.0123456789
        assert log.errors == []


def test_a_report_saved_elsewhere_links_its_own_copy_of_the_artifacts(
    browser: object, report_dir: Path, tmp_path: Path
) -> None:
    moved = Report.load(report_dir).save(tmp_path / "moved")
    with new_page(browser) as (page, log):
        _open(page, moved)
        page.click('#table tr[data-path="blocks.1.attn"]')
        href = page.locator("#details a.artifact[data-kind='ops']").evaluate("a => a.href")
        assert href == (moved / "artifacts" / "blocks.1.attn" / "ops.csv").as_uri()  # under the new directory
        assert Path(href.removeprefix("file://")).read_text() == "name,calls\naten::addmm,1\n"
        assert "aten::addmm" in page.locator("#details .op-table").inner_text()  # its top operators, from the copy
        assert log.errors == []


def test_a_row_without_a_time_shows_dash_in_every_time_cell(browser: object, tmp_path: Path) -> None:
    """Issue 23 §6: a skipped row showed ``ms × calls 0`` beside ``total ms -``; every time-derived cell is ``-``."""
    rows = [
        ComponentRow("", "Net", 0, None, "ok", calls=1, fwd_ms=3.0, bwd_ms=1.0, total_ms=4.0, share=1.0, noise=0.1),
        ComponentRow("skip", "Identity", 1, "", "skipped", calls=2),  # no time measured: NaN times
    ]
    out = Report(rows, {"device_name": "cpu"}).save(tmp_path)
    with new_page(browser) as (page, log):
        _open_file(browser, page, out / HTML_FILE)
        cells = {h: _cell(page, "skip", h) for h in ("fwd ms", "bwd ms", "total ms", "ms \u00d7 calls", "share %")}
        assert cells == dict.fromkeys(cells, "-")  # ms × calls was "0"
        assert _cell(page, "", "ms \u00d7 calls") == "4.00"  # 4.0 ms x 1 call
        assert log.errors == []


def test_the_diff_page_shows_the_cells_cb_diff_prints(browser: object, tmp_path: Path) -> None:
    """Issue 23 §6: the page's A, B, change, B/A cells are cb diff's (no "0.000", no hidden ratio, "-" untimed)."""
    from cb_callback._report.diff import compare_reports
    from cb_callback._report.html import write_diff_html

    def net(fc_ms: float) -> Report:
        return Report(
            [
                ComponentRow("", "Net", 0, None, "ok", calls=1, total_ms=20.0, noise=0.1),
                ComponentRow("fc", "Linear", 1, "", "ok", calls=1, total_ms=fc_ms, noise=1.0),
                ComponentRow("skip", "Identity", 1, "", "skipped", calls=2),
            ],
            {"device_name": "cpu"},
        )

    # fc 5.554 -> 16.011 within its noise (2 x 1.0 x 16.011 = 32.0): ratio 2.88 shown, sig "noise"
    a, b = net(5.554), net(16.011)
    page_file = write_diff_html(a, b, compare_reports(a, b), tmp_path / "diff.html")
    with new_page(browser) as (page, log):
        _open_file(browser, page, page_file)
        heads = ("A total_ms \u00d7 calls", "B total_ms \u00d7 calls", "change", "B/A", "sig")
        assert [_cell(page, "fc", h) for h in heads] == ["5.55", "16.0", "+10.5", "2.88\u00d7", "noise"]
        assert [_cell(page, "", h) for h in heads] == ["20.0", "20.0", "0", "1.00\u00d7", "unchanged"]
        assert [_cell(page, "skip", h) for h in (*heads, "ms \u00d7 calls")] == ["-", "-", "-", "-", "", "-"]
        assert log.errors == []
