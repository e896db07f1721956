"""The callback's Lightning-free parts: placement, the step's plan, precision, arguments, fork."""

from __future__ import annotations

import datetime
import math
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import cb_callback._lightning.child as child_module
from cb_callback import BenchmarkConfig, Capture
from cb_callback._engine.run.precision import AUTOCAST_DTYPES, DEFAULT_DTYPES, PRECISIONS, peak_dtype
from cb_callback._engine.run.schedule_count import ScheduleCount
from cb_callback._lightning.args import ENGINE_OPTIONS, check_callback_args
from cb_callback._lightning.child import ChildResult
from cb_callback._lightning.fork import SNAPSHOT_DIR, Fork, fork_report
from cb_callback._lightning.placement import (
    check_pause_device,
    check_writable,
    output_dir,
    profiles_on_rank,
    time_bound_s,
)
from cb_callback._lightning.step import capture_warnings, never_reached, plan, unreachable
from cb_callback._lightning.trainer_bar import ProgressBar, TrainerBar
from cb_callback._report.model import ComponentRow, Report

# --- placement -------------------------------------------------------------------------------


def test_output_dir_default_explicit_and_per_rank() -> None:
    def log_dir() -> str:
        return "/logs/v0"

    assert output_dir(None, log_dir, "zero", 1, 0) == Path("/logs/v0/component_benchmark")
    assert output_dir("/mine", lambda: pytest.fail("not asked"), "zero", 4, 2) == Path("/mine")
    assert output_dir("/mine", log_dir, "all", 4, 2) == Path("/mine/rank_2")
    assert output_dir("/mine", log_dir, "all", 1, 0) == Path("/mine")  # one process: no rank directory


def test_which_ranks_profile() -> None:
    assert [profiles_on_rank("zero", r) for r in range(3)] == [True, False, False]
    assert [profiles_on_rank("all", r) for r in range(3)] == [True, True, True]


def test_time_bound_is_half_the_collective_timeout() -> None:
    assert time_bound_s(None, 1, None) is None  # one process: no bound
    assert time_bound_s(60.0, 2, None) is None  # the user's budget stays
    assert time_bound_s(None, 2, datetime.timedelta(minutes=10)) == 300.0  # 600 s / 2
    assert time_bound_s(None, 2, None) == 900.0  # torch.distributed's default 1800 s / 2


