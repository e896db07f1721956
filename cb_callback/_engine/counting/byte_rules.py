"""Byte rules of cb_callback's own counting: what each aten op reads and writes.

The census (:mod:`cb_callback._engine.counting.census`) and the traffic metric
(``cb_callback._metrics.traffic``) count with the same rules.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch._ops import OpOverload, OpOverloadPacket
from torch.utils import _pytree as pytree

from cb_callback._engine.capture.storage import storage_key
from cb_callback._types import OpValue

__all__ = [
    "FREE",
    "RULES",
    "TrafficRule",
    "op_bytes",
    "register_traffic_rule",
    "storage_bytes",
    "tensor_bytes",
    "tensors_in",
    "unique_bytes",
]

aten = torch.ops.aten

TrafficRule = Callable[[Sequence[OpValue], Mapping[str, OpValue], OpValue], int]

RULES: dict[OpOverloadPacket, TrafficRule] = {}

#: Ops that allocate without writing, or alias without moving: no traffic.
FREE = {
    aten.empty,
    aten.empty_like,
    aten.empty_strided,
    aten.new_empty,
    aten.new_empty_strided,
    aten._unsafe_view,
    aten.lift_fresh,
    aten.detach,
    aten.alias,
    aten._reshape_alias,
    aten.resize_,
    aten.set_,
    aten.sym_size,
    aten.sym_stride,
    aten.sym_numel,
    aten.sym_storage_offset,
    aten.is_same_size,
    aten._local_scalar_dense,
}


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a kernel reads or writes for ``t``: its elements, at most its storage.

    An expanded tensor (stride 0, e.g. a broadcast bias) reads only its storage.
    """
    if t.is_sparse:
        return tensor_bytes(t._values()) + tensor_bytes(t._indices())
    n = t.numel() * t.element_size()
    try:
        return min(n, t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return n


def tensors_in(tree: object) -> list[torch.Tensor]:
    return [x for x in pytree.tree_leaves(tree) if isinstance(x, torch.Tensor)]


def unique_bytes(tensors: Sequence[torch.Tensor]) -> int:
    """:func:`tensor_bytes` of each distinct tensor: the same view of one storage counts once."""
    seen: set[object] = set()
    total = 0
    for t in tensors:
        storage = storage_key(t)
        nested = t.is_nested  # a strided nested tensor has no sizes or strides: the tensor is its own key
        key = ("tensor", id(t)) if storage is None or nested else (storage, t.storage_offset(), t.shape, t.stride())
        if key in seen:
            continue
        seen.add(key)
        total += tensor_bytes(t)
    return total


def register_traffic_rule(op: OpOverloadPacket, rule: TrafficRule) -> None:
    """Give ``op`` (an ``OpOverloadPacket``, e.g. ``torch.ops.fbgemm.foo``) its own byte count.

    ``rule(args, kwargs, out) -> bytes`` replaces the default (every input and
    output tensor's bytes). Use it for gathers and scatters, which touch only the
    rows they index.

    Raises:
        ValueError: if ``op`` already has a rule.
    """
    if op in RULES:
        raise ValueError(f"a traffic rule for {op} is already registered")
    RULES[op] = rule


def _rows_touched(index: torch.Tensor, row_bytes: int) -> int:
    return index.numel() * row_bytes


def _row_bytes(table: torch.Tensor) -> int:
    return (table.numel() // max(table.shape[0], 1)) * table.element_size() if table.dim() else 0


# --- gathers: read the index, read the rows they touch, write the output ----------
def _gather_like(args: Sequence[OpValue], kwargs: Mapping[str, OpValue], out: OpValue) -> int:
    # embedding(weight, indices), index_select(self, dim, index), gather(self, dim, index):
    # rows read == output elements, so bytes = index + 2 * output.
    index = next(a for a in args[1:] if isinstance(a, torch.Tensor))
    return tensor_bytes(index) + 2 * unique_bytes(tensors_in(out))


def _embedding_bag(args: Sequence[OpValue], kwargs: Mapping[str, OpValue], out: OpValue) -> int:
    # (weight, indices, offsets, ..., per_sample_weights): every index reads one row.
    weight, indices = args[0], args[1]
    small = [a for a in list(args[2:]) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
    return (
        tensor_bytes(indices)
        + unique_bytes(small)
        + _rows_touched(indices, _row_bytes(weight))
        + unique_bytes(tensors_in(out))
    )


# --- scatters of gradients: read grads and index, read-modify-write touched rows --
def _embedding_backward(args: Sequence[OpValue], kwargs: Mapping[str, OpValue], out: OpValue) -> int:
    # embedding_dense_backward(grad_output, indices, num_weights, ...): each index
    # adds one grad row into the table's gradient (read grad row, read + write that row).
    grad, indices = args[0], args[1]
    return tensor_bytes(indices) + 3 * tensor_bytes(grad)


def _embedding_bag_backward(args: Sequence[OpValue], kwargs: Mapping[str, OpValue], out: OpValue) -> int:
    # _embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, max_indices,
    # num_weights, ...): per index, one grad row read and one table-gradient row updated.
    grad, indices = args[0], args[1]
    small = [a for a in args[2:] if isinstance(a, torch.Tensor)]
    row = (grad.numel() // max(grad.shape[0], 1)) * grad.element_size()
    return tensor_bytes(indices) + unique_bytes(small) + 3 * indices.numel() * row


def _embedding_bag_psw_backward(args: Sequence[OpValue], kwargs: Mapping[str, OpValue], out: OpValue) -> int:
    # _embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode):
    # reads one weight row per index.
    grad, weight, indices = args[0], args[1], args[2]
    small = [a for a in args[3:] if isinstance(a, torch.Tensor)]
    return (
        tensor_bytes(grad)
        + tensor_bytes(indices)
        + unique_bytes(small)
        + _rows_touched(indices, _row_bytes(weight))
        + unique_bytes(tensors_in(out))
    )


def _index_add_like(args: Sequence[OpValue], kwargs: Mapping[str, OpValue], out: OpValue) -> int:
    # index_add(self, dim, index, source), scatter_add(self, dim, index, src), index_put:
    # read index and source, read-modify-write the touched part of self (source-sized).
    tensors = [a for a in args[1:] if isinstance(a, torch.Tensor)]
    source = max(tensors, key=lambda t: t.numel()) if tensors else None
    index_b = sum(tensor_bytes(t) for t in tensors if t is not source)
    src_b = tensor_bytes(source) if source is not None else 0
    return index_b + 3 * src_b


def _index_select_backward(args: Sequence[OpValue], kwargs: Mapping[str, OpValue], out: OpValue) -> int:
    # index_select_backward(grad, self_sizes, dim, index): scatter-add of grad rows.
    grad = args[0]
    index = next(a for a in args[1:] if isinstance(a, torch.Tensor))
    return tensor_bytes(index) + 3 * tensor_bytes(grad)


for _op, _rule in (
    (aten.embedding, _gather_like),
    (aten.index_select, _gather_like),
    (aten.gather, _gather_like),
    (aten.embedding_dense_backward, _embedding_backward),
    (aten._embedding_bag, _embedding_bag),
    (aten._embedding_bag_forward_only, _embedding_bag),
    (aten.embedding_bag, _embedding_bag),
    (aten._embedding_bag_backward, _embedding_bag_backward),
    (aten._embedding_bag_dense_backward, _embedding_bag_backward),
    (aten._embedding_bag_per_sample_weights_backward, _embedding_bag_psw_backward),
    (aten.index_add, _index_add_like),
    (aten.index_add_, _index_add_like),
    (aten.scatter_add, _index_add_like),
    (aten.scatter_add_, _index_add_like),
    (aten.index_put, _index_add_like),
    (aten.index_put_, _index_add_like),
    (aten.index_select_backward, _index_select_backward),
):
    register_traffic_rule(_op, _rule)


def op_bytes(func: OpOverload, args: Sequence[OpValue], kwargs: Mapping[str, OpValue], out: OpValue) -> int:
    packet = func.overloadpacket
    if func.is_view or packet in FREE:
        return 0
    rule = RULES.get(packet)
    if rule is not None:
        return int(rule(args, kwargs, out))
    inputs = tensors_in((args, kwargs))
    outputs = tensors_in(out)
    if packet in (aten.copy_, aten.fill_, aten.zero_, aten.zeros_like, aten.ones_like, aten.full_like):
        # Overwrite their destination without reading it.
        inputs = inputs[1:] if packet is aten.copy_ else []
    return unique_bytes(inputs) + unique_bytes(outputs)


def storage_bytes(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return t.numel() * t.element_size()
