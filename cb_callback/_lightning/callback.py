"""``ComponentBenchmark``: the Lightning callback that captures training steps and profiles them.

A thin adapter (*when* to capture, *where* results go); the work is in modules without Lightning.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from lightning.pytorch.callbacks.callback import Callback
from lightning.pytorch.callbacks.progress import RichProgressBar, TQDMProgressBar
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from typing_extensions import override

from cb_callback._engine.capture.capture import Capture
from cb_callback._lightning import args as _args
from cb_callback._lightning import placement as place
from cb_callback._lightning import publish as _publish
from cb_callback._lightning import run
from cb_callback._lightning import step as _step
from cb_callback._lightning.child import ChildResult
from cb_callback._lightning.fork import Fork, fork_report
from cb_callback._lightning.spawn import fork_problem, fork_sharded_problem
from cb_callback._lightning.step import OptionValue, StepCaptures, UserValue  # _types' aliases (300 lines)
from cb_callback._lightning.trainer_bar import TrainerBar
from cb_callback._lightning.when import CaptureSchedule
from cb_callback._report.context import ReportContext
from cb_callback._report.pixels import sharing

if TYPE_CHECKING:
    import lightning.pytorch as pl
    import torch

    from cb_callback._report.model import Report

__all__ = ["ComponentBenchmark"]


def _bar(trainer: pl.Trainer) -> TrainerBar:
    """The Trainer's progress bar on rank zero, to draw the pause and print through (none on other ranks)."""
    return TrainerBar(
        trainer.progress_bar_callback if trainer.is_global_zero else None, RichProgressBar, TQDMProgressBar
    )


