/* cb_callback report viewer.
 *
 * Reads the report embedded in <script id="cb-data" type="application/json">
 * (the report.json written beside the page, embedded once) and draws:
 * an icicle of the component tree (plotly), a table linked to it (sort, filter,
 * roll-ups, CSV export) and the details of the selected component.
 * No request leaves the page: plotly is inline (report.html) or served by the
 * TensorBoard plugin's own route.
 */
(function () {
  "use strict";

  var ROOT_ID = "(root)";
  var data = JSON.parse(document.getElementById("cb-data").textContent);
  var rows = data.rows || [];
  var meta = data.metadata || {};
  var configEl = document.getElementById("cb-config");
  var config = configEl ? JSON.parse(configEl.textContent) : {};
  var artifactBase = config.artifactBase || "";

  function isNum(v) { return typeof v === "number" && isFinite(v); }
  function nodeId(path) { return path === "" ? ROOT_ID : path; }
  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }
  /* Numbers as cb_callback/_report/numbers.py shows them: n significant figures, trailing zeros kept
   * ("4.00", "0.0420"), no exponent from 1e-6 up; a value that is not 0 never shows as 0, exactly 0
   * is "0"; "-" when missing. */
  function sigFixed(v, n) {
    if (!isNum(v)) return "-";
    if (v === 0) return "0";
    var e = Number(v.toExponential(n - 1).split("e")[1]);  // the exponent once rounded (9.996 -> 1 at 3)
    return e < -6 || e > 15 ? v.toExponential(n - 1).replace("e+", "e") : v.toFixed(Math.max(n - 1 - e, 0));
  }
  /* v × scale to 3 significant figures (a "%" column passes 100). */
  function num(v, scale) { return isNum(v) ? sigFixed(v * (scale || 1), 3) : "-"; }

  var byPath = new Map();
  rows.forEach(function (r) { byPath.set(r.path, r); });
  var children = new Map();
  rows.forEach(function (r) {
    if (r.parent !== null && r.parent !== undefined && byPath.has(r.parent)) {
      if (!children.has(r.parent)) children.set(r.parent, []);
      children.get(r.parent).push(r);
    }
  });
  var root = byPath.get("") || rows[0];

  /* Time over the step: per-call total times the calls (at least 1). */
  function stepMs(r) { return isNum(r.total_ms) ? r.total_ms * Math.max(r.calls || 0, 1) : 0; }
  /* The same as a cell shows it: NaN ("-") for a row without a time (skipped, failed), never "0". */
  function timedStepMs(r) { return isNum(r.total_ms) ? stepMs(r) : NaN; }
  /* A parent's own time: what its children do not cover (never below 0). */
  function ownMs(r) {
    var kids = children.get(r.path) || [];
    var covered = kids.reduce(function (s, k) { return s + stepMs(k); }, 0);
    return Math.max(stepMs(r) - covered, 0);
  }
  function flagsOf(r) { return (r.details && r.details.flags) || []; }
  function asRep(r) { return !!(r && r.details && r.details.as === "representative"); }
  function totalFlop(r) {
    var f = [r.fwd_flops, r.bwd_flops].filter(isNum);
    return f.length ? f.reduce(function (a, b) { return a + b; }, 0) : NaN;
  }
  /* Several batches (profile_components(batches=...)): the row is their median. */
  var nBatches = isNum(meta.batches) ? meta.batches : 1;
  function batchesOf(r) { return r.details && Array.isArray(r.details.batches) ? r.details.batches : null; }
  function p90Of(r) { return r.details && isNum(r.details.p90_ms) ? r.details.p90_ms : NaN; }
  /* The compile what-if (compile=True): details.compile, compiled_ms, compile_speedup. */
  function compileOf(r) {
    var c = r.details && r.details.compile;
    return c && typeof c === "object" && !Array.isArray(c) ? c : null;
  }
  var anyCompiled = rows.some(function (r) { return isNum(r.compiled_ms); });
  /* Several ranks (a sharded or data-parallel run): details.ranks spreads each row over the ranks;
   * collectives per component (comm_bytes, details.comm); a planner's estimate (details.planned). */
  function ranksOf(r) { var k = r.details && r.details.ranks; return k && k.total_ms ? k : null; }
  /* (slowest - fastest rank) / median rank of total ms: 0 when the ranks agree. */
  function spreadOf(r) {
    var k = ranksOf(r), t = k && k.total_ms;
    return t && isNum(t.max) && isNum(t.min) && isNum(t.median) && t.median > 0 ? (t.max - t.min) / t.median : NaN;
  }
  var SPREAD_WARN = 0.1, SPREAD_BAD = 0.25;
  /* Imbalanced: above SPREAD_WARN and above twice the row's own noise (run-to-run variation explains less). */
  function spreadClass(v, r) {
    if (!isNum(v) || v <= SPREAD_WARN || (r && isNum(r.noise) && v <= 2 * r.noise)) return "";
    return v > SPREAD_BAD ? "imbalance-bad" : "imbalance";
  }
  function plannedOf(r) { var p = r.details && r.details.planned; return p && typeof p === "object" && !p.error ? p : null; }
  function planned(r, key) { var p = plannedOf(r); return p && p.planned_on_split && isNum(p.planned_on_split[key]) ? p.planned_on_split[key] : NaN; }
  function vsPlanned(r, key) { var p = plannedOf(r); return p && p.ratio && isNum(p.ratio[key]) ? p.ratio[key] : NaN; }
  var anyRanks = rows.some(ranksOf);
  var anyComm = rows.some(function (r) { return isNum(r.comm_bytes) && r.comm_bytes > 0; });
  var anyPlanned = rows.some(plannedOf);

  /* --- metrics a node can be coloured by --------------------------------------- */
  var METRICS = {
    time: { label: "time over the step (ms)", value: timedStepMs, scale: 1, unit: "ms" },
    mfu: { label: "MFU (%)", value: function (r) { return r.mfu; }, scale: 100, unit: "%" },
    tflops: { label: "TFLOP/s", value: function (r) { return r.tflops; }, scale: 1, unit: "" },
    bw_util: { label: "bandwidth utilisation (%)", value: function (r) { return r.bw_util; }, scale: 100, unit: "%" },
    peak_mem_mb: { label: "peak memory (MiB)", value: function (r) { return r.peak_mem_mb; }, scale: 1, unit: "MiB" },
    noise: { label: "noise (IQR / median, %)", value: function (r) { return r.noise; }, scale: 100, unit: "%" },
    bound: { label: "bound", categorical: { compute: "#3b6fc4", memory: "#e08a2c", latency: "#8c8c8c" }, value: function (r) { return r.bound; } },
    status: {
      label: "status",
      categorical: { ok: "#5fa35a", estimated: "#e8b62c", failed: "#c62828", skipped: "#9e9e9e", not_run: "#d6d6d6" },
      value: function (r) { return r.status; }
    }
  };
  if (anyCompiled) {
    METRICS.compile_speedup = {
      label: "compile speed-up (eager \u00f7 compiled, \u00d7)", value: function (r) { return r.compile_speedup; }, scale: 1, unit: "\u00d7"
    };
  }
  if (anyRanks) {
    METRICS.rank_spread = {
      label: "rank spread ((slowest − fastest) ÷ median rank, %)", value: spreadOf, scale: 100, unit: "%"
    };
  }
  var NAN_COLOR = "#d0d0d0";
  function diffOf(r) { return (r.details && r.details.diff) || null; }
  if (config.diff) {
    METRICS.change = {
      label: "change B \u2212 A (" + (config.diff.label || config.diff.metric + " \u00d7 calls") + ")",
      diverging: true,
      value: function (r) {
        var d = diffOf(r);
        if (!d || d.change === null || d.change === undefined) return NaN;
        return d.significant ? d.change : 0;  // within noise: no colour
      }
    };
  }
  // viridis, 9 stops
  var RAMP = ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725"];

  function hexToRgb(h) { return [parseInt(h.slice(1, 3), 16), parseInt(h.slice(3, 5), 16), parseInt(h.slice(5, 7), 16)]; }
  function ramp(t) {
    t = Math.min(Math.max(t, 0), 1) * (RAMP.length - 1);
    var i = Math.min(Math.floor(t), RAMP.length - 2), f = t - i;
    var a = hexToRgb(RAMP[i]), b = hexToRgb(RAMP[i + 1]);
    var c = a.map(function (x, k) { return Math.round(x + (b[k] - x) * f); });
    return "rgb(" + c.join(",") + ")";
  }
  /* The colour range is that of the leaf-most measured components (a parent sums
   * its children, and the root would dominate every time-like metric), with the
   * 95th percentile as its top, so hotspots stand out; parents above it saturate. */
  function isLeafMost(r) {
    return r !== root && !(children.get(r.path) || []).some(function (k) { return k.status === "ok" || k.status === "estimated"; });
  }
  function scaleFor(metric) {
    var m = METRICS[metric];
    var vals = rows.filter(isLeafMost).map(m.value).filter(isNum).sort(function (a, b) { return a - b; });
    if (!vals.length) return { lo: 0, hi: 1 };
    var hi = vals[Math.min(vals.length - 1, Math.floor(0.95 * (vals.length - 1) + 0.5))];
    var lo = Math.min(0, vals[0]);
    return { lo: lo, hi: hi > lo ? hi : lo + 1 };
  }
  function diverge(v, hi) {
    var t = Math.max(-1, Math.min(1, v / hi)), a = Math.abs(t);
    var end = t < 0 ? [33, 102, 172] : [178, 24, 43], mid = [247, 247, 247];
    var c = mid.map(function (x, k) { return Math.round(x + (end[k] - x) * a); });
    return "rgb(" + c.join(",") + ")";
  }
  function colorsFor(metric) {
    var m = METRICS[metric];
    if (m.categorical) return rows.map(function (r) { return m.categorical[m.value(r)] || NAN_COLOR; });
    if (m.diverging) {
      var mags = rows.filter(isLeafMost).map(m.value).filter(isNum).map(Math.abs).sort(function (a, b) { return a - b; });
      var hi = mags.length ? mags[Math.floor(0.95 * (mags.length - 1) + 0.5)] || 1 : 1;
      return rows.map(function (r) { var v = m.value(r); return isNum(v) ? diverge(v, hi) : NAN_COLOR; });
    }
    var s = scaleFor(metric);
    return rows.map(function (r) {
      var v = m.value(r);
      return isNum(v) ? ramp((v - s.lo) / (s.hi - s.lo)) : NAN_COLOR;
    });
  }

  /* --- the icicle ---------------------------------------------------------------- */
  var state = { metric: config.diff ? "change" : "time", selected: null, sortKey: "step", sortDir: -1, view: "components" };
  var gd = document.getElementById("icicle");

  function label(r) {
    var name = r.path === "" ? ROOT_ID : r.path.split(".").pop();
    if (r.parent !== null && r.parent !== undefined && /^\d+$/.test(name)) {
      name = r.parent.split(".").pop() + "." + name;  // "layers.3", not a bare "3"
    }
    if (r.status === "estimated") return "\u2248 " + name;
    if (r.status === "failed") return "\u2717 " + name;
    return name;
  }
  function hoverText(r) {
    var lines = [
      "<b>" + esc(r.path === "" ? ROOT_ID : r.path) + "</b> (" + esc(r.module_type) + ")",
      "status: " + esc(r.status) + (r.error ? " \u2014 " + esc(String(r.error).slice(0, 120)) : ""),
      "calls: " + esc(r.calls) + "; share: " + num(r.share, 100) + " %",
      "fwd " + num(r.fwd_ms) + " + bwd " + num(r.bwd_ms) + " = " + num(r.total_ms) + " ms per call",
      "FLOP " + siText(totalFlop(r), "", 3, true) + "; TFLOP/s " + num(r.tflops) + "; MFU " + num(r.mfu, 100) + " %",
      "GB/s " + num(r.gbps) + "; BW util " + num(r.bw_util, 100) + " %; bound " + esc(r.bound || "-"),
      "peak " + num(r.peak_mem_mb) + " MiB; activations " + num(r.activation_mb) + " MiB; params " + num(r.params_mb) + " MiB",
      "noise " + num(r.noise, 100) + " %" + (flagsOf(r).length ? "; flags: " + esc(flagsOf(r).join(", ")) : "")
    ];
    var b = batchesOf(r);
    if (isNum(p90Of(r))) lines.push("p90 " + num(p90Of(r)) + " ms over " + esc(b ? b.length : nBatches) + " batches");
    var c = compileOf(r);
    if (isNum(r.compiled_ms)) lines.push("compiled " + num(r.compiled_ms) + " ms (\u00d7" + num(r.compile_speedup) + ")");
    else if (c && c.error) lines.push("compile failed: " + esc(String(c.error).slice(0, 80)));
    else if (c && c.skipped) lines.push("compile skipped: " + esc(String(c.skipped).slice(0, 80)));
    return lines.join("<br>");
  }
  /* Outline colours mark the selection, estimated and failed nodes. The width is
   * one number: plotly's pathbar breaks (NaN geometry) with a per-node width array. */
  function lineStyle() {
    return {
      color: rows.map(function (r) {
        if (r.path === state.selected) return "#2f6fde";
        if (r.status === "failed") return "#b3261e";
        if (r.status === "estimated") return "#b35c00";
        return "#ffffff";
      }),
      width: 2.5
    };
  }
  function drawIcicle() {
    var trace = {
      type: "icicle",
      ids: rows.map(function (r) { return nodeId(r.path); }),
      labels: rows.map(label),
      parents: rows.map(function (r) {
        return r.parent !== null && r.parent !== undefined && byPath.has(r.parent) ? nodeId(r.parent) : "";
      }),
      values: rows.map(ownMs),
      branchvalues: "remainder",
      customdata: rows.map(hoverText),
      hovertemplate: "%{customdata}<extra></extra>",
      marker: { colors: colorsFor(state.metric), line: lineStyle() },
      tiling: { orientation: "v" },
      pathbar: { visible: true, side: "top", thickness: 22, textfont: { size: 12 } },
      sort: false,
      textinfo: "label"
    };
    var layout = { margin: { t: 28, l: 4, r: 4, b: 4 }, uniformtext: { minsize: 9, mode: "hide" } };
    Plotly.newPlot(gd, [trace], layout, { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["toImage"] });
    gd.on("plotly_click", function (ev) {
      if (ev && ev.points && ev.points.length) {
        var id = ev.points[0].id;
        select(id === ROOT_ID ? "" : id, false);
      }
      return true;  // let plotly zoom into the clicked node
    });
    drawLegend();
  }
  function recolor() {
    Plotly.restyle(gd, { "marker.colors": [colorsFor(state.metric)] });
    drawLegend();
  }
  function drawLegend() {
    var m = METRICS[state.metric], el = document.getElementById("legend");
    var html;
    if (m.diverging) {
      html = esc(m.label) + ': <span style="color:#2166ac">\u25a0 faster</span> \u00b7 <span style="color:#999">\u25a0 within noise / unchanged</span> \u00b7 <span style="color:#b2182b">\u25a0 slower</span>';
    } else if (m.categorical) {
      html = esc(m.label) + ": " + Object.keys(m.categorical).map(function (k) {
        return '<span><span style="display:inline-block;width:10px;height:10px;background:' + m.categorical[k] + '"></span> ' + esc(k) + "</span>";
      }).join(" &nbsp; ");
    } else {
      var s = scaleFor(state.metric);
      var stops = RAMP.map(function (c, i) { return c + " " + (100 * i / (RAMP.length - 1)).toFixed(0) + "%"; }).join(",");
      html = esc(m.label) + ": " + num(s.lo, m.scale) + ' <span style="display:inline-block;width:160px;height:10px;vertical-align:middle;background:linear-gradient(to right,' + stops + ')"></span> ' + num(s.hi, m.scale) + "+ (range of the leaf-most components; parents above it saturate; grey: no value)";
    }
    el.innerHTML = html + '<br>Width: time over the step. A parent is as wide as its own time plus its children\u2019s: the part its children do not cover is its <b>own time</b> (work between its children). \u2248 estimated from children, \u2717 failed.';
  }

  /* --- the table ------------------------------------------------------------------- */
  var COLS = [
    { key: "path", label: "path", get: function (r) { return r.path === "" ? ROOT_ID : r.path; } },
    { key: "module_type", label: "type", get: function (r) { return r.module_type; } },
    { key: "status", label: "status", get: function (r) { return r.status; },
      show: function (v, r) { return esc(v) + (asRep(r) ? ' <span class="as-rep" title="taken from ' + esc(r.details.from || ROOT_ID) + ', a representative of its repeated structure">as rep</span>' : "") + (r && r.details && r.details.as === "insitu" ? ' <span class="as-insitu" title="not replayed alone: its in-situ time inside the step, its FLOPs and bytes from the step\'s census">in situ</span>' : ""); } },
    { key: "calls", label: "calls", num: true, get: function (r) { return r.calls; }, show: function (v) { return esc(v); } },
    { key: "fwd_ms", label: "fwd ms", num: true, get: function (r) { return r.fwd_ms; }, show: function (v) { return num(v); } },
    { key: "bwd_ms", label: "bwd ms", num: true, get: function (r) { return r.bwd_ms; }, show: function (v) { return num(v); } },
    { key: "total_ms", label: "total ms", num: true, get: function (r) { return r.total_ms; }, show: function (v) { return num(v); } },
    { key: "step", label: "ms \u00d7 calls", num: true, get: timedStepMs, show: function (v) { return num(v); } },
    { key: "share", label: "share %", num: true, scale: 100, get: function (r) { return r.share; }, show: function (v) { return num(v, 100); } },
    { key: "noise", label: "noise %", num: true, scale: 100, get: function (r) { return r.noise; }, show: function (v) { return num(v, 100); } },
    { key: "flop", label: "FLOP", num: true, title: "forward + backward FLOP per call, with an SI prefix (k, M, G: 10^3, 10^6, 10^9)",
      get: totalFlop, show: function (v) { return siText(v, "", 3, true); } },
    { key: "tflops", label: "TFLOP/s", num: true, get: function (r) { return r.tflops; }, show: function (v) { return num(v); } },
    { key: "mfu", label: "MFU %", num: true, scale: 100, get: function (r) { return r.mfu; }, show: function (v) { return num(v, 100); } },
    { key: "gbps", label: "GB/s", num: true, get: function (r) { return r.gbps; }, show: function (v) { return num(v); } },
    { key: "bw_util", label: "BW %", num: true, scale: 100, get: function (r) { return r.bw_util; }, show: function (v) { return num(v, 100); } },
    { key: "peak_mem_mb", label: "peak MiB", num: true, get: function (r) { return r.peak_mem_mb; }, show: function (v) { return num(v); } },
    { key: "bound", label: "bound", get: function (r) { return r.bound || "-"; } },
    { key: "flags", label: "flags", get: function (r) { return flagsOf(r).join(" "); } }
  ];
  function colIndex(key) { for (var i = 0; i < COLS.length; i++) if (COLS[i].key === key) return i; return -1; }
  if (nBatches > 1) {
    var totalCol = COLS[colIndex("total_ms")];
    totalCol.label = "median ms";
    totalCol.title = "fwd + bwd per call: the median over the " + nBatches + " batches";
    COLS.splice(colIndex("total_ms") + 1, 0, {
      key: "p90_ms", label: "p90 ms", num: true, title: "90th percentile of fwd + bwd per call over the " + nBatches + " batches",
      get: p90Of, show: function (v) { return num(v); }
    });
  }
  if (anyCompiled) {
    COLS.splice(colIndex("noise") + 1, 0,
      { key: "compiled_ms", label: "compiled ms", num: true, title: "fwd + bwd per call of the component compiled alone (torch.compile)",
        get: function (r) { return r.compiled_ms; }, show: function (v) { return num(v); } },
      { key: "compile_speedup", label: "compile \u00d7", num: true, title: "speed-up: eager total ms \u00f7 compiled ms (above 1: compiling helps)",
        get: function (r) { return r.compile_speedup; }, show: function (v) { return num(v); } });
  }
  if (rows.some(function (r) { return isNum(r.insitu_ms); })) {
    COLS.splice(colIndex("fwd_ms") + 1, 0,
      { key: "insitu_ms", label: "in-situ fwd ms", num: true,
        title: "forward per call inside the real forward (the in-situ pass), beside the isolated fwd; flag insitu_mismatch when they disagree beyond noise",
        get: function (r) { return r.insitu_ms; }, show: function (v) { return num(v); } });
  }
  if (anyComm) {
    COLS.splice(colIndex("bw_util") + 1, 0,
      { key: "comm_bytes", label: "comm KiB", num: true, scale: 1 / 1024,
        title: "payload of the component's collectives per call, forward and backward (nccl-tests' count)",
        get: function (r) { return r.comm_bytes; }, show: function (v) { return num(v, 1 / 1024); } },
      { key: "comm_ms", label: "comm ms", num: true,
        title: "time in those collectives per call, each waited for as it was issued (passes of their own)",
        get: function (r) { return r.comm_ms; }, show: function (v) { return num(v); } });
  }
  if (anyRanks) {
    COLS.splice(colIndex("total_ms") + 1, 0, {
      key: "rank_spread", label: "rank spread %", num: true, scale: 100,
      title: "(slowest − fastest rank) ÷ median rank of total ms; amber above " + SPREAD_WARN * 100 +
        " %, red above " + SPREAD_BAD * 100 + " %, unless within twice the row's noise (details: every rank, the straggler)",
      get: spreadOf, show: function (v) { return num(v, 100); }, cls: spreadClass
    });
  }
  if (anyPlanned) {
    COLS.splice(colIndex("total_ms") + 1, 0,
      { key: "planned_ms", label: "planned ms", num: true,
        title: "the planner's estimate of fwd + bwd per call (torchrec: its Perf total plus the input all-to-all)",
        get: function (r) { return planned(r, "total_ms"); }, show: function (v) { return num(v); } },
      { key: "vs_planned", label: "× planned", num: true, title: "measured total ms ÷ planned ms",
        get: function (r) { return vsPlanned(r, "total_ms"); }, show: function (v) { return isNum(v) ? sig(v, 3) : "-"; } });
  }
  if (rows.some(function (r) { return isNum(r.headroom_ms); })) {
    COLS.splice(colIndex("bound") + 1, 0,
      { key: "headroom_ms", label: "headroom ms", num: true,
        title: "per call: what the component would save at its own roof, forward + backward, each pass its time minus max(FLOP \u00f7 peak FLOP/s, bytes \u00f7 the bandwidth that bounds it) (docs/columns.md, Headroom); times calls, the summary's \u201cwhere optimisation pays most\u201d",
        get: function (r) { return r.headroom_ms; }, show: function (v) { return num(v); } });
  }
  if (config.diff) {
    /* The cells cb diff prints (details.diff.text: cb_callback._report.diff.cell_texts), sorted by the number. */
    var dcol = function (key, label) {
      return {
        key: "diff_" + key, label: label, num: true,
        get: function (r) { var d = diffOf(r); return d && d[key] !== null && d[key] !== undefined ? d[key] : NaN; },
        show: function (v, r) { var d = diffOf(r); return esc(d && d.text && d.text[key] !== undefined ? d.text[key] : num(v)); }
      };
    };
    var dlabel = config.diff.label || (config.diff.metric + " \u00d7 calls");
    COLS.splice(3, 0, dcol("a", "A " + dlabel), dcol("b", "B " + dlabel), dcol("change", "change"), dcol("ratio", "B/A"),
      { key: "diff_sig", label: "sig", get: function (r) { var d = diffOf(r); return !d ? "" : typeof d.sig === "string" ? d.sig : d.only_in ? "only in " + d.only_in : ""; } });
  }
  var GROUP_COLS = [
    { key: "group", label: "group", get: function (g) { return g.group; } },
    { key: "count", label: "count", num: true, get: function (g) { return g.count; }, show: esc },
    { key: "step", label: "ms \u00d7 calls", num: true, get: function (g) { return g.step; }, show: function (v) { return num(v); } },
    { key: "share", label: "share %", num: true, scale: 100, get: function (g) { return g.share; }, show: function (v) { return num(v, 100); } },
    { key: "mfu", label: "mean MFU %", num: true, scale: 100, get: function (g) { return g.mfu; }, show: function (v) { return num(v, 100); } }
  ];

  function globToRegExp(glob) {
    var re = glob.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".");
    return new RegExp("^" + re + "$", "i");
  }
  function filters() {
    return {
      path: document.getElementById("f-path").value.trim(),
      status: document.getElementById("f-status").value,
      type: document.getElementById("f-type").value,
      bound: document.getElementById("f-bound").value,
      depth: document.getElementById("f-depth").value
    };
  }
  function passes(r, f) {
    var shown = r.path === "" ? ROOT_ID : r.path;
    if (f.path) {
      if (/[*?]/.test(f.path)) { if (!globToRegExp(f.path).test(shown)) return false; }
      else if (shown.toLowerCase().indexOf(f.path.toLowerCase()) < 0) return false;
    }
    if (f.status && r.status !== f.status) return false;
    if (f.type && r.module_type !== f.type) return false;
    if (f.bound && (r.bound || "-") !== f.bound) return false;
    if (f.depth !== "" && r.depth > Number(f.depth)) return false;
    return true;
  }
  function visibleRows() {
    var f = filters();
    var col = COLS.filter(function (c) { return c.key === state.sortKey; })[0] || COLS[colIndex("step")];
    return rows.filter(function (r) { return passes(r, f); }).sort(function (a, b) {
      var x = col.get(a), y = col.get(b);
      if (col.num) {
        x = isNum(x) ? x : -Infinity; y = isNum(y) ? y : -Infinity;
        return (x - y) * state.sortDir;
      }
      return String(x).localeCompare(String(y)) * state.sortDir;
    });
  }
  function pattern(path) { return path.split(".").map(function (s) { return /^\d+$/.test(s) ? "*" : s; }).join("."); }
  function groups(kind) {
    var f = filters(), out = new Map(), rootStep = stepMs(root) || NaN;
    rows.forEach(function (r) {
      if (!passes(r, f) || (r.status !== "ok" && r.status !== "estimated")) return;
      var key = kind === "types" ? r.module_type : pattern(r.path === "" ? ROOT_ID : r.path);
      if (!out.has(key)) out.set(key, { group: key, count: 0, step: 0, flops: 0, seconds: 0, peakTime: 0, mfuTime: 0 });
      var g = out.get(key), t = stepMs(r);
      g.count += 1; g.step += t;
      if (isNum(r.mfu)) { g.mfuTime += r.mfu * t; g.peakTime += t; }
    });
    var list = Array.from(out.values()).map(function (g) {
      g.share = g.step / rootStep;
      g.mfu = g.peakTime > 0 ? g.mfuTime / g.peakTime : NaN;  // latency-weighted mean
      return g;
    });
    if (kind === "structure") list = list.filter(function (g) { return g.count >= 2; });
    var col = GROUP_COLS.filter(function (c) { return c.key === state.sortKey; })[0] || GROUP_COLS[2];
    return list.sort(function (a, b) {
      var x = col.get(a), y = col.get(b);
      if (col.num) { x = isNum(x) ? x : -Infinity; y = isNum(y) ? y : -Infinity; return (x - y) * state.sortDir; }
      return String(x).localeCompare(String(y)) * state.sortDir;
    });
  }
  function currentTable() {
    if (state.view === "components") {
      return { cols: COLS, items: visibleRows(), key: function (r) { return r.path; } };
    }
    return { cols: GROUP_COLS, items: groups(state.view), key: null };
  }
  function drawTable() {
    var t = currentTable();
    var head = "<tr>" + t.cols.map(function (c) {
      var cls = (c.num ? "num " : "") + (c.key === state.sortKey ? (state.sortDir > 0 ? "sorted-asc" : "sorted-desc") : "");
      return '<th data-key="' + esc(c.key) + '" class="' + cls + '"' + (c.title ? ' title="' + esc(c.title) + '"' : "") + ">" + esc(c.label) + "</th>";
    }).join("") + "</tr>";
    var body = t.items.map(function (item) {
      var attrs = t.key ? ' data-path="' + esc(t.key(item)) + '"' + (t.key(item) === state.selected ? ' class="selected"' : "") : "";
      return "<tr" + attrs + ">" + t.cols.map(function (c) {
        var v = c.get(item);
        var text = c.show ? c.show(v, item) : esc(v);
        if (c.key === "flags" && v) text = flagsOf(item).map(function (x) { return '<span class="flag">' + esc(x) + "</span>"; }).join("");
        var cls = (c.num ? "num" : "") + (c.key === "status" ? " status-" + esc(v) : "") + (c.cls ? " " + c.cls(v, item) : "");
        return '<td class="' + cls + '">' + text + "</td>";
      }).join("") + "</tr>";
    }).join("");
    document.getElementById("table").innerHTML = "<thead>" + head + "</thead><tbody>" + body + "</tbody>";
    document.getElementById("shown").textContent = t.items.length + " of " + (state.view === "components" ? rows.length + " components" : "groups");
  }
  /* The CSV of what is shown: the table's headers over the table's units (a "%" column holds
   * percents, 17.67 for a share of 0.1767), every digit kept (15 significant: the scaling's
   * rounding error dropped); missing values are empty. */
  function toCsv() {
    var t = currentTable();
    function cell(v) {
      var s = v === null || v === undefined || (typeof v === "number" && !isFinite(v)) ? "" : String(v);
      return /[",\n]/.test(s) ? '"' + s.replace(/"/g, '""') + '"' : s;
    }
    function value(c, item) {
      var v = c.get(item);
      return c.scale && isNum(v) ? Number((v * c.scale).toPrecision(15)) : v;
    }
    var lines = [t.cols.map(function (c) { return cell(c.label); }).join(",")];
    t.items.forEach(function (item) { lines.push(t.cols.map(function (c) { return cell(value(c, item)); }).join(",")); });
    return lines.join("\n") + "\n";
  }

  /* --- details ------------------------------------------------------------------------ */
  function yesNo(v) { return v === true ? "yes" : v === false ? "no" : "-"; }
  function sci(v) { return isNum(v) ? (v === 0 ? "0" : v.toExponential(2)) : "-"; }
  function kv(k, v) { return "<dt>" + esc(k) + "</dt><dd>" + v + "</dd>"; }  // v: already escaped
  /* Each batch the component ran in (profile_components(batches=...)), with its compiled time if any. */
  function batchesSection(r) {
    var b = batchesOf(r), det = r.details || {};
    if (!b) return "";
    var c = compileOf(r) || {}, perCompile = new Map();
    (Array.isArray(c.batches) ? c.batches : []).forEach(function (x) { if (x && x.batch !== undefined) perCompile.set(x.batch, x); });
    var cols = [
      ["batch", function (x) { return esc(x.batch); }, ""],
      ["status", function (x) { return esc(x.status); }, ""],
      ["calls", function (x) { return esc(x.calls); }, "num"],
      ["fwd ms", function (x) { return num(x.fwd_ms); }, "num"],
      ["bwd ms", function (x) { return num(x.bwd_ms); }, "num"],
      ["total ms", function (x) { return num(x.total_ms); }, "num"]
    ];
    if (perCompile.size) cols.push(["compiled ms", function (x) { var p = perCompile.get(x.batch); return p ? num(p.compiled_ms) : "-"; }, "num"]);
    var summary = [];
    if (isNum(det.median_ms)) summary.push("median " + num(det.median_ms) + " ms");
    if (isNum(det.p90_ms)) summary.push("p90 " + num(det.p90_ms) + " ms");
    summary.push("over " + esc(b.length) + " of " + esc(nBatches) + " batches");
    var shapes = Array.isArray(det.shapes) && det.shapes.length
      ? '<p class="muted">shapes: ' + det.shapes.map(function (s) { return "<code>" + esc(s) + "</code>"; }).join(", ") + "</p>" : "";
    return '<section class="batches"><h3>batches</h3><p>' + summary.join("; ") + "</p>" + shapes +
      '<div class="scroll-x"><table class="mini-table batch-table"><thead><tr>' +
      cols.map(function (k) { return '<th class="' + k[2] + '">' + esc(k[0]) + "</th>"; }).join("") + "</tr></thead><tbody>" +
      b.map(function (x) {
        x = x || {};
        // the input shape (and any error) on a line of its own under the numbers: the panel is narrow
        return '<tr data-batch="' + esc(x.batch) + '" class="batch-numbers">' + cols.map(function (k) {
          return '<td class="' + k[2] + (k[0] === "status" ? " status-" + esc(x.status) : "") + '">' + k[1](x) + "</td>";
        }).join("") + '</tr><tr class="batch-shape"><td class="shape" colspan="' + cols.length + '">' +
          esc(x.shape === null || x.shape === undefined ? "-" : x.shape) +
          (x.error ? '<div class="compile-error">' + esc(String(x.error)) + "</div>" : "") + "</td></tr>";
      }).join("") + "</tbody></table></div></section>";
  }
  /* The component compiled alone (compile=True): what compiling it would buy. */
  function compileSection(r) {
    var c = compileOf(r);
    if (!c) return "";
    var out = [], known = {
      options: 1, graphs: 1, graph_breaks: 1, break_reasons: 1, compile_s: 1, recompiles: 1, fwd_ms: 1, bwd_ms: 1,
      noise: 1, repeats: 1, eager_ms_same_rounds: 1, outputs_close: 1, max_abs_error: 1, max_rel_error: 1, batches: 1,
      children_separately_ms: 1, children_compiled: 1, error: 1, skipped: 1, explain_error: 1
    };
    if (c.skipped) out.push('<p class="muted">not compiled: ' + esc(c.skipped) + "</p>");
    if (c.error) out.push('<p class="compile-error">compile failed: ' + esc(c.error) + "</p>");
    if (isNum(r.compiled_ms)) {
      out.push('<p class="compile-headline">eager ' + num(r.total_ms) + " ms \u2192 compiled <b>" + num(r.compiled_ms) + " ms</b> (\u00d7" + num(r.compile_speedup) + ")</p>");
    }
    var dl = [];
    if (isNum(c.fwd_ms) || isNum(c.bwd_ms)) dl.push(kv("compiled fwd + bwd", num(c.fwd_ms) + " + " + num(c.bwd_ms) + " ms"));
    if (isNum(c.eager_ms_same_rounds)) dl.push(kv("eager, same rounds", num(c.eager_ms_same_rounds) + " ms"));
    if (isNum(c.noise)) dl.push(kv("noise", num(c.noise, 100) + " %" + (isNum(c.repeats) ? " (" + esc(c.repeats) + " repeats)" : "")));
    if (isNum(c.compile_s)) dl.push(kv("compile time", num(c.compile_s) + " s"));
    if (c.graphs !== undefined) dl.push(kv("graphs", esc(c.graphs)));
    if (c.graph_breaks !== undefined) dl.push(kv("graph breaks", esc(c.graph_breaks)));
    if (c.recompiles !== undefined) dl.push(kv("recompiles", esc(c.recompiles)));
    if (c.outputs_close !== undefined) {
      dl.push(kv("outputs close", '<span class="' + (c.outputs_close === false ? "compile-error" : "") + '">' + yesNo(c.outputs_close) + "</span>" +
        "; max abs error " + sci(c.max_abs_error) + (c.max_rel_error !== undefined ? ", rel " + sci(c.max_rel_error) : "")));
    }
    if (c.options && typeof c.options === "object") dl.push(kv("options", "<code>" + esc(JSON.stringify(c.options)) + "</code>"));
    if (c.explain_error) dl.push(kv("explain failed", esc(c.explain_error)));
    Object.keys(c).forEach(function (k) {
      if (!known[k]) dl.push(kv(k, esc(typeof c[k] === "object" ? JSON.stringify(c[k]) : c[k])));
    });
    if (dl.length) out.push("<dl>" + dl.join("") + "</dl>");
    var reasons = Array.isArray(c.break_reasons) ? c.break_reasons : [];
    if (reasons.length) {
      out.push('<p>graph-break reasons:</p><ul class="break-reasons">' + reasons.map(function (x) {
        x = x || {};
        return "<li>" + esc(x.reason === undefined ? "?" : x.reason) + (isNum(x.count) && x.count > 1 ? " (\u00d7" + esc(x.count) + ")" : "") +
          (x.where ? ' <span class="muted">at ' + esc(x.where) + "</span>" : "") + "</li>";
      }).join("") + "</ul>");
    }
    if (isNum(c.children_separately_ms)) {
      out.push('<p class="children-separately">its children compiled separately: ' + num(r.total_ms) + " \u2192 " +
        num(c.children_separately_ms) + " ms" + (c.children_compiled ? " (" + esc(c.children_compiled) + " children compiled)" : "") + "</p>");
    }
    return '<section class="compile-whatif"><h3>compile what-if</h3>' + out.join("") + "</section>";
  }
  /* A small table: cols are [header, function(item) -> html, class]. */
  function miniTable(cls, cols, items, rowClass) {
    return '<div class="scroll-x"><table class="mini-table ' + cls + '"><thead><tr>' +
      cols.map(function (k) { return '<th class="' + k[2] + '">' + esc(k[0]) + "</th>"; }).join("") + "</tr></thead><tbody>" +
      items.map(function (x, i) {
        return '<tr class="' + (rowClass ? rowClass(x, i) : "") + '">' +
          cols.map(function (k) { return '<td class="' + k[2] + '">' + k[1](x, i) + "</td>"; }).join("") + "</tr>";
      }).join("") + "</tbody></table></div>";
  }
  function kib(v) { return isNum(v) ? sig(v / 1024, 4) : "-"; }
  /* The component's collectives (details.comm; torchrec: details.torchrec.stages). */
  /* Repeated structure and the in-situ time: which member measured this row, the group, in situ vs alone. */
  function groupSection(r) {
    var det = r.details || {}, g = det.group, ins = det.insitu, out = "";
    if (det.as === "representative") out += "<p>taken from <b>" + esc(det.from || ROOT_ID) + "</b>, a representative of its repeated structure (its own calls, in-situ time and share)</p>";
    else if (det.as === "measured") out += "<p>measured (a member of a repeated structure)</p>";
    if (g && Array.isArray(g.members)) {
      out += "<p>group of " + g.members.length + ": representatives " + esc((g.representatives || []).join(", ")) +
        (isNum(g.insitu_share) ? "; in-situ share of the group " + num(g.insitu_share, 100) + " %" : "") +
        (g.agree !== undefined ? "; representatives " + (g.agree ? "agree" : "disagree") + " (spread " + num(g.spread, 100) + " %)" : "") + "</p>";
    }
    if (ins && isNum(ins.fwd_ms)) {
      out += "<p>in situ: fwd " + num(ins.fwd_ms) + " ms per call (spread " + num(ins.spread, 100) + " % over " + esc(ins.passes) +
        " passes) vs isolated " + num(r.fwd_ms) + " ms" + (isNum(ins.capture_ms) ? "; in the captured step " + num(ins.capture_ms) + " ms" : "") +
        (isNum(ins.bwd_ms) ? "; bwd " + num(ins.bwd_ms) + " ms per call vs isolated " + num(r.bwd_ms) + " ms" : "") +
        (isNum(ins.share) ? "; in-situ share " + num(ins.share, 100) + " %" : "") + "</p>";
    }
    return out ? "<h3>repeated structure, in situ</h3>" + out : "";
  }
  function commSection(r) {
    var c = r.details && r.details.comm, stages = r.details && r.details.torchrec && r.details.torchrec.stages;
    if (!Array.isArray(c) || !c.length) return "";
    var out = "<p>" + kib(r.comm_bytes) + " KiB per call in " + num(r.comm_ms) + " ms (each collective waited for as it was issued)</p>" +
      miniTable("comm-table", [
        ["op", function (x) { return "<code>" + esc(x.op) + "</code>"; }, ""],
        ["phase", function (x) { return esc(x.phase); }, ""],
        ["count", function (x) { return esc(x.count); }, "num"],
        ["KiB", function (x) { return kib(x.bytes); }, "num"],
        ["ms", function (x) { return num(x.ms); }, "num"]
      ], c);
    if (Array.isArray(stages) && stages.length) {
      out += '<p class="muted">forward collectives by stage:</p>' + miniTable("stage-table", [
        ["stage", function (x) { return esc(x.stage); }, ""],
        ["KiB", function (x) { return kib(x.comm_bytes); }, "num"],
        ["ops", function (x) { return esc(Object.keys(x.ops || {}).map(function (k) { return k + " ×" + x.ops[k]; }).join(", ")); }, ""]
      ], stages);
    }
    return '<section class="comm"><h3>communication</h3>' + out + "</section>";
  }
  /* Every rank's time for this component (details.ranks, ranks="all"): the spread and the straggler. */
  function ranksSection(r) {
    var k = ranksOf(r);
    if (!k) return "";
    var n = Array.isArray(k.total_ms.per_rank) ? k.total_ms.per_rank.length : 0, items = [];
    for (var i = 0; i < n; i++) items.push(i);
    var comm = k.comm_ms && Array.isArray(k.comm_ms.per_rank) ? k.comm_ms.per_rank : [];
    var spread = spreadOf(r);
    return '<section class="ranks"><h3>ranks</h3><p class="' + spreadClass(spread, r) + '">spread ' + num(spread, 100) +
      " % of the median (" + num(k.total_ms.min) + " – " + num(k.total_ms.max) + " ms); straggler: rank " + esc(k.straggler) + "</p>" +
      miniTable("rank-table", [
        ["rank", function (i) { return esc(i); }, ""],
        ["total ms", function (i) { return num(k.total_ms.per_rank[i]); }, "num"],
        ["comm ms", function (i) { return num(comm[i]); }, "num"]
      ], items, function (i) { return i === k.straggler ? "straggler" : ""; }) + "</section>";
  }
  /* Pieces measured on their own that are no modules of the tree (torchrec: the local lookups). */
  function partsSection(r) {
    var parts = r.details && r.details.parts;
    if (!Array.isArray(parts) || !parts.length) return "";
    return '<section class="parts"><h3>parts</h3>' + miniTable("part-table", [
      ["part (tables)", function (x) {
        return Array.isArray(x.tables) ? '<span title="' + esc(x.tables.join(", ") || "no table on this rank") + '">' + esc(x.name) +
          " (" + esc(x.tables.length) + ")</span>" : esc(x.name);
      }, ""],
      ["ids", function (x) { return esc(x.ids === undefined || x.ids === null ? "-" : x.ids); }, "num"],
      ["KiB", function (x) { return kib(x.bytes); }, "num"],
      ["fwd ms", function (x) { return num(x.fwd_ms); }, "num"],
      ["GB/s", function (x) { return isNum(x.gbps) ? sig(x.gbps, 3) : "-"; }, "num"],
      ["BW %", function (x) { return isNum(x.bw_util) ? sig(x.bw_util * 100, 3) : "-"; }, "num"]
    ], parts) + (parts.some(function (x) { return x.not_timed; }) ? '<p class="muted">' +
      parts.filter(function (x) { return x.not_timed; }).map(function (x) { return esc(x.name + ": " + x.not_timed); }).join("<br>") + "</p>" : "") +
      '<p class="muted">(tables): how many on this rank (hover: which); fwd ms: the part\u2019s forward alone on this rank; BW %: of the peak bandwidth (the copy ceiling on a CPU)</p></section>';
  }
  /* The planner's estimate beside the measured split (details.planned). */
  function plannedSection(r) {
    var p = r.details && r.details.planned;
    if (!p || typeof p !== "object") return "";
    if (p.error) return '<section class="planned"><h3>measured vs planned</h3><p class="compile-error">' + esc(p.error) + "</p></section>";
    var m = p.measured || {}, q = p.planned_on_split || {}, ratio = p.ratio || {};
    var parts = [["fwd_compute_ms", "forward compute"], ["fwd_comms_ms", "forward comms"], ["bwd_compute_ms", "backward compute"],
      ["bwd_comms_ms", "backward comms"], ["total_ms", "total"]];
    var a = p.assumptions || {};
    return '<section class="planned"><h3>measured vs planned</h3><p class="muted">' + esc(p.source || "planner") +
      (p.rank !== undefined ? ", rank " + esc(p.rank) : "") + "</p>" + miniTable("planned-table", [
        ["", function (x) { return esc(x[1]); }, ""],
        ["measured ms", function (x) { return isNum(m[x[0]]) ? sig(m[x[0]], 4) : "-"; }, "num"],
        ["planned ms", function (x) { return isNum(q[x[0]]) ? sig(q[x[0]], 4) : "-"; }, "num"],
        ["×", function (x) { return isNum(ratio[x[0]]) ? sig(ratio[x[0]], 3) : "-"; }, "num"]
      ], parts) + '<p class="muted">planned forward comms and total include the input all-to-all the planner reports apart' +
      (isNum(a.batch_size) ? "; batch " + esc(a.batch_size) + " per rank" : "") +
      (isNum(a.bwd_compute_multiplier) ? "; backward = " + esc(a.bwd_compute_multiplier) + " × forward compute" : "") +
      "; measured compute: the lookups alone (forward), the backward less its collectives</p></section>";
  }
  /* The details panel's numbers: 4 significant figures with their unit (the table's units;
   * fractions as percents); the exact value is the cell's tooltip. */
  var UNITS = {
    fwd_ms: "ms", bwd_ms: "ms", total_ms: "ms", cpu_ms: "ms", device_ms: "ms", compiled_ms: "ms", comm_ms: "ms", insitu_ms: "ms",
    headroom_ms: "ms",
    tflops: "TFLOP/s", params_mb: "MiB", activation_mb: "MiB", peak_mem_mb: "MiB", gbps: "GB/s",
    intensity: "FLOP/byte"
  };
  var PERCENTS = { share: 1, noise: 1, mfu: 1, bw_util: 1 };
  var SI = { fwd_flops: "FLOP", bwd_flops: "FLOP", bytes: "B", comm_bytes: "B" };
  /* n significant figures without trailing zeros (sigFixed's rules otherwise): "12.5", "0.0001235". */
  function sig(v, n) { return isNum(v) ? String(Number(sigFixed(v, n))) : "-"; }
  /* A count with an SI prefix a factor 1000 apart, rounding carried across one (999.96 -> "1.00 k"):
   * n significant figures, trailing zeros kept when fixed (the table's "6.00 G"), else dropped. */
  function siText(v, unit, n, fixed) {
    if (!isNum(v)) return "-";
    var prefixes = ["", "k", "M", "G", "T", "P", "E"], i = 0;
    n = n || 4;
    while (v !== 0 && i < prefixes.length - 1 && Number(v.toExponential(n - 1).split("e")[1]) >= 3) { v /= 1000; i++; }
    var text = fixed ? sigFixed(v, n) : sig(v, n), suffix = prefixes[i] + unit;
    return suffix ? text + " " + suffix : text;
  }
  function detailText(k, v) {
    if (v === null || v === undefined) return "-";
    if (typeof v !== "number") return String(v);
    if (!isFinite(v)) return "-";
    if (PERCENTS[k]) return sig(v * 100, 4) + " %";
    if (SI[k]) return siText(v, SI[k]);
    if (UNITS[k]) return sig(v, 4) + " " + UNITS[k];
    if (k === "compile_speedup") return "\u00d7" + sig(v, 4);
    return Number.isInteger(v) ? String(v) : sig(v, 4);
  }
  /* JSON.stringify's replacer for the details dump: fractional numbers to 4 significant figures. */
  function rounded(k, v) { return typeof v === "number" && isFinite(v) && !Number.isInteger(v) ? Number(v.toPrecision(4)) : v; }
  function drawDetails() {
    var el = document.getElementById("details"), r = state.selected === null ? null : byPath.get(state.selected);
    if (!r) { el.innerHTML = '<p class="muted">Select a component in the icicle or the table.</p>'; return; }
    var items = Object.keys(r).filter(function (k) { return k !== "details"; }).map(function (k) {
      var v = r[k], exact = typeof v === "number" ? ' title="' + esc(v) + '"' : "";
      return '<dt>' + esc(k) + '</dt><dd data-key="' + esc(k) + '"' + exact + ">" + esc(detailText(k, v)) + "</dd>";
    }).join("");
    var det = r.details || {};
    var arts = det.artifacts || {};
    // Artifact paths are relative to the report: a URL scheme (javascript:) or an absolute path is not linked.
    var links = Object.keys(arts).filter(function (kind) {
      var p = String(arts[kind]);
      return !/^[a-z][\w+.-]*:/i.test(p) && p.charAt(0) !== "/" && p.indexOf("\\") < 0;
    }).map(function (kind) {
      return '<a class="artifact" data-kind="' + esc(kind) + '" href="' + esc(artifactBase + encodeURI(String(arts[kind]))) + '" target="_blank">' + esc(kind) + "</a>";
    }).join("");
    var ops = "";
    if (Array.isArray(det.ops_top) && det.ops_top.length) {
      var keys = Object.keys(det.ops_top[0]);
      ops = '<h3>top operators</h3><div class="scroll-x"><table class="op-table"><tr>' + keys.map(function (k) { return "<th>" + esc(k) + "</th>"; }).join("") + "</tr>" +
        det.ops_top.map(function (o) { return "<tr>" + keys.map(function (k) { return "<td>" + esc(o[k]) + "</td>"; }).join("") + "</tr>"; }).join("") + "</table></div>";
    }
    var shown = { artifacts: 1, ops_top: 1, batches: 1, median_ms: 1, p90_ms: 1, shapes: 1, compile: 1, comm: 1, ranks: 1, parts: 1, planned: 1 };  // drawn above the dump
    var rest = {};
    Object.keys(det).forEach(function (k) { if (!shown[k]) rest[k] = det[k]; });
    el.innerHTML = "<h2>" + esc(r.path === "" ? ROOT_ID : r.path) + "</h2>" +
      (flagsOf(r).length ? "<p>" + flagsOf(r).map(function (x) { return '<span class="flag">' + esc(x) + "</span>"; }).join("") + "</p>" : "") +
      '<p class="artifacts">' + (links ? "artifacts: " + links : '<span class="muted">no artifacts (profile with artifacts=("trace", "ops", "memory"))</span>') + "</p>" +
      groupSection(r) + compileSection(r) + batchesSection(r) + plannedSection(r) + partsSection(r) + commSection(r) + ranksSection(r) +
      ops + "<dl>" + items + '</dl><h3>details</h3><p class="muted">numbers to 4 significant figures (report.json has every digit)</p><pre>' +
      esc(JSON.stringify(rest, rounded, 1)) + "</pre>";
  }
  function select(path, fromTable) {
    state.selected = byPath.has(path) ? path : null;
    drawTable();
    drawDetails();
    Plotly.restyle(gd, { "marker.line": [lineStyle()] });
    document.dispatchEvent(new CustomEvent("cb-select", { detail: state.selected }));  // roofline.js outlines it
    if (fromTable) {
      var tr = document.querySelector('#table tr[data-path="' + CSS.escape(path) + '"]');
      if (tr) tr.scrollIntoView({ block: "nearest" });
    }
  }

  /* --- header and controls -------------------------------------------------------------- */
  function drawHeader() {
    var peaks = meta.peaks || {};
    var parts = [];
    if (meta.device_name) parts.push("device: " + esc(meta.device_name));
    if (meta.dtype) parts.push("dtype: " + esc(meta.dtype));
    if (isNum(peaks.flops)) parts.push("peak " + num(peaks.flops, 1e-12) + " TFLOP/s (" + esc(peaks.flops_source || "?") + ")");
    if (isNum(peaks.bandwidth)) parts.push(num(peaks.bandwidth, 1e-9) + " GB/s (" + esc(peaks.bandwidth_source || "?") + ")");
    if (meta.created_at) parts.push(esc(meta.created_at));
    var step = isNum(meta.capture_step) ? meta.capture_step : meta.step;
    if (isNum(step)) parts.push("step " + step);
    document.getElementById("meta").innerHTML = parts.map(function (p) { return "<span>" + p + "</span>"; }).join("");
    if (config.diff) return;  // the diff page's box, both runs' quality, is written by write_diff_html
    var q = meta.quality, qel = document.getElementById("quality");
    if (q && q.verdict && q.verdict !== "clean") {
      qel.className = "quality " + esc(q.verdict);
      qel.innerHTML = "<b>quality: " + esc(q.verdict) + "</b><ul>" + (q.advice || []).map(function (a) { return "<li>" + esc(a) + "</li>"; }).join("") + "</ul>";
    } else {
      qel.style.display = "none";
    }
  }
  function fillSelect(id, values) {
    var el = document.getElementById(id);
    values.forEach(function (v) { var o = document.createElement("option"); o.value = v; o.textContent = v; el.appendChild(o); });
  }
  function init() {
    drawHeader();
    var metricSel = document.getElementById("metric");
    Object.keys(METRICS).forEach(function (k) {
      var o = document.createElement("option"); o.value = k; o.textContent = METRICS[k].label; metricSel.appendChild(o);
    });
    metricSel.value = state.metric;
    metricSel.addEventListener("change", function () { state.metric = metricSel.value; recolor(); });
    function uniq(f) { return Array.from(new Set(rows.map(f))).filter(function (x) { return x !== null && x !== undefined; }).sort(); }
    fillSelect("f-status", uniq(function (r) { return r.status; }));
    fillSelect("f-type", uniq(function (r) { return r.module_type; }));
    fillSelect("f-bound", uniq(function (r) { return r.bound || "-"; }));
    fillSelect("f-depth", uniq(function (r) { return r.depth; }).map(String).sort(function (a, b) { return a - b; }));
    ["f-path", "f-status", "f-type", "f-bound", "f-depth"].forEach(function (id) {
      document.getElementById(id).addEventListener(id === "f-path" ? "input" : "change", drawTable);
    });
    document.getElementById("table").addEventListener("click", function (ev) {
      var th = ev.target.closest("th");
      if (th) {
        var key = th.getAttribute("data-key");
        state.sortDir = state.sortKey === key ? -state.sortDir : (key === "path" || key === "group" ? 1 : -1);
        state.sortKey = key;
        drawTable();
        return;
      }
      var tr = ev.target.closest("tr[data-path]");
      if (tr) select(tr.getAttribute("data-path"), true);
    });
    Array.prototype.forEach.call(document.querySelectorAll(".tabs button"), function (b) {
      b.addEventListener("click", function () {
        Array.prototype.forEach.call(document.querySelectorAll(".tabs button"), function (x) { x.classList.remove("active"); });
        b.classList.add("active");
        state.view = b.getAttribute("data-view");
        state.sortKey = "step"; state.sortDir = -1;
        drawTable();
      });
    });
    document.getElementById("csv").addEventListener("click", function () {
      var blob = new Blob([toCsv()], { type: "text/csv" });
      var a = document.createElement("a");
      a.href = URL.createObjectURL(blob);
      a.download = state.view === "components" ? "components_shown.csv" : "rollup_" + state.view + ".csv";
      document.body.appendChild(a); a.click(); a.remove();
    });
    drawIcicle();
    drawTable();
    drawDetails();
  }

  window.cbViewer = {
    state: state,
    select: function (path) { select(path, true); },
    setMetric: function (m) { document.getElementById("metric").value = m; state.metric = m; recolor(); },
    visiblePaths: function () { return visibleRows().map(function (r) { return r.path; }); },
    csv: toCsv,
    colors: function () { return gd.data[0].marker.colors.slice(); }
  };
  init();
})();
