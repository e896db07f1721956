"""Save and restore everything profiling could change: weights, buffers, grads, flags, RNG."""

from __future__ import annotations

import random
from collections.abc import Callable
from types import TracebackType

import numpy as np
import torch
from torch import nn

__all__ = ["RngState", "StateGuard", "register_state_saver"]

# Extra savers: callables ``saver(module) -> restore()`` for state that is not a
# parameter or buffer (e.g. an optimizer step counter kept as a python attribute).
_SAVERS: list[Callable[[nn.Module], Callable[[], None]]] = []


def register_state_saver(saver: Callable[[nn.Module], Callable[[], None]]) -> None:
    """Register ``saver(root) -> restore`` for state :class:`StateGuard` does not know.

    ``saver`` is called on entering the guard with the guarded module and returns
    a function that puts that state back. Integrations use it for fused
    optimizers whose step counters are plain attributes.
    """
    if saver in _SAVERS:
        raise ValueError(f"state saver {saver!r} is already registered")
    _SAVERS.append(saver)


class RngState:
    """The torch CPU and CUDA, python ``random`` and numpy generator states."""

    def __init__(self) -> None:
        self.torch_cpu = torch.get_rng_state()
        self.torch_cuda = (
            torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        )
        self.python = random.getstate()
        self.numpy = np.random.get_state()

    def restore(self) -> None:
        """Put every generator back where it was."""
        torch.set_rng_state(self.torch_cpu)
        if self.torch_cuda is not None:
            torch.cuda.set_rng_state_all(self.torch_cuda)
        random.setstate(self.python)
        np.random.set_state(self.numpy)


class StateGuard:
    """Restores a module tree and the process's RNGs to their state at ``__enter__``.

    Saved: every parameter's data (a fused optimizer may update weights inside
    backward) and ``.grad``, every buffer (BatchNorm running statistics, counters),
    each submodule's ``training`` flag, grad mode, and the RNG streams. Restored
    in place, so optimizers keep their references to the same tensors.

    Args:
        module: the tree to guard.
        weights: also copy parameter data (memory: one extra copy of the weights).
    """

    def __init__(self, module: nn.Module, *, weights: bool = True) -> None:
        self._module = module
        self._weights = weights
        self._params: list[tuple[nn.Parameter, torch.Tensor | None, torch.Tensor | None]] = []
        self._buffers: list[tuple[nn.Module, str, torch.Tensor | None, torch.Tensor | None]] = []
        self._flags: list[tuple[nn.Module, bool]] = []
        self._restorers: list[Callable[[], None]] = []
        self._rng: RngState | None = None
        self._grad_mode = True

    def __enter__(self) -> StateGuard:
        with torch.no_grad():
            seen: set[int] = set()
            for p in self._module.parameters():
                if id(p) in seen:
                    continue
                seen.add(id(p))
                data = p.detach().clone() if self._weights else None
                grad = None if p.grad is None else p.grad.detach().clone()
                self._params.append((p, data, grad))
            for mod in self._module.modules():
                self._flags.append((mod, mod.training))
                for name, buf in mod._buffers.items():
                    self._buffers.append((mod, name, buf, None if buf is None else buf.detach().clone()))
        self._restorers = [saver(self._module) for saver in _SAVERS]
        self._rng = RngState()
        self._grad_mode = torch.is_grad_enabled()
        return self

    def restore(self) -> None:
        """Put everything back (the guard stays usable)."""
        with torch.no_grad():
            for p, data, grad in self._params:
                if data is not None:
                    p.data.copy_(data)
                if grad is None:
                    p.grad = None
                elif p.grad is not None and p.grad.shape == grad.shape:
                    p.grad.copy_(grad)
                else:
                    p.grad = grad.clone()
            for mod, name, original, copy in self._buffers:
                if original is None or copy is None:
                    mod._buffers[name] = original
                    continue
                if mod._buffers.get(name) is not original:
                    mod._buffers[name] = original
                original.copy_(copy)
        for mod, flag in self._flags:
            mod.training = flag
        for restore in self._restorers:
            restore()
        if self._rng is not None:
            self._rng.restore()
        torch.set_grad_enabled(self._grad_mode)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.restore()
