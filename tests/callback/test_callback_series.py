"""Captures over training (capture_every / capture_steps): a report per capture, curves, resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from cb_callback import ComponentBenchmark
from cb_callback._lightning.when import CaptureSchedule
from tests._callback_models import WAIT_FOR_FORK, MLPModule, WaitsForForkModule, run_fit
from tests._children import forked_children
from tests._figures import blank_figures
from tests.callback.test_callback import MLP_PATHS, _assert_same_training
from tests.conftest import FAST

# descend_share=0: every row replayed at every capture (the curves' structure follows no timing-driven triage)
OPTS: dict[str, Any] = {**FAST, "peak_flops": 1e11, "peak_bandwidth": 1e10, "descend_share": 0.0}


@pytest.fixture(autouse=True)
def _blank_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test here reads an image: the reports' charts are drawn blank (a second each saved)."""
    blank_figures(monkeypatch)


def _meta(path: Path) -> dict[str, Any]:
    return json.loads((path / "report.json").read_text())["metadata"]


def test_capture_every_writes_a_report_per_capture_and_curves(tmp_path: Path) -> None:
    baseline = run_fit(tmp_path / "base", max_steps=8)
    cb = ComponentBenchmark(capture_step=1, capture_every=3, **OPTS)
    run = run_fit(tmp_path / "cb", [cb], max_steps=8)
    _assert_same_training(baseline, run)  # three profiles in the run, training bit-identical
    # global_step 0..7 run: captures start at 1, 4 and 7 (1 + 3k)
    assert sorted(cb.reports) == [1, 4, 7] and cb.report is cb.reports[7]
    assert cb.state_dict()["captured_steps"] == [1, 4, 7]
    out = cb.output_dir
    assert out is not None
    for step in (1, 4, 7):
        meta = _meta(out / f"step_{step}")
        assert (meta["capture_step"], meta["capture_series"]) == (step, True)
    assert not (out / "report.json").exists()  # a series: each capture in its own step_<N>/
    acc = EventAccumulator(str(run[0].logger.log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    # a series: the root and (log_scalars=None) the 10 costliest components, one point per capture
    for path in ("root", "encoder", "head"):
        assert [e.step for e in acc.Scalars(f"component_benchmark/total_ms/{path}")] == [1, 4, 7], path
    assert {r.path for r in cb.reports[4].rows} == set(MLP_PATHS)


def test_a_single_capture_keeps_its_place_and_logs_the_root_only(tmp_path: Path) -> None:
    cb = ComponentBenchmark(capture_step=2, **OPTS)
    run = run_fit(tmp_path, [cb], max_steps=4)
    assert cb.output_dir is not None and (cb.output_dir / "report.json").exists()
    assert "capture_series" not in _meta(cb.output_dir)
    acc = EventAccumulator(str(run[0].logger.log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    scalars = acc.Tags()["scalars"]
    assert "component_benchmark/total_ms/root" in scalars
    # one dot per chart is no chart: no component's scalars besides the root's
    assert [t for t in scalars if t.startswith("component_benchmark/") and not t.endswith("/root")] == []


def test_capture_steps_in_fork_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    forked_children(monkeypatch)  # two children, the schedule under test, not their start
    baseline = run_fit(tmp_path / "base", model_cls=WaitsForForkModule, max_steps=5)
    cb = ComponentBenchmark(capture_steps=[1, 3], mode="fork", fork_timeout_s=120, **OPTS)
    WAIT_FOR_FORK[:] = [cb]
    try:
        run = run_fit(tmp_path / "cb", [cb], model_cls=WaitsForForkModule, max_steps=5)
    finally:
        WAIT_FOR_FORK.clear()
    _assert_same_training(baseline, run)
    # step 2 waited for the first child: the capture due at step 3 was not held back
    assert sorted(cb.reports) == [1, 3]
    assert cb.output_dir is not None
    assert _meta(cb.output_dir / "step_3")["capture_step"] == 3
    assert (cb.output_dir / "step_1" / "snapshot").is_dir()  # each capture's snapshot stays for cb replay


def test_resume_does_not_repeat_the_captures_done(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    first = ComponentBenchmark(capture_step=1, capture_every=3, **OPTS)
    run_fit(tmp_path, [first, ckpt], max_steps=5, logger=False, enable_checkpointing=True, limit_val_batches=0)
    assert sorted(first.reports) == [1, 4]
    state = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)["callbacks"][first.state_key]
    assert state == {"captured": True, "capture_step": 1, "captured_steps": [1, 4]}
    import lightning.pytorch as pl

    again = ComponentBenchmark(capture_step=1, capture_every=3, **OPTS)
    pl.seed_everything(0, verbose=False)
    trainer = pl.Trainer(
        default_root_dir=tmp_path, max_steps=9, accelerator="cpu", devices=1, logger=False,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        limit_val_batches=0, callbacks=[again],
    )  # fmt: skip
    trainer.fit(MLPModule(), ckpt_path=tmp_path / "ckpt" / "last.ckpt")
    # resumed at global_step 5: 1 and 4 are done, 7 is the next capture (not 1 or 4 again)
    assert sorted(again.reports) == [7]
    assert again.state_dict()["captured_steps"] == [1, 4, 7]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"capture_every": 2, "capture_batches": 3}, r"capture_every=2\): expected an integer >= capture_batches"),
        ({"capture_every": 0}, r"capture_every=0"),
        ({"capture_every": 3, "capture_steps": [1]}, "capture_every or capture_steps, not both"),
        ({"capture_steps": []}, r"capture_steps=\[\]"),
        ({"capture_steps": [1, -2]}, r"capture_steps=\[1, -2\]"),
        ({"capture_every": 5, "stop_after": True}, "capture_every has no last capture"),
    ],
)
def test_the_schedule_is_validated(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ComponentBenchmark(**kwargs)


def _run(schedule: CaptureSchedule, steps: list[int], busy: set[int] = frozenset()) -> list[int]:  # type: ignore[assignment]
    """Drive the schedule over ``steps``; a step in ``busy`` is one where a fork child still runs (no take)."""
    for step in steps:
        if step in busy:
            continue
        window = schedule.window()
        if window is not None and window.take(step) and window.add(None):
            schedule.close()
    return schedule.done


def test_schedule_windows_hold_back_and_resume() -> None:
    # every 3 from 1, 2 steps each: captures at 1-2, 4-5, 7-8
    assert _run(CaptureSchedule(1, 2, every=3), list(range(10))) == [1, 4, 7]
    # steps 4..6 busy (a fork child): the capture due at 4 opens at 7; then the next start after 8 is 10
    assert _run(CaptureSchedule(1, 1, every=3), list(range(12)), busy={4, 5, 6}) == [1, 7, 10]
    # capture_steps sorted and deduplicated; a run past them resumes with what is left
    s = CaptureSchedule(0, 1, steps=[5, 2, 5])
    assert (s.first, s.planned, s.series) == (2, 2, True)
    s.restore([2])
    assert _run(s, list(range(3, 8))) == [2, 5] and s.finished
    one = CaptureSchedule(4, 1)
    assert (one.planned, one.series, one.output_dir(Path("o"), 4)) == (1, False, Path("o"))
    assert CaptureSchedule(4, 1, every=2).output_dir(Path("o"), 6) == Path("o/step_6")
    # a checkpoint of one capture (before capture_every) resumes as done
    old = CaptureSchedule(3, 1)
    old.load_state_dict({"captured": True, "capture_step": 3})
    assert old.done == [3] and old.finished