class ComponentBenchmark(Callback):
    r"""Profiles every component of the LightningModule on the inputs of real training steps.

    At ``trainer.global_step == capture_step`` (and every ``capture_every`` steps after, or at each of
    ``capture_steps``) it hooks every submodule, lets the real step run untouched, takes the hooks off, and
    replays each component alone, forward and backward (:func:`cb_callback.profile_components`). Each report
    goes through the reporters of :mod:`cb_callback.reporters`: files in ``output_dir`` (``step_<N>/`` per
    capture when the run captures several), and TensorBoard at the capture's step under
    ``component_benchmark/`` (curves over the captures). Every keyword but the callback's own is a
    :class:`cb_callback.BenchmarkConfig` option, by its name and with its default (the signature is derived
    from the dataclass); below is what differs (docs/callback.md has the details).

    Example: ``L.Trainer(callbacks=[cb := ComponentBenchmark(capture_step=10)]).fit(model)``; ``cb.report``.

    Args:
        capture_step: the ``trainer.global_step`` whose first micro-batch is captured (resumed past it: its first).
        capture_batches: capture ``k`` consecutive steps (dynamic shapes); each row is the median of the ``k``.
        capture_every: capture again every ``N >= capture_batches`` steps until training ends (cost over time).
        capture_steps: capture at each of these steps instead (``capture_step`` is then unused).
        mode: ``"pause"`` profiles in-process after the capture; ``"fork"`` in a ``spawn``-ed child meanwhile.
        max_total_time_s: ``None``: no limit in one process; with DDP half the strategy's collective timeout.
        device: where to replay (``None``: the module's); another device gets a copy of the module.
        dtype: the MFU peak's dtype; ``None`` follows ``Trainer(precision=...)`` or infers it.
        log_scalars: ``None``: the root's scalars with one capture; with several, the 10 costliest components too.
        reporters: extra :class:`cb_callback.reporters.Reporter` plugins (pause mode: ``ctx.writer`` is the logger's).
        capture_batch_size: keep ``k`` samples per input, replicated back to the batch size.
        output_dir: default ``<log_dir>/component_benchmark``; ``ranks="all"`` adds ``rank_<global_rank>/``.
        log_to_tensorboard: log to the first ``TensorBoardLogger`` of ``trainer.loggers``.
        stop_after: stop training once every scheduled capture is profiled (not with ``capture_every``).
        ranks: ``"zero"``: rank 0 profiles; ``"all"``: every rank does (sharded: every rank replays in lockstep).
        enabled: ``False`` makes the callback do nothing (so does ``CB_DISABLE=1``).
        fork_timeout_s: how long ``on_train_end`` waits for the fork child (``None``: no limit).

    Raises:
        ValueError: an invalid argument, naming it.

    Attributes:
        report: the latest :class:`cb_callback.Report` once profiled, else ``None``; ``reports``: each by its step.
        output_dir: the resolved output directory (after ``setup``).

    Notes:
        Training is unchanged (bit-identical losses and weights): hooks only copy inputs, the replay runs after
        the (last) captured batch (with gradient accumulation, its step's first micro-batch) and restores
        weights, grads, buffers, flags, RNG and FSDP's state. A fork child still profiling holds the next
        capture back. Isolation cannot see fusion across modules, cache state or overlap with communication.
    """

    def __init__(
        self,
        capture_step: int = 10,
        mode: Literal["pause", "fork"] = "pause",
        *,
        capture_batches: int = 1, capture_every: int | None = None, capture_steps: Sequence[int] | None = None,
        capture_batch_size: int | None = None, output_dir: str | None = None,
        log_to_tensorboard: bool = True, stop_after: bool = False, ranks: Literal["zero", "all"] = "zero",
        enabled: bool = True, fork_timeout_s: float | None = 300.0,
        **options: OptionValue,  # BenchmarkConfig's options, by its names, with its defaults (see ENGINE_OPTIONS)
    ) -> None:  # fmt: skip
        super().__init__()
        self.config = _args.check_callback_args({**locals(), **options}, options)  # every argument, by name
        self.capture_step, self.mode, self.ranks, self.enabled = capture_step, mode, ranks, enabled
        self.capture_batch_size, self.stop_after = capture_batch_size, stop_after
        self.log_to_tensorboard = log_to_tensorboard
        self.fork_timeout_s = None if fork_timeout_s is None else float(fork_timeout_s)
        self._output_dir_arg = None if output_dir is None else os.fspath(output_dir)
        # Lightning reads state_key around every hook call: build it once.
        key = (capture_step, mode, ranks, self.config, self._output_dir_arg, capture_every, capture_steps)
        self._state_key = self._generate_state_key(**_args.state_key_fields(*key))
        self.report: Report | None = None
        self.reports: dict[int, Report] = {}
        self.output_dir: Path | None = None  # resolved in setup
        self._active = self._pending = False  # pending: a capture's step is running
        self._capture: Capture | None = None
        self._schedule = CaptureSchedule(capture_step, capture_batches, capture_every, capture_steps)
        self._fork: Fork | None = None
        self._files_ok, self._warned_unreached = True, False
        self._time_bound_s: float | None = None

    @property
    @override
    def state_key(self) -> str:
        return self._state_key

    @override
    def state_dict(self) -> dict[str, Any]:
        return self._schedule.state_dict()

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._schedule.load_state_dict(state_dict)

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._active = _args.active(self.enabled, rank_zero_info)  # enabled=False or CB_DISABLE=1: not
        if not self._active:
            return
        if self.mode == "fork" and (problem := fork_problem(type(pl_module))) is not None:
            rank_zero_warn(problem)  # never crash the user's run: profile in-process, and say how to fork
            self.mode = "pause"
        place.check_pause_device(self.config.device if self.mode == "pause" else None)
        log_dir = lambda: trainer.log_dir or trainer.default_root_dir  # noqa: E731  (a broadcast: every rank asks)
        ws, rank = trainer.world_size, trainer.global_rank
        self.output_dir = place.output_dir(self._output_dir_arg, log_dir, self.ranks, ws, rank)
        if (message := self._schedule.unreachable_warning(trainer.max_steps)) is not None:
            self._warned_unreached = True
            rank_zero_warn(message)
        timeout = getattr(trainer.strategy, "_timeout", None)  # a timedelta, on DDP-like strategies
        self._time_bound_s = place.time_bound_s(self.config.max_total_time_s, trainer.world_size, timeout)
        if place.profiles_on_rank(self.ranks, trainer.global_rank) and not self._schedule.finished:
            self._files_ok = place.check_writable(self.output_dir, fork=self.mode == "fork")

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: UserValue, batch_idx: int
    ) -> None:
        if not self._active or self._pending:
            return
        step = self._schedule.saw(trainer.global_step)
        if self._fork is not None and (result := self._fork.poll()) is not None:
            self._finish_fork(trainer, result)
        if self._fork is not None:
            return  # the next capture waits until the fork child has profiled the last one
        window = self._schedule.window()
        if window is not None and not trainer.sanity_checking and window.take(step):
            self._pending = True
            if self.mode == "fork" and (problem := fork_sharded_problem(pl_module, trainer.world_size)) is not None:
                rank_zero_warn(problem)  # every rank sees the same model: every rank switches
                self.mode = "pause"
            lockstep = self.mode == "pause" and trainer.world_size > 1  # every rank replays what communicates
            if place.profiles_on_rank(self.ranks, trainer.global_rank) or lockstep:
                self._capture = _step.step_capture(pl_module, self.capture_batch_size).__enter__()

    def _disarm(self) -> Capture | None:
        """Take the capture's hooks off; a batch that never ended re-arms the same step."""
        capture, self._capture, self._pending = self._capture, None, False
        if capture is not None:
            capture.remove()
        return capture

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: UserValue, batch: UserValue, batch_idx: int
    ) -> None:
        if self._fork is not None and (result := self._fork.poll()) is not None:
            self._finish_fork(trainer, result)
        window = self._schedule.window()
        if window is None or not self._pending or not window.add(self._disarm()):
            return
        self._profile(trainer, pl_module, outputs, window, self._schedule.close())
        if self.mode == "pause" and trainer.world_size > 1:
            trainer.strategy.barrier("cb_callback_profiled")
        if self.stop_after and self._schedule.finished:
            trainer.should_stop = True

    @override
    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        # The captured step's backward runs from ``loss``: it decides which calls have one (a probe only
        # logged has none). Reads the graph only; never raises (Capture.mark_backward).
        if self._capture is not None:
            self._capture.mark_backward(loss)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._disarm()

    on_train_epoch_end = on_validation_start  # a capture's step never spans an epoch's end either

    def _profile(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: UserValue, window: StepCaptures, step: int
    ) -> None:
        """Profile (pause) or fork after the capture's last batch, named by its first ``step``; never raises."""
        if not window.captures:  # a rank that does not profile
            return
        mine = place.profiles_on_rank(self.ranks, trainer.global_rank)  # else: it takes part in lockstep only
        out = self._schedule.output_dir(self.output_dir, step) if self._files_ok and mine else None
        for message in _step.capture_warnings(step, pl_module, window.captures[0], outputs):
            rank_zero_warn(message)
        cfg, metadata = _step.plan(
            self.config, window.captures[0], step=step, mode=self.mode, precision=trainer.precision,
            module=type(pl_module), output_dir=out, global_rank=trainer.global_rank, world_size=trainer.world_size,
            capture_batch_size=self.capture_batch_size, time_bound_s=self._time_bound_s, series=self._schedule.series,
        )  # fmt: skip
        try:
            if self.mode == "pause":
                # The engine runs the user's reporters with ctx (the logger's writer on rank zero).
                ctx = ReportContext(output_dir=out, step=step, writer=_publish.open_writer(self._tb(trainer)))
                forward = trainer.precision_plugin.forward_context
                with sharing():  # files and TensorBoard draw each image once between them
                    report = run.profile_here(pl_module, window, cfg, metadata, ctx, forward, _bar(trainer))
                    if mine:
                        self._publish(trainer, report, _publish.write_files(report, ctx), step)
                return
            device = str(self.config.device or pl_module.device)
            self._fork = run.fork(pl_module, window, cfg, metadata, out, device, step, trainer.precision)
            _bar(trainer).say(self._fork.describe(), rank_zero_info)
        except Exception as e:
            _publish.report_failure(step, out, e)

    def _finish_fork(self, trainer: pl.Trainer, result: ChildResult) -> None:
        self._fork, report = None, fork_report(result, " Training is not affected.")
        if report is not None:
            self._publish(trainer, report, result.files, int(report.metadata.get("capture_step", 0)))

    def _tb(self, trainer: pl.Trainer) -> _publish.TensorBoardTarget | None:
        enabled = self.log_to_tensorboard and trainer.is_global_zero
        return _publish.tensorboard(trainer.loggers, TensorBoardLogger, enabled)

    def _publish(self, trainer: pl.Trainer, report: Report, files: _publish.FilesWritten, step: int) -> None:
        """Keep the report; log it to TensorBoard at ``step``, say where everything is and why files are missing."""
        self.report = self.reports[step] = report
        ctx, target = ReportContext(output_dir=files.directory, step=step), self._tb(trainer)
        if trainer.is_global_zero and (
            line := _publish.log_to_tensorboard(report, ctx, target, self.log_to_tensorboard, files.problem)
        ):
            _bar(trainer).say(line, rank_zero_info)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        window = self._schedule.open_window
        if self._active and window is not None and (partial := window.partial(trainer.world_size)) is not None:
            rank_zero_warn(partial)
            self._warned_unreached, step = True, self._schedule.close()
            if trainer.world_size == 1:  # one process: no rank waits at a barrier for this
                self._profile(trainer, pl_module, True, window, step)
        if self._fork is not None:
            self._finish_fork(trainer, self._fork.wait(self.fork_timeout_s))
        if self._active and self.mode == "fork" and self._schedule.done and trainer.world_size > 1:
            trainer.strategy.barrier("cb_callback_fork_done")

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._active and not self._schedule.done and not self._warned_unreached:
            self._warned_unreached = True
            rank_zero_warn(_step.never_reached(self._schedule.first, self._schedule.seen))

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._disarm()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._disarm()
        if self._fork is not None:
            fork, self._fork = self._fork, None
            self.report = fork_report(fork.stop("training ended before it finished")) or self.report


# What users, help() and LightningCLI see: the own arguments, then every BenchmarkConfig option (derived).
ComponentBenchmark.__init__.__signature__ = _args.with_engine_options(ComponentBenchmark.__init__)  # type: ignore[attr-defined]
