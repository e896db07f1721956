"""Profiling one finished capture: in this process (pause mode) or in a spawned child (fork mode)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from torch import nn

from cb_callback._engine.run.config import BenchmarkConfig
from cb_callback._engine.run.profile import profile_captured
from cb_callback._engine.run.schedule_count import ScheduleCount
from cb_callback._lightning.fork import Fork
from cb_callback._lightning.step import StepCaptures
from cb_callback._lightning.trainer_bar import ProgressBar, TrainerBar
from cb_callback._report.context import ReportContext
from cb_callback._report.model import Report

__all__ = ["fork", "profile_here"]


def profile_here(
    module: nn.Module,
    window: StepCaptures,
    cfg: BenchmarkConfig,
    metadata: dict[str, Any],
    ctx: ReportContext,
    forward_context: Callable[[], AbstractContextManager[Any]] | None,
    bar: TrainerBar,
) -> Report:
    """Profile the capture's steps now, in the Trainer's precision context, drawn through its progress ``bar``."""
    calls = window.calls()
    drawn = bar.bar is not None  # the tree is walked for a bar's total only
    count = ScheduleCount.for_run(module, [calls] if isinstance(calls, dict) else calls, cfg) if drawn else None
    with ProgressBar(ctx.step, bar, count or ScheduleCount(None, cfg.rounds, 1)) as progress:
        return profile_captured(
            module, calls, config=cfg.replace(progress=progress), metadata=metadata, report_context=ctx,
            captured_batch_size=window.captures[0].stored_batch_size, forward_context=forward_context,
        )  # fmt: skip


def fork(
    module: nn.Module,
    window: StepCaptures,
    cfg: BenchmarkConfig,
    metadata: dict[str, Any],
    out: Path | None,
    device: str,
    step: int,
    precision: object,
) -> Fork:
    """Snapshot the capture's steps under ``out`` and start the child that profiles them."""
    return Fork.start(
        module, window.calls(), config=cfg.replace(output_dir=None),
        captured_batch_size=window.captures[0].stored_batch_size, precision=str(precision),
        metadata=metadata | {"capture_device": str(next((p.device for p in module.parameters()), "cpu"))},
        output_dir=out, device=device, step=step,
    )  # fmt: skip
