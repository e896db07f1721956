"""Captured inputs: deep copies, fresh replay copies, device moves, batch slicing.

Inputs are pytrees (tuples, lists, dicts, namedtuples and any type registered
with ``torch.utils._pytree``). Tensor leaves are detached clones that keep the
``requires_grad`` flag the real step gave them; other leaves are kept as they are
(immutables) or by reference (unknown objects, noted in ``unknown_leaves``).

Types that must be sliced or replicated as a whole (a ``KeyedJaggedTensor``
holds one batch across several tensors) register a :func:`register_batch_rule`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

__all__ = [
    "ComponentInputs",
    "clone_tree",
    "leading_batch_size",
    "register_batch_rule",
    "replicate_batch",
    "slice_batch",
    "to_device",
]

_IMMUTABLE = (int, float, bool, complex, str, bytes, type(None), torch.dtype, torch.device, torch.Size)


@dataclass
class ComponentInputs:
    """The first captured call of one component.

    Attributes:
        args: positional arguments (a pytree; tensors are detached clones whose
            ``requires_grad`` is the flag they had in the real step).
        kwargs: keyword arguments, likewise.
        calls: how many times the real step called the component.
        training: the component's ``training`` flag during the call.
        order: index of its first call among all captured calls (execution order).
        unknown_leaves: type names of leaves kept by reference (not copied).
    """

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    calls: int = 1
    training: bool = True
    order: int = 0
    unknown_leaves: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _BatchRule:
    size: Callable[[Any], int | None]
    slice: Callable[[Any, int], Any]
    replicate: Callable[[Any, int], Any]


_BATCH_RULES: dict[type, _BatchRule] = {}


def register_batch_rule(
    cls: type,
    *,
    size: Callable[[Any], int | None],
    slice: Callable[[Any, int], Any],
    replicate: Callable[[Any, int], Any],
) -> None:
    """Teach batch slicing/replication a type that holds a batch across tensors.

    Args:
        cls: the type (exact match, not subclasses).
        size: ``size(obj)`` -> its batch size, or ``None``.
        slice: ``slice(obj, k)`` -> an object holding the first ``k`` samples.
        replicate: ``replicate(obj, n)`` -> an object of batch size ``n`` made by
            tiling the samples (``n`` may be smaller, then it slices).

    Raises:
        ValueError: if ``cls`` already has a rule.
    """
    if cls in _BATCH_RULES:
        raise ValueError(f"a batch rule for {cls.__qualname__} is already registered")
    _BATCH_RULES[cls] = _BatchRule(size, slice, replicate)


def _has_rule(x: Any) -> bool:
    return type(x) in _BATCH_RULES


def _copy_tensor(t: torch.Tensor) -> torch.Tensor:
    out = t.detach().clone()
    if t.requires_grad and (out.is_floating_point() or out.is_complex()):
        out.requires_grad_(True)
    return out


def clone_tree(tree: Any, unknown: list[str] | None = None) -> Any:
    """Deep copy of a pytree: tensors detached and cloned, ``requires_grad`` kept.

    Args:
        tree: any pytree.
        unknown: if given, the type names of leaves kept by reference are appended.
    """

    def leaf(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return _copy_tensor(x)
        if isinstance(x, (*_IMMUTABLE, torch.nn.Module, type)):
            return x
        if unknown is not None:
            unknown.append(type(x).__qualname__)
        return x

    return pytree.tree_map(leaf, tree)


def to_device(tree: Any, device: torch.device, dtype: torch.dtype | None = None) -> Any:
    """Move tensor leaves to ``device`` (floats cast to ``dtype`` if given).

    ``requires_grad`` flags are kept; the results are new leaves.
    """

    def leaf(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        cast = dtype if (dtype is not None and x.is_floating_point()) else None
        if x.device == device and cast in (None, x.dtype):
            return x
        out = x.detach().to(device=device, dtype=cast)
        if x.requires_grad:
            out.requires_grad_(True)
        return out

    return pytree.tree_map(leaf, tree)


def leading_batch_size(tree: Any) -> int | None:
    """Batch size of a pytree: its first batch-ruled object's, else its first tensor's dim 0."""
    for x in pytree.tree_leaves(tree, is_leaf=_has_rule):
        if _has_rule(x):
            return _BATCH_RULES[type(x)].size(x)
        if isinstance(x, torch.Tensor) and x.dim() > 0:
            return int(x.shape[0])
    return None


def _map_batch(tree: Any, batch: int, tensor_fn: Callable[[torch.Tensor], torch.Tensor], rule_fn: str, n: int) -> Any:
    def leaf(x: Any) -> Any:
        if _has_rule(x):
            rule = _BATCH_RULES[type(x)]
            return getattr(rule, rule_fn)(x, n) if rule.size(x) == batch else x
        if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == batch:
            out = tensor_fn(x.detach())
            if x.requires_grad:
                out.requires_grad_(True)
            return out
        return x

    return pytree.tree_map(leaf, tree, is_leaf=_has_rule)


def slice_batch(tree: Any, batch: int, k: int) -> Any:
    """Keep the first ``k`` samples of every leaf whose batch size is ``batch``.

    Tensors with ``shape[0] == batch`` are sliced (and cloned, so the big batch
    can be freed); registered types use their rule; everything else is kept.
    """
    if k >= batch:
        return tree
    return _map_batch(tree, batch, lambda t: t[:k].clone(), "slice", k)


def replicate_batch(tree: Any, batch: int, n: int) -> Any:
    """Tile every leaf whose batch size is ``batch`` along dim 0 to ``n`` samples.

    Tiling (``[x0..xb, x0..xb, …]`` cut to ``n``) keeps the captured samples'
    distribution, unlike padding or random data.

    Notes:
        Only leaves whose leading dimension equals the captured batch size are
        replicated; a tensor laid out ``[B*T, …]`` or batch-second is left as is.
    """
    if n == batch:
        return tree

    def tile(t: torch.Tensor) -> torch.Tensor:
        reps = -(-n // batch)
        return t.repeat((reps,) + (1,) * (t.dim() - 1))[:n].contiguous()

    return _map_batch(tree, batch, tile, "replicate", n)