def test_check_writable(tmp_path: Path) -> None:
    assert check_writable(tmp_path / "new", fork=False)
    assert (tmp_path / "new").is_dir() and not any((tmp_path / "new").iterdir())  # the probe is gone
    (tmp_path / "file").write_text("")
    with pytest.warns(RuntimeWarning, match="fork mode keeps its snapshot in a temporary directory"):
        assert not check_writable(tmp_path / "file" / "out", fork=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_pause_device_check() -> None:
    check_pause_device(None)
    check_pause_device("cpu")
    with pytest.raises(ValueError, match=r"device='cuda:1'\): CUDA is not available: .*; drop device="):
        check_pause_device(torch.device("cuda", 1))


# --- precision: one table ------------------------------------------------------------------------


def test_precision_table_feeds_both_maps_and_the_peak_key() -> None:
    assert set(AUTOCAST_DTYPES) | set(DEFAULT_DTYPES) == set(PRECISIONS)
    assert not set(AUTOCAST_DTYPES) & set(DEFAULT_DTYPES)
    bf16, fp16 = torch.bfloat16, torch.float16
    assert dict(AUTOCAST_DTYPES) == {"bf16-mixed": bf16, "bf16": bf16, "16-mixed": fp16, "16": fp16}
    keys = {p: peak_dtype(p) for p in ("bf16-mixed", "bf16-true", "16-mixed", "16-true", "64-true", "64", "32-true")}
    assert keys == {
        "bf16-mixed": "bf16", "bf16-true": "bf16", "16-mixed": "fp16", "16-true": "fp16",
        "64-true": "fp64", "64": "fp64", "32-true": None,
    }  # fmt: skip
    assert peak_dtype(None) is None
    assert peak_dtype(16) == "fp16"  # Lightning also takes the integer


# --- arguments -----------------------------------------------------------------------------------


def _args(**over: Any) -> dict[str, Any]:
    base = dict(
        capture_step=1, capture_batches=1, mode="pause", ranks="zero", capture_batch_size=None, log_to_tensorboard=True,
        stop_after=False, enabled=True, fork_timeout_s=None, output_dir=None, warmup=2, self=object(),
    )  # fmt: skip
    return base | over


def test_arguments_build_the_engine_config() -> None:
    cfg = check_callback_args(_args())
    assert isinstance(cfg, BenchmarkConfig) and cfg.warmup == 2
    assert "progress" not in ENGINE_OPTIONS and "output_dir" not in ENGINE_OPTIONS and "warmup" in ENGINE_OPTIONS
    with pytest.raises(ValueError, match=r"^ComponentBenchmark\(mode='x'\): expected one of \('pause', 'fork'\)$"):
        check_callback_args(_args(mode="x"))
    with pytest.raises(ValueError, match=r"^ComponentBenchmark: .*warmup="):
        check_callback_args(_args(warmup=-1))
    with pytest.raises(ValueError, match=r"^ComponentBenchmark\(fork_timeout_s=nan\)"):
        check_callback_args(_args(fork_timeout_s=math.nan))


# --- the captured step ---------------------------------------------------------------------------


def _capture(batch: int = 8) -> Capture:
    model = nn.Linear(3, 2)
    with Capture(model, keep_samples=2) as capture:
        model(torch.randn(batch, 3))
    return capture


def test_plan_options_and_metadata() -> None:
    capture = _capture()
    cfg, meta = plan(
        BenchmarkConfig(), capture, step=5, mode="pause", precision="bf16-mixed", global_rank=1, world_size=2,
        module=nn.Linear, output_dir=Path("/out"), capture_batch_size=2, time_bound_s=900.0,
    )  # fmt: skip
    assert (cfg.dtype, cfg.batch_size, cfg.max_total_time_s, cfg.output_dir) == ("bf16", 8, 900.0, "/out")
    assert meta == {
        "capture_step": 5, "mode": "pause", "global_rank": 1, "world_size": 2, "precision": "bf16-mixed",
        "lightning_module": "torch.nn.modules.linear.Linear", "real_batch_size": 8,
    }  # fmt: skip
    # the user's dtype and batch size win; 32-true and no bound change nothing
    cfg, _ = plan(
        BenchmarkConfig(dtype="fp32", batch_size=4), capture, step=5, mode="fork", precision="32-true",
        global_rank=0, world_size=1, module=nn.Linear, output_dir=None, capture_batch_size=2, time_bound_s=None,
    )  # fmt: skip
    assert (cfg.dtype, cfg.batch_size, cfg.max_total_time_s, cfg.output_dir) == ("fp32", 4, None, None)


def test_step_messages() -> None:
    module = types.SimpleNamespace(automatic_optimization=True)
    assert capture_warnings(2, module, _capture(), outputs={"loss": 1}) == []
    (message,) = capture_warnings(2, module, _capture(), outputs=None)
    assert message.startswith("cb_callback: training_step returned None at capture_step=2")
    manual = types.SimpleNamespace(automatic_optimization=False)
    assert capture_warnings(2, manual, _capture(), outputs=None) == []
    assert unreachable(3, None) is None and unreachable(3, -1) is None and unreachable(3, 4) is None
    assert unreachable(4, 4) == (
        "cb_callback: capture_step=4 is never reached: Trainer(max_steps=4) stops after global_step 3. "
        "Lower capture_step to profile."
    )
    assert "(no training step ran)" in never_reached(9, None)
    assert "(training ran global_step 0 to 2)" in never_reached(9, (0, 2))


def test_progress_bar_is_a_context_manager() -> None:
    class Rich: ...

    class Tqdm: ...

    class Lines:  # another progress bar: plain lines through its print
        def __init__(self) -> None:
            self.lines: list[str] = []

        def print(self, line: str) -> None:
            self.lines.append(line)

    with ProgressBar(1, TrainerBar(None, Rich, Tqdm), ScheduleCount(1, 1, 1)) as none:
        assert none is None  # no bar: nothing drawn
    lines = Lines()
    with ProgressBar(1, TrainerBar(lines, Rich, Tqdm), ScheduleCount(1, 1, 1)) as bar:
        assert bar is not None
        bar(1, 2, "")  # 1 component + 1 round x 1 level = 2 steps
        assert bar._row is not None
        assert lines.lines == ["cb_callback: profiling step 1: 1 component, 1 timing round per level"]
    assert bar._row is None and lines.lines[-1].startswith("cb_callback: step 1 profiled in ")  # closed on exit


# --- fork lifecycle ------------------------------------------------------------------------------


class _Process:
    """A process that never runs: ``start`` records, ``is_alive`` is false, exit code 0."""

    def __init__(self, target: Any, args: tuple[Any, ...], name: str, daemon: bool) -> None:
        self.args, self.pid, self.exitcode = args, 99, 0

    def start(self) -> None:
        pass

    def is_alive(self) -> bool:
        return False

    def join(self, timeout: float | None = None) -> None:
        pass


def test_fork_writes_a_snapshot_in_a_temporary_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    monkeypatch.setattr(child_module, "spawn_context", lambda: types.SimpleNamespace(Process=_Process))
    model = nn.Linear(3, 2)
    with Capture(model) as capture:
        model(torch.randn(4, 3))
    fork = Fork.start(
        model, capture.calls, config=BenchmarkConfig(), captured_batch_size=4, precision=None, metadata={"k": 1},
        output_dir=None, device="cpu", step=7,
    )  # fmt: skip
    try:
        assert fork.work_dir.name.startswith("cb_callback_")
        assert fork.snapshot_dir == fork.work_dir / SNAPSHOT_DIR and (fork.snapshot_dir / "snapshot.pt").is_file()
        assert fork.describe() == (
            f"cb_callback: snapshot of step 7 written to {fork.snapshot_dir}; profiling it in child process 99 "
            "while training continues"
        )
        result = fork.poll()  # exit code 0 but no report.json: a failure, with its message
        assert result is not None and result.report is None
        assert result.error is not None and result.error.startswith(
            "the profiling child ended but its report could not be read"
        )
    finally:
        shutil.rmtree(fork.work_dir)


def test_fork_report_warns_for_a_failed_child() -> None:
    report = Report([ComponentRow("", "Net", 0, None, "ok")])
    assert fork_report(ChildResult(report)) is report
    with pytest.warns(RuntimeWarning) as record:
        assert fork_report(ChildResult(None, "it crashed."), " Training is not affected.") is None
    assert [str(w.message) for w in record] == ["cb_callback: it crashed. Training is not affected."]
