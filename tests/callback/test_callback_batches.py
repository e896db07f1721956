"""ComponentBenchmark(capture_batches=k) and the compile what-if through the callback (issue 10)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cb_callback import ComponentBenchmark
from cb_callback._whatif.snapshot import load_snapshot
from tests._callback_models import BATCH, FEATURES, VAR_LENGTHS, VarLenModule, run_fit
from tests._children import forked_children
from tests._figures import blank_figures
from tests.callback.test_callback import _assert_same_training
from tests.conftest import FAST

OPTS: dict[str, Any] = {**FAST, "peak_flops": 1e11, "peak_bandwidth": 1e10, "descend_share": 0.0}  # all replayed


@pytest.fixture(autouse=True)
def _blank_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test here reads an image: the reports' charts are drawn blank (a second each saved)."""
    blank_figures(monkeypatch)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Any]:
    """The unprofiled run the profiled ones are compared with: VarLenModule, 6 steps (read only)."""
    return run_fit(tmp_path_factory.mktemp("base"), model_cls=VarLenModule, max_steps=6)


@pytest.mark.parametrize("mode", ["pause", "fork"])
def test_capture_batches_measures_each_step_and_training_is_unchanged(
    tmp_path: Path, mode: str, baseline: tuple[Any, Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    forked_children(monkeypatch)  # the batches the snapshot holds under test, not the child's start
    cb = ComponentBenchmark(capture_step=1, capture_batches=3, mode=mode, **OPTS)
    run = run_fit(tmp_path / mode, [cb], model_cls=VarLenModule, max_steps=6)
    _assert_same_training(baseline, run)
    report = cb.report
    assert report is not None and report.metadata["batches"] == 3
    # steps 1, 2, 3 are batches 1, 2, 3: lengths 8, 16, 4
    lengths = [VAR_LENGTHS[i % 3] for i in (1, 2, 3)]
    embed = report.row("embed")
    assert embed.details["shapes"] == [f"float32[{BATCH},{n},{FEATURES}]" for n in lengths]
    # Linear(8 -> 16) on (B, n, 8): 2·B·n·8·16 forward, n the length of the row's median batch
    assert embed.fwd_flops == 2 * BATCH * lengths[embed.details["median_batch"]] * FEATURES * 16
    assert [b["batch"] for b in report.row("").details["batches"]] == [0, 1, 2]
    assert "p90 ms" in report.summary()
    if mode == "fork":
        snap = load_snapshot(cb.output_dir / "snapshot")
        assert len(snap.batches) == 3


def test_a_run_that_ends_inside_the_capture_window_profiles_what_it_captured(tmp_path: Path) -> None:
    cb = ComponentBenchmark(capture_step=1, capture_batches=3, **OPTS)
    with pytest.warns(UserWarning) as seen:
        run_fit(tmp_path, [cb], model_cls=VarLenModule, max_steps=3)
    messages = [str(w.message) for w in seen if "cb_callback" in str(w.message)]
    assert any("capture_batches=3 needs global_step 3, but Trainer(max_steps=3)" in m for m in messages), messages
    assert any("training ended after 2 of capture_batches=3 steps" in m for m in messages), messages
    assert not any("never reached (" in m for m in messages), messages  # not also "never reached"
    assert cb.report is not None and cb.report.metadata["batches"] == 2


def test_compile_what_if_runs_from_the_callback(tmp_path: Path, baseline: tuple[Any, Any, Any]) -> None:
    cb = ComponentBenchmark(
        capture_step=1, compile=True, compile_options={"backend": "aot_eager"}, compile_top=2, **OPTS
    )
    _assert_same_training(baseline, run_fit(tmp_path / "cb", [cb], model_cls=VarLenModule, max_steps=6))
    assert cb.report is not None
    # the rows compiled themselves (a representative's copies carry its what-if with the rest of its row)
    compiled = [r for r in cb.report if "compile" in r.details and r.details.get("as") != "representative"]
    assert len(compiled) == 2 and all("error" not in r.details["compile"] for r in compiled)
    # the two most expensive by measured cost (the root, unless noise put a child above it)
    summary = cb.report.summary()
    assert all(f"compiling {r.path or 'root'} whole:" in summary for r in compiled), summary


def test_cli_flags_reach_the_engine(tmp_path: Path) -> None:
    from lightning.pytorch.cli import LightningCLI

    args = [
        "--trainer.callbacks+=cb_callback.ComponentBenchmark",
        "--trainer.callbacks.capture_batches=2",
        "--trainer.callbacks.compile=true",
        "--trainer.callbacks.compile_top=3",
        "--trainer.callbacks.compile_options={backend: eager, dynamic: false}",
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.logger=false",
        "--trainer.accelerator=cpu",
    ]
    cli = LightningCLI(VarLenModule, args=args, run=False, save_config_callback=None)
    (cb,) = [c for c in cli.trainer.callbacks if isinstance(c, ComponentBenchmark)]
    assert cb.config.compile is True and cb.config.compile_top == 3
    assert cb.config.compile_options == {"backend": "eager", "dynamic": False}
    assert cb._schedule.batches == 2


def test_capture_batches_is_validated() -> None:
    with pytest.raises(ValueError, match=r"capture_batches=0"):
        ComponentBenchmark(capture_batches=0)


def test_step_captures_takes_consecutive_steps_on_every_rank() -> None:
    from cb_callback._lightning.step import StepCaptures

    steps = StepCaptures(3, 2)
    assert not steps.take(2) and steps.take(3) and steps.last_step == 4
    assert steps.partial() is None  # nothing taken yet: the never-reached warning applies
    assert steps.add(None) is False  # a rank that does not profile takes the step too
    assert not steps.take(3)  # a second micro-batch of step 3 is not taken
    assert steps.partial() is not None and "profiling the 1 captured" in steps.partial()
    message = steps.partial(world_size=2)
    assert message is not None and "with 2 processes nothing is profiled" in message
    assert steps.take(5)  # global_step jumped (two optimizer steps per batch): the next step it reaches
    assert steps.add(None) is True and not steps.take(6) and steps.partial() is None
