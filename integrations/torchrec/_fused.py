"""Fused-optimizer state that the engine's ``StateGuard`` cannot see, saved to host memory and restored.

fbgemm's ``SplitTableBatchedEmbeddingBagsCodegen`` (TBE) applies its optimizer
inside backward: the weights *and* the optimizer state (momentum tensors, the
``iter`` buffer) change in place — without bumping their version counters —
and plain Python attributes count steps (``step``, ``iter_cpu``, ``timestep``
…). ``StateGuard`` copies every buffer of the guarded tree but only the
parameters it can see being written (those with gradient hooks); this saver
adds, as host copies (pinned for CUDA tensors),

* the parameters (weights, optimizer state) of every TBE in the tree;
* every parameter and buffer of modules that are *not* in the tree:
  torchrec's ``FusedEmbeddingBagCollection`` keeps its TBEs in a plain list
  (``_emb_modules``) and exposes only views of the weights as parameters, so
  its tables and optimizer state (e.g. Adagrad's ``momentum1_host``) are
  invisible to a ``parameters()``/``buffers()`` walk;
* the Python-level state of every TBE (numbers, plain tensor attributes).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, MutableMapping
from typing import Any

import torch
from torch import nn

import cb_callback
import cb_callback.plugins

from ._hidden import hidden_modules, tbe_modules

__all__ = ["fused_tbe_state_saver", "register_fused_state_saver"]


_PLAIN = (int, float, bool)


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    """``t``'s data in host memory: pinned for a CUDA tensor (pageable when none is left)."""
    src = t.detach()
    if src.device.type == "cuda":
        with contextlib.suppress(RuntimeError):
            return torch.empty_like(src, device="cpu", pin_memory=True).copy_(src)
    return src.to("cpu", copy=True)


def fused_tbe_state_saver(root: nn.Module) -> Callable[[], None]:
    """Save the fused-optimizer state of every TBE under ``root``; return its restorer.

    Registered with :func:`cb_callback.plugins.register_state_saver` on import of the
    integration: every ``StateGuard`` (each profiling run) calls it on entry and
    the restorer on exit, after parameters and buffers are restored.

    Notes:
        The copies are in host memory, so profiling a model whose tables fill
        the GPU needs no second copy of them on the device; the restorer copies
        every saved tensor back (fbgemm's update bumps no version counter, so
        there is no telling which were written). A FusedEBC's weight parameters
        are views of its hidden TBE's weights: copying the TBE's tensors covers
        them. A tensor attribute reassigned during profiling (a TBE stores its
        last ``indices``) is put back as the same object.
    """
    tbes = tbe_modules(root)
    if not tbes:
        return lambda: None
    in_tree = {id(m) for m in root.modules()}
    plain: list[tuple[nn.Module, str, object]] = []
    tensors: list[tuple[MutableMapping[str, Any], str, torch.Tensor, torch.Tensor]] = []
    seen: set[int] = set()

    def keep(store: MutableMapping[str, Any], name: str, t: object) -> None:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta" or id(t) in seen:
            return
        seen.add(id(t))
        tensors.append((store, name, t, _host_copy(t)))

    with torch.no_grad():
        for mod in hidden_modules(root):  # outside the tree: the guard sees none of their tensors
            for store in (mod._parameters, mod._buffers):
                for name, t in store.items():
                    keep(store, name, t)
        for mod in tbes:
            if id(mod) in in_tree:  # the guard copies its buffers, and its parameters have no hooks
                for name, t in mod._parameters.items():
                    keep(mod._parameters, name, t)
            for name, value in vars(mod).items():
                if isinstance(value, _PLAIN):
                    plain.append((mod, name, value))
                elif isinstance(value, torch.Tensor):
                    keep(mod.__dict__, name, value)
                elif isinstance(value, list) and name in ("timesteps_prefetched",):
                    plain.append((mod, name, list(value)))

    def restore() -> None:
        with torch.no_grad():
            for store, name, original, copy in tensors:
                if store.get(name) is not original:
                    store[name] = original
                if original.shape == copy.shape:
                    original.copy_(copy)
        for mod, name, value in plain:
            setattr(mod, name, list(value) if isinstance(value, list) else value)

    return restore


_REGISTERED = False


def register_fused_state_saver() -> None:
    """Register :func:`fused_tbe_state_saver` with the engine (idempotent)."""
    global _REGISTERED
    if _REGISTERED:
        return
    with contextlib.suppress(ValueError):  # registered by hand already
        cb_callback.plugins.register_state_saver(fused_tbe_state_saver)
    _REGISTERED = True
