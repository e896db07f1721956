"""Fused-optimizer state that the engine's ``StateGuard`` cannot see, saved and restored.

fbgemm's ``SplitTableBatchedEmbeddingBagsCodegen`` (TBE) applies its optimizer
inside backward: the weights *and* the optimizer state (momentum tensors, the
``iter`` buffer) change in place, and plain Python attributes count steps
(``step``, ``iter_cpu``, ``timestep`` …). ``StateGuard`` restores every
parameter and buffer of the guarded tree; this saver adds

* the Python-level state of every TBE (numbers, plain tensor attributes), and
* every parameter and buffer of TBEs that are *not* in the tree:
  torchrec's ``FusedEmbeddingBagCollection`` keeps its TBEs in a plain list
  (``_emb_modules``) and exposes only views of the weights as parameters, so
  its optimizer state (e.g. Adagrad's ``momentum1_host``) is invisible to a
  ``parameters()``/``buffers()`` walk.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import cb_callback

from ._hidden import hidden_modules, tbe_modules

__all__ = ["fused_tbe_state_saver", "register_fused_state_saver"]


_PLAIN = (int, float, bool)


def _storage(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr() if t.device.type != "meta" else None
    except (RuntimeError, NotImplementedError):
        return None


def fused_tbe_state_saver(root: nn.Module) -> Callable[[], None]:
    """Save the fused-optimizer state of every TBE under ``root``; return its restorer.

    Registered with :func:`cb_callback.register_state_saver` on import of the
    integration: every ``StateGuard`` (each profiling run) calls it on entry and
    the restorer on exit, after parameters and buffers are restored.

    Notes:
        Tensors of a hidden TBE that share storage with a parameter of the tree
        (FusedEBC's weight views) are restored by ``StateGuard`` already and are
        not copied twice. A tensor attribute reassigned during profiling (a TBE
        stores its last ``indices``) is put back as the same object.
    """
    tbes = tbe_modules(root)
    if not tbes:
        return lambda: None
    tree_storages = {s for p in root.parameters() if (s := _storage(p)) is not None}
    plain: list[tuple[nn.Module, str, Any]] = []
    tensors: list[tuple[Any, str, torch.Tensor, torch.Tensor]] = []
    with torch.no_grad():
        for mod in hidden_modules(root):
            for store in (mod._parameters, mod._buffers):
                for name, t in store.items():
                    if t is None or _storage(t) in tree_storages or t.device.type == "meta":
                        continue
                    tensors.append((store, name, t, t.detach().clone()))
        for mod in tbes:
            for name, value in vars(mod).items():
                if isinstance(value, _PLAIN):
                    plain.append((mod, name, value))
                elif isinstance(value, torch.Tensor) and value.device.type != "meta":
                    tensors.append((mod.__dict__, name, value, value.detach().clone()))
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
        cb_callback.register_state_saver(fused_tbe_state_saver)
    _REGISTERED = True
