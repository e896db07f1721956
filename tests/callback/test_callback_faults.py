"""ComponentBenchmark under bad input and faults: a clear message, and training goes on."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import cb_callback._lightning.callback as callback_module
import cb_callback._lightning.run as run_module
import cb_callback._report.tensorboard as tensorboard_module
from cb_callback import ComponentBenchmark
from tests._callback_models import GatedModule, MLPModule, run_fit
from tests._figures import blank_figures
from tests.conftest import FAST

OPTS: dict[str, Any] = {**FAST, "peak_flops": 1e11, "peak_bandwidth": 1e10}


@pytest.fixture(autouse=True)
def _blank_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test here reads an image: the reports' charts are drawn blank (a second each saved)."""
    blank_figures(monkeypatch)


def _ours(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if str(w.message).startswith("cb_callback")]


def test_hooks_are_removed_when_the_training_step_raises_at_the_capture_step(tmp_path: Path) -> None:
    cb = ComponentBenchmark(capture_step=2, **OPTS)
    seen: dict[str, Any] = {}

    class Spy(callback_module.Callback):
        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
            seen["active"] = cb._capture is not None and cb._capture.active

    with pytest.raises(RuntimeError, match="training_step failed at step 2"):
        run_fit(tmp_path, [Spy(), cb], model_kwargs={"fail_at": 2}, logger=False)
    assert seen == {"active": True}  # the step raised while capturing ...
    assert cb._capture is None  # ... and on_exception took the hooks off
    assert cb.report is None


def test_hooks_are_removed_in_teardown_too(tmp_path: Path) -> None:
    model = MLPModule()
    cb = ComponentBenchmark(capture_step=0, **OPTS)
    cb._active = True
    trainer: Any = type("T", (), {"global_step": 0, "sanity_checking": False, "global_rank": 0, "world_size": 1})()
    cb.on_train_batch_start(trainer, model, None, 0)
    assert cb._capture is not None and cb._capture.active
    cb.teardown(trainer, model, "fit")
    assert cb._capture is None
    assert all(not m._forward_pre_hooks for m in model.modules())


def test_training_step_returning_none_at_the_capture_step(tmp_path: Path) -> None:
    cb = ComponentBenchmark(capture_step=2, **OPTS)
    with pytest.warns(UserWarning) as record:
        trainer, _, _ = run_fit(tmp_path, [cb], model_kwargs={"none_at": 2}, logger=False)
    assert _ours(record) == [
        "cb_callback: training_step returned None at capture_step=2, so Lightning skipped this batch's "
        "backward and optimizer step; the captured forward inputs are profiled anyway."
    ]
    assert trainer.global_step == 6
    assert cb.report is not None
    # Every row measured, or left in situ with its time there (the triage follows in-situ times, and they
    # follow the machine's load: which small rows stay unreplayed varies).
    left = [r for r in cb.report.rows if r.status != "ok"]
    assert all(r.details.get("as") == "insitu" and math.isfinite(r.insitu_ms) for r in left), left


def test_a_step_that_calls_no_module_reports_every_component_not_run(tmp_path: Path) -> None:
    class ParamOnly(MLPModule):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.head.weight.square().sum()

    cb = ComponentBenchmark(capture_step=1, **OPTS)
    with pytest.warns(UserWarning) as record:
        trainer, _, _ = run_fit(tmp_path, [cb], model_cls=ParamOnly, max_steps=3, logger=False)
    assert _ours(record) == [
        "cb_callback: no module of ParamOnly ran during training step 1 (training_step called none of "
        "its submodules), so there is nothing to profile: every component is reported as not_run."
    ]
    assert trainer.global_step == 3
    assert cb.report is not None
    assert {r.status for r in cb.report.rows} == {"not_run"}
    assert len(cb.report.rows) == 7


def test_a_component_whose_replay_raises_is_failed_and_its_parent_estimated(tmp_path: Path) -> None:
    cb = ComponentBenchmark(capture_step=1, **OPTS)
    baseline = run_fit(tmp_path / "base", model_cls=GatedModule, max_steps=3, logger=False)
    _, _, recorder = run_fit(tmp_path / "cb", [cb], model_cls=GatedModule, max_steps=3, logger=False)
    assert all(torch.equal(a, b) for a, b in zip(baseline[2].losses, recorder.losses, strict=True))
    assert cb.report is not None
    gate, root = cb.report.row("gate"), cb.report.row("")
    assert gate.status == "failed"
    assert gate.error == "replay raised RuntimeError: GatedOnStep only runs inside training_step"
    assert root.status == "estimated"  # its replay runs the gate, so it is built from its children
    assert cb.report.row("encoder").status == "ok"
    assert (cb.output_dir / "report.json").is_file()


def test_unwritable_output_dir_warns_and_training_continues(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    out = blocker / "sub"  # a directory under a file can never be created
    cb = ComponentBenchmark(capture_step=1, output_dir=str(out), **OPTS)
    with pytest.warns(RuntimeWarning) as record:
        trainer, _, _ = run_fit(tmp_path / "run", [cb], max_steps=3)
    (message,) = _ours(record)
    assert message.startswith(f"cb_callback: output_dir {out} is not writable (")
    assert "Pass output_dir= a writable directory" in message
    assert trainer.global_step == 3
    assert cb.report is not None  # kept in memory ...
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(trainer.logger.log_dir)
    acc.Reload()
    assert "component_benchmark/total_ms/root" in acc.Tags()["scalars"]  # ... and logged


def test_a_failing_profile_run_warns_writes_an_error_file_and_training_continues(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError("out of memory while profiling")

    monkeypatch.setattr(run_module, "profile_captured", broken)
    cb = ComponentBenchmark(capture_step=1, **OPTS)
    with pytest.warns(RuntimeWarning) as record:
        trainer, _, _ = run_fit(tmp_path, [cb], max_steps=3, logger=False)
    error_file = tmp_path / "component_benchmark" / "error.txt"
    assert _ours(record) == [
        "cb_callback: profiling step 1 failed (MemoryError: out of memory while profiling); training "
        f"continues without a component report. Details: {error_file}"
    ]
    assert "Traceback" in error_file.read_text()
    assert trainer.global_step == 3
    assert cb.report is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_pause_mode_refuses_an_unavailable_device(tmp_path: Path) -> None:
    cb = ComponentBenchmark(capture_step=1, device="cuda", **OPTS)
    with pytest.raises(ValueError, match=r"device='cuda'.*CUDA is not available: "):
        run_fit(tmp_path, [cb], max_steps=2, logger=False)


def test_a_tensorboard_failure_is_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(tensorboard_module, "log_report", broken)
    cb = ComponentBenchmark(capture_step=1, **OPTS)
    with pytest.warns(RuntimeWarning) as record:
        trainer, _, _ = run_fit(tmp_path, [cb], max_steps=3)
    out = Path(trainer.logger.log_dir) / "component_benchmark"
    assert _ours(record) == [
        f"cb_callback: could not log the report to TensorBoard (OSError: disk full); it is written to {out} "
        "(report.json, components.csv, report.html, icicle_*.png, roofline.png)."
    ]
    assert trainer.global_step == 3
    assert cb.report is not None and (out / "report.json").is_file()
