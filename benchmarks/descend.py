"""The default profile (triage + repeated structure) vs ``descend="all"``: wall, replays, top-k, cost.

Run: ``python benchmarks/descend.py [--models gpt12 wide deep48 gpt2s dlrm] [--json out.json]``
(about 15 minutes on 2 CPU cores, most of it ``"all"`` on ``deep48``).

Models (issue 17's):

- ``gpt12``: ``examples/gpt.py``'s GPT, 12 blocks, 256 wide, 8 heads, GPT-2's
  vocabulary (50,257), batch 2 × 256 tokens. Default timing settings.
- ``wide``: one hot ``Linear(2048, 2048)`` on 1,024 rows and a ``ModuleList`` of
  300 tiny blocks (``Linear(8, 8)``, ``ReLU``) run one after the other on 4 rows,
  903 modules; the container holds about 7 % of the step. Reduced timing settings (below).
- ``deep48``: 48 repeated layers of 47 modules (norms, attention projections, an
  MLP and 8 experts of ``Sequential(Linear, GELU, Linear)``), 64 wide on 64 rows:
  2,263 modules. Reduced timing settings.
- ``gpt2s``: GPT-2 small (12 × 768, 12 heads, 124 M parameters), batch 2 × 256:
  the default profile only (``"all"`` takes minutes and is not the question).
- ``dlrm``: the demo's torchrec DLRM (``examples/dlrm.py``, 26 tables, batch 512).

Reduced settings (``min_run_time_s=0.01``, ``min_repeats=3``, ``rounds=3``) are
the same for both modes of a model, so that ``"all"`` over thousands of
components finishes. For each model and mode: the wall seconds of
``profile_components`` (after a warm-up call that pays the CPU peak calibration),
the rows replayed (``ok`` and not ``details["as"] == "representative"``), the
rows taken from a representative, ``metadata["cost"]`` (where the wall went,
``efficiency`` = timed ÷ wall) and the top-k hotspots with repeated blocks
merged: ``Report.hotspots`` rows, each path's numeric segments replaced by
``*`` (``blocks.3.attn.qkv`` → ``blocks.*.attn.qkv``), shares summed per
pattern, top-k patterns compared as sets. Prints what it measured; the figures
recorded are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _examples import load_example
from torch import nn

from cb_callback import Report, profile_components

REDUCED: dict[str, Any] = dict(min_run_time_s=0.01, min_repeats=3, rounds=3)
REPORTS: dict[str, Report] = {}  # the last report of each mode


def _gpt(n_layer: int, n_embd: int, n_head: int) -> tuple[nn.Module, tuple[Any, ...]]:
    ex = load_example("gpt")
    torch.manual_seed(0)
    cfg = ex.GPTConfig(vocab_size=50257, block_size=256, n_layer=n_layer, n_head=n_head, n_embd=n_embd)
    return ex.GPT(cfg), (torch.randint(0, 50257, (2, 256)),)


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


class Wide(nn.Module):
    """One hot Linear and 300 tiny blocks under a container: 903 modules."""

    def __init__(self, n: int = 300) -> None:
        super().__init__()
        self.hot = nn.Linear(2048, 2048)
        self.blocks = nn.ModuleList([Tiny() for _ in range(n)])

    def forward(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.hot(h).sum() + x.sum()


def wide() -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    return Wide(), (torch.randn(1024, 2048), torch.randn(4, 8))


class Layer(nn.Module):
    """47 modules: norms, q/k/v/o, an MLP and 8 experts of Sequential(Linear, GELU, Linear)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.experts = nn.ModuleList([nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, d)) for _ in range(8)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        a = torch.softmax(self.q(h) @ self.k(h).T / 8.0, -1) @ self.v(h)
        x = x + self.o(a)
        h = self.ln2(x)
        x = x + self.mlp(h)
        return x + sum(e(h) for e in self.experts) / 8


