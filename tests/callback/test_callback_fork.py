"""ComponentBenchmark(mode="fork"): snapshot, child process, polling, timeouts and failures.

A real ``spawn`` child costs seconds (it imports torch and Lightning), so one test
crashes a real child and the others run the child's entry point in-process
through a fake ``multiprocessing`` context.
"""

from __future__ import annotations

import multiprocessing
import shutil
import sys
import types
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, ClassVar

import pytest

import cb_callback._lightning.callback as callback_module
import cb_callback._lightning.child as child_module
from cb_callback import ComponentBenchmark
from cb_callback._lightning.spawn import spawn_problem
from cb_callback._whatif.snapshot import SnapshotError
from tests._callback_models import CrashingChildModule, MLPModule, run_fit
from tests._figures import blank_figures
from tests.conftest import FAST

OPTS: dict[str, Any] = {**FAST, "peak_flops": 1e11, "peak_bandwidth": 1e10}


@pytest.fixture(autouse=True)
def _blank_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test here reads an image: the reports' charts are drawn blank (a second each saved)."""
    blank_figures(monkeypatch)


def _ours(record: Any) -> list[str]:
    return [str(w.message) for w in record if str(w.message).startswith("cb_callback")]


class _InlineProcess:
    """Runs the child's target inside ``start()`` (a process that ends at once)."""

    started: ClassVar[list[_InlineProcess]] = []

    def __init__(self, target: Any, args: tuple[Any, ...], name: str, daemon: bool) -> None:
        self.target, self.args, self.name, self.daemon = target, args, name, daemon
        self.exitcode: int | None = None
        self.pid = 4242

    def start(self) -> None:
        _InlineProcess.started.append(self)
        try:
            self.target(*self.args)
            self.exitcode = 0
        except SystemExit as e:
            self.exitcode = int(e.code or 0)

    def is_alive(self) -> bool:
        return False

    def join(self, timeout: float | None = None) -> None:
        return None


class _HangingProcess(_InlineProcess):
    """Never ends until terminated."""

    def start(self) -> None:
        self.terminated = False
        self.joins: list[float | None] = []

    def is_alive(self) -> bool:
        return not self.terminated

    def join(self, timeout: float | None = None) -> None:
        self.joins.append(timeout)

    def terminate(self) -> None:
        self.terminated = True
        self.exitcode = -15

    def kill(self) -> None:
        self.terminate()


def _use(monkeypatch: pytest.MonkeyPatch, process: type) -> None:
    _InlineProcess.started = []
    monkeypatch.setattr(child_module, "spawn_context", lambda: types.SimpleNamespace(Process=process))


def test_a_real_child_that_crashes_becomes_a_warning_and_an_error_file(tmp_path: Path) -> None:
    cb = ComponentBenchmark(capture_step=1, mode="fork", **OPTS)
    with pytest.warns(RuntimeWarning) as record:
        trainer, _, _ = run_fit(tmp_path, [cb], model_cls=CrashingChildModule, max_steps=3, logger=False)
    assert trainer.global_step == 3
    assert cb.report is None
    (message,) = _ours(record)
    snapshot = tmp_path / "component_benchmark" / "snapshot"
    assert message.startswith("cb_callback: the profiling child process exited with code 7 before writing a report")
    assert 'if __name__ == "__main__":' in message
    assert f"cb replay {snapshot}" in message
    assert "Training is not affected." in message
    assert "exited with code 7" in (tmp_path / "component_benchmark" / "error.txt").read_text()
    assert (snapshot / "snapshot.pt").is_file()


def test_the_report_is_picked_up_at_the_next_batch_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _use(monkeypatch, _InlineProcess)
    cb = ComponentBenchmark(capture_step=1, mode="fork", **OPTS)
    seen: list[tuple[int, bool]] = []

    class Spy(callback_module.Callback):
        def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
            seen.append((trainer.global_step, cb.report is not None))

    trainer, _, _ = run_fit(tmp_path, [cb, Spy()], max_steps=4)
    # step 1's batch forks (global_step becomes 2); the next batch end finds the report
    assert seen == [(1, False), (2, False), (3, True), (4, True)]
    (proc,) = _InlineProcess.started
    out = Path(trainer.logger.log_dir) / "component_benchmark"
    assert proc.args[:4] == (str(out / "snapshot"), str(out), "cpu", 1)
    assert isinstance(proc.args[4], Connection)  # the pipe the child says what failed through
    assert proc.daemon is True
    assert cb.report is not None and cb.report.metadata["mode"] == "fork"
    assert cb.report.metadata["capture_device"] == "cpu"
    assert {p.name for p in out.iterdir()} >= {"snapshot", "report.json", "components.csv", "icicle_mfu.png"}


def test_a_child_past_fork_timeout_s_is_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _use(monkeypatch, _HangingProcess)
    cb = ComponentBenchmark(capture_step=1, mode="fork", fork_timeout_s=0.5, **OPTS)
    with pytest.warns(RuntimeWarning) as record:
        trainer, _, _ = run_fit(tmp_path, [cb], max_steps=3, logger=False)
    assert trainer.global_step == 3
    snapshot = tmp_path / "component_benchmark" / "snapshot"
    assert _ours(record) == [
        "cb_callback: the profiling child process was stopped: it did not finish within "
        f"fork_timeout_s=0.5. The snapshot is kept; profile it offline with `cb replay {snapshot}` "
        "(raise fork_timeout_s to wait longer). Training is not affected."
    ]
    assert "fork_timeout_s=0.5" in (tmp_path / "component_benchmark" / "error.txt").read_text()
    assert cb.report is None


