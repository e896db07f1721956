"""``ComponentBenchmark``: the Lightning callback that captures one step and profiles it."""

from __future__ import annotations

import math
import multiprocessing
import os
import re
import sys
import tempfile
import traceback
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from lightning.pytorch.callbacks.callback import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torch import nn
from typing_extensions import override

from cb_callback._capture import Capture
from cb_callback._child import ERROR_FILE, ChildResult, ChildRun
from cb_callback._config import BenchmarkConfig
from cb_callback._engine import profile_captured
from cb_callback._files import FileReporter
from cb_callback._plugins import ReportContext
from cb_callback._snapshot import save_snapshot
from cb_callback._tensorboard import log_report

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from cb_callback._report import Report

__all__ = ["ComponentBenchmark"]

#: Environment variable that disables every ``ComponentBenchmark`` when set to a true value.
DISABLE_ENV = "CB_DISABLE"

#: Subdirectory of the output directory that holds a fork-mode snapshot.
SNAPSHOT_DIR = "snapshot"

_OUTPUT_SUBDIR = "component_benchmark"
_MODES = ("pause", "fork")
_RANKS = ("zero", "all")
# Lightning precision -> the peak key the report's MFU uses.
_PRECISION_DTYPES = {
    "bf16-mixed": "bf16", "bf16-true": "bf16", "bf16": "bf16",
    "16-mixed": "fp16", "16-true": "fp16", "16": "fp16",
    "64-true": "fp64", "64": "fp64",
}  # fmt: skip
# The benchmark options' defaults are BenchmarkConfig's (one source of truth).
_DEFAULTS = BenchmarkConfig()
_GUARD_RE = re.compile(r"""__name__\s*==\s*["']__main__["']""")


