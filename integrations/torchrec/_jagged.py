"""Batch slicing and replication of torchrec's jagged types, per key.

``KeyedJaggedTensor``, ``JaggedTensor`` and ``KeyedTensor`` are pytree nodes in
torchrec (``torch.utils._pytree``), so the engine's deep copy and device moves
already rebuild them leaf by leaf. What a pytree cannot do is cut or tile the
*batch* they hold: a KJT stores one batch across ``values``/``weights``/
``lengths``, key-major (all samples of key 0, then of key 1, …), so tiling its
tensors (``from_lengths_sync(values=v.repeat(f), lengths=l.repeat(f))``) mixes
keys up. The rules here take samples per key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import torch
from torch.utils import _pytree as pytree
from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor, KeyedTensor

import cb_callback
import cb_callback.plugins

__all__ = [
    "jt_batch_size",
    "kjt_batch_size",
    "kt_batch_size",
    "register_jagged_batch_rules",
    "take_jt",
    "take_kjt",
    "take_kt",
]


def _like(src: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out`` as a new leaf that requires grad if ``src`` did (floats only)."""
    out = out.detach()
    if src.requires_grad and (out.is_floating_point() or out.is_complex()):
        out.requires_grad_(True)
    return out


def _sample_index(n: int, batch: int, device: torch.device) -> torch.Tensor:
    # Sample j of the result is sample j % batch of the source: tiling
    # [x0..xb, x0..xb, …] cut to n (n <= batch slices the first n).
    return torch.arange(n, device=device) % batch


