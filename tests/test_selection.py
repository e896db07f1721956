"""Every selection (descent, artifacts_top, compile_top, hotspots) ranks by time over all batches."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from cb_callback import profile_components


class _FixedAndMlp(nn.Module):
    """``fixed`` costs the same whatever the batch (two 384x384 matmuls of its own weight); ``mlp``
    scales with the batch's rows."""

    def __init__(self) -> None:
        super().__init__()
        self.fixed_w = nn.Parameter(torch.randn(384, 384) / 20)
        self.fixed = _Fixed(self.fixed_w)
        self.mlp = nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 128))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x) + self.fixed(x)


class _Fixed(nn.Module):
    def __init__(self, w: nn.Parameter) -> None:
        super().__init__()
        self.w = w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.w @ self.w @ self.w).sum() * 1e-6 + x[:, :1] * 0


def _batches() -> list[tuple[tuple[torch.Tensor], dict[str, object]]]:
    torch.manual_seed(0)
    return [((torch.randn(1, 128),), {}), ((torch.randn(16384, 128),), {})]


def test_descent_and_artifacts_rank_by_share_over_batches(tmp_path: Path) -> None:
    # Two batches: the median batch (the lower middle of two) is the 1-row one for every
    # component, where mlp is far below fixed (2*1*128*128*2 FLOPs against 2 * 2*384**3).
    # Over both batches mlp dominates (its 16384-row batch: 2*16384*128*128*2 = 1.07 GFLOP forward).
    # Before, hotspots descent judged mlp by the 1-row batch (share ~0.02) and skipped its children;
    # artifacts_top=2 took root and fixed.
    report = profile_components(
        _FixedAndMlp(), batches=_batches(), descend="hotspots", descend_share=0.05,
        artifacts=("ops",), artifacts_top=2, output_dir=tmp_path, min_run_time_s=0.005, rounds=2,
    )  # fmt: skip
    mlp = report.row("mlp")
    assert mlp.share > 0.3, mlp.share  # share sums over the batches
    assert report.row("fixed").share < mlp.share
    # descended: mlp's children measured, not skipped with a median-batch share
    for child in ("mlp.0", "mlp.1", "mlp.2"):
        assert report.row(child).status == "ok", (child, report.row(child).note)
    # artifacts_top=2: the root and mlp, the two largest by share
    with_artifacts = sorted(r.path for r in report.rows if "artifacts" in r.details)
    assert with_artifacts == ["", "mlp"]


def test_compile_top_ranks_by_the_same_figure() -> None:
    report = profile_components(
        _FixedAndMlp(), batches=_batches(), compile=True, compile_top=2,
        compile_options={"backend": "eager"}, max_depth=1, min_run_time_s=0.005, rounds=2,
    )  # fmt: skip
    compiled = sorted(r.path for r in report.rows if math.isfinite(r.compiled_ms))
    assert compiled == ["", "mlp"]
