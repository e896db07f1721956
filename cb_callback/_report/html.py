"""``report.html``: the interactive report, one self-contained page.

The page (``viewer_assets/``: an HTML template, a stylesheet and a script)
embeds the report's JSON once and draws an icicle of the component tree with
plotly, a table linked to it (sort, filter, roll-ups, CSV export), the details
of the selected component and the roofline (``roofline.js``: the points of
:mod:`cb_callback._report.roofline`, in the page's config). Written beside ``report.json`` it inlines
plotly.js, so it opens offline by double-click; the TensorBoard plugin serves
the same page with plotly from one of its routes instead.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Callable
from functools import lru_cache
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cb_callback._report.finite import finite

if TYPE_CHECKING:
    from cb_callback._report.diff import Comparison
    from cb_callback._report.model import Report

__all__ = ["HTML_FILE", "PAGE_DATA", "plotly_js", "render_html", "viewer_js", "write_diff_html", "write_html"]

_MARKER = re.compile(r"__(?:SCRIPT_ORIGINS|TITLE|CSS|CONFIG|DATA|JS|PLOTLY|QUALITY)__")

#: The header's quality box, filled by the viewer's script from ``metadata["quality"]``.
_QUALITY_BOX = '<div id="quality" class="quality"></div>'

#: The file name of the interactive report, beside ``report.json``.
HTML_FILE = "report.html"


def _asset(name: str) -> str:
    return files("cb_callback._report").joinpath("viewer_assets").joinpath(name).read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def plotly_js() -> str:
    """plotly.js as shipped inside the ``plotly`` Python package (for offline use).

    Raises:
        ImportError: naming the fix when ``plotly`` is not installed.
    """
    try:
        import plotly
    except ImportError as e:  # pragma: no cover - plotly is a dependency
        raise ImportError("report.html needs plotly: pip install plotly") from e
    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    return path.read_text(encoding="utf-8")


def viewer_js() -> str:
    """The viewer's scripts (served on their own by the TensorBoard plugin): ``viewer.js``, then
    ``roofline.js`` (the roofline chart, which reads the viewer's ``window.cbViewer``) and
    ``checkpoint.js`` (the checkpointing section)."""
    # ";" between them: separate scripts, whatever the one before ends with
    return _asset("viewer.js") + "\n;" + _asset("roofline.js") + "\n;" + _asset("checkpoint.js")


def _roofline(data: dict[str, Any]) -> dict[str, Any] | None:
    """The roofline's points, ceilings and what was left out (:func:`cb_callback._report.roofline.roofline_data`),
    as the page's chart draws them; ``None`` for rows that do not make a report."""
    from cb_callback._report.model import Report
    from cb_callback._report.roofline import roofline_data

    try:
        return roofline_data(Report.from_dict(data)).to_dict()
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


#: Data the layers above compute for a page from its report's dict, by the page config's key
#: (``cb_callback._api`` installs ``"checkpoint"``: the checkpointing plan's curve). A function
#: that raises gives ``{"error": "Type: message"}`` there instead; the diff page takes none.
PAGE_DATA: dict[str, Callable[[dict[str, Any]], Any]] = {}


def _page_data(data: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, compute in PAGE_DATA.items():
        try:
            out[key] = compute(data)
        except Exception as e:  # a page is still written without the section
            out[key] = {"error": f"{type(e).__name__}: {e}"}
    return out


def _json_for_script(value: object) -> str:
    """JSON that can sit inside a ``<script>`` element (no ``</script>`` early end)."""
    text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def render_html(
    report: Report | dict[str, Any],
    *,
    title: str | None = None,
    plotly_src: str | None = None,
    viewer_src: str | None = None,
    artifact_base: str = "",
    diff: dict[str, Any] | None = None,
    quality_html: str | None = None,
) -> str:
    """The interactive page of ``report``.

    Args:
        report: a :class:`Report` or its :meth:`Report.to_dict`.
        title: the page title; default "cb_callback components" and the device.
        plotly_src: a URL the page loads plotly.js from (the TensorBoard plugin's
            route); ``None`` inlines plotly.js, so the page needs nothing else.
        viewer_src: a URL the page loads the viewer's script from; ``None``
            inlines it. With both given the page has no inline script to run
            (a server's Content-Security-Policy need not allow any).
        artifact_base: prefix of the artifact links (``row.details["artifacts"]``
            holds paths relative to the report's directory).
        diff: for a diff page (:func:`write_diff_html`): what was compared; the
            rows carry ``details["diff"]`` and the icicle is coloured by change.
        quality_html: the header's quality box as HTML (an element with ``id="quality"``),
            written into the page as is; ``None``: the one the script fills from
            ``metadata["quality"]``. The diff page's shows both runs'.

    Returns:
        The HTML text.
    """
    data = report if isinstance(report, dict) else report.to_dict()
    meta = data.get("metadata") or {}
    if title is None:
        device = meta.get("device_name")
        title = "cb_callback components" + (f" \u2014 {device}" if device else "")
    if plotly_src is None:
        plotly_tag = "<script>\n" + plotly_js().replace("</script", "<\\/script") + "\n</script>"
    else:
        plotly_tag = f'<script src="{_attr(plotly_src)}"></script>'
    if viewer_src is None:
        viewer_tag = "<script>\n" + viewer_js() + "\n</script>"
    else:
        viewer_tag = f'<script src="{_attr(viewer_src)}"></script>'
    origins = ""
    values = {
        "__SCRIPT_ORIGINS__": origins,
        "__TITLE__": _text(title),
        "__CSS__": _asset("viewer.css"),
        # a diff page colours B's tree by change and draws no roofline and no section of the layers above
        "__CONFIG__": _json_for_script(
            {
                "artifactBase": artifact_base,
                "diff": diff,
                "roofline": None if diff else _roofline(data),
                **(_page_data(data) if diff is None else {}),
            }
        ),
        "__DATA__": _json_for_script(data),
        "__JS__": viewer_tag,
        "__PLOTLY__": plotly_tag,
        "__QUALITY__": _QUALITY_BOX if quality_html is None else quality_html,
    }
    # One pass: what is substituted (plotly.js, the report) is never scanned again.
    return _MARKER.sub(lambda m: values[m.group(0)], _asset("viewer.html"))


def read_ops_table(path: str | Path, top: int = 15) -> list[dict[str, str]]:
    """The first ``top`` rows of an ``ops`` artifact (``ops.csv``), as the page shows them."""
    with Path(path).open(newline="") as f:
        return [row for _, row in zip(range(top), csv.DictReader(f), strict=False)]


def with_artifact_tables(data: dict[str, Any], directory: str | Path, top: int = 15) -> dict[str, Any]:
    """``data`` (a report's dict) with each row's ``ops`` artifact read into ``details["ops_top"]``.

    The page shows the ``top`` operators of a component from its ``ops.csv``
    (written by the ``ops`` artifact, relative to ``directory``); a file that
    cannot be read, or that lies outside ``directory``, is skipped.
    ``report.json`` itself is not changed.
    """
    rows = []
    for row in data.get("rows") or []:
        arts = (row.get("details") or {}).get("artifacts") or {}
        if "ops" in arts:
            home = Path(directory).resolve()
            target = (home / str(arts["ops"])).resolve()
            table = None
            if target.is_relative_to(home):  # never a file outside the report's directory
                try:
                    table = read_ops_table(target, top)
                except (OSError, ValueError):
                    table = None
            if table:
                row = {**row, "details": {**row["details"], "ops_top": table}}
        rows.append(row)
    return {**data, "rows": rows}


def write_html(report: Report, directory: str | Path) -> Path:
    """Write ``report.html`` (plotly inlined) into ``directory``; returns its path.

    Each component's operator table (its ``ops`` artifact, if any) is shown in
    its details.
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    path = out / HTML_FILE
    path.write_text(render_html(with_artifact_tables(report.to_dict(), out)), encoding="utf-8")
    return path


def _diff_quality_html(comparison: Comparison, labels: tuple[str, str]) -> str:
    """The diff page's quality box: A's and B's verdict and advice, each labelled (hidden when neither has one).

    Its class is the worse verdict's (``contended`` over ``noisy`` over ``clean``), as the
    single report's box is styled by its verdict.
    """
    quality = getattr(comparison, "quality", None) or {}
    if not any(quality.get(k) for k in ("A", "B")):
        return '<div id="quality" class="quality" hidden></div>'
    parts, verdicts = [], []
    for key, label in zip(("A", "B"), labels, strict=True):
        q = quality.get(key) or {}
        verdict = str(q.get("verdict") or "not measured")
        verdicts.append(verdict)
        advice = "".join(f"<li>{_text(str(a))}</li>" for a in q.get("advice") or [])
        parts.append(
            f'<div class="quality-run" data-run="{key}"><b>{key}</b> ({_text(label)}): quality <b>{_text(verdict)}</b>'
            + (f"<ul>{advice}</ul>" if advice else "")
            + "</div>"
        )
    worst = next((v for v in ("contended", "noisy") if v in verdicts), "clean")
    return f'<div id="quality" class="quality {worst}">' + "".join(parts) + "</div>"


def write_diff_html(
    a: Report,
    b: Report,
    comparison: Comparison,
    path: str | Path,
    *,
    labels: tuple[str, str] = ("baseline", "compared"),
) -> Path:
    """A page of B's tree coloured by the change from A (blue faster, red slower, grey within noise).

    Its header shows both runs' quality (``metadata["quality"]``: the verdict and the advice
    of A and of B, each labelled); each row's ``details["diff"]`` holds A, B, the change, the
    ratio, the noise bound, ``sig`` (the word ``cb diff`` prints) and ``text``, the cells
    ``cb diff`` prints (:func:`cb_callback._report.diff.cell_texts`), which the page shows.

    Args:
        a: the baseline report.
        b: the report compared with it.
        comparison: :func:`cb_callback._report.diff.compare_reports` of the two.
        path: the HTML file to write.
        labels: what A and B are, as the header names them (``cb diff`` passes its two locations).
    """
    from cb_callback._report.diff import cell_texts, metric_kind

    data = b.to_dict()
    only_a = [r for r in a.to_dict()["rows"] if r["path"] not in {row["path"] for row in data["rows"]}]
    data["rows"] = data["rows"] + only_a
    by_path = {c.path: c for c in comparison.changes}
    for row in data["rows"]:
        c = by_path.get(row["path"])
        if c is None:
            continue
        values = {
            k: (v if isinstance(v, float) and finite(v) else None)
            for k, v in (("a", c.a), ("b", c.b), ("change", c.change), ("ratio", c.ratio), ("noise", c.noise))
        }
        text = cell_texts(c, comparison.metric)  # the cells cb diff prints: the page shows the same
        row.setdefault("details", {})["diff"] = {
            **values,
            "significant": c.significant,
            "only_in": c.only_in,
            "sig": text["sig"],
            "text": text,
        }
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    label = f"{comparison.metric} \u00d7 calls" if metric_kind(comparison.metric)[1] else comparison.metric
    title = f"cb_callback diff \u2014 {label}, B vs A"
    page = render_html(
        data,
        title=title,
        diff={"metric": comparison.metric, "label": label},
        quality_html=_diff_quality_html(comparison, labels),
    )
    out.write_text(page, encoding="utf-8")
    return out


def _text(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _attr(s: str) -> str:
    return _text(s).replace('"', "&quot;")
