"""The captured training step: its capture, run options, metadata and messages.

What the callback derives from one Lightning training step, from plain values
(no Trainer), so each rule is testable on its own.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from cb_callback._engine.capture.capture import Capture
from cb_callback._engine.capture.inputs import ComponentInputs
from cb_callback._engine.run.config import BenchmarkConfig
from cb_callback._engine.run.precision import peak_dtype
from cb_callback._types import OptionValue, UserValue

__all__ = [
    "StepCaptures",
    "capture_warnings",
    "is_redirected",
    "never_reached",
    "plan",
    "step_capture",
    "unreachable",
]


def is_redirected(module: nn.Module) -> bool:
    """Whether this call of ``module`` is Lightning's forward redirection to ``training_step``.

    DDP-like strategies patch the LightningModule's ``forward`` on the instance and
    call the wrapped module, so that ``training_step(batch, batch_idx)`` runs
    inside DDP's forward; that call is not a forward of the module.
    """
    patched = module.__dict__.get("forward")
    return patched is not None and "_ForwardRedirection" in getattr(patched, "__qualname__", "")


def step_capture(root: nn.Module, keep_samples: int | None) -> Capture:
    """A capture of one training step that ignores Lightning's forward redirection.

    Under DDP-like strategies the root's first call is the redirected
    ``training_step``; it is skipped, so the root's real ``forward`` (if
    ``training_step`` calls ``self(...)``) is what gets captured.
    """
    return Capture(root, keep_samples=keep_samples, skip=lambda module, args, kwargs: is_redirected(module))


class StepCaptures:
    """The captures of the first ``count`` training steps at or after ``first_step`` (``capture_batches``).

    Each step's first micro-batch is captured (the next steps the run reaches:
    ``first_step``, ``first_step + 1`` … normally; a run resumed past
    ``first_step``, or one whose ``global_step`` advances by two per batch, takes
    the steps it has). A step is *taken* on every rank (one that does not profile
    adds ``None``), so all ranks agree on when the last one is done.
    """

    def __init__(self, first_step: int, count: int) -> None:
        self.first_step, self.count = first_step, count
        self.taken = 0
        #: The steps taken, in order (the first names the capture).
        self.steps: list[int] = []
        self.captures: list[Capture] = []
        self._last: int | None = None  # the last step taken
        self._next: int | None = None  # the step being captured

    def take(self, step: int) -> bool:
        """Whether to capture this batch of ``step`` (the first micro-batch of a step not taken yet)."""
        if self.taken >= self.count or step < self.first_step or (self._last is not None and step <= self._last):
            return False
        self._next = step
        return True

    def add(self, capture: Capture | None) -> bool:
        """Take the step :meth:`take` began (its capture on a rank that profiles); return whether all are taken."""
        self.taken += 1
        self._last = self._next
        if self._next is not None:
            self.steps.append(self._next)
        if capture is not None:
            self.captures.append(capture)
        return self.taken >= self.count

    @property
    def last_step(self) -> int:
        """The last step to capture."""
        return self.first_step + self.count - 1

    def calls(self) -> dict[str, ComponentInputs] | list[dict[str, ComponentInputs]]:
        """The first capture's calls, or one mapping per captured step when there are several."""
        if len(self.captures) == 1:
            return self.captures[0].calls
        return [c.calls for c in self.captures]

    def partial(self, world_size: int = 1) -> str | None:
        """The warning for a run that ended with only some of the steps captured, else ``None``.

        One process profiles what it captured; with several, nothing is profiled
        (the ranks that do not profile would have to wait for it at a barrier).
        """
        if not 0 < self.taken < self.count:
            return None
        what = (
            f"profiling the {self.taken} captured" if world_size == 1
            else f"with {world_size} processes nothing is profiled; lower capture_step or capture_batches"
        )  # fmt: skip
        return (
            f"cb_callback: training ended after {self.taken} of capture_batches={self.count} steps from "
            f"capture_step={self.first_step}; {what}"
        )