class Deep(nn.Module):
    def __init__(self, n: int = 48, d: int = 64) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Layer(d) for _ in range(n)])
        self.head = nn.Linear(d, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def deep48() -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    return Deep(), (torch.randn(64, 64),)


def dlrm() -> tuple[nn.Module, tuple[Any, ...]]:
    import cb_callback.integrations.torchrec  # noqa: F401  (KJT rules)

    module = load_example("dlrm")
    cfg = module.DLRMConfig()
    dense, kjt, _ = module.synthetic_batch(512, cfg)
    return module.build_dlrm(cfg), (dense, kjt)


# name -> (builder, options for both modes, modes)
MODELS: dict[str, tuple[Callable[[], tuple[nn.Module, tuple[Any, ...]]], dict[str, Any], tuple[str, ...]]] = {
    "gpt12": (lambda: _gpt(12, 256, 8), {}, ("all", "hotspots")),
    "wide": (wide, REDUCED, ("all", "hotspots")),
    "deep48": (deep48, REDUCED, ("all", "hotspots")),
    "gpt2s": (lambda: _gpt(12, 768, 12), {}, ("hotspots",)),
    "dlrm": (dlrm, {}, ("all", "hotspots")),
}


def pattern(path: str) -> str:
    """``blocks.3.attn.qkv`` → ``blocks.*.attn.qkv``: the repeated blocks merged."""
    return re.sub(r"(^|\.)\d+(?=\.|$)", r"\1*", path) if path else "(root)"


def merged_top(report: Report, k: int) -> list[tuple[str, float]]:
    """The top-``k`` hotspot patterns by summed share (:func:`pattern` of each hotspot's path)."""
    sums: dict[str, float] = {}
    for r in report.hotspots(len(report.rows)):
        if r.share == r.share:
            sums[pattern(r.path)] = sums.get(pattern(r.path), 0.0) + r.share
    return sorted(sums.items(), key=lambda kv: -kv[1])[:k]


def mapped_top(full: Report, hot: Report, k: int) -> list[tuple[str, float]]:
    """``full``'s hotspots, each as the deepest of itself and its ancestors that ``hot`` has a time for (a
    row not descended into stands for its subtree), merged by :func:`pattern`: the top-``k``."""
    timed = {r.path for r in hot.rows if r.total_ms == r.total_ms}
    sums: dict[str, float] = {}
    for r in full.hotspots(len(full.rows)):
        path = r.path
        while path not in timed and path != "":
            path = path.rsplit(".", 1)[0] if "." in path else ""
        if r.share == r.share:
            sums[pattern(path)] = sums.get(pattern(path), 0.0) + r.share
    return sorted(sums.items(), key=lambda kv: -kv[1])[:k]


def _loss(out: Any) -> torch.Tensor:
    """The sum of every floating tensor the model returned (a stand-in loss for a plain step)."""
    if isinstance(out, torch.Tensor):
        return out.float().sum() if out.is_floating_point() else torch.zeros(())
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return sum((_loss(o) for o in out), torch.zeros(()))
    return torch.zeros(())


def plain_step_s(model: nn.Module, args: tuple[Any, ...], steps: int = 3) -> float:
    """Median seconds of a plain training step of a copy of ``model`` on ``args``: forward, the sum of its
    outputs as the loss, backward, an SGD step (after one warm-up step). What the profile's wall is counted in."""
    import copy
    import statistics

    twin = copy.deepcopy(model)
    opt = torch.optim.SGD(twin.parameters(), lr=1e-3)
    times = []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        _loss(twin(*args)).backward()
        opt.step()
        if i:
            times.append(time.perf_counter() - t0)
    del twin, opt
    return statistics.median(times)


def measure(model: nn.Module, args: tuple[Any, ...], descend: str, options: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    report = profile_components(model, args, descend=descend, **options)
    REPORTS[descend] = report
    wall = time.perf_counter() - t0
    statuses: dict[str, int] = {}
    for r in report.rows:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    copied = [r for r in report.rows if r.details.get("as") == "representative"]
    replayed = [r for r in report.rows if r.status == "ok" and r.details.get("as") != "representative"]
    return {
        "wall_s": wall,
        "components": len(report.rows),
        "statuses": statuses,
        "replayed": len(replayed),
        "copied": len(copied),
        # rows whose timing stopped before min_repeats because a long run agreed with itself (timing.SETTLE_NOISE)
        "settled": sum(1 for r in report.rows if (r.details.get("timing") or {}).get("settled")),
        "root_repeats": next((r.details.get("fwd_repeats") for r in report.rows if r.path == ""), None),
        "cost": report.metadata.get("cost"),
        "triage": report.metadata.get("triage"),
        "insitu_ratio": report.metadata.get("quality", {}).get("insitu_ratio"),
        "insitu_mismatch": report.metadata.get("quality", {}).get("insitu_mismatch"),
        "verdict": report.metadata.get("quality", {}).get("verdict"),
        "top5": merged_top(report, 5),
        "top10": merged_top(report, 10),
        "every_block_timed": _every_block_timed(report),
        "insitu_rows": sum(1 for r in report.rows if r.details.get("as") == "insitu"),
        "without_time": _without_time(report),
    }


def _has_time(r: Any) -> bool:
    """A measured (or copied) ``total_ms``, or, on a row not replayed (``details["as"] == "insitu"``), its
    in-situ forward: the time the step itself gave it."""
    return r.total_ms == r.total_ms or (r.details.get("as") == "insitu" and r.insitu_ms == r.insitu_ms)


def _every_block_timed(report: Report) -> bool | None:
    """Whether every member of the model's top-level repeated container has a time (:func:`_has_time`)."""
    for container in ("blocks", "layers"):
        members = [r for r in report.rows if r.parent == container]
        if members:
            return all(_has_time(r) for r in members)
    return None


def _without_time(report: Report) -> list[str]:
    """The called rows without a time (:func:`_has_time`): issue 24's "every row has a time"."""
    return [r.path for r in report.rows if r.calls > 0 and not _has_time(r)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    parser.add_argument("--json", default=None)
    a = parser.parse_args(argv)
    # Pay the one-off CPU peak calibration and start-up before anything is timed.
    profile_components(nn.Linear(4, 4), (torch.randn(2, 4),), **REDUCED)
    out: dict[str, Any] = {}
    for name in a.models:
        build, options, modes = MODELS[name]
        model, args = build()
        step_s = plain_step_s(model, args)
        result: dict[str, Any] = {mode: measure(model, args, mode, options) for mode in modes}
        result["plain_step_s"] = step_s
        out[name] = result
        print(f"{name:7} plain training step {step_s:.3f} s (median of 3, after a warm-up)")
        for mode in modes:
            r = result[mode]
            c = r["cost"] or {}
            print(
                f"{name:7} {mode:8} wall {r['wall_s']:6.1f} s  rows {r['components']}  replayed {r['replayed']}  "
                f"copied {r['copied']}  statuses {r['statuses']}  efficiency {c.get('efficiency', float('nan')):.2f}  "
                f"every block timed {r['every_block_timed']}  in situ {r['insitu_rows']}  "
                f"without a time {len(r['without_time'])}  = {r['wall_s'] / step_s:.1f} plain steps  "
                f"settled {r['settled']} (root {r['root_repeats']} runs)"
            )
            print(
                f"{name:7} {mode:8} cost {json.dumps({k: round(v, 2) for k, v in c.items() if isinstance(v, float)})}"
            )
            print(f"{name:7} {mode:8} top-5 {[p for p, _ in r['top5']]}")
        if "all" in result and "hotspots" in result:
            full, hot = result["all"], result["hotspots"]
            ratio = hot["wall_s"] / full["wall_s"]
            same5 = {p for p, _ in full["top5"]} == {p for p, _ in hot["top5"]}
            same10 = {p for p, _ in full["top10"]} == {p for p, _ in hot["top10"]}
            result["wall_ratio"], result["same_top5"], result["same_top10"] = ratio, same5, same10
            # "all"'s hotspots mapped onto what the default profile timed (a row it did not descend into
            # stands for its subtree), then merged: the same places to act on?
            m5, m10 = (mapped_top(REPORTS["all"], REPORTS["hotspots"], k) for k in (5, 10))
            result["same_top5_mapped"] = {p for p, _ in m5} == {p for p, _ in hot["top5"]}
            result["same_top10_mapped"] = {p for p, _ in m10} == {p for p, _ in hot["top10"]}
            print(
                f"{name:7} all's hotspots mapped onto the default's rows: same top-5 {result['same_top5_mapped']}, "
                f"top-10 {result['same_top10_mapped']}; all top-10 mapped {[p for p, _ in m10]}; default top-10 "
                f"{[p for p, _ in hot['top10']]}"
            )
            result["replayed_ratio"] = hot["replayed"] / max(full["replayed"], 1)
            print(
                f"{name:7} default/all wall {ratio:.2f}  replayed {hot['replayed']}/{full['replayed']} "
                f"({result['replayed_ratio']:.2f})  same merged top-5 {same5}  top-10 {same10}"
            )
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
