"""ComponentBenchmark: training is unchanged, the report lands in files and TensorBoard."""

from __future__ import annotations

import dataclasses
import inspect
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import cb_callback._lightning.callback as callback_module
import cb_callback._lightning.run as run_module
from cb_callback import BenchmarkConfig, ComponentBenchmark, Report
from cb_callback._engine.capture.tree import SCRIPTED
from cb_callback._lightning.step import step_capture
from cb_callback._lightning.trainer_bar import ProgressBar
from cb_callback._report.tensorboard import SCALAR_METRICS, scalar_rows
from tests._callback_models import (
    BATCH,
    CLASSES,
    FEATURES,
    ChildrenOnlyModule,
    MLPModule,
    ScriptedModule,
    TransformerModule,
    run_fit,
)
from tests._children import forked_children
from tests._figures import blank_figures
from tests.conftest import FAST

# User peaks: no CPU calibration, and MFU is finite so its scalars are written.
PEAKS: dict[str, Any] = dict(peak_flops=1e11, peak_bandwidth=1e10)
#: descend_share=0: every row is replayed (these tests are about the callback, not the triage, whose
#: in-situ shares follow the machine's load).
OPTS: dict[str, Any] = {**FAST, **PEAKS, "descend_share": 0.0}
MLP_PATHS = ["", "encoder", "head", "encoder.0", "encoder.1", "encoder.2", "encoder.3"]
REQUIRED_SCALARS = ("total_ms", "fwd_ms", "bwd_ms", "mfu", "tflops", "peak_mem_mb")


def _events(logdir: str | Path) -> EventAccumulator:
    acc = EventAccumulator(str(logdir), size_guidance={"images": 0, "scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def _assert_same_training(a: tuple[Any, Any, Any], b: tuple[Any, Any, Any]) -> None:
    (ta, ma, ra), (tb, mb, rb) = a, b
    assert ra.steps == rb.steps
    assert len(ra.losses) == len(rb.losses) == len(ra.steps)
    for i, (la, lb) in enumerate(zip(ra.losses, rb.losses, strict=True)):
        assert torch.equal(la, lb), f"loss of batch {i} differs: {la.item()!r} != {lb.item()!r}"
    sa, sb = ma.state_dict(), mb.state_dict()
    assert list(sa) == list(sb)
    for key in sa:
        assert torch.equal(sa[key], sb[key]), f"state_dict[{key!r}] differs"
    oa, ob = ta.optimizers[0].state_dict()["state"], tb.optimizers[0].state_dict()["state"]
    assert oa.keys() == ob.keys()
    for idx in oa:
        for name, value in oa[idx].items():
            other = ob[idx][name]
            assert torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other


# --- arguments -------------------------------------------------------------------------


def test_every_benchmark_option_is_an_argument_with_the_same_default() -> None:
    params = inspect.signature(ComponentBenchmark.__init__).parameters
    defaults = BenchmarkConfig()
    for f in dataclasses.fields(BenchmarkConfig):
        if f.name in ("progress", "output_dir", "ranks"):  # the callback owns these (ranks: default "zero")
            continue
        assert f.name in params, f"BenchmarkConfig.{f.name} is not a ComponentBenchmark argument"
        assert params[f.name].default == getattr(defaults, f.name), f.name
    assert ComponentBenchmark(capture_step=3, warmup=5).config.warmup == 5


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"capture_step": -1}, "capture_step"),
        ({"capture_step": True}, "capture_step"),
        ({"mode": "thread"}, "mode"),
        ({"ranks": "some"}, "ranks"),
        ({"capture_batch_size": 0}, "capture_batch_size"),
        ({"fork_timeout_s": -1.0}, "fork_timeout_s"),
        ({"enabled": "yes"}, "enabled"),
        ({"output_dir": 3}, "output_dir"),
        ({"warmup": -1}, "warmup"),
        ({"max_repeats": 0}, "max_repeats"),
        ({"dtype": "int3"}, "dtype"),
        ({"min_run_time_s": math.inf}, "min_run_time_s"),
    ],
)
def test_invalid_arguments_raise_naming_the_argument(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=rf"\b{name}="):
        ComponentBenchmark(**kwargs)


