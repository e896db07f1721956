"""The TensorBoard "Components" tab: the interactive report, served from the log directory.

Registered under the ``tensorboard_plugins`` entry point (``plugin_name =
"components"``). It is active when the log directory holds a component report
(a ``report.json`` written by :class:`cb_callback.ComponentBenchmark` or
``Report.save``). Its tab lists the reports (each run, and each of its captures
by step), opens on the most recently written one, and shows a report as
the same page as ``report.html`` (:func:`cb_callback._report.html.render_html`), with
plotly.js, the viewer's script and each row's artifacts served by the
plugin's own routes. No TensorFlow is needed.

Routes, under ``data/plugin/components/``:

- ``index.js``: the tab (an ES module TensorBoard imports into an iframe);
- ``runs``: JSON list of the reports: ``run`` (the report's directory relative to
  the log directory), ``group`` (the run it is a capture of: ``run`` without a
  last ``step_<N>`` folder, as ``ComponentBenchmark(capture_every=N)`` writes
  each capture), ``step``, ``created_at``, ``device_name``, ``components``, and
  ``newest`` (true for the most recently written one, which the tab opens
  on); grouped by ``group``, each group's captures by step. A ``report.json``
  that cannot be shown (its ``rows`` not a list of objects, its ``metadata`` not
  an object, a file that cannot be read) is listed after them as ``run``,
  ``group`` and ``unreadable`` (why), which the tab names beside the others, and
  logged once;
- ``report?run=RUN``: the page of one report;
- ``plotly.js``, ``viewer.js``: the page's scripts;
- ``artifact?run=RUN&path=PATH``: a file of that report's directory (artifact
  links are relative to it; nothing outside it is served).
"""

from __future__ import annotations

import json
import logging
import mimetypes
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from cb_callback._report.discover import REPORT_FILE, find_reports, run_of
from cb_callback._report.html import plotly_js, render_html, viewer_js, with_artifact_tables

__all__ = ["ComponentsPlugin"]

_REPORT_FILE = REPORT_FILE
_CACHE_S = 10.0
_log = logging.getLogger(__name__)


_INDEX_JS = r"""
// The "Components" tab: pick a report, see it. URLs are relative to this module's,
// so they reach the plugin's routes however TensorBoard loads the tab.
const base = new URL(".", import.meta.url);
export async function render() {
  document.body.style.margin = "0";
  document.body.style.fontFamily = "system-ui, sans-serif";
  const bar = document.createElement("div");
  bar.style.cssText = "padding:6px 10px;border-bottom:1px solid #ddd;font-size:13px";
  const label = document.createElement("label");
  label.textContent = "component report: ";
  const select = document.createElement("select");
  select.id = "cb-run";
  bar.append(label, select);
  const frame = document.createElement("iframe");
  frame.id = "cb-report";
  frame.style.cssText = "border:0;width:100%;height:calc(100vh - 40px)";
  document.body.append(bar, frame);
  const listed = await (await fetch(new URL("runs", base))).json();
  const runs = listed.filter((r) => !r.unreadable);
  const skipped = listed.filter((r) => r.unreadable).map((r) => `${r.run || "."} (${r.unreadable})`);
  if (!runs.length) {
    bar.textContent = skipped.length
      ? `No readable component report in this log directory; not shown: ${skipped.join("; ")}`
      : "No component report in this log directory yet.";
    frame.remove();
    return;
  }
  if (skipped.length) {
    const note = document.createElement("span");
    note.id = "cb-unreadable";
    note.style.cssText = "margin-left:12px;color:#a00";
    note.textContent = `not shown, unreadable: ${skipped.join("; ")}`;
    bar.append(note);
  }
  // One group per run, its captures by step (the route's order); the tab opens on the newest report.
  const groups = new Map();
  for (const r of runs) {
    let group = groups.get(r.group);
    if (!group) {
      group = document.createElement("optgroup");
      group.label = r.group || ".";
      groups.set(r.group, group);
      select.append(group);
    }
    const o = document.createElement("option");
    o.value = r.run;
    const device = r.device_name ? `, ${r.device_name}` : "";
    o.textContent = `step ${r.step ?? "?"} (${r.components} components${device})`;
    o.selected = Boolean(r.newest);
    group.append(o);
  }
  const show = () => { frame.src = new URL("report?run=" + encodeURIComponent(select.value), base).href; };
  select.addEventListener("change", show);
  show();
}
"""


def _unshowable(data: object) -> str | None:
    """Why a parsed ``report.json`` cannot be listed as a report (its ``rows`` or ``metadata`` of another
    kind); ``None``: it can."""
    if not isinstance(data, dict):
        return f"expected a JSON object, got {type(data).__name__}"
    rows = data.get("rows") or []
    if not isinstance(rows, list):
        return f"rows: expected a list, got {type(rows).__name__}"
    bad = next((i for i, row in enumerate(rows) if not isinstance(row, dict)), None)
    if bad is not None:
        return f"rows[{bad}]: expected an object, got {type(rows[bad]).__name__}"
    meta = data.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        return f"metadata: expected an object, got {type(meta).__name__}"
    return None


