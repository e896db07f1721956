/* cb_callback report viewer: the roofline (docs/columns.md, "The roofline chart").
 *
 * Draws the points the page's config carries (config.roofline: cb_callback/_report/roofline.py's
 * roofline_data, the same points as roofline.png): one per measured pass, x FLOP/byte, y TFLOP/s,
 * under the device's FLOP/s roof and each bandwidth roof, log-log. Runs after viewer.js and uses
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

  var PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  var CEILING_COLOURS = ["#1f3b73", "#2f6fde", "#5fa35a", "#e08a2c", "#b3261e", "#6a5acd"];
  var SYMBOLS = { fwd: "circle", bwd: "triangle-up" };
  var points = data.points || [];
  var ceilings = data.ceilings || [];
  var peak = typeof data.peak_flops === "number" ? data.peak_flops / 1e12 : null;

  function isNum(v) { return typeof v === "number" && isFinite(v); }
  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }
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
  points.forEach(function (p) { weight.set(p.module_type, (weight.get(p.module_type) || 0) + p.ms * Math.max(p.calls || 0, 1)); });
  var types = Array.from(weight.keys()).sort(function (a, b) { return weight.get(b) - weight.get(a); });
  function colour(t) { var i = types.indexOf(t); return i >= 0 && i < PALETTE.length - 1 ? PALETTE[i] : PALETTE[PALETTE.length - 1]; }
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
      var end = isNum(c.ridge) ? c.ridge : x1;
      out.push({
        type: "scatter", mode: "lines", name: c.name + " " + sig(c.bandwidth / 1e9) + " GB/s",
        x: [x0, end], y: [c.bandwidth * x0 / 1e12, c.bandwidth * end / 1e12],
        line: { color: CEILING_COLOURS[i % CEILING_COLOURS.length], width: 2 }, hoverinfo: "name"
      });
      if (peak && isNum(c.ridge)) {
        out.push({
          type: "scatter", mode: "markers", showlegend: false, x: [c.ridge], y: [peak],
          marker: { symbol: "diamond", size: 9, color: CEILING_COLOURS[i % CEILING_COLOURS.length] },
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
      "<br>share of the step " + sig(p.share * 100) + " %; headroom " + sig(p.headroom_ms) + " ms per call (both passes)";
  }
  /* One trace per module type (its legend entry), the passes told apart by their symbol. */
  function pointTraces(shown) {
    var selected = viewer.state.selected;
    return types.map(function (t) {
      var mine = shown.filter(function (p) { return p.module_type === t; });
      return {
        type: "scatter", mode: "markers", name: t, x: mine.map(function (p) { return p.intensity; }),
        y: mine.map(function (p) { return p.tflops; }),
        customdata: mine.map(function (p) { return p.path; }),
        text: mine.map(hover), hovertemplate: "%{text}<extra></extra>",
        marker: {
          color: colour(t), opacity: 0.8, size: mine.map(size), symbol: mine.map(function (p) { return SYMBOLS[p.pass_name]; }),
          line: { color: mine.map(function (p) { return p.path === selected ? "#2f6fde" : "#333333"; }),
            width: mine.map(function (p) { return p.path === selected ? 3 : 0.5; }) }
        }
      };
    }).filter(function (tr) { return tr.x.length; });
  }
  function shownPoints() {
    var visible = new Set(viewer.visiblePaths());
    return points.filter(function (p) { return visible.has(p.path); });
  }
  function draw() {
    var shown = shownPoints();
    var layout = {
      margin: { t: 30, l: 60, r: 10, b: 46 }, hovermode: "closest",
      title: { text: "roofline: every measured pass (\u25cf forward, \u25b2 backward; area: share of the step; colour: module type)", font: { size: 13 } },
      xaxis: { type: "log", range: xr, title: { text: "arithmetic intensity (FLOP / byte moved)" } },
      yaxis: { type: "log", range: yr, title: { text: "achieved TFLOP/s" } },
      legend: { font: { size: 11 } }
    };
    Plotly.react(gd, ceilingTraces().concat(pointTraces(shown)), layout, { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["toImage"] });
    noteEl.innerHTML = esc(shown.length + " of " + points.length + " points shown (the table's filters hide the rest); " + data.left_out_text) +
      '. A point\u2019s distance below the roof above it is its headroom (headroom_ms); click one to select its component.';
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
    shown: function () { return shownPoints().map(function (p) { return p.path + ":" + p.pass_name; }); },
    where: function (path, passName) {
      var p = points.filter(function (q) { return q.path === path && q.pass_name === passName; })[0];
      if (!p) return null;
      var fl = gd._fullLayout, box = gd.getBoundingClientRect();
      return { x: box.left + fl._size.l + fl.xaxis.l2p(Math.log10(p.intensity)), y: box.top + fl._size.t + fl.yaxis.l2p(Math.log10(p.tflops)) };
    }
  };
})();
