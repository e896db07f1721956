"""What profiling a sharded model costs: a 2-rank FSDP2 profile against the same model unsharded on 1 rank.

The model is the FSDP2 test model (``tests/_lockstep_script.py``'s ``Net``: 3 residual MLP blocks and a head,
every block and the model ``fully_shard``-ed). For each run:

* **unsharded, 1 process**: one real step, then ``profile_components(Net(), x)``, in a fresh process (no
  process group);
* **FSDP2, 2 ranks** (gloo, ``torch.multiprocessing``): one real step, then ``profile_components`` on both
  ranks at once (the units and the root in lockstep, the blocks' children with their unit unsharded).

The wall time of the ``profile_components`` call is taken on every process (the slower rank for the
2-rank run); process start-up and the real step are not in it. Every process uses ``--threads`` threads
(default 1: two ranks on a 2-core machine get one core each). The CPU peak calibration is cached on disk
by the first run (``CB_CACHE_DIR``), so no run pays it.

Usage::

    python benchmarks/distributed.py [--runs 3] [--settings default|fast] [--json out.json]

``default``: the engine's default timing options; ``fast``: the tests' (1 warm-up, 2 repeats, 2 rounds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests._lockstep_script import batch, sharded  # noqa: E402

SETTINGS: dict[str, dict[str, Any]] = {
    "default": {},
    "fast": dict(warmup=1, min_run_time_s=0.0, min_repeats=2, max_repeats=2, rounds=2),
}


def _profile(model: torch.nn.Module, x: torch.Tensor, settings: str) -> tuple[float, int, int]:
    """The profile's wall, its rows ``ok`` and its rows left in situ (``details["as"] == "insitu"``)."""
    import cb_callback

    t0 = time.perf_counter()
    report = cb_callback.profile_components(model, x, load_plugins=False, **SETTINGS[settings])
    wall = time.perf_counter() - t0
    insitu = sum(1 for r in report.rows if r.details.get("as") == "insitu")
    return wall, sum(1 for r in report.rows if r.status == "ok"), insitu


def _rank(rank: int, store: str, settings: str, threads: int, out: str) -> None:
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        model = sharded()
        x = batch(rank)
        model(x).sum().backward()  # one real step's forward and backward (FSDP's state as in training)
        for p in model.parameters():
            p.grad = None
        wall, ok, insitu = _profile(model, x, settings)
        Path(out, f"rank_{rank}.json").write_text(json.dumps({"wall_s": wall, "ok": ok, "insitu": insitu}))
    finally:
        dist.destroy_process_group()


def _one_rank(settings: str, threads: int) -> dict[str, Any]:
    """The unsharded model in a fresh process (no process group)."""
    code = (
        "import json, sys, torch; sys.path.insert(0, sys.argv[1]); torch.set_num_threads(int(sys.argv[3]));"
        "from benchmarks.distributed import _profile; from tests._lockstep_script import Net, batch;"
        "torch.manual_seed(0); m = Net(); x = batch(0); m(x).sum().backward();"  # a real step first, as on 2 ranks
        "[setattr(p, 'grad', None) for p in m.parameters()]; wall, ok, insitu = _profile(m, x, sys.argv[2]);"
        "print(json.dumps({'wall_s': wall, 'ok': ok, 'insitu': insitu}))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(REPO), settings, str(threads)], capture_output=True, text=True, check=True
    )
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _two_ranks(settings: str, threads: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(str(Path(tmp) / "store"), settings, threads, tmp), nprocs=2, join=True)
        ranks = [json.loads(Path(tmp, f"rank_{r}.json").read_text()) for r in (0, 1)]
    wall = max(r["wall_s"] for r in ranks)
    return {
        "wall_s": wall,
        "ok": ranks[0]["ok"],
        "insitu": ranks[0]["insitu"],
        "per_rank_s": [r["wall_s"] for r in ranks],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--settings", choices=sorted(SETTINGS), default="default")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    _one_rank(args.settings, args.threads)  # warms the peak cache (and the disk cache of imports)
    one, two = [], []
    for _ in range(args.runs):  # interleaved: a machine that gets busier hurts both alike
        one.append(_one_rank(args.settings, args.threads))
        two.append(_two_ranks(args.settings, args.threads))
    m1 = statistics.median(r["wall_s"] for r in one)
    m2 = statistics.median(r["wall_s"] for r in two)
    result = {
        "settings": args.settings, "threads": args.threads, "runs": args.runs,
        "unsharded_1_rank_s": [r["wall_s"] for r in one], "fsdp2_2_ranks_s": [r["wall_s"] for r in two],
        "median_unsharded_s": m1, "median_fsdp2_s": m2, "ratio": m2 / m1,
        "rows_ok": {"unsharded": one[0]["ok"], "fsdp2": two[0]["ok"]},
        "rows_in_situ": {"unsharded": one[0]["insitu"], "fsdp2": two[0]["insitu"]},
    }  # fmt: skip
    print(
        f"settings={args.settings} threads={args.threads}: unsharded 1 rank {m1:.2f} s, FSDP2 2 ranks {m2:.2f} s "
        f"(median of {args.runs}); ratio {m2 / m1:.2f}; rows ok {one[0]['ok']} / {two[0]['ok']}, in situ "
        f"{one[0]['insitu']} / {two[0]['insitu']}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
