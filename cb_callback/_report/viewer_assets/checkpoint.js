/* cb_callback report viewer: the activation-checkpointing section.
 *
 * Draws the plan's trade-off curve (activation bytes saved vs time added per step, the
 * frontier `cb_callback.plan_checkpointing` computes from the rows' activation_mb and fwd_ms)
 * that the page's config carries under "checkpoint", and marks the point a target picks:
 * the cheapest point of the curve that saves at least the target (what `cb checkpoint
 * REPORT --save SIZE` chooses). No config entry (the diff page): the section stays hidden; a plan
 * without a candidate (a curve of one point) or one that could not be made: one line says why.
 * The curve is drawn as steps "vh": reaching a saving between two points costs the next point's time.
 */
(function () {
  "use strict";

  var MIB = 1048576;
  var section = document.getElementById("checkpoint");
  var configEl = document.getElementById("cb-config");
  if (!section || !configEl || typeof Plotly === "undefined") return;
  var plan = (JSON.parse(configEl.textContent) || {}).checkpoint;
  if (!plan) return;
  var curve = Array.isArray(plan.curve) ? plan.curve : [];
  section.hidden = false;
  var input = document.getElementById("ckpt-target");
  var summary = document.getElementById("ckpt-summary");
  var chart = document.getElementById("ckpt-chart");
  var NAMES_MOST = 8;  // module names a summary lists before "... and K more"

  if (curve.length < 2) {  // nothing to draw: say why in one line
    var refused = plan.refused || {};
    var paths = Object.keys(refused).filter(function (p) { return p !== ""; });
    summary.textContent = plan.error
      ? "no checkpointing plan: " + plan.error
      : "nothing to checkpoint: no component saves activations it can drop (" + paths.length +
        " refused" + (paths.length ? ", e.g. " + paths[0] + ": " + refused[paths[0]] : "") +
        "; cb checkpoint REPORT lists every reason)";
    input.hidden = true;
    var label = section.querySelector("label[for=ckpt-target]");
    if (label) label.hidden = true;
    chart.hidden = true;
    return;
  }

  function mib(b) { return (b / MIB).toPrecision(3); }
  function names(p) {
    if (!p.modules.length) return "(nothing)";
    var shown = p.modules.slice(0, NAMES_MOST).join(", ");
    var more = p.modules.length - NAMES_MOST;
    return more > 0 ? shown + " \u2026 and " + more + " more" : shown;
  }
  function chosen(target) {
    for (var i = 0; i < curve.length; i++) if (curve[i].saved_bytes >= target) return curve[i];
    return null;  // ascending time: the first that reaches the target is the cheapest
  }

  function draw() {
    var target = Math.max(0, parseFloat(input.value) || 0) * MIB;
    var pick = chosen(target);
    var line = {
      x: curve.map(function (p) { return p.saved_bytes / MIB; }),
      y: curve.map(function (p) { return p.extra_ms; }),
      text: curve.map(names), mode: "lines+markers", line: { shape: "vh" }, name: "trade-off points",
      hovertemplate: "saves %{x:.3g} MiB, adds %{y:.3g} ms<br>%{text}<extra></extra>"
    };
    var traces = [line];
    if (pick) {
      traces.push({
        x: [pick.saved_bytes / MIB], y: [pick.extra_ms], text: [names(pick)], mode: "markers", name: "chosen",
        marker: { size: 14, symbol: "star", color: "#d62728" },
        hovertemplate: "chosen: saves %{x:.3g} MiB, adds %{y:.3g} ms<br>%{text}<extra></extra>"
      });
    }
    Plotly.react(chart, traces, {
      height: 340, margin: { t: 10, r: 10, b: 50, l: 60 },
      xaxis: { title: { text: "activations saved (MiB, held from forward to backward)" } },
      yaxis: { title: { text: "time added per step (ms, the recomputes)" } }
    }, { displaylogo: false, responsive: true });
    summary.textContent = pick
      ? "checkpoint " + names(pick) + ": saves " + mib(pick.saved_bytes) + " MiB, adds " + pick.extra_ms.toPrecision(3) +
        " ms per step"
      : "no point saves " + mib(target) + " MiB: the most is " + mib(curve[curve.length - 1].saved_bytes) + " MiB";
  }

  var asked = plan.save_bytes || (plan.modules && plan.modules.length ? plan.saved_bytes : 0);
  input.value = mib(asked || curve[curve.length - 1].saved_bytes / 2);
  input.addEventListener("input", draw);
  draw();
})();
