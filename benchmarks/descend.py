"""``descend="all"`` vs ``"hotspots"``: wall time, components measured, agreement of the top-10.

Run: ``python benchmarks/descend.py [--blocks 400] [--min-run-time-s 0.01] [--no-dlrm] [--json out.json]``.

Models:

- ``synthetic``: ``--blocks`` small blocks (``Linear(16, 16)``, ``ReLU``,
  ``LayerNorm``, ``Sequential(Linear(16, 16), ReLU)``: 7 modules each) in a
  ``ModuleList``, run one after the other on 64 rows, plus one heavy block of
  8 × ``Linear(1024, 1024)`` + ``ReLU`` on 256 rows. 400 blocks: 2,819 modules.
- ``dlrm``: the demo's torchrec DLRM (``examples/dlrm.py``, 26 tables, batch 512).

For each model and mode: the wall seconds of ``profile_components``, how many
components were measured (``ok``) and skipped, and ``Report.hotspots(10)``'s
paths. The top-10 of the two modes are compared as lists and as sets. The
timing settings are reduced for both modes alike (``--min-run-time-s``,
``min_repeats=3``, ``rounds=3``) so that ``"all"`` on thousands of components
finishes in a minute on 2 CPU cores; the ratio is what the benchmark is for.
``Report.hotspots`` lists leaf-most measured rows, and a component that was
not descended into is a leaf under ``"hotspots"``: the benchmark also says how
many of ``"all"``'s top-10 with a share at or above ``descend_share`` are in
``"hotspots"``' top-10 (the ones it must find), and how many of ``"all"``'s
top-10, each replaced by its deepest ancestor (or itself) that ``"hotspots"``
measured, are in ``"hotspots"``' top-10. Prints what it measured; the figures recorded are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
from _examples import load_example
from torch import nn

from cb_callback import profile_components


class Block(nn.Module):
    """A small block: 7 modules, tens of µs forward + backward."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.act = nn.ReLU()
        self.norm = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, d), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(self.act(self.fc(x))))


class Synthetic(nn.Module):
    """``blocks`` small blocks in a ``ModuleList`` and one heavy block."""

    def __init__(self, blocks: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(blocks)])
        layers: list[nn.Module] = []
        for _ in range(8):
            layers += [nn.Linear(1024, 1024), nn.ReLU()]
        self.heavy = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x.sum() + self.heavy(h).sum()


def synthetic(blocks: int) -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    return Synthetic(blocks), (torch.randn(64, 16), torch.randn(256, 1024))


def dlrm() -> tuple[nn.Module, tuple[Any, ...]]:
    module = load_example("dlrm")
    cfg = module.DLRMConfig()
    dense, kjt, _ = module.synthetic_batch(512, cfg)
    return module.build_dlrm(cfg), (dense, kjt)


def measure(model: nn.Module, args: tuple[Any, ...], descend: str, options: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    report = profile_components(model, args, descend=descend, **options)
    wall = time.perf_counter() - t0
    statuses: dict[str, int] = {}
    for r in report.rows:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    return {
        "wall_s": wall,
        "components": len(report.rows),
        "statuses": statuses,
        "top10": [r.path for r in report.hotspots(10)],
        "top10_share": [r.share for r in report.hotspots(10)],
        "measured": [r.path for r in report.rows if r.status in ("ok", "estimated")],
        "verdict": report.metadata.get("quality", {}).get("verdict"),
        "calibration_s": report.metadata["timing"]["calibration_s"],
    }


def _deepest_measured(path: str, measured: set[str]) -> str:
    """``path`` or its deepest ancestor in ``measured`` (the root ``""`` last)."""
    while path not in measured and path != "":
        path = path.rsplit(".", 1)[0] if "." in path else ""
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=400)
    parser.add_argument("--min-run-time-s", type=float, default=0.01)
    parser.add_argument("--descend-share", type=float, default=0.05)
    parser.add_argument("--no-dlrm", action="store_true")
    parser.add_argument("--json", default=None)
    a = parser.parse_args(argv)
    options = dict(min_run_time_s=a.min_run_time_s, min_repeats=3, rounds=3, descend_share=a.descend_share)
    models = {"synthetic": lambda: synthetic(a.blocks)}
    if not a.no_dlrm:
        import cb_callback.integrations.torchrec  # noqa: F401  (KJT rules)

        models["dlrm"] = dlrm
    # Pay the one-off CPU peak calibration and start-up before anything is timed.
    profile_components(nn.Linear(4, 4), (torch.randn(2, 4),), **options)
    out: dict[str, Any] = {}
    for name, build in models.items():
        model, args = build()
        result = {mode: measure(model, args, mode, options) for mode in ("all", "hotspots")}
        full, hot = result["all"]["top10"], result["hotspots"]["top10"]
        result["top10_same_list"] = full == hot
        result["top10_overlap"] = len(set(full) & set(hot))
        # The rows of "all"'s top-10 at or above descend_share: "hotspots" must find each of them.
        above = [p for p, s in zip(full, result["all"]["top10_share"], strict=True) if s >= a.descend_share]
        result["top10_above_share_found"] = [len([p for p in above if p in hot]), len(above)]
        # "all"'s top-10, each as the deepest of itself and its ancestors that "hotspots" measured.
        measured = set(result["hotspots"].pop("measured"))
        result["all"].pop("measured")
        mapped = [_deepest_measured(p, measured) for p in full]
        result["top10_mapped_overlap"] = len(set(mapped) & set(hot))
        out[name] = result
        for mode in ("all", "hotspots"):
            r = result[mode]
            print(
                f"{name:9} {mode:8} wall {r['wall_s']:6.1f} s  components {r['components']}  "
                f"statuses {r['statuses']}  verdict {r['verdict']}  calibration {r['calibration_s']:.1f} s"
            )
        found, of = result["top10_above_share_found"]
        print(
            f"{name:9} top-10 same list: {result['top10_same_list']}, overlap {result['top10_overlap']}/10; "
            f"of all's top-10 with share >= {a.descend_share}: {found}/{of} in hotspots' top-10"
        )
        print(
            f"{name:9} all's top-10 mapped to what hotspots measured: {result['top10_mapped_overlap']}/10 in its top-10"
        )
        print(f"{name:9} all      top-10 {full}")
        print(f"{name:9} hotspots top-10 {hot}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
