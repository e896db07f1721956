"""Rows not replayed keep the step's numbers (issue 24, "every row has a time"): ``details["as"] = "insitu"``,
the in-situ time and the census's FLOPs and bytes per call, on rows the triage did not descend into and on the
copies of such rows. The model zoo checks these numbers against ``descend="all"`` on every model
(``tests/test_zoo.py``); here the shares are made by sleeps, so the triage's decisions hold on a busy machine."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from cb_callback import profile_components
from cb_callback._report.table import format_summary, format_text_table
from tests.conftest import FAST


class _Block(nn.Module):
    """20 ms of its own (a sleep) around a tiny ``Linear(8, 8)``: the block is most of the step, its child
    about a hundredth of it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.02)
        return self.lin(x) * 2.0


class _Two(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([_Block(), _Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


SETTINGS = dict(FAST, peak_flops=1e12, peak_bandwidth=1e11, insitu_passes=1, descend_share=0.3)


def test_a_copy_of_a_row_left_in_situ_takes_its_own_census_numbers() -> None:
    """The blocks (about 50 % of the step each, 20 ms of sleep against a Linear of microseconds) are one
    group: ``blocks.0`` is replayed and descended into, ``blocks.1`` takes its row. ``blocks.0.lin`` is
    under descend_share (0.3), and under a fifth of it (no top hotspot): a child of a row descended into,
    it is not replayed (a parent's share alone is not enough) and stays in situ; its counterpart
    ``blocks.1.lin``, a copy of a row nobody replayed, is in situ too, with its own in-situ time and
    counts (before: the representative's NaN FLOPs and bytes)."""
    x = torch.randn(4, 8, requires_grad=True)
    # The triage decides from in-situ times: three passes (a budget that lets them run), so that one pass
    # preempted by another process cannot lift the Linear's median past a fifth of descend_share (beside two
    # CPU hogs one pass read it 4.9 ms, 11 % of the step: a top hotspot, replayed).
    report = profile_components(_Two(), (x,), **(SETTINGS | {"insitu_passes": 3, "min_run_time_s": 0.05}))
    full = profile_components(_Two(), (x,), descend="all", **SETTINGS)
    rows = {r.path: r for r in report}
    assert rows["blocks.0"].details["as"] == "measured" and rows["blocks.1"].details["as"] == "representative"
    for path in ("blocks.0.lin", "blocks.1.lin"):
        row, measured = rows[path], full.row(path)
        assert row.status == "skipped" and row.details["as"] == "insitu", (path, row.status, row.details)
        assert row.details["insitu"]["counted"] == "census"
        assert math.isfinite(row.insitu_ms) and row.insitu_ms == row.details["insitu"]["fwd_ms"]
        # Linear(8, 8) on (4, 8): 2*4*8*8 = 512 forward FLOPs; the backward computes the input's and the
        # weight's gradients (the input requires grad): 1024
        assert (row.fwd_flops, row.bwd_flops) == (512, 1024) == (measured.fwd_flops, measured.bwd_flops)
        assert row.bytes == measured.bytes and row.bytes > 0
        assert math.isnan(row.fwd_ms) and math.isnan(row.activation_mb)  # no replay: no time, no memory
    assert rows["blocks.1.lin"].details["from"] == "blocks.0.lin"  # whose triage decision it shares
    assert "skipped (in situ)" in format_text_table(report)
    assert "in situ: 2 rows not replayed keep the step's own numbers" in format_summary(report)
    assert "the backward in the step on 2 of them" in format_summary(report)  # CPU: each module's nodes
    assert "FLOPs and bytes from the census on 2;" in format_summary(report)
    assert all(rows[p].details["insitu"]["bwd_ms"] >= 0.0 for p in ("blocks.0.lin", "blocks.1.lin"))


class _TwoTops(pl.LightningModule):
    """``training_step`` calls ``enc`` and ``aux`` once each and ``head`` twice: three tops, ``head`` called
    twice alike (its census replays one call of it)."""

    def __init__(self) -> None:
        super().__init__()
        # enc and aux hold the six largest leaves; head, far smaller, is not among the top hotspots
        self.enc = nn.Sequential(nn.Linear(16, 256), nn.Linear(256, 256), nn.Linear(256, 256))
        self.aux = nn.Sequential(nn.Linear(16, 256), nn.Linear(256, 256), nn.Linear(256, 256))
        self.head = nn.Linear(256, 2)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        return self.head(self.enc(x)).sum() + self.head(self.aux(x)).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_top_called_twice_keeps_its_census_per_call(tmp_path: Path) -> None:
    from cb_callback import ComponentBenchmark

    torch.manual_seed(0)
    cb = ComponentBenchmark(capture_step=1, budget_s=0.0, **FAST)  # nothing replayed: every row in situ
    data = DataLoader(TensorDataset(torch.randn(32, 16)), batch_size=16)
    trainer = pl.Trainer(
        accelerator="cpu", max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[cb], default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(_TwoTops(), data)
    report = cb.report
    assert report is not None
    head = report.row("head")
    assert head.details.get("as") == "insitu" and head.calls == 2, (head.status, head.details)
    # Linear(256, 2) on 16 rows: 2*16*256*2 = 16384 forward FLOPs a call, twice that backward (the weight's
    # and the input's gradients). Per call, as a replay of one call counts it (before: halved).
    assert (head.fwd_flops, head.bwd_flops) == (16384, 32768)
    # the root, never called itself, is the sum of its tops' calls: enc and aux 2*16*(16*256 + 2*256*256)
    # each, head's two calls
    assert report.row("").fwd_flops == 2 * (2 * 16 * (16 * 256 + 2 * 256 * 256)) + 2 * 16384
