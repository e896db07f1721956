"""``ComponentBenchmark``: the Lightning callback that captures one step and profiles it.

A thin adapter (*when* to capture, *where* results go); the work is in modules without Lightning.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from lightning.pytorch.callbacks.callback import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from typing_extensions import override

from cb_callback._engine.capture import Capture
from cb_callback._engine.config import BenchmarkConfig
from cb_callback._engine.profile import profile_captured
from cb_callback._lightning import placement as place
from cb_callback._lightning import publish as _publish
from cb_callback._lightning import step as _step
from cb_callback._lightning.args import check_callback_args
from cb_callback._lightning.child import ChildResult
from cb_callback._lightning.fork import Fork, fork_report
from cb_callback._lightning.progress import ProgressBar
from cb_callback._lightning.spawn import fork_problem
from cb_callback._report.context import ReportContext

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from cb_callback._report.model import Report

__all__ = ["ComponentBenchmark"]

#: Environment variable that disables every ``ComponentBenchmark`` when set to a true value.
DISABLE_ENV = "CB_DISABLE"

_DEFAULTS = BenchmarkConfig()  # the engine options' defaults (one source of truth)


class ComponentBenchmark(Callback):
    r"""Profiles every component of the LightningModule on the inputs of one real training step.

    At ``trainer.global_step == capture_step`` it hooks every submodule, lets the real
    step run untouched, takes the hooks off, and replays each component alone, forward
    and backward (:func:`cb_callback.profile_components`). The report goes through the
    reporters of :mod:`cb_callback.reporters`: files in ``output_dir``, and TensorBoard at
    ``capture_step`` under ``component_benchmark/``. The options from ``max_depth`` to
    ``load_plugins`` are :class:`cb_callback.BenchmarkConfig`'s; below is what differs.

    Example: ``L.Trainer(callbacks=[cb := ComponentBenchmark(capture_step=10)]).fit(model)``,
    then ``print(cb.report.summary())``.

    Args:
        capture_step: the ``trainer.global_step`` whose first micro-batch is captured (a run
            resumed past it: its first step).
        capture_batches: capture steps ``capture_step … capture_step + k − 1`` (dynamic
            shapes): each component is measured on each, its row the median (p90 in ``details``).
        mode: ``"pause"`` profiles in-process after the captured batch, in the Trainer's
            precision context; ``"fork"`` snapshots to ``output_dir/snapshot/`` and profiles
            it in a ``spawn``-ed child process while training goes on.
        max_total_time_s: ``None`` is no limit in one process; with several (DDP)
            half the strategy's collective timeout, so waiting ranks cannot time out.
        device: where to replay; ``None`` is the module's. Another device gets a copy of the
            module (pause: a deep copy, room for its weights; fork: the child loads it there).
        dtype: the MFU peak's dtype; ``None`` follows ``Trainer(precision=...)``
            (``bf16-*`` -> bf16, ``16-*`` -> fp16, ``64-*`` -> fp64) or infers it.
        reporters: extra :class:`cb_callback.Reporter` plugins; in pause mode ``ctx.writer`` is
            the ``TensorBoardLogger``'s writer (rank zero).
        capture_batch_size: keep ``k`` samples per input, replicated back to the batch size.
        output_dir: default ``<trainer.log_dir or default_root_dir>/component_benchmark``;
            ``ranks="all"`` with several processes adds ``rank_<global_rank>/``.
        log_to_tensorboard: log to the first ``TensorBoardLogger`` of ``trainer.loggers``.
        stop_after: stop training once profiling is done (a profile-only run).
        ranks: ``"zero"``: global rank 0 profiles, the others wait at a barrier;
            ``"all"``: every rank profiles and writes its own files, rank 0 logs.
        enabled: ``False`` makes the callback do nothing (so does ``CB_DISABLE=1``).
        fork_timeout_s: how long ``on_train_end`` waits for the fork child (``None``:
            no limit); past it the child stops, the snapshot stays for ``cb replay``.

    Raises:
        ValueError: an invalid argument, naming it.

    Attributes:
        report: the :class:`cb_callback.Report` once profiling finished, else ``None``.
        output_dir: the resolved output directory (after ``setup``).

    Notes:
        Training is unchanged (bit-identical losses and weights): hooks only copy inputs, the
        replay runs after the (last) captured batch (with gradient accumulation, its step's first
        micro-batch) and restores weights, buffers, grads, flags and RNG streams. Isolation cannot see
        fusion across modules,
        cache state or overlap with communication; ``"fork"`` timings include contention.
    """

    def __init__(
        self,
        capture_step: int = 10,
        mode: Literal["pause", "fork"] = "pause",
        *,
        # the engine's options (BenchmarkConfig's names and defaults)
        max_depth: int | None = _DEFAULTS.max_depth, include: Sequence[str] = tuple(_DEFAULTS.include),
        exclude: Sequence[str] = tuple(_DEFAULTS.exclude), backward: bool = _DEFAULTS.backward,
        warmup: int = _DEFAULTS.warmup, min_run_time_s: float = _DEFAULTS.min_run_time_s,
        min_repeats: int = _DEFAULTS.min_repeats, max_repeats: int = _DEFAULTS.max_repeats,
        rounds: int = _DEFAULTS.rounds, max_total_time_s: float | None = _DEFAULTS.max_total_time_s,
        log_scalars: int | Literal["all"] = _DEFAULTS.log_scalars, device: str | None = None, dtype: str | None = None,
        peak_flops: float | None = _DEFAULTS.peak_flops, peak_bandwidth: float | None = _DEFAULTS.peak_bandwidth,
        batch_size: int | None = _DEFAULTS.batch_size, preprocessors: Sequence[Any] = (), metrics: Sequence[Any] = (),
        reporters: Sequence[Any] = (), descend: Literal["all", "hotspots"] = _DEFAULTS.descend,
        descend_share: float = _DEFAULTS.descend_share, seed: int = _DEFAULTS.seed,
        load_plugins: bool = _DEFAULTS.load_plugins, artifacts: Sequence[str] = (), artifacts_top: int | None = None,
        compile: bool = _DEFAULTS.compile, compile_options: dict[str, Any] | None = None,
        compile_top: int | None = None,
        # the callback's own
        capture_batches: int = 1, capture_batch_size: int | None = None, output_dir: str | None = None,
        log_to_tensorboard: bool = True, stop_after: bool = False, ranks: Literal["zero", "all"] = "zero",
        enabled: bool = True, fork_timeout_s: float | None = 300.0,
    ) -> None:  # fmt: skip
        super().__init__()
        self.config = check_callback_args(locals())  # every argument, by name
        self.capture_step, self.mode, self.ranks, self.enabled = capture_step, mode, ranks, enabled
        self.capture_batch_size, self.stop_after, self.log_to_tensorboard = (
            capture_batch_size,
            stop_after,
            log_to_tensorboard,
        )
        self.fork_timeout_s = None if fork_timeout_s is None else float(fork_timeout_s)
        self._output_dir_arg = None if output_dir is None else os.fspath(output_dir)
        # Lightning reads state_key around every hook call: build it once.
        self._state_key = self._generate_state_key(
            capture_step=capture_step, mode=mode, ranks=ranks, max_depth=self.config.max_depth,
            include=list(self.config.include), exclude=list(self.config.exclude), output_dir=self._output_dir_arg,
        )  # fmt: skip
        self.report: Report | None = None
        self.output_dir: Path | None = None
        self._active = self._done = self._pending = False  # done: the capture step was handled
        self._capture: Capture | None = None
        self._steps = _step.StepCaptures(capture_step, capture_batches)
        self._fork: Fork | None = None
        self._files_ok, self._warned_unreached = True, False
        self._time_bound_s: float | None = None
        self._steps_seen: tuple[int, int] | None = None  # the first and last global_step seen

    @property
    @override
    def state_key(self) -> str:
        return self._state_key

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"captured": self._done, "capture_step": self.capture_step}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._done = bool(state_dict.get("captured", False))

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        off = os.environ.get(DISABLE_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")
        if self.enabled and off:
            rank_zero_info(f"cb_callback: ComponentBenchmark is disabled by {DISABLE_ENV}=1")
        self._active = self.enabled and not off
        if not self._active:
            return
        if self.mode == "fork" and (problem := fork_problem(type(pl_module))) is not None:
            rank_zero_warn(problem)  # never crash the user's run: profile in-process, and say how to fork
            self.mode = "pause"
        place.check_pause_device(self.config.device if self.mode == "pause" else None)
        log_dir = lambda: trainer.log_dir or trainer.default_root_dir  # noqa: E731  (a broadcast: every rank asks)
        self.output_dir = place.output_dir(
            self._output_dir_arg, log_dir, self.ranks, trainer.world_size, trainer.global_rank
        )
        if (message := _step.unreachable(self.capture_step, trainer.max_steps, self._steps.count)) is not None:
            self._warned_unreached = True
            rank_zero_warn(message)
        timeout = getattr(trainer.strategy, "_timeout", None)  # a timedelta, on DDP-like strategies
        self._time_bound_s = place.time_bound_s(self.config.max_total_time_s, trainer.world_size, timeout)
        if place.profiles_on_rank(self.ranks, trainer.global_rank) and not self._done:
            self._files_ok = place.check_writable(self.output_dir, fork=self.mode == "fork")

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if not self._active or self._done or self._pending:
            return
        step, seen = trainer.global_step, self._steps_seen
        self._steps_seen = (step, step) if seen is None else (seen[0], step)
        if not trainer.sanity_checking and self._steps.take(step):
            self._pending = True
            if place.profiles_on_rank(self.ranks, trainer.global_rank):
                self._capture = _step.step_capture(pl_module, self.capture_batch_size).__enter__()

    def _disarm(self) -> Capture | None:
        """Take the capture's hooks off; a batch that never ended re-arms the same step."""
        capture, self._capture, self._pending = self._capture, None, False
        if capture is not None:
            capture.remove()
        return capture

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._fork is not None and (result := self._fork.poll()) is not None:
            self._finish_fork(trainer, result)
        if not self._pending or not self._steps.add(self._disarm()):
            return
        self._done = True
        if self._steps.captures:
            self._profile(trainer, pl_module, outputs)
        if self.mode == "pause" and trainer.world_size > 1:
            trainer.strategy.barrier("cb_callback_profiled")
        if self.stop_after:
            trainer.should_stop = True

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._disarm()

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._disarm()

    def _profile(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any) -> None:
        """Profile (pause) or fork after the captured batch(es); never raises."""
        step, out, capture, calls = (
            self.capture_step,
            self.output_dir if self._files_ok else None,
            self._steps.captures[0],
            self._steps.calls(),
        )
        for message in _step.capture_warnings(step, pl_module, capture, outputs):
            rank_zero_warn(message)
        cfg, metadata = _step.plan(
            self.config, capture, step=step, mode=self.mode, precision=trainer.precision, module=type(pl_module),
            output_dir=out, global_rank=trainer.global_rank, world_size=trainer.world_size,
            capture_batch_size=self.capture_batch_size, time_bound_s=self._time_bound_s,
        )  # fmt: skip
        try:
            if self.mode == "pause":
                self._profile_here(trainer, pl_module, capture, calls, cfg, metadata, out)
                return
            self._fork = Fork.start(
                pl_module, calls, config=cfg.replace(output_dir=None), captured_batch_size=capture.stored_batch_size,
                precision=str(trainer.precision), metadata=metadata | {"capture_device": str(pl_module.device)},
                output_dir=out, device=str(self.config.device or pl_module.device), step=step,
            )  # fmt: skip
            rank_zero_info(self._fork.describe())
        except Exception as e:
            _publish.report_failure(step, out, e)

    def _profile_here(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, capture: Capture, calls: Any, cfg: BenchmarkConfig,
        metadata: dict[str, Any], out: Path | None,
    ) -> None:  # fmt: skip
        # The engine runs the user's reporters with this context (the logger's writer on rank zero).
        writer = _publish.open_writer(self._tensorboard(trainer))
        ctx = ReportContext(output_dir=out, step=self.capture_step, writer=writer)
        show = trainer.is_global_zero and trainer.progress_bar_callback is not None
        with ProgressBar(self.capture_step, show) as progress:
            self.report = profile_captured(
                pl_module, calls, config=cfg.replace(progress=progress), metadata=metadata, report_context=ctx,
                captured_batch_size=capture.stored_batch_size, forward_context=trainer.precision_plugin.forward_context,
            )  # fmt: skip
        self._publish(trainer, self.report, _publish.write_files(self.report, ctx))

    def _finish_fork(self, trainer: pl.Trainer, result: ChildResult) -> None:
        self._fork, report = None, fork_report(result, " Training is not affected.")
        if report is not None:
            self.report = report
            self._publish(trainer, report, result.files)

    def _tensorboard(self, trainer: pl.Trainer) -> _publish.TensorBoardTarget | None:
        """Rank zero's first ``TensorBoardLogger``; ``None`` if there is none or logging is off."""
        logger = next((lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)), None)
        if logger is None or not (self.log_to_tensorboard and trainer.is_global_zero):
            return None
        return _publish.TensorBoardTarget(logger.log_dir, lambda: logger.experiment)

    def _publish(self, trainer: pl.Trainer, report: Report, files: _publish.FilesWritten) -> None:
        """Log to TensorBoard and say where everything is, and why files are missing (rank zero)."""
        ctx, target = ReportContext(output_dir=files.directory, step=self.capture_step), self._tensorboard(trainer)
        if trainer.is_global_zero and (
            line := _publish.log_to_tensorboard(report, ctx, target, self.log_to_tensorboard, files.problem)
        ):
            rank_zero_info(line)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._active and not self._done and (partial := self._steps.partial(trainer.world_size)) is not None:
            rank_zero_warn(partial)
            self._done = self._warned_unreached = True
            if trainer.world_size == 1:  # one process: no rank waits at a barrier for this
                self._profile(trainer, pl_module, outputs=True)
        if self._fork is not None:
            self._finish_fork(trainer, self._fork.wait(self.fork_timeout_s))
        if self._active and self.mode == "fork" and self._done and trainer.world_size > 1:
            trainer.strategy.barrier("cb_callback_fork_done")

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._active and not self._done and not self._warned_unreached:
            self._warned_unreached = True
            rank_zero_warn(_step.never_reached(self.capture_step, self._steps_seen))

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._disarm()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._disarm()
        if self._fork is not None:
            fork, self._fork = self._fork, None
            self.report = fork_report(fork.stop("training ended before it finished")) or self.report