def plan(
    config: BenchmarkConfig,
    capture: Capture,
    *,
    step: int,
    mode: str,
    precision: object,
    global_rank: int,
    world_size: int,
    module: type,
    output_dir: Path | None,
    capture_batch_size: int | None,
    time_bound_s: float | None,
    series: bool = False,
) -> tuple[BenchmarkConfig, dict[str, OptionValue]]:
    """The options of the captured step's profile, and what its report's metadata adds.

    Args:
        config: the user's options.
        capture: the step's capture (its batch size).
        step: the capture step.
        mode: ``"pause"`` or ``"fork"``.
        precision: the Trainer's precision; its dtype is the MFU peak's unless
            ``config.dtype`` is set.
        global_rank: this process's rank.
        world_size: the number of processes.
        module: the LightningModule's class.
        output_dir: where the engine's reporters write (``None``: nowhere).
        capture_batch_size: the samples kept per input; with it (and no
            ``config.batch_size``) the inputs are replicated to the real batch size.
        time_bound_s: a budget for ``max_total_time_s`` (DDP), ``None`` to keep it.
        series: the run captures several times (``capture_every``/``capture_steps``).

    Returns:
        The options, and the metadata: ``capture_step``, ``mode``, ``global_rank``,
        ``world_size``, ``precision``, ``lightning_module``, ``real_batch_size``, and
        ``capture_series`` (``True``) when the run captures several times.
    """
    opts: dict[str, OptionValue] = {"output_dir": None if output_dir is None else str(output_dir)}
    dtype = peak_dtype(precision) if config.dtype is None else None
    if dtype is not None:
        opts["dtype"] = dtype
    if capture_batch_size is not None and config.batch_size is None and capture.batch_size:
        opts["batch_size"] = capture.batch_size
    if time_bound_s is not None:
        opts["max_total_time_s"] = time_bound_s
    metadata = {
        "capture_step": step,
        "mode": mode,
        "global_rank": global_rank,
        "world_size": world_size,
        "precision": str(precision),
        "lightning_module": f"{module.__module__}.{module.__qualname__}",
        "real_batch_size": capture.batch_size,
    }
    if series:
        metadata["capture_series"] = True
    return config.replace(**opts), metadata


def capture_warnings(step: int, module: nn.Module, capture: Capture, outputs: UserValue) -> list[str]:
    """What to warn about a captured step that is profiled anyway.

    Args:
        step: the capture step.
        module: the LightningModule (its class name, ``automatic_optimization``).
        capture: the step's capture.
        outputs: what ``training_step`` returned (``None``: under automatic
            optimization, Lightning skipped the backward and the optimizer step).
    """
    out = []
    if getattr(module, "automatic_optimization", False) and not outputs:
        out.append(
            f"cb_callback: training_step returned None at capture_step={step}, so Lightning skipped this "
            "batch's backward and optimizer step; the captured forward inputs are profiled anyway."
        )
    if not capture.calls:
        out.append(
            f"cb_callback: no module of {type(module).__name__} ran during training step {step} (training_step "
            "called none of its submodules), so there is nothing to profile: every component is reported as "
            "not_run."
        )
    return out


def unreachable(step: int, max_steps: int | None, batches: int = 1) -> str | None:
    """The warning for a ``capture_step`` (and ``capture_batches``) that ``Trainer(max_steps=...)``
    never reaches, else ``None``."""
    last = step + batches - 1
    if max_steps is None or not 0 <= max_steps <= last:
        return None
    if batches > 1:
        return (
            f"cb_callback: capture_step={step} with capture_batches={batches} needs global_step {last}, but "
            f"Trainer(max_steps={max_steps}) stops after global_step {max_steps - 1}. Lower capture_step or "
            "capture_batches."
        )
    return (
        f"cb_callback: capture_step={step} is never reached: Trainer(max_steps={max_steps}) stops after "
        f"global_step {max_steps - 1}. Lower capture_step to profile."
    )


def never_reached(step: int, seen: tuple[int, int] | None) -> str:
    """The warning at the end of a run that never reached ``step`` (``seen``: first and last step run)."""
    ran = "no training step ran" if seen is None else f"training ran global_step {seen[0]} to {seen[1]}"
    return (
        f"cb_callback: capture_step={step} was never reached ({ran}), so nothing was profiled. Pick a "
        "capture_step the run reaches."
    )
