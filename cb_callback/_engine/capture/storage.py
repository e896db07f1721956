"""Where a module's tensors live: storage identity, unique bytes, device."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

__all__ = ["model_device", "storage_key", "unique_storage_bytes"]


def storage_key(t: torch.Tensor) -> int | None:
    """The identity of ``t``'s storage (its data pointer), shared by every view of it.

    ``None`` when ``t`` has no memory of its own to identify: a meta tensor, an
    empty storage (data pointer 0, which all empty storages share) or a tensor
    subclass without a storage.
    """
    if t.device.type == "meta":
        return None
    try:
        key = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None
    return key or None


def unique_storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the storages behind ``tensors``, each storage counted once.

    A tensor without an identifiable storage (see :func:`storage_key`) counts
    its own elements, once per tensor object.
    """
    seen: set[object] = set()
    total = 0
    for t in tensors:
        key = storage_key(t)
        if key is None:
            ident: object = ("tensor", id(t))
            size = t.numel() * t.element_size()
        else:
            ident, size = key, t.untyped_storage().nbytes()
        if ident in seen:
            continue
        seen.add(ident)
        total += size
    return total


def model_device(model: nn.Module) -> torch.device:
    """The device of ``model``'s first parameter or buffer that is not on ``meta``; CPU if none."""
    for t in [*model.parameters(), *model.buffers()]:
        if t.device.type != "meta":
            return t.device
    return torch.device("cpu")
