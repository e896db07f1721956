"""The TensorBoard "Components" tab: routes, activity, and a real `tensorboard --logdir` in a browser."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn
from werkzeug.test import Client

from cb_callback import profile_components
from cb_callback._report.discover import find_reports
from cb_callback._report.tb_plugin import ComponentsPlugin
from tests._browser import own_page

FAST = dict(min_run_time_s=0.0, min_repeats=2, max_repeats=2, rounds=1)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Lightning-like log directory: version_0/component_benchmark/report.json (+ an artifact)."""
    root = tmp_path_factory.mktemp("tblogs")
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    report = profile_components(model, (torch.randn(4, 8),), **FAST)
    out = root / "version_0" / "component_benchmark"
    (out / "artifacts" / "0").mkdir(parents=True)
    (out / "artifacts" / "0" / "ops.csv").write_text("name,calls\naten::addmm,1\n")
    report.row("0").details["artifacts"] = {"ops": "artifacts/0/ops.csv"}
    report.metadata["capture_step"] = 3  # what the callback records
    report.save(out)
    (root / "version_1").mkdir()  # a run without a report
    (root / "version_1" / "report.json").write_text('["not ours"]')
    return root


def _app(logdir: Path) -> Client:
    from tensorboard.plugins import base_plugin

    plugin = ComponentsPlugin(base_plugin.TBContext(logdir=str(logdir)))
    routes = plugin.get_plugin_apps()

    def app(environ: dict, start_response: object) -> object:
        path = environ["PATH_INFO"]
        handler = routes.get(path)
        if handler is None:
            start_response("404 NOT FOUND", [])  # type: ignore[operator]
            return [b""]
        return handler(environ, start_response)

    return Client(app)


def test_reports_are_found_and_the_plugin_is_active_only_with_one(logdir: Path, tmp_path: Path) -> None:
    from tensorboard.plugins import base_plugin

    assert find_reports(logdir) == [logdir / "version_0" / "component_benchmark"]  # version_1's is not ours
    assert ComponentsPlugin(base_plugin.TBContext(logdir=str(logdir))).is_active()
    assert not ComponentsPlugin(base_plugin.TBContext(logdir=str(tmp_path))).is_active()
    assert ComponentsPlugin.plugin_name == "components"


def test_routes_serve_runs_page_scripts_and_only_the_reports_files(logdir: Path) -> None:
    client = _app(logdir)
    runs = json.loads(client.get("/runs").get_data())
    assert runs == [
        {
            "run": "version_0/component_benchmark",
            "group": "version_0/component_benchmark",  # one capture: its own run
            "newest": True,
            "step": 3,
            "components": 4,
            "created_at": runs[0]["created_at"],
            "device_name": runs[0]["device_name"],
        }
    ]
    page = client.get("/report", query_string={"run": "version_0/component_benchmark"}).get_data(as_text=True)
    # the same page as report.html, with plotly and the viewer from the plugin's routes
    assert '<script src="plotly.js"></script>' in page and '<script src="viewer.js"></script>' in page
    assert '"artifactBase":"artifact?run=version_0%2Fcomponent_benchmark&path="' in page
    assert client.get("/plotly.js").get_data(as_text=True).lstrip().startswith("/**\n* plotly.js")
    art = client.get("/artifact", query_string={"run": "version_0/component_benchmark", "path": "artifacts/0/ops.csv"})
    assert art.status_code == 200 and art.get_data(as_text=True).startswith("name,calls")
    for bad in ("../../version_1/report.json", "/etc/passwd", "report.json/.."):
        r = client.get("/artifact", query_string={"run": "version_0/component_benchmark", "path": bad})
        assert r.status_code == 404, bad
    assert client.get("/report", query_string={"run": "nope"}).status_code == 404


