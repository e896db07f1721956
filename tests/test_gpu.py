"""CUDA paths: events, allocator peaks, datasheet peaks. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cb_callback import profile_components
from tests.conftest import FAST

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_cuda_linear_profile_uses_events_allocator_and_datasheet() -> None:
    model = nn.Linear(1024, 1024).cuda()
    x = torch.randn(512, 1024, device="cuda")
    report = profile_components(model, (x,), **{**FAST, "max_repeats": 5, "min_repeats": 5})
    row = report.row("")
    assert row.status == "ok"
    assert row.fwd_flops == 2 * 512 * 1024 * 1024
    assert row.details["peak_mem_source"] == "cuda_caching_allocator"
    # alive at the end: y, dY (512x1024 fp32 each), dW (1024x1024), db (1024)
    assert row.peak_mem_mb * 2**20 >= 4 * (2 * 512 * 1024 + 1024 * 1024 + 1024)
    assert row.device_ms > 0 and row.cpu_ms > 0
    peaks = report.metadata["peaks"]
    assert peaks["flops_source"] in ("datasheet", "unknown")
    if peaks["flops_source"] == "datasheet":
        assert 0 < row.mfu < 1


def test_cuda_bf16_dtype_peak() -> None:
    model = nn.Linear(256, 256).cuda().to(torch.bfloat16)
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    report = profile_components(model, (x,), **FAST)
    assert report.metadata["dtype"] == "bf16"


def test_cuda_compile_what_if_fuses_an_elementwise_chain() -> None:
    class Chain(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(8):
                x = torch.sin(x) * 1.01 + 0.1
            return x

    x = torch.randn(4096, 4096, device="cuda", requires_grad=True)  # 64 MiB: 24 eager passes forward
    report = profile_components(
        Chain(), (x,), compile=True, warmup=1, min_run_time_s=0.05, min_repeats=5, load_plugins=False
    )
    row, info = report.row(""), report.row("").details["compile"]
    assert "error" not in info, info
    assert info["outputs_close"] is True
    assert info["eager_ms_same_rounds"] > 2 * row.compiled_ms  # one fused kernel per pass instead of 24


def test_cuda_in_situ_times_come_from_events_read_after_the_pass() -> None:
    from cb_callback._engine.capture.capture import Capture

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda()
    x = torch.randn(2048, 1024, device="cuda")
    with Capture(model) as cap:
        model(x)
    # The capture step's own times, from events (the copies' kernels left out).
    assert all(cap.calls[p].insitu_ms is not None and cap.calls[p].insitu_ms > 0 for p in ("", "0", "1", "2"))
    report = profile_components(model, (x,), descend="all", **{**FAST, "min_run_time_s": 0.05})
    rows = {r.path: r for r in report.rows}
    for path in ("", "0", "1", "2"):
        assert rows[path].insitu_ms > 0, path
    # The Linears hold most of the forward in situ (2 × 2 × 2048 × 1024 × 4096 FLOP of 3 modules).
    assert rows["0"].insitu_ms + rows["2"].insitu_ms < rows[""].insitu_ms * 1.05
    assert report.metadata["quality"]["insitu_ratio"]["fwd"] > 0
