"""What profiling a sharded model costs: a 2-rank profile against the same model unsharded on 1 rank.

Two models (``--model``):

* ``fsdp``: the FSDP2 test model (``tests/_lockstep_script.py``'s ``Net``: 3 residual MLP blocks and a
  head, every block and the model ``fully_shard``-ed), batch 8;
* ``dlrm``: the DLRM of ``examples/sharded_dlrm.py`` (26 tables of 20,000 / 2,000 / 200 rows, dim 16),
  sharded by torchrec's ``DistributedModelParallel`` (table-wise, column-wise and data-parallel
  tables), batch 64; unsharded, the same DLRM with its plain ``EmbeddingBagCollection``.

For each run:

* **unsharded, 1 process**: the real steps, then ``profile_components(model, inputs)``, in a fresh
  process (no process group);
* **sharded, 2 ranks** (gloo, ``torch.multiprocessing``): the real steps, then ``profile_components``
  on both ranks at once (what communicates in lockstep; the in-situ pass and the triage on every rank).

The wall time of the ``profile_components`` call is taken on every process (the slower rank for the
2-rank run); process start-up and the real steps are not in it. Every process uses ``--threads``
threads (default 1: two ranks on a 2-core machine get one core each). The CPU peak calibration is
cached on disk by the first run (``CB_CACHE_DIR``), so no run pays it.

Usage::

    python benchmarks/distributed.py [--model fsdp|dlrm] [--runs 3] [--settings default|fast|level]
        [--json out.json]

``default``: the engine's default options (the in-situ pass and the triage); ``fast``: the tests'
(1 warm-up, 2 repeats, 2 rounds); ``level``: the default without the in-situ pass
(``insitu_passes=0``: level by level on measured shares, what several ranks got before the triage
ran under them).
"""

from __future__ import annotations

import argparse
import json
import os
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
sys.path.insert(0, str(REPO / "examples"))
from tests._lockstep_script import batch, sharded  # noqa: E402

SETTINGS: dict[str, dict[str, Any]] = {
    "default": {},
    "fast": dict(warmup=1, min_run_time_s=0.0, min_repeats=2, max_repeats=2, rounds=2),
    "level": {"insitu_passes": 0},
}
#: The DLRM's real steps before the profile (as examples/sharded_dlrm.py's --capture-step).
DLRM_STEPS = 3
DLRM_BATCH = 64


def _profile(model: torch.nn.Module, inputs: Any, settings: str) -> dict[str, Any]:
    """The profile's wall, its rows ``ok`` and its rows left in situ (``details["as"] == "insitu"``)."""
    import cb_callback

    t0 = time.perf_counter()
    report = cb_callback.profile_components(model, inputs, load_plugins=False, **SETTINGS[settings])
    wall = time.perf_counter() - t0
    insitu = sum(1 for r in report.rows if r.details.get("as") == "insitu")
    return {"wall_s": wall, "ok": sum(1 for r in report.rows if r.status == "ok"), "insitu": insitu}


def _dlrm(rank: int | None) -> tuple[torch.nn.Module, Any]:
    """The DLRM after its real steps (sharded over the 2 ranks, or whole with ``rank=None``) and the last
    step's ``(dense, kjt)``."""
    from dlrm import DLRMConfig, build_dlrm, synthetic_batch

    import cb_callback.integrations.torchrec  # noqa: F401  (its state savers and traffic: load_plugins=False)

    cfg = DLRMConfig(table_rows=(20_000, 2_000, 200), embedding_dim=16)
    if rank is None:
        torch.manual_seed(0)
        model: torch.nn.Module = build_dlrm(cfg)
        params = list(model.parameters())
    else:
        from sharded_dlrm import _plan
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.distributed.model_parallel import DistributedModelParallel

        os.environ["LOCAL_WORLD_SIZE"] = "2"
        base = build_dlrm(cfg, device="meta")
        model = DistributedModelParallel(
            base, device=torch.device("cpu"), plan=_plan(base, cfg, torch.device("cpu")),
            sharders=[EmbeddingBagCollectionSharder()],
        )  # fmt: skip
        params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.05)
    inputs: Any = None
    for step in range(DLRM_STEPS + 1):
        dense, kjt, labels = synthetic_batch(DLRM_BATCH, cfg, seed=1000 * step + (rank or 0))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(dense, kjt).squeeze(-1), labels)
        loss.backward()
        opt.step()
        opt.zero_grad()
        inputs = (dense, kjt)
    return model, inputs