def test_a_foreign_report_with_nan_or_garbage_is_shown_or_refused_not_a_500(tmp_path: Path) -> None:
    good = tmp_path / "nan"
    good.mkdir()
    (good / "report.json").write_text('{"metadata": {}, "rows": [{"path": "", "total_ms": NaN}]}')
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "report.json").write_text('{"metadata": {}, "rows": [oops')
    client = _app(tmp_path)
    ok = client.get("/report", query_string={"run": "nan"})
    assert ok.status_code == 200 and '"total_ms":null' in ok.get_data(as_text=True)
    refused = client.get("/report", query_string={"run": "bad"})
    assert refused.status_code == 422 and refused.get_data(as_text=True).startswith("cannot show 'bad'")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def tensorboard_url(logdir: Path) -> Iterator[str]:
    """A real ``tensorboard --logdir`` on 127.0.0.1, stopped afterwards."""
    port = _free_port()
    exe = Path(sys.executable).with_name("tensorboard")
    proc = subprocess.Popen(
        [str(exe), "--logdir", str(logdir), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(url + "/data/plugins_listing", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail("tensorboard did not start within 60 s")
                time.sleep(0.1)  # polled: it starts in a few seconds
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_real_tensorboard_lists_the_plugin_as_active(tensorboard_url: str) -> None:
    listing = json.loads(urllib.request.urlopen(tensorboard_url + "/data/plugins_listing", timeout=10).read())
    assert listing["components"]["enabled"] is True
    assert listing["components"]["tab_name"] == "Components"
    assert listing["components"]["loading_mechanism"] == {
        "type": "IFRAME",
        "module_path": "/data/plugin/components/index.js",
    }


def test_the_components_tab_renders_the_tree(browser: object, tensorboard_url: str) -> None:
    with own_page(browser) as (page, log):  # a site of its own: its own context (storage)
        page.goto(tensorboard_url + "/#components")
        deadline = time.monotonic() + 60
        frame = None
        while True:
            frame = next((f for f in page.frames if "/data/plugin/components/report?run=" in f.url), None)
            if frame is not None or time.monotonic() > deadline:
                break
            page.wait_for_timeout(50)
        assert frame is not None, [f.url for f in page.frames]
        # (locators, not wait_for_function: the page's CSP allows no eval, as it should)
        frame.locator("#icicle g.slice").nth(3).wait_for()
        assert frame.locator("#icicle g.slice").count() == 4
        assert frame.locator("#table tbody tr").count() == 4
        frame.click('#table tr[data-path="0"]')
        href = frame.locator("#details a.artifact").evaluate("a => a.href")
        body = urllib.request.urlopen(href, timeout=10).read().decode()
        assert body.startswith("name,calls")  # the artifact link resolves through the plugin's route
        assert [e for e in log.errors if "components" in e] == []


# --- one run, several captures (ComponentBenchmark(capture_every=N)) -----------------------------

CAPTURES = (8, 10, 500)  # by name step_10 < step_500 < step_8: neither the name's order nor the first is the newest


@pytest.fixture(scope="module")
def stepped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """version_0: a capture every N steps (step_<N>/report.json, written in step order); version_1: one capture."""
    import os

    from cb_callback import ComponentRow, Report

    root = tmp_path_factory.mktemp("tbsteps")
    for i, step in enumerate(CAPTURES):
        out = root / "version_0" / "component_benchmark" / f"step_{step}"
        Report([ComponentRow("", "Net", 0, None, "ok", calls=1, total_ms=1.0)], {"capture_step": step}).save(out)
        os.utime(out / "report.json", (1_000 + i, 1_000 + i))
    single = root / "version_1" / "component_benchmark"
    Report([ComponentRow("", "Net", 0, None, "ok", calls=1, total_ms=1.0)], {"capture_step": 3}).save(single)
    os.utime(single / "report.json", (500, 500))  # older than every capture of version_0
    (root / "version_2").mkdir()  # a hand-edited report: named by the tab, not listed
    (root / "version_2" / "report.json").write_text('{"metadata": {}, "rows": 5}')
    return root


def test_runs_list_each_capture_by_step_and_mark_the_newest(stepped: Path) -> None:
    runs = json.loads(_app(stepped).get("/runs").get_data())
    # grouped by run, each run's captures by step (8 < 10 < 500, not by name); the newest written
    # (version_0's step 500, mtime 1002) is the one the tab shows first
    assert [(r["group"], r["run"], r["step"], r["newest"]) for r in runs[:4]] == [
        ("version_0/component_benchmark", "version_0/component_benchmark/step_8", 8, False),
        ("version_0/component_benchmark", "version_0/component_benchmark/step_10", 10, False),
        ("version_0/component_benchmark", "version_0/component_benchmark/step_500", 500, True),
        ("version_1/component_benchmark", "version_1/component_benchmark", 3, False),
    ]
    assert runs[4:] == [{"run": "version_2", "group": "version_2", "unreadable": "rows: expected a list, got int"}]


@pytest.fixture(scope="module")
def plugin_url(stepped: Path) -> Iterator[str]:
    """The plugin's routes under TensorBoard's prefix, plus a page that loads the tab as TensorBoard does."""
    import threading

    from tensorboard.plugins import base_plugin
    from werkzeug.serving import make_server
    from werkzeug.wrappers import Response

    routes = ComponentsPlugin(base_plugin.TBContext(logdir=str(stepped))).get_plugin_apps()
    prefix = "/data/plugin/components"
    harness = f'<!doctype html><script type="module">import {{render}} from "{prefix}/index.js"; render();</script>'

    def app(environ: dict, start_response: object) -> object:
        path = environ["PATH_INFO"]
        if path == "/":
            return Response(harness, mimetype="text/html")(environ, start_response)
        if path == "/favicon.ico":  # the browser asks; TensorBoard has one
            return Response(b"", status=204)(environ, start_response)
        handler = routes.get(path.removeprefix(prefix)) if path.startswith(prefix) else None
        if handler is None:
            return Response("", status=404)(environ, start_response)
        return handler(environ, start_response)

    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(timeout=10)


def test_the_tab_shows_the_newest_capture_and_lists_the_others_by_step(browser: object, plugin_url: str) -> None:
    with own_page(browser) as (page, log):  # a site of its own: its own context (storage)
        page.goto(plugin_url + "/")
        page.locator("#cb-run option").nth(3).wait_for(state="attached")
        assert page.locator("#cb-run").input_value() == "version_0/component_benchmark/step_500"
        groups = page.locator("#cb-run optgroup").evaluate_all("gs => gs.map(g => g.label)")
        assert groups == ["version_0/component_benchmark", "version_1/component_benchmark"]
        labels = page.locator("#cb-run option").evaluate_all("os => os.map(o => o.textContent)")
        assert labels == [
            "step 8 (1 components)",
            "step 10 (1 components)",
            "step 500 (1 components)",
            "step 3 (1 components)",
        ]
        src = page.locator("#cb-report").get_attribute("src") or ""
        assert src.endswith("report?run=version_0%2Fcomponent_benchmark%2Fstep_500")
        # the unreadable one is named beside the list, not offered in it
        assert page.locator("#cb-unreadable").text_content() == (
            "not shown, unreadable: version_2 (rows: expected a list, got int)"
        )
        assert log.errors == []


def test_an_unreadable_report_is_named_and_the_others_still_listed(
    logdir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import shutil

    shutil.copytree(logdir / "version_0", tmp_path / "good")
    for name, content in {
        "rows": '{"metadata": {}, "rows": 5}',
        "row": '{"metadata": {}, "rows": [{"path": ""}, 7]}',
        "meta": '{"metadata": [1], "rows": []}',
    }.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "report.json").write_text(content)
    (tmp_path / "step").mkdir()  # a step of another kind: listed without one
    (tmp_path / "step" / "report.json").write_text('{"metadata": {"capture_step": [1]}, "rows": []}')
    client = _app(tmp_path)
    with caplog.at_level("WARNING", logger="cb_callback._report.tb_plugin"):
        runs = json.loads(client.get("/runs").get_data())
        json.loads(client.get("/runs").get_data())  # logged once per report, not per request
    assert [(r["run"], r.get("step"), r.get("unreadable")) for r in runs] == [
        ("good/component_benchmark", 3, None),
        ("step", None, None),
        ("meta", None, "metadata: expected an object, got list"),
        ("row", None, "rows[1]: expected an object, got int"),
        ("rows", None, "rows: expected a list, got int"),
    ]
    assert [r.getMessage() for r in caplog.records] == [
        f"cb_callback: the Components tab skips {tmp_path / name / 'report.json'}: {why}"
        for name, why in [
            ("meta", "metadata: expected an object, got list"),
            ("row", "rows[1]: expected an object, got int"),
            ("rows", "rows: expected a list, got int"),
        ]
    ]
    # the newest among the readable: step (written now; copytree kept good's older time), never an unreadable one
    assert [r.get("newest") for r in runs] == [False, True, None, None, None]