def _by_group_and_step(run: dict[str, Any]) -> tuple[str, int, float, str]:
    """The tab's order: by run, then step (a run's captures 8 < 10 < 500, not by name), no step first."""
    step = run["step"]
    number = isinstance(step, (int, float)) and not isinstance(step, bool)
    return (run["group"], int(number), float(step) if number else 0.0, run["run"])


class ComponentsPlugin(base_plugin.TBPlugin):
    """TensorBoard plugin serving component reports found in the log directory."""

    plugin_name = "components"

    def __init__(self, context: base_plugin.TBContext) -> None:
        self._logdir = Path(context.logdir or ".")
        self._cache: tuple[float, list[Path]] | None = None
        self._warned: set[tuple[Path, str]] = set()  # each unreadable report logged once

    def _reports(self) -> list[Path]:
        now = time.monotonic()
        if self._cache is None or now - self._cache[0] > _CACHE_S:
            self._cache = (now, find_reports(self._logdir))
        return self._cache[1]

    def is_active(self) -> bool:
        """Whether the log directory holds a component report (cached for 10 s)."""
        return bool(self._reports())

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="Components")

    def get_plugin_apps(self) -> dict[str, Any]:
        handlers = {
            "/index.js": self._serve_index,
            "/runs": self._serve_runs,
            "/report": self._serve_report,
            "/plotly.js": self._serve_plotly,
            "/viewer.js": self._serve_viewer,
            "/artifact": self._serve_artifact,
        }
        return {route: wrappers.Request.application(fn) for route, fn in handlers.items()}

    def _run_dir(self, run: str) -> Path | None:
        for d in self._reports():
            if self._name(d) == run:
                return d
        return None

    def _name(self, directory: Path) -> str:
        rel = directory.relative_to(self._logdir).as_posix()
        return "" if rel == "." else rel

    def _serve_index(self, request: wrappers.Request) -> wrappers.Response:
        return http_util.Respond(request, _INDEX_JS, "application/javascript")

    def _serve_runs(self, request: wrappers.Request) -> wrappers.Response:
        out: list[dict[str, Any]] = []
        mtimes: list[float] = []
        unreadable: list[dict[str, Any]] = []
        for d in self._reports():
            try:
                data = json.loads((d / _REPORT_FILE).read_text(), parse_constant=lambda _: None)
                mtime = (d / _REPORT_FILE).stat().st_mtime
                why = _unshowable(data)
            except (OSError, ValueError) as e:
                why = f"cannot read it: {e}"
            if why is not None:  # skipped and named: the other runs are listed all the same
                unreadable.append({"run": self._name(d), "group": self._name(run_of(d)), "unreadable": why})
                if (d, why) not in self._warned:
                    self._warned.add((d, why))
                    _log.warning("cb_callback: the Components tab skips %s: %s", d / _REPORT_FILE, why)
                continue
            meta = data.get("metadata")
            meta = meta if isinstance(meta, dict) else {}
            step = meta.get("capture_step", meta.get("step"))
            device = meta.get("device_name")
            out.append(
                {
                    "run": self._name(d),
                    "group": self._name(run_of(d)),
                    "step": step if isinstance(step, (int, float)) and not isinstance(step, bool) else None,
                    "created_at": meta.get("created_at"),
                    "device_name": device if isinstance(device, str) else None,
                    "components": len(data.get("rows") or []),
                    "newest": False,
                }
            )
            mtimes.append(mtime)
        if out:
            out[max(range(len(out)), key=mtimes.__getitem__)]["newest"] = True
        out.sort(key=_by_group_and_step)
        return http_util.Respond(request, out + unreadable, "application/json")

    def _serve_report(self, request: wrappers.Request) -> wrappers.Response:
        run = request.args.get("run", "")
        d = self._run_dir(run)
        if d is None:
            return http_util.Respond(request, f"no component report {run!r}", "text/plain", code=404)
        try:
            # NaN/Infinity (written by other tools) become null, as Report.to_dict writes them.
            raw = json.loads((d / _REPORT_FILE).read_text(), parse_constant=lambda _: None)
            page = render_html(
                with_artifact_tables(raw, d),
                plotly_src="plotly.js",
                viewer_src="viewer.js",
                artifact_base=f"artifact?run={quote(run, safe='')}&path=",
            )
        except (OSError, ValueError, TypeError, AttributeError) as e:
            return http_util.Respond(request, f"cannot show {run!r}: {e}", "text/plain", code=422)
        return http_util.Respond(request, page, "text/html")

    def _serve_plotly(self, request: wrappers.Request) -> wrappers.Response:
        return http_util.Respond(request, plotly_js(), "application/javascript", expires=3600)

    def _serve_viewer(self, request: wrappers.Request) -> wrappers.Response:
        return http_util.Respond(request, viewer_js(), "application/javascript")

    def _serve_artifact(self, request: wrappers.Request) -> wrappers.Response:
        d = self._run_dir(request.args.get("run", ""))
        rel = request.args.get("path", "")
        if d is None or not rel:
            return http_util.Respond(request, "no such artifact", "text/plain", code=404)
        target = (d / rel).resolve()
        if not target.is_relative_to(d.resolve()) or not target.is_file():
            return http_util.Respond(request, "no such artifact", "text/plain", code=404)
        ctype = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        if target.suffix == ".gz":
            ctype = "application/gzip"
        return http_util.Respond(request, target.read_bytes(), ctype)