def _gather_segments(offsets: torch.Tensor, segments: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions (into the values) of the given segments, concatenated; and their lengths.

    ``offsets`` has one entry per segment plus one; ``segments`` lists the
    source segment of each result segment, in result order.
    """
    offsets = offsets.long()
    starts = offsets[:-1][segments]
    lengths = (offsets[1:] - offsets[:-1])[segments]
    total = int(lengths.sum().item()) if lengths.numel() else 0
    new_offsets = torch.zeros(lengths.numel() + 1, dtype=torch.long, device=offsets.device)
    if lengths.numel():
        new_offsets[1:] = torch.cumsum(lengths, 0)
    within = torch.arange(total, device=offsets.device) - torch.repeat_interleave(new_offsets[:-1], lengths)
    return torch.repeat_interleave(starts, lengths) + within, lengths


# --- KeyedJaggedTensor ---------------------------------------------------------------


def kjt_batch_size(kjt: KeyedJaggedTensor) -> int | None:
    """The batch size (``stride()``) of a KJT, or ``None`` for a variable-batch one.

    A variable-batch KJT (``stride_per_key_per_rank``, VBE) holds a different
    number of samples per key: there is no single batch to cut or tile.
    """
    if kjt.variable_stride_per_key() or kjt.inverse_indices_or_none() is not None:
        return None
    return int(kjt.stride())


def take_kjt(kjt: KeyedJaggedTensor, n: int) -> KeyedJaggedTensor:
    """A KJT of ``n`` samples per key: the first ``n`` (``n <= stride``) or the samples tiled.

    Per key ``k``, result sample ``j`` is source sample ``j % stride`` of the
    same key; values, weights and lengths follow it, so a model's output on the
    result is its output on the source's rows, tiled (row for row).

    Raises:
        ValueError: for a variable-batch KJT, or ``n < 0``.
    """
    batch = kjt_batch_size(kjt)
    if batch is None:
        raise ValueError("a variable-batch (VBE) KeyedJaggedTensor has no single batch size to take from")
    if n < 0:
        raise ValueError(f"n={n} must be >= 0")
    keys = kjt.keys()
    values = kjt.values()
    lengths = kjt.lengths()
    device = values.device
    if batch == 0 or not keys:
        if n != 0 and keys:
            raise ValueError("cannot tile an empty batch")
        return KeyedJaggedTensor(
            keys=list(keys), values=values, weights=kjt.weights_or_none(), lengths=lengths, stride=n
        )
    k = torch.arange(len(keys), device=device).unsqueeze(1) * batch
    segments = (k + _sample_index(n, batch, device).unsqueeze(0)).reshape(-1)
    index, new_lengths = _gather_segments(kjt.offsets(), segments)
    weights = kjt.weights_or_none()
    return KeyedJaggedTensor(
        keys=list(keys),
        values=_like(values, values.detach()[index]),
        weights=None if weights is None else _like(weights, weights.detach()[index]),
        lengths=new_lengths.to(lengths.dtype),
        stride=n,
    )


# --- JaggedTensor --------------------------------------------------------------------


def jt_batch_size(jt: JaggedTensor) -> int:
    """Number of samples (bags) of a JaggedTensor."""
    return int(jt.lengths().numel())


def take_jt(jt: JaggedTensor, n: int) -> JaggedTensor:
    """A JaggedTensor of ``n`` samples: the first ``n`` or the samples tiled.

    Values may be 1-D (ids) or 2-D (an ``EmbeddingCollection``'s looked-up rows,
    which require grad); ``requires_grad`` is kept.
    """
    batch = jt_batch_size(jt)
    lengths = jt.lengths()
    if batch == 0:
        if n != 0:
            raise ValueError("cannot tile an empty batch")
        return jt
    segments = _sample_index(n, batch, lengths.device)
    index, new_lengths = _gather_segments(jt.offsets(), segments)
    values = jt.values()
    weights = jt.weights_or_none()
    return JaggedTensor(
        values=_like(values, values.detach()[index]),
        weights=None if weights is None else _like(weights, weights.detach()[index]),
        lengths=new_lengths.to(lengths.dtype),
    )


# --- KeyedTensor ---------------------------------------------------------------------


def kt_batch_size(kt: KeyedTensor) -> int | None:
    """The batch size of a KeyedTensor: the size of its values' non-key dimension."""
    values = kt.values()
    if values.dim() != 2:
        return None
    return int(values.shape[1 - kt.key_dim()])


def take_kt(kt: KeyedTensor, n: int) -> KeyedTensor:
    """A KeyedTensor of ``n`` samples (rows sliced or tiled); ``requires_grad`` kept.

    Keys, ``length_per_key`` and ``key_dim`` are kept; the values are a new leaf
    that requires grad when the captured one did, so the replay differentiates
    through it as the real step did.
    """
    batch = kt_batch_size(kt)
    if batch is None or batch == 0:
        raise ValueError("KeyedTensor has no batch dimension to take from")
    values = kt.values()
    dim = 1 - kt.key_dim()
    index = _sample_index(n, batch, values.device)
    out = values.detach().index_select(dim, index)
    return KeyedTensor(
        keys=list(kt.keys()),
        length_per_key=list(kt.length_per_key()),
        values=_like(values, out),
        key_dim=kt.key_dim(),
    )


# --- registration --------------------------------------------------------------------


def _batch_dataclass_node(cls: type) -> None:
    """Make a dataclass of tensors/KJTs (torchrec's ``Batch``) a pytree node, if it is not."""
    if cls in pytree.SUPPORTED_NODES:
        return
    names = [f.name for f in dataclasses.fields(cls)]

    def flatten(obj: object) -> tuple[list[object], list[str]]:
        return [getattr(obj, n) for n in names], names

    def unflatten(values: Iterable[object], context: list[str]) -> object:
        return cls(**dict(zip(context, values, strict=True)))

    pytree.register_pytree_node(cls, flatten, unflatten, serialized_type_name=f"{cls.__module__}.{cls.__qualname__}")


_REGISTERED = False


def register_jagged_batch_rules() -> None:
    """Register the batch rules of KJT, JT and KT with :func:`cb_callback.plugins.register_batch_rule`.

    Also makes torchrec's ``torchrec.datasets.utils.Batch`` (dense features,
    sparse KJT, labels) a pytree node, so a ``DLRMTrain``-style model's input is
    deep-copied, moved and replicated field by field. Idempotent.
    """
    global _REGISTERED
    if _REGISTERED:
        return
    cb_callback.plugins.register_batch_rule(KeyedJaggedTensor, size=kjt_batch_size, slice=take_kjt, replicate=take_kjt)
    cb_callback.plugins.register_batch_rule(JaggedTensor, size=jt_batch_size, slice=take_jt, replicate=take_jt)
    cb_callback.plugins.register_batch_rule(KeyedTensor, size=kt_batch_size, slice=take_kt, replicate=take_kt)
    try:
        from torchrec.datasets.utils import Batch
    except ImportError:  # pragma: no cover - torchrec without its datasets package
        Batch = None  # type: ignore[assignment,misc]
    if isinstance(Batch, type) and dataclasses.is_dataclass(Batch):
        _batch_dataclass_node(Batch)
    _REGISTERED = True
