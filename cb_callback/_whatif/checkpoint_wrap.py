"""Wrap chosen submodules' forwards in ``torch.utils.checkpoint.checkpoint`` (non-reentrant), undoably."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.checkpoint import checkpoint

__all__ = ["CheckpointHandle", "checkpointed_forward", "wrap_modules"]

#: The attribute a wrapped forward carries: the forward it replaced.
_ORIGINAL = "__cb_checkpoint_original__"


def checkpointed_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (a bound ``forward``) run under a non-reentrant checkpoint, keyword arguments passed through.

    ``preserve_rng_state`` is torch's default (True): a dropout inside draws the same
    mask again in the recompute, so the gradients are the unwrapped model's.
    """

    def forward(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(original, *args, use_reentrant=False, **kwargs)

    setattr(forward, _ORIGINAL, original)
    return forward


def _problem(path: str, module: nn.Module) -> str | None:
    """Why ``module`` cannot be wrapped now (``None``: it can)."""
    if _ORIGINAL in getattr(module.__dict__.get("forward"), "__dict__", {}):
        return f"{path!r} is already wrapped in a checkpoint by cb_callback"
    for name, sub in module.named_modules():
        if isinstance(sub, _BatchNorm) and sub.training and sub.track_running_stats:
            where = f"{path}.{name}" if name else path
            return (
                f"{where!r} is a {type(sub).__name__} in training mode: the recompute would update its running "
                "statistics a second time (call .eval() on it, or leave it out of the plan)"
            )
    return None


class CheckpointHandle:
    """The modules :func:`wrap_modules` wrapped; :meth:`remove` (or leaving a ``with`` block) unwraps them.

    Attributes:
        model: the model whose submodules were wrapped (the same object, changed in place).
        modules: the wrapped paths.
    """

    def __init__(self, model: nn.Module, wrapped: dict[str, nn.Module]) -> None:
        self.model = model
        self.modules: tuple[str, ...] = tuple(wrapped)
        self._wrapped = wrapped

    def remove(self) -> None:
        """Give each wrapped module its own forward back (idempotent)."""
        for module in self._wrapped.values():
            forward = module.__dict__.get("forward")
            if forward is not None and _ORIGINAL in getattr(forward, "__dict__", {}):
                del module.__dict__["forward"]  # the class's forward shows through again
        self._wrapped = {}

    def __enter__(self) -> CheckpointHandle:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.remove()

    def __repr__(self) -> str:
        return f"CheckpointHandle({len(self.modules)} modules wrapped: {', '.join(self.modules)})"


def wrap_modules(model: nn.Module, paths: Sequence[str]) -> CheckpointHandle:
    """Wrap each submodule at ``paths`` so that its forward runs under a non-reentrant checkpoint.

    The module's ``forward`` is replaced by an instance attribute (hooks, ``state_dict``
    and parameters are untouched; ``__call__`` still runs the module's hooks outside the
    checkpoint). Every path is checked before any is wrapped.

    Raises:
        ValueError: a path the model does not have, the root (``""``), a module already
            wrapped, or one with a BatchNorm in training mode inside (its running statistics
            would be updated twice).
    """
    modules: dict[str, nn.Module] = {}
    for path in paths:
        if path == "":
            raise ValueError("the root cannot be checkpointed (its recompute is the whole forward): wrap its children")
        try:
            module = model.get_submodule(path)
        except AttributeError as e:
            raise ValueError(f"the model has no submodule {path!r} ({e}): was the plan made for another model?") from e
        problem = _problem(path, module)
        if problem is not None:
            raise ValueError(f"cannot checkpoint {path!r}: {problem}")
        modules[path] = module
    for module in modules.values():
        module.forward = checkpointed_forward(module.forward)  # type: ignore[method-assign]
    return CheckpointHandle(model, modules)
