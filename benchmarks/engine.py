"""Engine benchmark: harness efficiency, repeatability and fidelity of isolated timings.

Run: ``python benchmarks/engine.py [--device cuda] [--runs 3] [--json out.json]``.
Prints measured ratios; the targets live in docs/benchmarks.md.

- harness efficiency: seconds inside timed regions / wall seconds of
  ``profile_components`` (default settings, after one warm-up run that pays the
  one-off CPU calibration and profiler start-up);
- repeatability: for every component with total_ms >= 1 ms, (max - min) / median
  of total_ms over ``--runs`` runs;
- fidelity: the root's isolated fwd_ms + bwd_ms over the same model's forward +
  backward timed the usual way (median of a loop, synchronised on CUDA).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from cb_callback import profile_components


def mlp(device: torch.device) -> tuple[nn.Module, tuple[Any, ...]]:
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(1024, 1024), nn.ReLU()]
    return nn.Sequential(*layers).to(device), (torch.randn(256, 1024, device=device),)


def transformer(device: torch.device) -> tuple[nn.Module, tuple[Any, ...]]:
    layer = nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024, dropout=0.1, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).to(device)
    return model, (torch.randn(16, 128, 256, device=device),)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def usual_step_ms(model: nn.Module, args: tuple[Any, ...], device: torch.device, seconds: float = 1.0) -> float:
    """Median forward + backward of the whole model, timed as a user would."""

    def step() -> None:
        out = model(*args)
        out.backward(torch.ones_like(out))

    for _ in range(3):
        step()
    samples: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(samples) < 5:
        _sync(device)
        t0 = time.perf_counter()
        step()
        _sync(device)
        samples.append((time.perf_counter() - t0) * 1e3)
    model.zero_grad(set_to_none=True)
    return statistics.median(samples)


def bench(name: str, make: Callable[[torch.device], tuple[nn.Module, tuple[Any, ...]]],
          device: torch.device, runs: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model, args = make(device)
    model.train()
    profile_components(model, args, max_depth=0, min_run_time_s=0.01)  # warm-up: calibration, profiler
    reports = [profile_components(model, args) for _ in range(runs)]
    eff = [r.metadata["timing"]["harness_efficiency"] for r in reports]
    walls = [r.metadata["timing"]["wall_s"] for r in reports]
    spreads: dict[str, float] = {}
    for row in reports[0]:
        vals = [r.row(row.path).total_ms for r in reports]
        if row.status == "ok" and min(vals) >= 1.0:
            spreads[row.path or "(root)"] = (max(vals) - min(vals)) / statistics.median(vals)
    usual = usual_step_ms(model, args, device)
    iso = statistics.median(r.row("").fwd_ms + r.row("").bwd_ms for r in reports)
    return {
        "model": name,
        "components": len(reports[0]),
        "wall_s": walls,
        "harness_efficiency": eff,
        "repeatability_max_spread": max(spreads.values()) if spreads else None,
        "repeatability_spreads": spreads,
        "root_isolated_ms": iso,
        "usual_step_ms": usual,
        "fidelity_ratio": iso / usual,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device: {name}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    results = [bench("mlp", mlp, device, args.runs), bench("transformer", transformer, device, args.runs)]
    for r in results:
        effs = ", ".join(f"{e:.2f}" for e in r["harness_efficiency"])
        spread = r["repeatability_max_spread"]
        print(
            f"{r['model']:<12} components={r['components']:<3} wall={statistics.median(r['wall_s']):.1f}s "
            f"harness_efficiency=[{effs}] max_spread(>=1ms)="
            f"{'n/a' if spread is None else f'{spread:.1%}'} "
            f"fidelity={r['root_isolated_ms']:.2f}ms/{r['usual_step_ms']:.2f}ms={r['fidelity_ratio']:.3f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