def test_state_key_and_state_dict() -> None:
    a, b = ComponentBenchmark(capture_step=3), ComponentBenchmark(capture_step=4)
    assert a.state_key != b.state_key
    assert a.state_key != ComponentBenchmark(capture_step=3, mode="fork").state_key
    assert a.state_key == ComponentBenchmark(capture_step=3).state_key
    assert a.state_dict() == {"captured": False, "capture_step": 3, "captured_steps": []}
    a.load_state_dict({"captured": True})
    assert a.state_dict()["captured"] is True
    a.load_state_dict({})  # an older or foreign state: defaults
    assert a.state_dict()["captured"] is False


# --- bit-identical training, TensorBoard and files ------------------------------------------


def _assert_tensorboard(logdir: str, report: Report, step: int) -> None:
    acc = _events(logdir)
    tags = acc.Tags()
    # the run's only capture (log_scalars=None, no capture_series): the root's scalars alone
    assert report.metadata["config"]["log_scalars"] is None and "capture_series" not in report.metadata
    logged = {r.path for r in scalar_rows(report, "root")}
    assert logged == {""}
    for row in report.rows:
        for metric in SCALAR_METRICS:
            tag = f"component_benchmark/{metric}/{row.path or 'root'}"
            value = float(getattr(row, metric))
            if row.path in logged and math.isfinite(value):
                (event,) = acc.Scalars(tag)
                assert event.step == step
                assert event.value == pytest.approx(value, rel=1e-6)
            else:
                assert tag not in tags["scalars"]
    for metric in REQUIRED_SCALARS:
        assert f"component_benchmark/{metric}/root" in tags["scalars"]
    texts = {t for t in tags["tensors"] if t.startswith("component_benchmark/")}
    assert texts == {"component_benchmark/table", "component_benchmark/summary"}
    assert acc.Tensors("component_benchmark/table")[0].step == step
    images = {t for t in tags["images"] if t.startswith("component_benchmark/")}
    assert images == {f"component_benchmark/icicle/{m}" for m in ("mfu", "total_ms", "peak_mem_mb")}
    for tag in images:
        (image,) = acc.Images(tag)
        assert image.step == step
        assert (image.width, image.height) == (1600, 900)


def _assert_files(directory: Path, report: Report) -> None:
    names = {p.name for p in directory.iterdir()}
    expected = {
        "report.json",
        "components.csv",
        "report.html",
        "icicle_mfu.png",
        "icicle_total_ms.png",
        "icicle_peak_mem_mb.png",
    }
    assert expected <= names
    assert "error.txt" not in names
    assert [r.path for r in Report.load(directory).rows] == [r.path for r in report.rows]


