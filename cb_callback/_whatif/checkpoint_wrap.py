"""Wrap chosen submodules' forwards in ``torch.utils.checkpoint.checkpoint`` (non-reentrant), undoably.

The wrapped forward is a :class:`CheckpointedForward` instance set as the module's
``forward`` attribute: a picklable object (a module-level class) that holds the module
itself and the instance ``forward`` it replaced (``None``: the class's). So
``copy.deepcopy(model)`` gives a copy whose wrapped modules run the copy's own weights
(deepcopy's memo rebinds the reference), and ``torch.save(model)`` / ``torch.load`` keep
the wrapping. ``DataParallel``'s replicas share their module's ``__dict__`` and so its
wrapped forward, which runs the original's weights: unwrap before replicating.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MethodType, TracebackType
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import checkpoint

from cb_callback._types import UserValue

__all__ = ["CheckpointHandle", "CheckpointedForward", "checkpointed_forward", "wrap_modules"]

#: The attribute :func:`checkpointed_forward`'s function carries: the forward it replaced.
_ORIGINAL = "__cb_checkpoint_original__"


def _call_packed(
    function: Callable[..., Any], args: tuple[UserValue, ...], kwargs: Mapping[str, UserValue]
) -> UserValue:
    """``function(*args, **kwargs)``: the module's arguments travel packed, so none is read as checkpoint's own."""
    return function(*args, **kwargs)


def _run_checkpointed(
    function: Callable[..., Any], args: tuple[UserValue, ...], kwargs: Mapping[str, UserValue]
) -> UserValue:
    """``function`` under a non-reentrant checkpoint, torch's defaults (``preserve_rng_state=True``) kept.

    The module's keywords (``debug``, ``use_reentrant``, ``preserve_rng_state``, ``context_fn``,
    ``determinism_check``, ``early_stop`` ...) are inside ``kwargs``, never checkpoint's.
    """
    return checkpoint(_call_packed, function, args, dict(kwargs), use_reentrant=False)


def checkpointed_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (a bound ``forward``) run under a non-reentrant checkpoint, its arguments passed through.

    The bare primitive, with none of :class:`CheckpointedForward`'s guards (a closure: not
    picklable, and a deepcopy still calls ``original``); :func:`wrap_modules` does not use it.
    ``preserve_rng_state`` is torch's default (True): a dropout inside draws the same
    mask again in the recompute, so the gradients are the unwrapped model's.
    """

    def forward(*args: UserValue, **kwargs: UserValue) -> UserValue:
        return _run_checkpointed(original, args, kwargs)

    setattr(forward, _ORIGINAL, original)
    return forward


def _version(tensor: torch.Tensor) -> int | None:
    """The tensor's version counter (``None``: an inference tensor keeps none)."""
    try:
        return int(tensor._version)
    except RuntimeError:
        return None


def _buffers_state(module: nn.Module) -> dict[str, tuple[torch.Tensor, int | None]]:
    return {name: (buf, _version(buf)) for name, buf in module.named_buffers(remove_duplicate=False)}


