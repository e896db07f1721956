"""Engine benchmark: noise floor, repeatability, ranking stability and fidelity.

Run: ``python benchmarks/engine.py [--device cuda] [--runs 3] [--threads N] [--json out.json]``.
Prints what it measured; the targets and the recorded figures live in
docs/benchmarks.md. Works with any version of the engine that has
``profile_components`` (``share`` is recomputed here when the report lacks it),
so the same script measures before and after a change.

Per model (a 4-layer 1024-wide MLP, a 2-layer ``nn.TransformerEncoder``):

- machine noise floor: the whole model's forward + backward timed as a user
  would (a plain loop), in ``--runs`` runs of ``--floor-s`` seconds each; the
  spread ``(max - min) / median`` over runs of each run's median and of each
  run's minimum. The profiler should be no noisier than this.
- profiler repeatability: ``--runs`` full ``profile_components`` runs; per
  component with ``total_ms >= 1`` ms, ``(max - min) / median`` of ``total_ms``.
- hotspot ranking: whether the top-5 of ``Report.hotspots`` is the same list in
  every run (also with components whose cost is within 5 % of each other
  merged as ties, and as a set); ``share`` stability: for components with ``share >= 5 %`` in any
  run, ``max - min`` of ``share`` over runs, in percentage points.
- fidelity: median over interleaved pairs of (isolated root ``fwd_ms +
  bwd_ms`` from a full profile) / (the plain loop's median right after it).
- harness efficiency: seconds inside timed regions / wall seconds of
  ``profile_components``, and the quality verdict and flags when the engine
  reports them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from cb_callback import Report, profile_components


def mlp(device: torch.device) -> tuple[nn.Module, tuple[Any, ...]]:
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(1024, 1024), nn.ReLU()]
    return nn.Sequential(*layers).to(device), (torch.randn(256, 1024, device=device),)


def transformer(device: torch.device) -> tuple[nn.Module, tuple[Any, ...]]:
    layer = nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024, dropout=0.1, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).to(device)
    return model, (torch.randn(16, 128, 256, device=device),)


MODELS: dict[str, Callable[[torch.device], tuple[nn.Module, tuple[Any, ...]]]] = {
    "mlp": mlp,
    "transformer": transformer,
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_loop_ms(model: nn.Module, args: tuple[Any, ...], device: torch.device, seconds: float) -> list[float]:
    """Forward + backward of the whole model timed as a training step runs, for ``seconds``.

    Gradients are set to ``None`` before each step (untimed), as ``zero_grad()``
    does by default, so every step allocates its gradients like a real one.
    """

    def step() -> None:
        out = model(*args)
        out.backward(torch.ones_like(out))

    for _ in range(2):
        step()
    samples: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(samples) < 5:
        model.zero_grad(set_to_none=True)
        _sync(device)
        t0 = time.perf_counter()
        step()
        _sync(device)
        samples.append((time.perf_counter() - t0) * 1e3)
    model.zero_grad(set_to_none=True)
    return samples


def _spread(values: list[float]) -> float:
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med > 0 else math.nan


def _shares(report: Report) -> dict[str, float]:
    """``share`` per path: the report's column when it has one, else total_ms * calls / root's."""
    root = report.row("")
    out: dict[str, float] = {}
    for r in report:
        share = getattr(r, "share", None)
        if share is None or not isinstance(share, float):
            share = r.total_ms * max(r.calls, 1) / root.total_ms if root.total_ms > 0 else math.nan
        out[r.path] = share
    return out


def bench(name: str, device: torch.device, runs: int, floor_s: float) -> dict[str, Any]:
    torch.manual_seed(0)
    model, args = MODELS[name](device)
    model.train()
    profile_components(model, args, max_depth=0, min_run_time_s=0.01)  # warm-up: calibration, profiler

    floor = [plain_loop_ms(model, args, device, floor_s) for _ in range(runs)]
    floor_median = [statistics.median(s) for s in floor]
    floor_min = [min(s) for s in floor]

    reports: list[Report] = []
    pairs: list[float] = []
    for _ in range(runs):  # interleaved: a profile, then the plain loop right after it
        report = profile_components(model, args)
        reports.append(report)
        usual = statistics.median(plain_loop_ms(model, args, device, floor_s / 2))
        root = report.row("")
        pairs.append((root.fwd_ms + root.bwd_ms) / usual)

    spreads: dict[str, float] = {}
    for row in reports[0]:
        vals = [r.row(row.path).total_ms for r in reports]
        if all(r.row(row.path).status == "ok" for r in reports) and min(vals) >= 1.0:
            spreads[row.path or "(root)"] = _spread(vals)
    top5 = [[h.path for h in r.hotspots(5)] for r in reports]
    # Components whose cost (total_ms x calls, median over runs) is within 5 % of each other
    # are tied (three identical layers): the ranking is compared with ties merged.
    cost = {
        p: statistics.median(r.row(p).total_ms * max(r.row(p).calls, 1) for r in reports)
        for p in {p for t in top5 for p in t}
    }
    tie = {p: min(q for q in cost if abs(cost[q] - cost[p]) <= 0.05 * max(cost[q], cost[p])) for p in cost}
    top5_tied = [[tie[p] for p in t] for t in top5]
    shares = [_shares(r) for r in reports]
    big = {p for s in shares for p, v in s.items() if math.isfinite(v) and v >= 0.05}
    share_pp = {(p or "(root)"): 100 * (max(s[p] for s in shares) - min(s[p] for s in shares)) for p in sorted(big)}
    quality = [r.metadata.get("quality", {}) for r in reports]
    return {
        "model": name,
        "components": len(reports[0]),
        "wall_s": [r.metadata["timing"]["wall_s"] for r in reports],
        "harness_efficiency": [r.metadata["timing"]["harness_efficiency"] for r in reports],
        "floor_medians_ms": floor_median,
        "floor_mins_ms": floor_min,
        "floor_spread_median": _spread(floor_median),
        "floor_spread_min": _spread(floor_min),
        "repeatability_spreads": spreads,
        "repeatability_max_spread": max(spreads.values()) if spreads else None,
        "repeatability_median_spread": statistics.median(spreads.values()) if spreads else None,
        "top5": top5,
        "top5_identical": all(t == top5[0] for t in top5),
        "top5_identical_up_to_ties": all(t == top5_tied[0] for t in top5_tied),
        "top5_same_set": all(set(t) == set(top5[0]) for t in top5),
        "share_max_pp": max(share_pp.values()) if share_pp else None,
        "share_pp": share_pp,
        "root_isolated_ms": [r.row("").fwd_ms + r.row("").bwd_ms for r in reports],
        "fidelity_pairs": pairs,
        "fidelity": statistics.median(pairs),
        "verdicts": [q.get("verdict") for q in quality],
        "flag_counts": [q.get("flags") for q in quality],
    }


def _fmt(v: float | None, pct: bool = True) -> str:
    if v is None or not math.isfinite(v):
        return "n/a"
    return f"{v:.1%}" if pct else f"{v:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--floor-s", type=float, default=1.5, help="seconds of each plain-loop run")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
    print(f"device: {name}, torch {torch.__version__}, threads {torch.get_num_threads()}, load1 {load:.2f}")
    results = [bench(m, device, args.runs, args.floor_s) for m in args.models]
    for r in results:
        effs = ", ".join(f"{e:.2f}" for e in r["harness_efficiency"])
        pairs = ", ".join(f"{p:.3f}" for p in r["fidelity_pairs"])
        print(
            f"{r['model']}: components={r['components']} wall={statistics.median(r['wall_s']):.1f}s "
            f"harness_efficiency=[{effs}]\n"
            f"  machine plain-loop spread: medians {_fmt(r['floor_spread_median'])}, "
            f"minimums {_fmt(r['floor_spread_min'])} "
            f"(medians {', '.join(f'{m:.2f}' for m in r['floor_medians_ms'])} ms)\n"
            f"  profiler spread (components >= 1 ms): max {_fmt(r['repeatability_max_spread'])}, "
            f"median {_fmt(r['repeatability_median_spread'])} over {len(r['repeatability_spreads'])}\n"
            f"  top-5 identical in {args.runs} runs: {r['top5_identical']} (up to ties within 5 %: "
            f"{r['top5_identical_up_to_ties']}, same set: {r['top5_same_set']}); "
            f"share (components >= 5 %) max change {_fmt(r['share_max_pp'], pct=False)} pp\n"
            f"  fidelity (median of interleaved pairs): {r['fidelity']:.3f} [{pairs}]\n"
            f"  quality verdicts: {r['verdicts']}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "threads": torch.get_num_threads(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
