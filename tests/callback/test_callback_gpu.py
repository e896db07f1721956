"""ComponentBenchmark on CUDA: bf16-mixed pause, fork, bit-identical training. Skipped without a GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from cb_callback import ComponentBenchmark
from tests._callback_models import MLPModule, TransformerModule, run_fit
from tests.conftest import FAST

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

GPU: dict[str, Any] = dict(accelerator="gpu", devices=1, deterministic=True)


@pytest.mark.parametrize("mode", ["pause", "fork"])
def test_cuda_bf16_mixed_profiles_in_bf16_and_training_is_unchanged(tmp_path: Path, mode: str) -> None:
    base = run_fit(tmp_path / "base", model_cls=TransformerModule, precision="bf16-mixed", **GPU)
    cb = ComponentBenchmark(capture_step=2, mode=mode, **FAST)
    run = run_fit(tmp_path / mode, [cb], model_cls=TransformerModule, precision="bf16-mixed", **GPU)
    for a, b in zip(base[2].losses, run[2].losses, strict=True):
        assert torch.equal(a, b)
    for (k, a), (_, b) in zip(base[1].state_dict().items(), run[1].state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    report = cb.report
    assert report is not None
    assert report.metadata["device"].startswith("cuda")
    assert report.metadata["dtype"] == "bf16"
    assert report.metadata["peaks"]["dtype"] == "bf16"
    not_ok = {r.path: r.status for r in report.rows if r.status != "ok"}
    assert not_ok == {"block.self_attn.out_proj": "not_run"}
    assert report.row("embed").details["peak_mem_source"] == "cuda_caching_allocator"


def test_cuda_fork_can_replay_on_the_cpu(tmp_path: Path) -> None:
    cb = ComponentBenchmark(capture_step=1, mode="fork", device="cpu", **FAST)
    run_fit(tmp_path, [cb], model_cls=MLPModule, max_steps=3, **GPU)
    assert cb.report is not None
    assert cb.report.metadata["device"] == "cpu"
    assert cb.report.metadata["capture_device"].startswith("cuda")