def _env_disabled() -> bool:
    return os.environ.get(DISABLE_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def _precision_dtype(precision: str | None) -> str | None:
    """The compute dtype key of a Lightning precision string (``None``: let the engine infer)."""
    return _PRECISION_DTYPES.get(str(precision)) if precision is not None else None


def _spawn_problem(model_cls: type) -> str | None:
    """Why a spawned child could not profile a snapshot of ``model_cls``, or ``None``.

    ``spawn`` re-imports the parent's ``__main__`` in the child (unless it was run
    as ``python -m pkg`` / ``pkg.__main__``): an unguarded script would train
    again there, and a class defined in a ``__main__`` that is not re-imported
    (a notebook, ``python -c``, ``python -m pkg``) cannot be unpickled.
    """
    main = sys.modules.get("__main__")
    spec_name = getattr(getattr(main, "__spec__", None), "name", None)
    main_file = getattr(main, "__file__", None)
    reimported = (spec_name is not None and spec_name != "__main__" and not spec_name.endswith(".__main__")) or (
        spec_name is None and main_file is not None
    )
    name = f"{model_cls.__module__}.{model_cls.__qualname__}"
    if "<locals>" in model_cls.__qualname__:
        return (
            f"the LightningModule class {name} is defined inside a function, so the spawned profiling "
            "process cannot import it; define it at the top level of a module (or use mode='pause')"
        )
    if model_cls.__module__ == "__main__" and not reimported:
        where = main_file or "an interactive session or notebook"
        return (
            f"the LightningModule class {name} is defined in `__main__` ({where}), which the spawned "
            "profiling process cannot import; move the class into an importable module "
            "(or use mode='pause')"
        )
    if reimported and main_file is not None and str(main_file).endswith(".py"):
        try:
            source = Path(main_file).read_text(errors="replace")
        except OSError:
            return None
        if not _GUARD_RE.search(source):
            return (
                f"mode='fork' starts the profiling process with multiprocessing's 'spawn', which "
                f"re-imports the training script {main_file}; it has no "
                '`if __name__ == "__main__":` guard, so the child would run the training again. '
                "Put the training code under that guard (or use mode='pause')"
            )
    return None


def _is_redirected(module: Any) -> bool:
    """Whether this call of ``module`` is Lightning's forward redirection to ``training_step``.

    DDP-like strategies patch the LightningModule's ``forward`` on the instance and
    call the wrapped module, so that ``training_step(batch, batch_idx)`` runs
    inside DDP's forward; that call is not a forward of the module.
    """
    patched = module.__dict__.get("forward")
    return patched is not None and "_ForwardRedirection" in getattr(patched, "__qualname__", "")


def _step_capture(root: nn.Module, keep_samples: int | None) -> Capture:
    """A capture of one training step that ignores Lightning's forward redirection.

    Under DDP-like strategies the root's first call is the redirected
    ``training_step``; it is skipped, so the root's real ``forward`` (if
    ``training_step`` calls ``self(...)``) is what gets captured.
    """
    return Capture(root, keep_samples=keep_samples, skip=lambda module, args, kwargs: _is_redirected(module))


class _ProgressBar:
    """``progress(done, total, path)`` drawn as a tqdm bar (created on the first call)."""

    def __init__(self, step: int) -> None:
        self._step = step
        self._bar: Any = None

    def __call__(self, done: int, total: int, path: str) -> None:
        if self._bar is None:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total, desc=f"component benchmark (step {self._step})", unit="component",
                leave=False, dynamic_ncols=True, file=sys.stdout,
            )  # fmt: skip
        self._bar.set_postfix_str(path or "(root)", refresh=False)
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class ComponentBenchmark(Callback):
    r"""Profiles every component of the LightningModule on the inputs of one real training step.

    At ``trainer.global_step == capture_step`` the callback installs forward
    pre-hooks on every submodule, lets the real step run untouched, removes the
    hooks at the step's end, and then replays each component alone, forward and
    backward (see :func:`cb_callback.profile_components`). The report is written
    to ``output_dir`` (``report.json``, ``components.csv``, icicle PNGs) and, with a
    ``TensorBoardLogger``, logged at ``capture_step`` under ``component_benchmark/``.
    The options from ``max_depth`` to ``load_plugins`` are those of
    :class:`cb_callback.BenchmarkConfig`, with its defaults.

    Example::

        from cb_callback import ComponentBenchmark

        cb = ComponentBenchmark(capture_step=10)
        trainer = L.Trainer(callbacks=[cb])
        trainer.fit(model)
        print(cb.report.summary())

    Args:
        capture_step: the ``trainer.global_step`` whose first micro-batch is captured.
        mode: ``"pause"`` profiles in-process right after the captured batch, inside
            the Trainer's precision context, then training resumes; ``"fork"`` writes
            a snapshot under ``output_dir/snapshot/`` and profiles it in a child
            process (``multiprocessing`` ``spawn``) while training goes on.
        max_depth: deepest component profiled (root, the LightningModule, is 0).
        include: glob patterns of paths to profile (see :class:`cb_callback.BenchmarkConfig`).
        exclude: glob patterns of paths to skip.
        backward: also measure the backward pass.
        warmup: untimed runs per component and pass.
        min_run_time_s: timing budget per component and pass.
        min_repeats: timed runs per pass, at least.
        max_repeats: timed runs per pass, at most.
        rounds: interleaved timing rounds over all components.
        max_total_time_s: wall-clock budget of the whole profile. ``None`` is no
            limit on one process; with several processes (DDP) it becomes half the
            strategy's collective timeout, so waiting ranks cannot time out.
        device: where to replay; ``None`` is the module's device. In ``"pause"`` mode
            it must be the module's device.
        dtype: compute dtype for the MFU peak; ``None`` takes it from
            ``Trainer(precision=...)`` (``bf16-*`` -> bf16, ``16-*`` -> fp16) or infers it.
        peak_flops: peak FLOP/s override.
        peak_bandwidth: peak memory bandwidth override, bytes/s.
        batch_size: replicate captured inputs to this batch size for profiling.
        preprocessors: :class:`cb_callback.Preprocessor` plugins.
        metrics: extra :class:`cb_callback.MetricPlugin` plugins.
        reporters: extra :class:`cb_callback.Reporter` plugins.
        seed: seed of the random output gradients of the backward replay.
        load_plugins: also use entry-point plugins (group ``cb_callback.plugins``).
        capture_batch_size: store only the first ``k`` samples of each captured input
            and replicate them back to the real batch size for profiling.
        output_dir: where files go; default ``<trainer.log_dir>/component_benchmark``,
            else ``<default_root_dir>/component_benchmark``. With ``ranks="all"`` and
            several processes, each rank writes under ``rank_<global_rank>/``.
        log_to_tensorboard: log to the first ``TensorBoardLogger`` among
            ``trainer.loggers`` (rank zero).
        stop_after: stop training once profiling is done (a profile-only run).
        ranks: ``"zero"``: global rank 0 profiles while the others wait at a
            barrier; ``"all"``: every rank profiles its own device and writes its
            own files, rank 0 logs.
        enabled: ``False`` makes the callback do nothing (so does ``CB_DISABLE=1``).
        fork_timeout_s: in ``"fork"`` mode, how long ``on_train_end`` waits for the
            child (``None``: as long as it takes); past it the child is stopped and
            the snapshot kept for ``cb replay``.

    Raises:
        ValueError: an invalid argument, naming it.

    Attributes:
        report: the :class:`cb_callback.Report` once profiling finished, else ``None``.
        output_dir: the resolved output directory (after ``setup``).

    Notes:
        The profile cannot change training: hooks only copy inputs, the replay runs
        after the optimizer step of the captured step (with gradient accumulation:
        after its first micro-batch), and the engine restores weights, buffers,
        grads, train/eval flags, grad mode and every RNG stream, so losses and
        weights are bit-identical to a run without the callback. What isolation
        cannot see: fusion across modules, cache state left by the previous module,
        overlap with communication or with other streams; timings in ``"fork"``
        mode include contention with the ongoing training.
    """

    def __init__(
        self,
        capture_step: int = 10,
        mode: Literal["pause", "fork"] = "pause",
        *,
        max_depth: int | None = _DEFAULTS.max_depth,
        include: Sequence[str] = tuple(_DEFAULTS.include),
        exclude: Sequence[str] = tuple(_DEFAULTS.exclude),
        backward: bool = _DEFAULTS.backward,
        warmup: int = _DEFAULTS.warmup,
        min_run_time_s: float = _DEFAULTS.min_run_time_s,
        min_repeats: int = _DEFAULTS.min_repeats,
        max_repeats: int = _DEFAULTS.max_repeats,
        rounds: int = _DEFAULTS.rounds,
        max_total_time_s: float | None = _DEFAULTS.max_total_time_s,
        device: str | None = None,
        dtype: str | None = None,
        peak_flops: float | None = _DEFAULTS.peak_flops,
        peak_bandwidth: float | None = _DEFAULTS.peak_bandwidth,
        batch_size: int | None = _DEFAULTS.batch_size,
        preprocessors: Sequence[Any] = (),
        metrics: Sequence[Any] = (),
        reporters: Sequence[Any] = (),
        seed: int = _DEFAULTS.seed,
        load_plugins: bool = _DEFAULTS.load_plugins,
        capture_batch_size: int | None = None,
        output_dir: str | None = None,
        log_to_tensorboard: bool = True,
        stop_after: bool = False,
        ranks: Literal["zero", "all"] = "zero",
        enabled: bool = True,
        fork_timeout_s: float | None = 300.0,
    ) -> None:
        super().__init__()
        if isinstance(capture_step, bool) or not isinstance(capture_step, int) or capture_step < 0:
            raise ValueError(f"ComponentBenchmark(capture_step={capture_step!r}): expected an integer >= 0")
        if mode not in _MODES:
            raise ValueError(f"ComponentBenchmark(mode={mode!r}): expected one of {_MODES}")
        if ranks not in _RANKS:
            raise ValueError(f"ComponentBenchmark(ranks={ranks!r}): expected one of {_RANKS}")
        if capture_batch_size is not None and (
            isinstance(capture_batch_size, bool) or not isinstance(capture_batch_size, int) or capture_batch_size < 1
        ):
            raise ValueError(
                f"ComponentBenchmark(capture_batch_size={capture_batch_size!r}): expected an integer >= 1 or None"
            )
        for name, flag in (
            ("log_to_tensorboard", log_to_tensorboard), ("stop_after", stop_after), ("enabled", enabled),
        ):  # fmt: skip
            if not isinstance(flag, bool):
                raise ValueError(f"ComponentBenchmark({name}={flag!r}): expected True or False")
        if fork_timeout_s is not None and (
            isinstance(fork_timeout_s, bool)
            or not isinstance(fork_timeout_s, (int, float))
            or not math.isfinite(fork_timeout_s)
            or fork_timeout_s < 0
        ):
            raise ValueError(
                f"ComponentBenchmark(fork_timeout_s={fork_timeout_s!r}): expected a finite number >= 0 or None"
            )
        if output_dir is not None and not isinstance(output_dir, (str, os.PathLike)):
            raise ValueError(f"ComponentBenchmark(output_dir={output_dir!r}): expected a path or None")
        try:
            self.config = BenchmarkConfig(
                max_depth=max_depth, include=include, exclude=exclude, backward=backward, warmup=warmup,
                min_run_time_s=min_run_time_s, min_repeats=min_repeats, max_repeats=max_repeats,
                rounds=rounds, max_total_time_s=max_total_time_s, device=device, dtype=dtype, peak_flops=peak_flops,
                peak_bandwidth=peak_bandwidth, batch_size=batch_size, preprocessors=preprocessors,
                metrics=metrics, reporters=reporters, seed=seed, load_plugins=load_plugins,
            )  # fmt: skip
        except ValueError as e:
            raise ValueError(f"ComponentBenchmark: {e}") from None
        self.capture_step = capture_step
        self.mode = mode
        self.capture_batch_size = capture_batch_size
        self.log_to_tensorboard = log_to_tensorboard
        self.stop_after = stop_after
        self.ranks = ranks
        self.enabled = enabled
        self.fork_timeout_s = None if fork_timeout_s is None else float(fork_timeout_s)
        self._output_dir_arg = None if output_dir is None else os.fspath(output_dir)

        # Lightning reads state_key around every hook call: build it once.
        self._state_key = self._generate_state_key(
            capture_step=capture_step, mode=mode, ranks=ranks, max_depth=self.config.max_depth,
            include=list(self.config.include), exclude=list(self.config.exclude), output_dir=self._output_dir_arg,
        )  # fmt: skip
        self.report: Report | None = None
        self.output_dir: Path | None = None
        self._active = False
        self._done = False  # the capture step was handled (profiled, forked, or failed)
        self._pending = False  # the capture step's batch is running
        self._capture: Capture | None = None
        self._child: ChildRun | None = None
        self._files_ok = True
        self._work_dir: Path | None = None
        self._time_bound_s: float | None = None
        self._warned_unreached = False
        self._steps_seen: tuple[int, int] | None = None

    # --- identity and state ------------------------------------------------------

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

    # --- setup and validation ------------------------------------------------------

    def _profiles_here(self, trainer: pl.Trainer) -> bool:
        return self.ranks == "all" or trainer.global_rank == 0

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._active = self.enabled and not _env_disabled()
        if not self._active:
            if self.enabled:
                rank_zero_info(f"cb_callback: ComponentBenchmark is disabled by {DISABLE_ENV}=1")
            return
        if self.mode == "fork":
            if getattr(multiprocessing.current_process(), "_inheriting", False):
                raise RuntimeError(
                    "cb_callback: training started while the profiling child process was importing the "
                    'training script: put the training code under an `if __name__ == "__main__":` guard'
                )
            problem = _spawn_problem(type(pl_module))
            if problem is not None:
                # Never crash the user's run: profile in-process instead, and say how to fork.
                rank_zero_warn(f"cb_callback: ComponentBenchmark(mode='fork') cannot fork: {problem}. "
                               "Profiling in-process (mode='pause') instead.")
                self.mode = "pause"
        # trainer.log_dir broadcasts from rank 0: every rank must ask.
        base = self._output_dir_arg
        if base is None:
            base = os.path.join(trainer.log_dir or trainer.default_root_dir, _OUTPUT_SUBDIR)
        out = Path(base)
        if self.ranks == "all" and trainer.world_size > 1:
            out = out / f"rank_{trainer.global_rank}"
        self.output_dir = out
        if trainer.max_steps is not None and trainer.max_steps >= 0 and self.capture_step >= trainer.max_steps:
            self._warned_unreached = True
            rank_zero_warn(
                f"cb_callback: capture_step={self.capture_step} is never reached: Trainer(max_steps="
                f"{trainer.max_steps}) stops after global_step {trainer.max_steps - 1}. Lower capture_step "
                "to profile."
            )
        if self.config.max_total_time_s is None and trainer.world_size > 1:
            timeout = getattr(trainer.strategy, "_timeout", None)
            seconds = timeout.total_seconds() if timeout is not None else 1800.0
            self._time_bound_s = seconds / 2
        if self._profiles_here(trainer) and not self._done:
            self._files_ok = self._check_writable(out)

    def _check_writable(self, out: Path) -> bool:
        probe = out / ".cb_write_test"
        try:
            out.mkdir(parents=True, exist_ok=True)
            probe.write_text("")
            probe.unlink()
        except OSError as e:
            extra = " fork mode keeps its snapshot in a temporary directory instead;" if self.mode == "fork" else ""
            warnings.warn(
                f"cb_callback: output_dir {out} is not writable ({e}); the report files will not be written "
                f"there;{extra} the report is still kept in ComponentBenchmark.report and logged to "
                "TensorBoard if there is a TensorBoardLogger. Pass output_dir= a writable directory.",
                RuntimeWarning,
                stacklevel=2,
            )
            return False
        return True

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._active or self.mode != "pause" or self.config.device is None:
            return
        wanted = torch.device(self.config.device)
        if wanted.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                f"ComponentBenchmark(device={self.config.device!r}): CUDA is not available here; drop "
                "device= to profile where the module lives, or replay the fork-mode snapshot on a GPU "
                "machine with `cb replay`"
            )
        # Another available device: the engine profiles a copy of the module there.

    # --- capture -------------------------------------------------------------------

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if not self._active or self._done or self._pending:
            return
        step = trainer.global_step
        seen = self._steps_seen
        self._steps_seen = (step, step) if seen is None else (seen[0], step)
        if step != self.capture_step or trainer.sanity_checking:
            return
        self._pending = True
        if self._profiles_here(trainer):
            self._capture = _step_capture(pl_module, self.capture_batch_size).__enter__()

    def _remove_hooks(self) -> Capture | None:
        capture, self._capture = self._capture, None
        if capture is not None:
            capture.remove()
        return capture

    def _disarm(self) -> None:
        """Drop a capture whose batch never ended (re-armed for the same step)."""
        if self._pending:
            self._remove_hooks()
            self._pending = False

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._child is not None:
            result = self._child.poll()
            if result is not None:
                self._finish_child(trainer, result)
        if not self._pending:
            return
        self._pending = False
        self._done = True
        capture = self._remove_hooks()
        if capture is not None:
            self._profile(trainer, pl_module, capture, outputs)
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

    # --- profiling -----------------------------------------------------------------

    def _metadata(self, trainer: pl.Trainer, pl_module: pl.LightningModule, capture: Capture) -> dict[str, Any]:
        cls = type(pl_module)
        return {
            "capture_step": self.capture_step,
            "mode": self.mode,
            "global_rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "precision": str(trainer.precision),
            "lightning_module": f"{cls.__module__}.{cls.__qualname__}",
            "real_batch_size": capture.batch_size,
        }

    def _run_config(self, trainer: pl.Trainer, capture: Capture, out: Path | None) -> BenchmarkConfig:
        opts: dict[str, Any] = {"output_dir": None if out is None else str(out)}
        if self.config.dtype is None:
            dtype = _precision_dtype(trainer.precision)
            if dtype is not None:
                opts["dtype"] = dtype
        if self.capture_batch_size is not None and self.config.batch_size is None and capture.batch_size:
            opts["batch_size"] = capture.batch_size
        if self._time_bound_s is not None:
            opts["max_total_time_s"] = self._time_bound_s
        return self.config.replace(**opts)

    def _profile(self, trainer: pl.Trainer, pl_module: pl.LightningModule, capture: Capture, outputs: Any) -> None:
        """Profile (pause) or fork after the captured batch; never raises."""
        if pl_module.automatic_optimization and not outputs:
            rank_zero_warn(
                f"cb_callback: training_step returned None at capture_step={self.capture_step}, so Lightning "
                "skipped this batch's backward and optimizer step; the captured forward inputs are profiled "
                "anyway."
            )
        if not capture.calls:
            rank_zero_warn(
                f"cb_callback: no module of {type(pl_module).__name__} ran during training step "
                f"{self.capture_step} (training_step called none of its submodules), so there is nothing to "
                "profile: every component is reported as not_run."
            )
        out = self.output_dir if self._files_ok else None
        try:
            if self.mode == "pause":
                self._profile_here(trainer, pl_module, capture, out)
            else:
                self._fork(trainer, pl_module, capture)
        except Exception as e:
            message = (
                f"cb_callback: profiling step {self.capture_step} failed ({type(e).__name__}: {e}); "
                "training continues without a component report."
            )
            error_file = self._write_error(out, f"{message}\n\n{traceback.format_exc()}")
            warnings.warn(
                message + (f" Details: {error_file}" if error_file else ""), RuntimeWarning, stacklevel=2
            )

    def _profile_here(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, capture: Capture, out: Path | None
    ) -> None:
        cfg = self._run_config(trainer, capture, out)
        bar = None
        if trainer.is_global_zero and trainer.progress_bar_callback is not None:
            bar = _ProgressBar(self.capture_step)
            cfg = cfg.replace(progress=bar)
        try:
            report = profile_captured(
                pl_module,
                capture.calls,
                config=cfg,
                captured_batch_size=capture.stored_batch_size,
                forward_context=trainer.precision_plugin.forward_context,
                metadata=self._metadata(trainer, pl_module, capture),
                report_context=ReportContext(output_dir=out, step=self.capture_step),
            )
        finally:
            if bar is not None:
                bar.close()
        self.report = report
        written = False
        if out is not None:
            try:
                FileReporter().write(report, ReportContext(output_dir=out, step=self.capture_step))
                written = True
            except Exception as e:
                warnings.warn(
                    f"cb_callback: could not write the report files to {out} ({type(e).__name__}: {e}); the "
                    "report is in ComponentBenchmark.report.",
                    RuntimeWarning,
                    stacklevel=3,
                )
        self._publish(trainer, report, out if written else None)

    def _fork(self, trainer: pl.Trainer, pl_module: pl.LightningModule, capture: Capture) -> None:
        work = self.output_dir if (self._files_ok and self.output_dir is not None) else None
        if work is None:
            work = Path(tempfile.mkdtemp(prefix="cb_callback_"))
        self._work_dir = work
        snapshot = work / SNAPSHOT_DIR
        cfg = self._run_config(trainer, capture, None)
        device = self.config.device if self.config.device is not None else str(pl_module.device)
        metadata = self._metadata(trainer, pl_module, capture) | {"capture_device": str(pl_module.device)}
        save_snapshot(
            snapshot,
            pl_module,
            capture.calls,
            config=cfg,
            captured_batch_size=capture.stored_batch_size,
            precision=str(trainer.precision),
            metadata=metadata,
        )
        child = ChildRun(snapshot, work, str(device), self.capture_step)
        child.start()
        self._child = child
        rank_zero_info(
            f"cb_callback: snapshot of step {self.capture_step} written to {snapshot}; profiling it in "
            f"child process {child.pid} while training continues"
        )

    def _finish_child(self, trainer: pl.Trainer, result: ChildResult) -> None:
        self._child = None
        if result.report is None:
            warnings.warn(
                f"cb_callback: {result.error} Training is not affected.", RuntimeWarning, stacklevel=3
            )
            return
        self.report = result.report
        self._publish(trainer, result.report, self._work_dir)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._child is not None:
            self._finish_child(trainer, self._child.wait(self.fork_timeout_s))
        if self._active and self.mode == "fork" and self._done and trainer.world_size > 1:
            trainer.strategy.barrier("cb_callback_fork_done")

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._active or self._done or self._warned_unreached:
            return
        self._warned_unreached = True
        seen = self._steps_seen
        ran = "no training step ran" if seen is None else f"training ran global_step {seen[0]} to {seen[1]}"
        rank_zero_warn(
            f"cb_callback: capture_step={self.capture_step} was never reached ({ran}), so nothing was "
            "profiled. Pick a capture_step the run reaches."
        )

    # --- results -------------------------------------------------------------------

    def _write_error(self, out: Path | None, text: str) -> Path | None:
        if out is None:
            return None
        try:
            out.mkdir(parents=True, exist_ok=True)
            (out / ERROR_FILE).write_text(text)
        except OSError:
            return None
        return out / ERROR_FILE

    @staticmethod
    def _tensorboard(trainer: pl.Trainer) -> TensorBoardLogger | None:
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                return logger
        return None

    def _publish(self, trainer: pl.Trainer, report: Report, files_dir: Path | None) -> None:
        """Log to TensorBoard (rank zero) and say where everything is."""
        if not trainer.is_global_zero:
            return
        where = (
            f"written to {files_dir} (report.json, components.csv, icicle_*.png)"
            if files_dir is not None
            else "not written to files"
        )
        logger = self._tensorboard(trainer) if self.log_to_tensorboard else None
        if logger is not None:
            try:
                writer = logger.experiment
                log_report(writer, report, step=self.capture_step)
                writer.flush()
            except Exception as e:
                warnings.warn(
                    f"cb_callback: could not log the report to TensorBoard ({type(e).__name__}: {e}); it is "
                    f"{where}.",
                    RuntimeWarning,
                    stacklevel=3,
                )
                return
            rank_zero_info(
                f"cb_callback: component report of step {self.capture_step} {where}; logged to TensorBoard "
                f"under component_benchmark/: tensorboard --logdir {logger.log_dir}"
            )
        elif self.log_to_tensorboard:
            rank_zero_info(
                f"cb_callback: component report of step {self.capture_step} {where}; there is no "
                "TensorBoardLogger among trainer.loggers, so nothing was logged to TensorBoard."
            )
        else:
            rank_zero_info(f"cb_callback: component report of step {self.capture_step} {where}")

    # --- cleanup -------------------------------------------------------------------

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._disarm()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._disarm()
        if self._child is not None:
            child, self._child = self._child, None
            result = child.poll() or child.stop("training ended before it finished")
            if result.report is not None:
                self.report = result.report
            else:
                warnings.warn(f"cb_callback: {result.error}", RuntimeWarning, stacklevel=2)
