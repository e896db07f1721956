"""Memory-traffic rules for fbgemm's table-batched embedding (TBE) kernels.

A TBE op takes *every* table of the batch as one flat tensor (``host_weights``,
``dev_weights``, ``uvm_weights``). The engine's default byte count (every input
and output tensor once) would charge the whole table — gigabytes — to a lookup
that touches a few thousand rows; the rules below charge the rows touched.

What torchrec 1.8 dispatches on CPU (seen with a ``TorchDispatchMode``):

* ``EmbeddingBagCollection`` / ``EmbeddingCollection``: ``aten._embedding_bag``
  / ``aten.embedding`` per feature and their backwards — the engine's built-in
  gather/scatter rules already count the rows touched; nothing to add here.
* ``FusedEmbeddingBagCollection`` and fbgemm's
  ``SplitTableBatchedEmbeddingBagsCodegen``: ``fbgemm.bounds_check_indices``,
  ``fbgemm.asynchronous_complete_cumsum`` (small, default count), then
  ``fbgemm.split_embedding_codegen_forward_{unweighted,weighted}[_vbe]_pt2_wrapper``
  forward and ``fbgemm.split_embedding_backward_codegen_<optimizer>_…_pt2_wrapper``
  backward, which applies the fused optimizer in place. Those get rules here.
* A ``DistributedModelParallel`` model sharded data-parallel on one CPU rank:
  ``fbgemm.dense_embedding_codegen_lookup_function`` (forward rule here; its
  backward is computed inside the op's autograd node and is not dispatched).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

import cb_callback
import cb_callback.plugins

if TYPE_CHECKING:
    from torch._ops import OpOverload

__all__ = ["register_tbe_traffic_rules", "tbe_backward_bytes", "tbe_forward_bytes", "tbe_op_bytes"]

_TABLES = ("host_weights", "dev_weights", "uvm_weights", "lxu_cache_weights")
# The dense TBE's lookup is one op whose backward runs inside its autograd node (in
# C++): its backward traffic is not visible to a dispatch mode.
_STATE_PREFIXES = ("momentum1", "momentum2", "prev_iter", "row_counter")
_STATE_SUFFIXES = ("_host", "_dev", "_uvm")


def _nbytes(t: object) -> int:
    if not isinstance(t, torch.Tensor):
        return 0
    return t.numel() * t.element_size()


def _table(named: Mapping[str, Any]) -> torch.Tensor | None:
    """The non-empty tensor among host/dev/uvm weights (where the rows live)."""
    for name in ("host_weights", "dev_weights", "uvm_weights"):
        t = named.get(name)
        if isinstance(t, torch.Tensor) and t.numel() > 0:
            return t
    return None


def _is_state(name: str) -> bool:
    return name.startswith(_STATE_PREFIXES) and name.endswith(_STATE_SUFFIXES)


def _ints(t: object) -> np.ndarray:
    """``t``'s values as int64 numpy (an empty array for a non-tensor).

    Read through numpy, off the device (one copy for a CUDA tensor, none on
    CPU): the rules dispatch no torch op and allocate nothing from torch's
    allocators, so they stay invisible to the FLOP counter, the op recorder and
    the memory metric's allocation events.
    """
    if not isinstance(t, torch.Tensor):
        return np.empty(0, dtype=np.int64)
    return t.detach().cpu().numpy().astype(np.int64, copy=False).reshape(-1)


def _per_feature(named: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(bounds of each feature's indices, embedding dim of each feature).

    ``offsets`` holds one bag per (feature, sample), feature-major; a uniform
    batch has ``T * B + 1`` entries, a variable batch (VBE) gives the per-feature
    starts in ``B_offsets``. Feature ``f``'s indices are
    ``indices[bounds[f]:bounds[f + 1]]``.
    """
    offsets = _ints(named["offsets"])
    if isinstance(named.get("D_offsets"), torch.Tensor):
        dims = np.diff(_ints(named["D_offsets"]))
    else:  # no-bag kernels: one dim for every feature (one per weights_offsets entry)
        dims = np.full(int(named["weights_offsets"].numel()), int(named["D"]), dtype=np.int64)
    features = len(dims)
    if isinstance(named.get("B_offsets"), torch.Tensor):
        starts = _ints(named["B_offsets"])
    else:
        batch = (len(offsets) - 1) // max(features, 1)
        starts = np.arange(features + 1, dtype=np.int64) * batch
    bounds = offsets[starts]
    if len(bounds) < features + 1:
        raise IndexError(f"{len(bounds)} feature bounds for {features} features")
    return bounds, dims


def _rows_gathered(named: Mapping[str, Any]) -> int:
    """Elements read from the tables: each index reads one row of its feature's dim."""
    bounds, dims = _per_feature(named)
    return int(np.dot(np.diff(bounds[: len(dims) + 1]), dims))


def _small_inputs(named: Mapping[str, Any], skip: Callable[[str], bool]) -> int:
    """Bytes of every tensor argument not skipped (indices, offsets, metadata, weights)."""
    return sum(_nbytes(v) for k, v in named.items() if not skip(k))


def _out_bytes(out: object) -> int:
    if isinstance(out, torch.Tensor):
        return _nbytes(out)
    if isinstance(out, (tuple, list)):
        return sum(_nbytes(t) for t in out)
    return 0


def tbe_forward_bytes(named: Mapping[str, Any], out: object) -> int:
    """Bytes of one TBE forward: inputs but the tables, the rows gathered, the output.

    Rows gathered: each index reads one row of its feature's table,
    ``sum over features of (indices of the feature) * D_feature * element size``.
    """
    table = _table(named)
    small = _small_inputs(named, lambda k: k in _TABLES)
    if table is None:
        return small + _out_bytes(out)
    return small + _rows_gathered(named) * table.element_size() + _out_bytes(out)


