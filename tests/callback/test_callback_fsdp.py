"""The callback under Lightning's ``ModelParallelStrategy`` (FSDP2) on 2 CPU ranks: every row measured, training
bit-identical to an unprofiled run, ``mode="fork"`` of the sharded model profiled in-process instead.

Each run is ``tests/_fsdp_lightning_script.py`` in a subprocess with a timeout that fails the test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests._fsdp_lightning_script import MARK
from tests.engine.distributed.test_lockstep import BLOCK_COMM, ROOT_COMM

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "_fsdp_lightning_script.py"


MODES = ("plain", "pause", "fork")


def _run(out: Path, modes: tuple[str, ...]) -> dict[str, tuple[list[dict[str, Any]], str]]:
    """The modes one after the other in one 2-rank launch: each mode's two ranks' results and its own output."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "CB_DISABLE": ""}
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), ",".join(modes)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    def parts(text: str) -> dict[str, str]:  # each mode's output: after its mark, before the next one
        chunks = text.split(MARK)
        return {c.split("\n", 1)[0]: c for c in chunks[1:]}

    out_parts, err_parts = parts(proc.stdout), parts(proc.stderr)
    assert list(out_parts) == list(err_parts) == list(modes), (list(out_parts), list(err_parts))
    return {m: ([torch.load(out / m / f"rank_{r}.pt") for r in (0, 1)], out_parts[m] + err_parts[m]) for m in modes}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[dict[str, Any]], str]]:
    # one launch: the unprofiled fit first, so nothing a profile leaves in the processes can reach it
    return _run(tmp_path_factory.mktemp("fsdp_lightning"), MODES)


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["pause", "fork"])
def test_profiled_fsdp2_training_is_bit_identical_on_every_rank(runs: dict[str, Any], mode: str) -> None:
    plain, _ = runs["plain"]
    profiled, _ = runs[mode]
    for rank in (0, 1):
        assert profiled[rank]["losses"] == plain[rank]["losses"] and len(plain[rank]["losses"]) == 4
        # the local shards of every parameter and of SGD's momentum, after the 3 steps that followed the capture
        assert _same(profiled[rank]["params"], plain[rank]["params"])
        assert _same(profiled[rank]["momentum"], plain[rank]["momentum"])


@pytest.mark.slow
def test_every_component_of_the_sharded_model_is_measured_with_its_collectives(runs: dict[str, Any]) -> None:
    (rank0, rank1), _ = runs["pause"]
    assert rank1["rows"] is None  # ranks="zero": rank 1 replays in lockstep, rank 0 reports
    rows = rank0["rows"]
    measured = {p: r["status"] for p, r in rows.items() if p not in ("", "net.blocks")}
    assert set(measured.values()) == {"ok"}, {p: r for p, r in rows.items() if r["status"] != "ok"}
    # the LightningModule and the ModuleList are containers: estimated from their children
    assert rows[""]["status"] == rows["net.blocks"]["status"] == "estimated"
    # tests/engine/distributed/test_lockstep.py derives these: each unit's all-gathers and reduce-scatter,
    # the root's on top
    assert [rows[f"net.blocks.{b}"]["comm_bytes"] for b in range(3)] == [BLOCK_COMM] * 3
    assert rows["net"]["comm_bytes"] == ROOT_COMM
    # children of a unit: replayed with the unit unsharded, their compute alone
    assert all(rows[f"net.blocks.{b}.{fc}"]["comm_bytes"] == 0 for b in range(3) for fc in ("fc1", "fc2"))
    # FLOPs of the unsharded model for this rank's 8 samples: fc1 2 x 8 x 16 x 32 = 8192 forward
    assert rows["net.blocks.1.fc1"]["fwd_flops"] == 2 * 8 * 16 * 32 and rows["net.head"]["fwd_flops"] == 2 * 8 * 16 * 4


@pytest.mark.slow
def test_fork_mode_of_a_sharded_model_profiles_in_process_and_says_why(runs: dict[str, Any]) -> None:
    (rank0, rank1), log = runs["fork"]
    assert rank0["mode"] == rank1["mode"] == "pause"  # every rank switched: the lockstep replay needs them all
    assert "mode='fork') cannot fork a sharded model over 2 ranks (it holds FSDP2 units)" in log
    assert {r["status"] for p, r in rank0["rows"].items() if p not in ("", "net.blocks")} == {"ok"}


def test_fsdp1_is_a_clear_error_naming_fsdp2_before_anything_runs() -> None:
    from torch import nn
    from torch.distributed.fsdp import FullyShardedDataParallel

    import cb_callback

    class FSDP1(FullyShardedDataParallel):  # FSDP1 needs an accelerator to build; its type is what is checked
        def __init__(self, inner: nn.Module) -> None:
            nn.Module.__init__(self)
            self.inner, self.calls = inner, 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            return self.inner(x)

    model = nn.Sequential(nn.Linear(4, 4), FSDP1(nn.Linear(4, 2)))
    with pytest.raises(ValueError, match=r"1 is wrapped in FSDP1 \(FullyShardedDataParallel\).*Shard with FSDP2"):
        cb_callback.profile_components(model, torch.randn(2, 4), load_plugins=False)
    assert model[1].calls == 0  # refused before the capture forward
