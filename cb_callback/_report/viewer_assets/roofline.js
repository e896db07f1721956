/* cb_callback report viewer: the roofline (docs/columns.md, "The roofline chart").
 *
 * Draws the points the page's config carries (config.roofline: cb_callback/_report/roofline.py's
 * roofline_data, the same points as roofline.png): one per measured pass, x FLOP/byte, y TFLOP/s,
 * under the device's FLOP/s roof and each bandwidth roof, log-log; beside it, a narrow panel of the
 * passes with no FLOPs counted (config.roofline.bandwidth): their achieved GB/s against the ceiling that
 * bounds them, one column per ceiling. Runs after viewer.js and uses
 * its window.cbViewer: a click selects the component (the details pane, as the icicle does), the
 * table's filters hide the points of the rows they hide, and the selected component is outlined.
 */
(function () {
  "use strict";

  var gd = document.getElementById("roofline");
  var noteEl = document.getElementById("roofline-note");
  var configEl = document.getElementById("cb-config");
  var config = configEl ? JSON.parse(configEl.textContent) : {};
  var data = config.roofline;
  var viewer = window.cbViewer;
  if (!gd || !viewer || typeof Plotly === "undefined") return;
  if (!data || config.diff) {  // no report's points (a diff page colours the icicle by change instead)
    document.getElementById("roofline-section").hidden = true;
    return;
  }

  /* As roofline.png: tab10 without its grey (next to "other types"); the ceilings black/grey dashes. */
  var PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf"];
  var OTHER = "#9e9e9e", OTHER_NAME = "other types";
  var CEILING_STYLES = [["#222222", "solid"], ["#222222", "dash"], ["#444444", "dashdot"], ["#444444", "dot"], ["#666666", "dash"]];
  var SYMBOLS = { fwd: "circle", bwd: "triangle-up" };
  var points = data.points || [];
  var bandwidth = data.bandwidth || [];
  var ceilings = data.ceilings || [];
  var peak = typeof data.peak_flops === "number" ? data.peak_flops / 1e12 : null;

  function isNum(v) { return typeof v === "number" && isFinite(v); }
  /* For plotly's hover text (and the note): plotly decodes &amp; &lt; &gt; and numeric entities (not
   * &quot;), so a quote is &#34;; no tag of a module path survives as markup. */
  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&#34;", "'": "&#39;" }[c];
    });
  }
  function pct(v) { return isNum(v) ? sig(v * 100) + " %" : "-"; }
  function sig(v) { return isNum(v) ? String(Number(v.toPrecision(3))) : "-"; }
  /* A count with an SI prefix (the table's "12.0 G"). */
  function si(v, unit) {
    if (!isNum(v)) return "-";
    var prefixes = ["", "k", "M", "G", "T", "P"], i = 0;
    while (Math.abs(v) >= 1000 && i < prefixes.length - 1) { v /= 1000; i++; }
    return sig(v) + " " + prefixes[i] + unit;
  }

  /* A colour per module type, the types with most time over the step first (as roofline.png). */
  var weight = new Map();
  points.concat(bandwidth).forEach(function (p) { weight.set(p.module_type, (weight.get(p.module_type) || 0) + p.ms * Math.max(p.calls || 0, 1)); });
  var ranked = Array.from(weight.keys()).sort(function (a, b) { return weight.get(b) - weight.get(a); });
  /* The legend's groups: the first PALETTE.length types, then every other type as one grey "other types". */
  function group(t) { var i = ranked.indexOf(t); return i >= 0 && i < PALETTE.length ? t : OTHER_NAME; }
  var groups = ranked.slice(0, PALETTE.length).concat(ranked.length > PALETTE.length ? [OTHER_NAME] : []);
  function colour(g) { var i = groups.indexOf(g); return g !== OTHER_NAME && i >= 0 ? PALETTE[i] : OTHER; }
  function size(p) { return isNum(p.share) ? 7 + 28 * Math.sqrt(Math.min(Math.max(p.share, 0), 1)) : 7; }

  /* The axes hold every point and ridge (not only the shown ones: filtering does not move them). */
  function range(values) {
    var v = values.filter(function (x) { return isNum(x) && x > 0; });
    if (!v.length) return [-1, 2];
    return [Math.log10(Math.min.apply(null, v) / 4), Math.log10(Math.max.apply(null, v) * 4)];
  }
  var xr = range(points.map(function (p) { return p.intensity; }).concat(ceilings.map(function (c) { return c.ridge; })));
  var yr = range(points.map(function (p) { return p.tflops; }).concat(peak ? [peak] : []));
  var x0 = Math.pow(10, xr[0]), x1 = Math.pow(10, xr[1]);

  function ceilingTraces() {
    var out = [];
    ceilings.forEach(function (c, i) {
      var end = isNum(c.ridge) ? c.ridge : x1, style = CEILING_STYLES[i % CEILING_STYLES.length];
      out.push({
        type: "scatter", mode: "lines", name: c.name + " " + sig(c.bandwidth / 1e9) + " GB/s",
        x: [x0, end], y: [c.bandwidth * x0 / 1e12, c.bandwidth * end / 1e12],
        line: { color: style[0], dash: style[1], width: 2 }, hoverinfo: "name"
      });
      if (peak && isNum(c.ridge)) {
        out.push({
          type: "scatter", mode: "markers", showlegend: false, x: [c.ridge], y: [peak],
          marker: { symbol: "diamond", size: 9, color: style[0] },
          hovertemplate: esc(c.name) + " ridge: " + sig(c.ridge) + " FLOP/byte<extra></extra>"
        });
      }
    });
    if (peak) {
      var start = ceilings.length ? Math.min.apply(null, ceilings.map(function (c) { return isNum(c.ridge) ? c.ridge : x0; })) : x0;
      out.push({
        type: "scatter", mode: "lines", name: "peak " + sig(peak) + " TFLOP/s", x: [start, x1], y: [peak, peak],
        line: { color: "#000000", width: 2 }, hoverinfo: "name"
      });
    }
    return out;
  }
  function hover(p) {
    return "<b>" + esc(p.path === "" ? "(root)" : p.path) + "</b> (" + esc(p.module_type) + "), " + (p.pass_name === "fwd" ? "forward" : "backward") +
      "<br>" + sig(p.intensity) + " FLOP/byte; " + sig(p.tflops) + " TFLOP/s" +
      "<br>" + sig(p.ms) + " ms per call; " + si(p.flops, "FLOP") + "; " + si(p.bytes, "B") +
      "<br>share of the step " + pct(p.share) + "; headroom " + sig(p.headroom_ms) + " ms per call (both passes)";
  }
  function bandwidthHover(p) {
    return "<b>" + esc(p.path === "" ? "(root)" : p.path) + "</b> (" + esc(p.module_type) + "), " + (p.pass_name === "fwd" ? "forward" : "backward") +
      "<br>no FLOPs counted; " + sig(p.gbps) + " GB/s" + (isNum(p.ceiling_gbps) ? " of " + esc(p.ceiling) + "'s " + sig(p.ceiling_gbps) +
      " GB/s (" + pct(p.gbps / p.ceiling_gbps) + ")" : " (no ceiling: no peaks)") +
      "<br>" + sig(p.ms) + " ms per call; " + si(p.bytes, "B") +
      "<br>share of the step " + pct(p.share) + "; headroom " + sig(p.headroom_ms) + " ms per call (both passes)";
  }
  /* The bandwidth panel's columns: each ceiling bounding a pass there, fastest first; a pass's x is its
   * column, spread across it (the strip: equal GB/s do not hide each other). */
  function colKey(p) { return (p.ceiling === null ? "no ceiling" : p.ceiling) + "\u0000" + p.ceiling_gbps; }
  var columns = [];
  bandwidth.forEach(function (p) {
    if (!columns.some(function (c) { return c.key === colKey(p); })) columns.push({ key: colKey(p), name: p.ceiling === null ? "no ceiling" : p.ceiling, gbps: p.ceiling_gbps });
  });
  columns.sort(function (a, b) { return (isNum(b.gbps) ? b.gbps : -1) - (isNum(a.gbps) ? a.gbps : -1); });
  var bx = new Map();
  columns.forEach(function (c, i) {
    var mine = bandwidth.filter(function (p) { return colKey(p) === c.key; }).sort(function (a, b) { return b.gbps - a.gbps; });
    mine.forEach(function (p, j) { bx.set(p, i - 0.3 + 0.6 * (j + 0.5) / mine.length); });
  });
  var b2 = range(bandwidth.map(function (p) { return p.gbps; }).concat(columns.map(function (c) { return c.gbps; })));
  function bandwidthCeilings() {
    return columns.filter(function (c) { return isNum(c.gbps); }).map(function (c) {
      var i = columns.indexOf(c);
      return {
        type: "scatter", mode: "lines", showlegend: false, xaxis: "x2", yaxis: "y2", x: [i - 0.45, i + 0.45], y: [c.gbps, c.gbps],
        line: { color: "#222222", width: 2 }, hovertemplate: esc(c.name) + " " + sig(c.gbps) + " GB/s<extra></extra>"
      };
    });
  }
  /* One trace per legend group and panel (the group's legend entry once), the passes told apart by their symbol. */
  function pointTraces(shown, shownBandwidth) {
    var selected = viewer.state.selected, out = [], named = new Set();
    function trace(g, mine, side) {
      if (!mine.length) return;
      out.push({
        type: "scatter", mode: "markers", name: g, legendgroup: g, showlegend: !named.has(g),
        xaxis: side ? "x2" : "x", yaxis: side ? "y2" : "y",
        x: mine.map(function (p) { return side ? bx.get(p) : p.intensity; }),
        y: mine.map(function (p) { return side ? p.gbps : p.tflops; }),
        customdata: mine.map(function (p) { return p.path; }),
        text: mine.map(side ? bandwidthHover : hover), hovertemplate: "%{text}<extra></extra>",
        marker: {
          color: colour(g), opacity: 0.8, size: mine.map(size), symbol: mine.map(function (p) { return SYMBOLS[p.pass_name]; }),
          line: { color: mine.map(function (p) { return p.path === selected ? "#2f6fde" : "#333333"; }),
            width: mine.map(function (p) { return p.path === selected ? 3 : 0.5; }) }
        }
      });
      named.add(g);
    }
    groups.forEach(function (g) {
      trace(g, shown.filter(function (p) { return group(p.module_type) === g; }), false);
      trace(g, shownBandwidth.filter(function (p) { return group(p.module_type) === g; }), true);
    });
    return out;
  }
  function visible(list) {
    var paths = new Set(viewer.visiblePaths());
    return list.filter(function (p) { return paths.has(p.path); });
  }
  function shownPoints() { return visible(points); }
  function layout() {
    var side = bandwidth.length > 0;
    var out = {
      margin: { t: 30, l: 60, r: 10, b: 46 }, hovermode: "closest",
      title: { text: "roofline: every measured pass (\u25cf forward, \u25b2 backward; area: share of the step; colour: module type)", font: { size: 13 } },
      xaxis: { type: "log", range: xr, domain: side ? [0, 0.74] : [0, 1], title: { text: "arithmetic intensity (FLOP / byte moved)" } },
      yaxis: { type: "log", range: yr, title: { text: "achieved TFLOP/s" } },
      legend: { font: { size: 11 } }
    };
    if (side) {
      out.xaxis2 = { domain: [0.82, 1], anchor: "y2", range: [-0.6, columns.length - 0.4], tickvals: columns.map(function (c, i) { return i; }),
        ticktext: columns.map(function (c) { return esc(c.name); }), zeroline: false, showgrid: false };
      out.yaxis2 = { type: "log", range: b2, anchor: "x2", title: { text: "achieved GB/s" } };
      out.annotations = [{ xref: "x2 domain", yref: "paper", x: 0.5, y: 1.0, yanchor: "bottom", showarrow: false, font: { size: 11 },
        text: "passes with no FLOPs counted:<br>GB/s against the ceiling bounding them" }];
    }
    return out;
  }
  function draw() {
    var shown = shownPoints(), shownBandwidth = visible(bandwidth);
    var traces = ceilingTraces().concat(bandwidthCeilings(), pointTraces(shown, shownBandwidth));
    Plotly.react(gd, traces, layout(), { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["toImage"] });
    var roof = peak !== null || ceilings.length
      ? "A point\u2019s distance below the roof above it is its headroom (headroom_ms)"
      : "No peaks in this report: no roof is drawn, no headroom";
    var panel = bandwidth.length ? " and " + shownBandwidth.length + " of " + bandwidth.length + " passes with no FLOPs counted (the bandwidth panel)" : "";
    noteEl.innerHTML = esc(shown.length + " of " + points.length + " points" + panel + " shown (the table's filters hide the rest); " + data.left_out_text) +
      ". " + roof + "; click a point to select its component.";
  }

  draw();
  gd.on("plotly_click", function (ev) {
    var p = ev && ev.points && ev.points[0];
    if (p && typeof p.customdata === "string") viewer.select(p.customdata);
  });
  ["f-path", "f-status", "f-type", "f-bound", "f-depth"].forEach(function (id) {
    var el = document.getElementById(id);
    if (el) el.addEventListener(id === "f-path" ? "input" : "change", draw);
  });
  document.addEventListener("cb-select", draw);

  /* For tests and the console: the points shown, and where one is on the page (CSS pixels). */
  window.cbRoofline = {
    shown: function () { return shownPoints().concat(visible(bandwidth)).map(function (p) { return p.path + ":" + p.pass_name; }); },
    where: function (path, passName) {
      function at(q) { return q.path === path && q.pass_name === passName; }
      var p = points.filter(at)[0], b = bandwidth.filter(at)[0];
      var fl = gd._fullLayout, box = gd.getBoundingClientRect();
      if (p) return { x: box.left + fl._size.l + fl.xaxis.l2p(Math.log10(p.intensity)), y: box.top + fl._size.t + fl.yaxis.l2p(Math.log10(p.tflops)) };
      if (!b) return null;
      return { x: box.left + fl.xaxis2._offset + fl.xaxis2.l2p(bx.get(b)), y: box.top + fl.yaxis2._offset + fl.yaxis2.l2p(Math.log10(b.gbps)) };
    }
  };
})();