def _unique_rows(named: Mapping[str, Any]) -> tuple[int, int]:
    """(number of distinct rows the indices touch, sum of their dims)."""
    bounds, dims = _per_feature(named)
    indices = _ints(named["indices"])
    starts = _ints(named["weights_offsets"])
    # A row is its element offset in the flat weights, base + id * D: unique across
    # tables, and the same for two features that share a table.
    keys = [starts[f] + indices[bounds[f] : bounds[f + 1]] * d for f, d in enumerate(dims)]
    widths = [np.full(len(k), d, dtype=np.int64) for k, d in zip(keys, dims, strict=True)]
    if not keys:
        return 0, 0
    # Each distinct row counts once, with the dim of its last feature (as a dict's
    # last assignment would): the first occurrence in the reversed order.
    flat, width = np.concatenate(keys)[::-1], np.concatenate(widths)[::-1]
    _, first = np.unique(flat, return_index=True)
    return len(first), int(width[first].sum())


def tbe_backward_bytes(named: Mapping[str, Any], out: object) -> int:
    """Bytes of one fused TBE backward (gradient scatter + optimizer update).

    Inputs but the tables and optimizer states (``grad_output`` read once,
    indices, offsets, metadata), then for each *distinct* row touched a read and
    a write of the row and of its optimizer state (a row-wise state has one
    element per row, an element-wise one ``D``), then the output.
    """
    table = _table(named)
    small = _small_inputs(named, lambda k: k in _TABLES or _is_state(k))
    if table is None:
        return small + _out_bytes(out)
    n_rows, dim_sum = _unique_rows(named)
    total = small + 2 * dim_sum * table.element_size()
    seen: set[str] = set()
    for name, state in named.items():
        prefix = name.rsplit("_", 1)[0]
        if not _is_state(name) or prefix in seen or not isinstance(state, torch.Tensor) or state.numel() == 0:
            continue
        seen.add(prefix)
        per_row = dim_sum if state.numel() == table.numel() else n_rows
        total += 2 * per_row * state.element_size()
    return total + _out_bytes(out)


def tbe_grad_indice_weights_bytes(named: Mapping[str, Any], out: object) -> int:
    """Bytes of the per-sample-weight gradient: inputs but the tables, one row read per index, output."""
    table = _table(named)
    small = _small_inputs(named, lambda k: k in _TABLES)
    if table is None or "D_offsets" not in named or isinstance(named.get("vbe_b_t_map"), torch.Tensor):
        # VBE without per-feature starts: charge each index the widest row.
        width = int(named.get("max_D", 0)) * (table.element_size() if table is not None else 0)
        return small + named["indices"].numel() * width + _out_bytes(out)
    return small + _rows_gathered(named) * table.element_size() + _out_bytes(out)


def _bind(
    schema_names: Sequence[str], fn: Callable[[Mapping[str, Any], object], int]
) -> Callable[[Sequence[object], Mapping[str, object], object], int]:
    def rule(args: Sequence[object], kwargs: Mapping[str, object], out: object) -> int:
        named = dict(zip(schema_names, args, strict=False))
        named.update(kwargs)
        # The traffic mode may be nested in other modes (the FLOP counter): hide
        # the reads of offsets/indices from them.
        with cb_callback.plugins.unobserved():
            try:
                return int(fn(named, out))
            except Exception:  # an argument layout this rule does not know: a lower bound
                return _small_inputs(named, lambda k: k in _TABLES or _is_state(k)) + _out_bytes(out)

    rule.__name__ = fn.__name__
    return rule


def _kind(name: str) -> Callable[[Mapping[str, Any], object], int] | None:
    if name == "dense_embedding_codegen_lookup_function":  # data-parallel (unfused) TBE
        return tbe_forward_bytes
    if not name.startswith("split_embedding") or not name.endswith("pt2_wrapper"):
        return None
    if "grad_indice_weights" in name:
        return tbe_grad_indice_weights_bytes
    if "_codegen_forward_" in name:
        return tbe_forward_bytes
    if "_backward_codegen_" in name:
        return tbe_backward_bytes
    return None


_REGISTERED: set[str] = set()


def tbe_op_bytes(func: OpOverload, args: Sequence[object], kwargs: Mapping[str, object], out: object) -> int | None:
    """The bytes of one dispatched fbgemm TBE forward op (this module's rule), ``None`` for any other op."""
    if getattr(func, "namespace", None) != "fbgemm":
        return None
    name = func.overloadpacket.__name__
    fn = _kind(name)
    if fn is not tbe_forward_bytes:
        return None
    names = [a.name for a in func._schema.arguments]
    return int(_bind(names, fn)(args, kwargs, out))


def register_tbe_traffic_rules() -> list[str]:
    """Register the rules for every fbgemm TBE forward/backward op loaded (idempotent).

    Returns:
        The op names that have a rule from this module.
    """
    for qualified in sorted(torch._C._dispatch_get_all_op_names()):
        ns, _, name = qualified.partition("::")
        if ns != "fbgemm" or name in _REGISTERED:
            continue
        fn = _kind(name)
        if fn is None:
            continue
        packet = getattr(torch.ops.fbgemm, name)
        names = [a.name for a in packet.default._schema.arguments]
        with contextlib.suppress(ValueError):  # someone registered their own rule first: keep it
            cb_callback.plugins.register_traffic_rule(packet, _bind(names, fn))
        _REGISTERED.add(name)
    return sorted(_REGISTERED)