def _inputs_state(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[tuple[torch.Tensor, int | None]]:
    return [(t, _version(t)) for t in tree_leaves((args, dict(kwargs))) if isinstance(t, torch.Tensor)]


class CheckpointedForward:
    """A module's forward run under a non-reentrant checkpoint, guarded against what a recompute repeats.

    Set by :func:`wrap_modules` as ``module.forward``. It runs ``previous`` (the instance
    ``forward`` it replaced) or, when that is ``None``, the class's ``forward`` on
    ``module``. While gradients are enabled it checks, after the forward (before any
    recompute, which runs in the backward), that the forward wrote no buffer of the
    module's subtree (a ``_version`` bump or a reassigned buffer: a training-mode
    BatchNorm's running statistics, a ``seen += n`` counter) and modified none of its
    tensor inputs in place (a first ``ReLU(inplace=True)``): either raises
    ``RuntimeError`` naming the module, since the recompute would write the buffer a
    second time or start from the modified input (torch raises "modified by an inplace
    operation" in the backward then). The forward has run once when it raises, as an
    unwrapped one would have. Python-side effects (a list a KV cache is appended to, an
    ``int`` counter) cannot be seen: they happen again in the recompute.

    Attributes:
        module: the wrapped module (a deepcopy's copy holds its own copy).
        previous: the instance ``forward`` replaced, restored by :meth:`CheckpointHandle.remove`.
        path: the module's path in the model it was wrapped in (for the messages).
    """

    def __init__(self, module: nn.Module, previous: Callable[..., Any] | None, path: str) -> None:
        self.module = module
        self.previous = previous
        self.path = path

    def _target(self) -> Callable[..., Any]:
        if self.previous is not None:
            return self.previous
        return MethodType(type(self.module).forward, self.module)

    @property
    def __wrapped__(self) -> Callable[..., Any]:
        """The forward run (``inspect.signature(module.forward)`` reads its parameters)."""
        return self._target()

    def __call__(self, *args: UserValue, **kwargs: UserValue) -> UserValue:
        if not torch.is_grad_enabled():  # nothing is saved, so nothing is recomputed
            return _run_checkpointed(self._target(), args, kwargs)
        buffers = _buffers_state(self.module)
        inputs = _inputs_state(args, kwargs)
        out = _run_checkpointed(self._target(), args, kwargs)
        self._check(buffers, inputs)
        return out

    def _check(
        self, buffers: dict[str, tuple[torch.Tensor, int | None]], inputs: list[tuple[torch.Tensor, int | None]]
    ) -> None:
        """Raise if the forward just run wrote a buffer or an input (see the class docstring)."""
        after = dict(self.module.named_buffers(remove_duplicate=False))
        for name, (buf, version) in buffers.items():
            now = after.get(name)
            if now is not buf or _version(buf) != version:
                raise RuntimeError(
                    f"cb_callback's checkpoint of {self.path!r}: its forward wrote the buffer {name!r} "
                    f"({type(self.module.get_submodule(name.rpartition('.')[0])).__name__}); the recompute in "
                    "the backward would write it a second time (a BatchNorm in training mode updates its "
                    "running statistics: call .eval() on it, or .remove() the checkpoint)"
                )
        for i, (tensor, version) in enumerate(inputs):
            if _version(tensor) != version:
                raise RuntimeError(
                    f"cb_callback's checkpoint of {self.path!r}: its forward modified its input tensor #{i} in "
                    "place (an inplace op such as ReLU(inplace=True) on it); the recompute in the backward would "
                    "start from the modified value (torch raises 'modified by an inplace operation' there): make "
                    "that op out of place, or leave the module out of the plan"
                )

    def __repr__(self) -> str:
        return f"CheckpointedForward({self.path!r}, {type(self.module).__name__})"


def _problem(path: str, module: nn.Module) -> str | None:
    """Why ``module`` cannot be wrapped now (``None``: it can)."""
    forward = module.__dict__.get("forward")
    if isinstance(forward, CheckpointedForward) or _ORIGINAL in getattr(forward, "__dict__", {}):
        return f"{path!r} is already wrapped in a checkpoint by cb_callback"
    for name, sub in module.named_modules():
        if isinstance(sub, (_BatchNorm, _InstanceNorm)) and sub.training and sub.track_running_stats:
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
        """Give each wrapped module the forward it had back (idempotent).

        An instance ``forward`` the module had before (a user's patch) is put back; else
        the class's shows through again. Only this handle's modules are touched: a deepcopy
        (or a loaded copy) of the model keeps its own wrapping.
        """
        for module in self._wrapped.values():
            forward = module.__dict__.get("forward")
            if isinstance(forward, CheckpointedForward) and forward.module is module:
                if forward.previous is None:
                    del module.__dict__["forward"]
                else:
                    module.__dict__["forward"] = forward.previous
        self._wrapped = {}

    def __enter__(self) -> CheckpointHandle:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.remove()

    def __repr__(self) -> str:
        return f"CheckpointHandle({len(self.modules)} modules wrapped: {', '.join(self.modules)})"


def wrap_modules(model: nn.Module, paths: Sequence[str]) -> CheckpointHandle:
    """Wrap each submodule at ``paths`` so that its forward runs under a non-reentrant checkpoint.

    The module's ``forward`` is replaced by a :class:`CheckpointedForward` instance attribute
    (hooks, ``state_dict`` and parameters are untouched; ``__call__`` still runs the module's
    hooks outside the checkpoint); its guards raise ``RuntimeError`` at the forward that
    writes a buffer or modifies an input in place. Every path is checked before any is wrapped.

    Raises:
        ValueError: a path the model does not have, the root (``""``), a module already
            wrapped or named twice, or one with a BatchNorm (or an InstanceNorm tracking
            running statistics) in training mode inside (its statistics would be updated twice).
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
        if problem is None:
            twin = next((p for p, m in modules.items() if m is module and p != path), None)
            problem = None if twin is None else f"it is the same module as {twin!r}"
        if problem is not None:
            raise ValueError(f"cannot checkpoint {path!r}: {problem}")
        modules[path] = module
    for path, module in modules.items():
        module.forward = CheckpointedForward(module, module.__dict__.get("forward"), path)  # type: ignore[method-assign]
    return CheckpointHandle(model, modules)