@pytest.mark.parametrize("model_cls", [MLPModule, TransformerModule], ids=["mlp", "transformer"])
def test_pause_and_fork_leave_training_bit_identical(
    tmp_path: Path, model_cls: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    if model_cls is TransformerModule:  # the MLP draws every chart for real; this one TensorBoard's (read below)
        blank_figures(monkeypatch, tensorboard=False)
        forked_children(monkeypatch)  # the MLP's fork-mode child is a real spawn one
    # max_steps=10 crosses an epoch (8 batches): the second epoch's shuffle draws from the global RNG
    baseline = run_fit(tmp_path / "base", model_cls=model_cls, max_steps=10)
    for mode in ("pause", "fork"):
        cb = ComponentBenchmark(capture_step=2, mode=mode, **OPTS)
        run = run_fit(tmp_path / mode, [cb], model_cls=model_cls, max_steps=10)
        _assert_same_training(baseline, run)
        trainer, model, _ = run
        assert all(not m._forward_pre_hooks for m in model.modules()), mode
        report = cb.report
        assert report is not None, mode
        assert report.metadata["capture_step"] == 2
        assert report.metadata["mode"] == mode
        assert report.metadata["real_batch_size"] == BATCH
        not_ok = {r.path: r.status for r in report.rows if r.status != "ok"}
        # MultiheadAttention uses out_proj's weights without calling it
        expected = {} if model_cls is MLPModule else {"block.self_attn.out_proj": "not_run"}
        assert not_ok == expected, report.summary()
        assert report.row("").module_type == model_cls.__name__
        if model_cls is MLPModule:
            assert [r.path for r in report.rows] == MLP_PATHS
            # Linear(8 -> 16) on a batch of 8: 2 * 8 * 8 * 16 FLOPs forward
            assert report.row("encoder.0").fwd_flops == 2 * BATCH * FEATURES * 16
        assert cb.output_dir == Path(trainer.logger.log_dir) / "component_benchmark"
        _assert_files(cb.output_dir, report)
        _assert_tensorboard(trainer.logger.log_dir, report, step=2)
    assert (tmp_path / "fork/tb/version_0/component_benchmark/snapshot/snapshot.pt").is_file()


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("mode", ["pause", "fork"])
def test_a_torchscript_submodule_is_replayed_whole_and_training_stays_bit_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    blank_figures(monkeypatch)  # reads no image
    forked_children(monkeypatch)  # fork mode's child: a fork, not a spawn (the snapshot is still written and read)
    baseline = run_fit(tmp_path / "base", model_cls=ScriptedModule, max_steps=4, logger=False)
    cb = ComponentBenchmark(capture_step=2, mode=mode, descend="all", output_dir=tmp_path / "out", **OPTS)
    run = run_fit(tmp_path / mode, [cb], model_cls=ScriptedModule, max_steps=4, logger=False)
    # register_forward_pre_hook on a ScriptModule raised into the step; the scripted BatchNorm's running stats
    # are restored after its replays
    _assert_same_training(baseline, run)
    report = cb.report  # fork: the snapshot pickles the ScriptModule as its torch.jit.save archive
    assert report is not None
    assert report.metadata["mode"] == mode
    # every row replayed, encoder.0 and encoder.1 whole (global hooks took their calls), noted so
    assert [r.path for r in report.rows] == MLP_PATHS
    assert {r.path: r.status for r in report.rows if r.status != "ok"} == {}, report.summary()
    assert {r.path: r.note for r in report.rows if r.note is not None} == {"encoder.0": SCRIPTED, "encoder.1": SCRIPTED}
    # Linear(8 -> 16) on a batch of 8: 2 * 8 * 8 * 16 FLOPs forward, in situ as in its replay
    assert report.row("encoder.0").fwd_flops == 2 * BATCH * FEATURES * 16
    # and all of encoder's (FlopCounterMode counts no FLOPs for BatchNorm, ReLU and Dropout)
    assert report.row("encoder").fwd_flops == 2 * BATCH * FEATURES * 16


def test_gradient_accumulation_profiles_the_first_micro_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blank_figures(monkeypatch)  # reads no image
    seen: dict[str, Any] = {}
    real = run_module.profile_captured

    def spy(model: Any, calls: Any, **kwargs: Any) -> Report:
        seen["x"] = calls[""].args[0].clone()
        seen["grads"] = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
        return real(model, calls, **kwargs)

    class Batches(callback_module.Callback):
        def __init__(self) -> None:
            self.batches: list[tuple[int, int, torch.Tensor]] = []

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            self.batches.append((trainer.global_step, batch_idx, batch[0].clone()))

    monkeypatch.setattr(run_module, "profile_captured", spy)
    baseline = run_fit(tmp_path / "base", accumulate_grad_batches=2, max_steps=4, val_check_interval=None)
    batches = Batches()
    cb = ComponentBenchmark(capture_step=1, **OPTS)
    run = run_fit(tmp_path / "cb", [batches, cb], accumulate_grad_batches=2, max_steps=4, val_check_interval=None)
    _assert_same_training(baseline, run)
    # global_step 1 is micro-batches 2 and 3; the first of them was captured.
    assert [(s, i) for s, i, _ in batches.batches[:4]] == [(0, 0), (0, 1), (1, 2), (1, 3)]
    assert torch.equal(seen["x"], batches.batches[2][2])
    # Profiled between the micro-batches: gradients were accumulating (and survived).
    assert all(g is not None for g in seen["grads"])
    assert cb.report is not None and cb.report.row("").calls == 1


def test_root_not_called_by_training_step_is_estimated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blank_figures(monkeypatch)  # reads no image
    cb = ComponentBenchmark(capture_step=1, **OPTS)
    run_fit(tmp_path, [cb], model_cls=ChildrenOnlyModule, max_steps=2, logger=False)
    assert cb.report is not None
    root = cb.report.row("")
    assert root.status == "estimated"
    assert root.calls == 0
    assert [cb.report.row(p).status for p in ("encoder", "head")] == ["ok", "ok"]
    # the root's time is its children's, weighted by their calls (one each)
    assert root.total_ms == pytest.approx(cb.report.row("encoder").total_ms + cb.report.row("head").total_ms)


def test_never_captures_during_sanity_check_or_validation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blank_figures(monkeypatch)  # reads no image

    # Validation batches have 4 samples (batch_size 8 over 16 would not tell): use 4.
    class SmallVal(MLPModule):
        def val_dataloader(self) -> Any:
            from torch.utils.data import DataLoader, TensorDataset

            return DataLoader(TensorDataset(torch.randn(8, FEATURES), torch.zeros(8, dtype=torch.long)), batch_size=4)

    # capture_step 0 follows the sanity check; validation runs right after step 0's batch.
    cb = ComponentBenchmark(capture_step=0, **OPTS)
    run_fit(tmp_path, [cb], model_cls=SmallVal, max_steps=2, num_sanity_val_steps=2, val_check_interval=1)
    assert cb.report is not None
    assert cb.report.metadata["real_batch_size"] == BATCH
    assert cb.report.row("encoder.3").calls == 1  # the validation forwards were not counted
    assert cb.report.row("").calls == 1


def test_capture_batch_size_stores_k_samples_and_replicates_to_the_real_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blank_figures(monkeypatch)  # reads no image
    cb = ComponentBenchmark(capture_step=1, capture_batch_size=2, **OPTS)
    run_fit(tmp_path, [cb], max_steps=2, logger=False)
    assert cb.report is not None
    meta = cb.report.metadata
    assert meta["captured_batch_size"] == 2
    assert meta["real_batch_size"] == BATCH
    assert meta["config"]["batch_size"] == BATCH
    # replicated back to 8 samples: 2 * 8 * 8 * 16 FLOPs, not 2 * 2 * 8 * 16
    assert cb.report.row("encoder.0").fwd_flops == 2 * BATCH * FEATURES * 16
    assert cb.report.row("head").fwd_flops == 2 * BATCH * 16 * CLASSES


def test_precision_context_and_dtype_come_from_the_trainer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blank_figures(monkeypatch)  # reads no image
    seen: list[Any] = []
    real = run_module.profile_captured

    def spy(model: Any, calls: Any, **kwargs: Any) -> Report:
        ctx = kwargs["forward_context"]
        with ctx():
            seen.append((ctx.__self__, torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return real(model, calls, **kwargs)

    monkeypatch.setattr(run_module, "profile_captured", spy)
    cb = ComponentBenchmark(capture_step=1, **OPTS)
    trainer, _, _ = run_fit(tmp_path / "a", [cb], max_steps=2, logger=False, precision="bf16-mixed")
    assert seen == [(trainer.precision_plugin, True, torch.bfloat16)]
    assert cb.report is not None
    assert cb.report.metadata["dtype"] == "bf16"
    assert cb.report.metadata["peaks"]["dtype"] == "bf16"
    assert cb.report.metadata["precision"] == "bf16-mixed"
    # an explicit dtype wins over the Trainer's precision
    cb32 = ComponentBenchmark(capture_step=1, dtype="fp32", **OPTS)
    run_fit(tmp_path / "b", [cb32], max_steps=2, logger=False, precision="bf16-mixed")
    assert cb32.report is not None and cb32.report.metadata["dtype"] == "fp32"


# --- outputs without TensorBoard ---------------------------------------------------------


def test_without_tensorboard_files_are_written_and_the_run_says_where(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning.pytorch.loggers import CSVLogger

    cb = ComponentBenchmark(capture_step=1, **OPTS)
    with caplog.at_level("INFO"):
        trainer, _, _ = run_fit(tmp_path / "csv", [cb], max_steps=2, logger=CSVLogger(tmp_path / "csv"))
    expected = Path(trainer.logger.log_dir) / "component_benchmark"
    assert cb.output_dir == expected
    assert cb.report is not None
    _assert_files(expected, cb.report)
    (message,) = [m for m in caplog.messages if m.startswith("cb_callback: component report")]
    assert str(expected) in message
    assert "no TensorBoardLogger" in message

    blank_figures(monkeypatch)  # the charts were drawn above; below, where the files go
    cb2 = ComponentBenchmark(capture_step=1, **OPTS)
    run_fit(tmp_path / "none", [cb2], max_steps=2, logger=False)
    assert cb2.output_dir == tmp_path / "none" / "component_benchmark"
    assert cb2.report is not None
    _assert_files(cb2.output_dir, cb2.report)

    own = tmp_path / "mine"
    cb3 = ComponentBenchmark(capture_step=1, output_dir=str(own), log_to_tensorboard=False, **OPTS)
    trainer3, _, _ = run_fit(tmp_path / "tb", [cb3], max_steps=2)
    assert cb3.output_dir == own and (own / "report.json").is_file()
    tags = _events(trainer3.logger.log_dir).Tags()
    assert not [t for kind in ("scalars", "images", "tensors") for t in tags[kind] if t.startswith("component_")]


def test_progress_bar_follows_the_trainers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blank_figures(monkeypatch)  # reads no image
    calls: list[tuple[int, int, str]] = []
    real = ProgressBar.__call__

    def spy(self: Any, done: int, total: int, path: str) -> None:
        calls.append((done, total, path))
        real(self, done, total, path)

    monkeypatch.setattr(ProgressBar, "__call__", spy)
    cb = ComponentBenchmark(capture_step=1, **OPTS)
    run_fit(tmp_path / "on", [cb], max_steps=2, logger=False, enable_progress_bar=True)
    # one step per component (its instrumented pass), then one per interleaved timing round
    rounds = [(7 + r, 7 + 5, f"timing round {r}/5") for r in range(1, 6)]
    assert calls == [(i + 1, 7 + 5, p) for i, p in enumerate(MLP_PATHS)] + rounds
    calls.clear()
    cb = ComponentBenchmark(capture_step=1, **OPTS)
    run_fit(tmp_path / "off", [cb], max_steps=2, logger=False, enable_progress_bar=False)
    assert cb.report is not None and calls == []


# --- toggles, resume, stop -----------------------------------------------------------------


def test_disabled_by_argument_or_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entered: list[Any] = []
    monkeypatch.setattr(callback_module.Capture, "__enter__", lambda self: entered.append(self) or self)
    off = ComponentBenchmark(capture_step=1, enabled=False, **OPTS)
    monkeypatch.setenv("CB_DISABLE", "1")
    env = ComponentBenchmark(capture_step=2, **OPTS)
    with _no_cb_warnings():
        run_fit(tmp_path, [off, env], max_steps=3, logger=False)
    assert entered == []
    assert off.report is None and env.report is None
    assert not (tmp_path / "component_benchmark").exists()


class _no_cb_warnings:
    """Fail on any cb_callback warning inside the block."""

    def __enter__(self) -> None:
        import warnings

        self._cm = warnings.catch_warnings(record=True)
        self._log = self._cm.__enter__()
        warnings.simplefilter("always")

    def __exit__(self, *exc: Any) -> None:
        self._cm.__exit__(*exc)
        ours = [str(w.message) for w in self._log if "cb_callback" in str(w.message)]
        assert ours == []


def test_capture_step_never_reached_warns_once_at_the_end(tmp_path: Path) -> None:
    cb = ComponentBenchmark(capture_step=50, **OPTS)
    with pytest.warns(UserWarning) as record:
        run_fit(tmp_path / "a", [cb], max_steps=-1, max_epochs=1, limit_train_batches=3, logger=False)
    ours = [str(w.message) for w in record if "cb_callback" in str(w.message)]
    assert ours == [
        "cb_callback: capture_step=50 was never reached (training ran global_step 0 to 2), so nothing "
        "was profiled. Pick a capture_step the run reaches."
    ]
    assert cb.report is None


def test_capture_step_beyond_max_steps_warns_at_setup_only(tmp_path: Path) -> None:
    cb = ComponentBenchmark(capture_step=4, **OPTS)
    with pytest.warns(UserWarning) as record:
        run_fit(tmp_path, [cb], max_steps=4, logger=False)
    ours = [str(w.message) for w in record if "cb_callback" in str(w.message)]
    assert len(ours) == 1
    assert ours[0].startswith("cb_callback: capture_step=4 is never reached: Trainer(max_steps=4)")
    assert "Lower capture_step" in ours[0]


def test_resume_after_the_capture_step_does_not_profile_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blank_figures(monkeypatch)  # reads no image
    from lightning.pytorch.callbacks import ModelCheckpoint

    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    first = ComponentBenchmark(capture_step=1, **OPTS)
    run_fit(tmp_path, [first, ckpt], max_steps=3, logger=False, enable_checkpointing=True, limit_val_batches=0)
    assert first.report is not None
    state = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)["callbacks"][first.state_key]
    assert state == {"captured": True, "capture_step": 1, "captured_steps": [1]}

    profiled: list[Any] = []
    real = run_module.profile_captured

    def spy(*args: Any, **kwargs: Any) -> Report:
        profiled.append(kwargs["metadata"]["capture_step"])
        return real(*args, **kwargs)

    monkeypatch.setattr(run_module, "profile_captured", spy)
    again = ComponentBenchmark(capture_step=1, **OPTS)
    other = ComponentBenchmark(capture_step=4, **OPTS)  # a second instance, not yet run: it profiles
    import lightning.pytorch as pl

    pl.seed_everything(0, verbose=False)
    trainer = pl.Trainer(
        default_root_dir=tmp_path, max_steps=6, accelerator="cpu", devices=1, logger=False,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        limit_val_batches=0, callbacks=[again, other],
    )  # fmt: skip
    with _no_cb_warnings():
        trainer.fit(MLPModule(), ckpt_path=tmp_path / "ckpt" / "last.ckpt")
    assert trainer.global_step == 6
    assert profiled == [4]  # `other`; `again` was restored as captured
    assert again.report is None and again.state_dict()["captured"] is True


def test_stop_after_ends_training_once_profiled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blank_figures(monkeypatch)  # reads no image
    cb = ComponentBenchmark(capture_step=1, stop_after=True, **OPTS)
    trainer, _, recorder = run_fit(tmp_path, [cb], max_steps=10, logger=False)
    assert cb.report is not None
    assert trainer.global_step == 2
    assert recorder.steps == [1, 2]  # global_step after each batch's optimizer step


def test_lightning_cli_builds_and_runs_the_callback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blank_figures(monkeypatch)  # reads no image
    from lightning.pytorch.cli import LightningCLI

    fast = [f"--trainer.callbacks.{k}={v}" for k, v in OPTS.items()]
    args = [
        "--trainer.callbacks+=cb_callback.ComponentBenchmark",
        "--trainer.callbacks.capture_step=5",
        *fast,
        "--trainer.callbacks.include=[encoder, encoder.*, '']",
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.max_steps=6",
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.limit_val_batches=0",
        "--trainer.accelerator=cpu",
    ]
    cli = LightningCLI(MLPModule, args=args, run=False, save_config_callback=None)
    (cb,) = [c for c in cli.trainer.callbacks if isinstance(c, ComponentBenchmark)]
    assert cb.capture_step == 5
    assert cb.config.warmup == 0 and cb.config.peak_flops == 1e11
    assert cb.config.include == ("encoder", "encoder.*", "")
    cli.trainer.fit(cli.model)
    assert cb.report is not None
    assert cb.report.metadata["capture_step"] == 5
    assert [r.status for r in cb.report.rows] == ["ok", "ok", "skipped", "ok", "ok", "ok", "ok"]


def test_forward_redirection_captures_the_roots_real_forward() -> None:
    # DDP-like strategies call training_step through the root's patched forward.
    from lightning.pytorch.strategies.strategy import _ForwardRedirection
    from torch import nn

    class Wrapper(nn.Module):  # what DistributedDataParallel does with its module
        def __init__(self, module: nn.Module) -> None:
            super().__init__()
            self.module = module

        def forward(self, *args: Any) -> Any:
            return self.module(*args)

    model = MLPModule()
    x, y = torch.randn(BATCH, FEATURES), torch.zeros(BATCH, dtype=torch.long)
    capture = step_capture(model, keep_samples=None).__enter__()
    try:
        _ForwardRedirection()(Wrapper(model), model, "training_step", (x, y), 0)
    finally:
        capture.remove()
    assert not capture.active
    root = capture.calls[""]
    assert len(root.args) == 1 and torch.equal(root.args[0], x)  # forward(x), not (batch, batch_idx)
    assert root.calls == 1
    assert capture.calls["head"].calls == 1
    assert capture.batch_size == BATCH
    # without redirection it is a plain capture of the root
    plain = step_capture(model, keep_samples=2).__enter__()
    try:
        model(x)
    finally:
        plain.remove()
    assert torch.equal(plain.calls[""].args[0], x[:2]) and plain.stored_batch_size == 2