def test_a_child_that_cannot_import_the_model_says_how_to_fix_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unimportable(*args: Any, **kwargs: Any) -> Any:
        raise SnapshotError("cannot load the snapshot: a class it references cannot be imported here")

    _use(monkeypatch, _InlineProcess)
    monkeypatch.setattr(child_module, "load_snapshot", unimportable)
    cb = ComponentBenchmark(capture_step=1, mode="fork", **OPTS)
    with pytest.warns(RuntimeWarning) as record:
        run_fit(tmp_path, [cb], max_steps=3, logger=False)
    (message,) = _ours(record)
    error_file = tmp_path / "component_benchmark" / "error.txt"
    assert message.startswith(
        "cb_callback: profiling failed in the child process (exit code 1): SnapshotError: cannot load the "
        "snapshot: a class it references cannot be imported here."
    )
    assert 'a script needs an `if __name__ == "__main__":` guard' in message
    assert message.endswith(f"Details: {error_file} Training is not affected.")
    assert "Traceback" in error_file.read_text()


def test_fork_with_an_unwritable_output_dir_uses_a_temporary_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _use(monkeypatch, _InlineProcess)
    blocker = tmp_path / "file"
    blocker.write_text("")
    cb = ComponentBenchmark(capture_step=1, mode="fork", output_dir=str(blocker / "out"), **OPTS)
    with pytest.warns(RuntimeWarning, match="fork mode keeps its snapshot in a temporary directory"):
        trainer, _, _ = run_fit(tmp_path / "run", [cb], max_steps=3)
    assert cb.report is not None
    (proc,) = _InlineProcess.started
    work = Path(proc.args[1])
    assert work.name.startswith("cb_callback_") and (work / "report.json").is_file()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(trainer.logger.log_dir)
    acc.Reload()
    assert acc.Scalars("component_benchmark/total_ms/root")[0].step == 1
    shutil.rmtree(work)


def test_stop_after_in_fork_mode_waits_for_the_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _use(monkeypatch, _InlineProcess)
    cb = ComponentBenchmark(capture_step=2, mode="fork", stop_after=True, **OPTS)
    trainer, _, _ = run_fit(tmp_path, [cb], max_steps=10, logger=False)
    assert trainer.global_step == 3
    assert cb.report is not None


# --- spawn preconditions, checked in setup ---------------------------------------------------


def _fake_main(monkeypatch: pytest.MonkeyPatch, file: str | None, spec: str | None = None) -> None:
    main = types.ModuleType("__main__")
    if file is not None:
        main.__file__ = file
    main.__spec__ = None if spec is None else types.SimpleNamespace(name=spec)  # type: ignore[assignment]
    monkeypatch.setitem(sys.modules, "__main__", main)


def test_spawn_problems_are_found_before_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    unguarded = tmp_path / "train.py"
    unguarded.write_text("import lightning\ntrainer.fit(model)\n")
    guarded = tmp_path / "guarded.py"
    guarded.write_text("class M: ...\nif __name__ == '__main__':\n    trainer.fit(model)\n")
    in_main = type("Net", (), {"__module__": "__main__", "__qualname__": "Net"})

    _fake_main(monkeypatch, str(unguarded))
    problem = spawn_problem(MLPModule)
    assert problem is not None
    assert f"re-imports the training script {unguarded}" in problem
    assert 'no `if __name__ == "__main__":` guard' in problem

    _fake_main(monkeypatch, str(guarded))
    assert spawn_problem(MLPModule) is None
    assert spawn_problem(in_main) is None  # a guarded script's classes unpickle in the child

    _fake_main(monkeypatch, None)  # a notebook or an interactive session
    problem = spawn_problem(in_main)
    assert problem is not None and "is defined in `__main__` (an interactive session or notebook)" in problem
    assert spawn_problem(MLPModule) is None

    _fake_main(monkeypatch, "/x/pkg/__main__.py", spec="pkg.__main__")  # python -m pkg: not re-imported
    assert spawn_problem(in_main) is not None
    assert spawn_problem(MLPModule) is None


def test_fork_of_a_class_defined_in_a_function_falls_back_to_pause(tmp_path: Path) -> None:
    class LocalModule(MLPModule):
        pass

    cb = ComponentBenchmark(capture_step=1, mode="fork", **OPTS, descend_share=0.0)  # head replayed, not in situ
    with pytest.warns(UserWarning, match=r"mode='fork'.*LocalModule is defined inside a function.*mode='pause'"):
        run_fit(tmp_path, [cb], model_cls=LocalModule, max_steps=2, logger=False)
    assert cb.mode == "pause"
    assert cb.report is not None and cb.report.row("head").status == "ok"


def test_training_inside_the_spawned_child_fails_fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    cb = ComponentBenchmark(capture_step=1, mode="fork", **OPTS)
    with pytest.raises(RuntimeError, match=r"training script: put the training code under an `if __name__"):
        run_fit(tmp_path, [cb], max_steps=2, logger=False)