def _rank(rank: int, store: str, model_name: str, settings: str, threads: int, out: str) -> None:
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        if model_name == "dlrm":
            model, inputs = _dlrm(rank)
        else:
            model = sharded()
            inputs = batch(rank)
            model(inputs).sum().backward()  # one real step's forward and backward (FSDP's state as in training)
            for p in model.parameters():
                p.grad = None
        Path(out, f"rank_{rank}.json").write_text(json.dumps(_profile(model, inputs, settings)))
    finally:
        dist.destroy_process_group()


def _unsharded(model_name: str, settings: str) -> dict[str, Any]:
    """The model unsharded, after its real steps, profiled (in the process :func:`_one_rank` starts)."""
    if model_name == "dlrm":
        model, inputs = _dlrm(None)
        return _profile(model, inputs, settings)
    from tests._lockstep_script import Net

    torch.manual_seed(0)
    net = Net()
    x = batch(0)
    net(x).sum().backward()  # a real step first, as on 2 ranks
    for p in net.parameters():
        p.grad = None
    return _profile(net, x, settings)


def _one_rank(model_name: str, settings: str, threads: int) -> dict[str, Any]:
    """The unsharded model in a fresh process (no process group)."""
    code = (
        "import json, sys, torch; sys.path.insert(0, sys.argv[1]); torch.set_num_threads(int(sys.argv[4]));"
        "from benchmarks.distributed import _unsharded; print(json.dumps(_unsharded(sys.argv[2], sys.argv[3])))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(REPO), model_name, settings, str(threads)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _two_ranks(model_name: str, settings: str, threads: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(str(Path(tmp) / "store"), model_name, settings, threads, tmp), nprocs=2, join=True)
        ranks = [json.loads(Path(tmp, f"rank_{r}.json").read_text()) for r in (0, 1)]
    wall = max(r["wall_s"] for r in ranks)
    return {**ranks[0], "wall_s": wall, "per_rank_s": [r["wall_s"] for r in ranks]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", choices=("fsdp", "dlrm"), default="fsdp")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--settings", choices=sorted(SETTINGS), default="default")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    _one_rank(args.model, args.settings, args.threads)  # warms the peak cache (and the disk cache of imports)
    one, two = [], []
    for _ in range(args.runs):  # interleaved: a machine that gets busier hurts both alike
        one.append(_one_rank(args.model, args.settings, args.threads))
        two.append(_two_ranks(args.model, args.settings, args.threads))
    m1 = statistics.median(r["wall_s"] for r in one)
    m2 = statistics.median(r["wall_s"] for r in two)
    result = {
        "model": args.model, "settings": args.settings, "threads": args.threads, "runs": args.runs,
        "unsharded_1_rank_s": [r["wall_s"] for r in one], "sharded_2_ranks_s": [r["wall_s"] for r in two],
        "median_unsharded_s": m1, "median_sharded_s": m2, "ratio": m2 / m1,
        "rows_ok": {"unsharded": [r["ok"] for r in one], "sharded": [r["ok"] for r in two]},
        "rows_in_situ": {"unsharded": [r["insitu"] for r in one], "sharded": [r["insitu"] for r in two]},
    }  # fmt: skip
    print(
        f"{args.model} settings={args.settings} threads={args.threads}: unsharded 1 rank {m1:.2f} s, sharded "
        f"2 ranks {m2:.2f} s (median of {args.runs}); ratio {m2 / m1:.2f}; rows ok "
        f"{[r['ok'] for r in one]} / {[r['ok'] for r in two]}, in situ {[r['insitu'] for r in one]} / "
        f"{[r['insitu'] for r in two]}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
