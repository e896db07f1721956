"""What a row owes to hash-size reduction: the ``hash_reduced`` / ``hash_collapsed`` flags and real-size bytes.

:class:`~._hash_size.ReduceHashSize` rebuilds large tables with fewer rows.
Every row whose subtree holds a rebuilt table is then a mix of two tables; the
:class:`ReducedTableMetric` (registered on import of the integration) says so
on the row and corrects what it can:

* ``details["own_flags"]`` gets ``"hash_reduced"`` (and ``"hash_collapsed"``
  when the remap ``id % reduced_rows`` fell distinct ids onto one row);
* ``details["hash_size"]``: per reduced table its real and reduced row counts
  and, where the table was called in the observed pass, its distinct ids before
  and after the remap; which columns come from the reduced tables and which
  from the real ones; the table-sized bytes at both sizes.
* ``bytes`` (and ``fwd_bytes``/``bwd_bytes``) at the real size: lookups and
  gradient scatters touch the same rows of the same width in both tables (the
  traffic rules count the rows touched), but an op over a whole table-sized
  tensor (the sum of a shared table's dense gradients, one per call) moves
  ``real / reduced`` times more at the real size. Those ops' table-sized
  tensors are scaled to the real rows; the rest of the count is the built-in
  traffic metric's.

Times are **not** scaled: no model of how a table's size changes a lookup's
time (cache and TLB hits of the ids' distribution) is trustworthy enough, so
``fwd_ms``/``bwd_ms``/``total_ms`` and the rates derived from them (TFLOP/s,
GB/s, ``bw_util``, MFU), ``params_mb``, the memory columns and the working set
(hence the bandwidth ceiling) are the reduced table's, and the row says so.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import cb_callback
import cb_callback.plugins

from ._stages import _Nothing

if TYPE_CHECKING:
    from torch._ops import OpOverload

__all__ = ["FROM_REAL", "FROM_REDUCED", "ReducedTable", "ReducedTableMetric", "register_reduced_table_metric"]

#: The columns a row with a reduced table takes from the reduced (shrunk) tables.
FROM_REDUCED = (
    "fwd_ms", "bwd_ms", "total_ms", "cpu_ms", "device_ms", "tflops", "mfu", "gbps", "bw_util", "intensity",
    "params_mb", "activation_mb", "peak_mem_mb", "bw_ceiling",
)  # fmt: skip
#: The columns it takes from the real tables (the rows a lookup touches; table-sized ops scaled to the real rows).
FROM_REAL = ("bytes", "fwd_flops", "bwd_flops")

#: Ops whose traffic rule counts the rows they touch, not the table (:mod:`._traffic` and the built-in rules).
_ROW_OPS = frozenset({
    "embedding", "embedding_bag", "_embedding_bag", "_embedding_bag_forward_only", "embedding_dense_backward",
    "_embedding_bag_backward", "_embedding_bag_dense_backward", "_embedding_bag_per_sample_weights_backward",
    "index_select", "gather", "index_add", "index_add_", "scatter_add", "scatter_add_", "index_put", "index_put_",
    "index_select_backward",
})  # fmt: skip
_OVERWRITE = frozenset({"copy_", "fill_", "zero_", "zeros_like", "ones_like", "full_like"})


@dataclass
class ReducedTable:
    """One table :class:`~._hash_size.ReduceHashSize` rebuilt, and the ids seen while counting."""

    path: str
    original_rows: int
    reduced_rows: int
    counting: bool = False
    before: list[torch.Tensor] = field(default_factory=list)  # distinct ids of each counted call
    after: list[torch.Tensor] = field(default_factory=list)  # distinct rows they were remapped to

    def count(self, ids: torch.Tensor, remapped: torch.Tensor) -> None:
        """Record one call's distinct ids and rows (only while an observed pass counts)."""
        if self.counting:
            self.before.append(torch.unique(ids.detach()).cpu())
            self.after.append(torch.unique(remapped.detach()).cpu())

    collapsed: dict[str, Any] | None = None  # the first observed pass whose remap collapsed ids (and its row)

    def distinct(self, row: str) -> dict[str, Any] | None:
        """``{"distinct": ids, "distinct_after_remap": rows}`` over this pass's counted calls (then cleared),
        ``None`` if the table was not called in it.

        A row whose inputs were captured already remapped (the capture's hooks run after the remap's, so a
        table's own row sees ``id % reduced_rows``) cannot tell a collapse itself: once an observed pass of
        an ancestor saw the original ids collapse, ``collapsed_in`` names that row on every later row.
        """
        if not self.before:
            return None
        before = int(torch.unique(torch.cat(self.before)).numel())
        after = int(torch.unique(torch.cat(self.after)).numel())
        self.before.clear()
        self.after.clear()
        out: dict[str, Any] = {"distinct": before, "distinct_after_remap": after}
        if after < before and self.collapsed is None:
            self.collapsed = {"row": row, **out}
        return out


#: The tables rebuilt by the preprocessors of the runs in progress (weakly: a copy dropped unrestored goes).
ACTIVE: weakref.WeakKeyDictionary[nn.Module, ReducedTable] = weakref.WeakKeyDictionary()


def _table_shapes(tables: list[tuple[nn.Module, ReducedTable]]) -> dict[tuple[tuple[int, ...], torch.dtype], float]:
    """``(shape, dtype) -> real / reduced rows - 1`` of each remapped table's weight."""
    out: dict[tuple[tuple[int, ...], torch.dtype], float] = {}
    for module, t in tables:
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor) and t.reduced_rows < t.original_rows:
            out[(tuple(weight.shape), weight.dtype)] = t.original_rows / t.reduced_rows - 1.0
    return out


class _TableSizedMode(TorchDispatchMode):
    """Sums, per phase, the bytes an op moves over whole table-sized tensors, times the real-size excess."""

    def __init__(self, shapes: Mapping[tuple[tuple[int, ...], torch.dtype], float]) -> None:
        super().__init__()
        self.shapes = shapes
        self.reduced = 0.0  # table-sized bytes as counted at the reduced size
        self.extra = 0.0  # what the real size adds to them

    def __torch_dispatch__(
        self,
        func: OpOverload,
        types: Collection[type],
        args: tuple[object, ...] = (),
        kwargs: dict[str, object] | None = None,
    ) -> object:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if func.is_view or name in _ROW_OPS or func.namespace == "fbgemm":
            return out
        inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if name in _OVERWRITE:
            inputs = inputs[1:] if name == "copy_" else []
        outputs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        for group in (inputs, outputs):
            seen: set[int] = set()
            for t in group:
                excess = self.shapes.get((tuple(t.shape), t.dtype)) if t.layout is torch.strided else None
                if excess is None or id(t) in seen:  # a sparse gradient holds only the rows touched
                    continue
                seen.add(id(t))
                nbytes = t.numel() * t.element_size()
                self.reduced += nbytes
                self.extra += nbytes * excess
        return out


class _ReducedInstrument:
    def __init__(
        self, path: str, tables: list[tuple[nn.Module, ReducedTable]], traffic: cb_callback.plugins.Instrument
    ) -> None:
        self.path = path
        self.tables = tables
        self.traffic = traffic  # the built-in byte count, observed again: its bytes are corrected here
        self.shapes = _table_shapes(tables)
        self.reduced = 0.0
        self.extra: dict[str, float] = {"forward": 0.0, "backward": 0.0}

    @contextlib.contextmanager
    def observe(self, ctx: cb_callback.plugins.PassContext) -> Iterator[None]:
        with self.traffic.observe(ctx):
            if ctx.phase is cb_callback.plugins.Phase.PASS:
                yield
                return
            counting = ctx.phase is cb_callback.plugins.Phase.FORWARD
            for _, t in self.tables:
                t.counting = counting
            mode = _TableSizedMode(self.shapes)
            try:
                with mode:
                    yield
            finally:
                for _, t in self.tables:
                    t.counting = False
            self.reduced += mode.reduced
            self.extra[ctx.phase.name.lower()] = self.extra.get(ctx.phase.name.lower(), 0.0) + mode.extra

    def values(self) -> Mapping[str, Any]:
        base = dict(self.traffic.values())
        fwd = float(base.get("fwd_bytes", 0)) + self.extra["forward"]
        bwd = float(base.get("bwd_bytes", 0)) + self.extra["backward"]
        tables: dict[str, Any] = {}
        collapsed = False
        for _, t in self.tables:
            entry: dict[str, Any] = {"original_rows": t.original_rows, "reduced_rows": t.reduced_rows}
            entry.update(t.distinct(self.path) or {})
            if t.collapsed is not None:
                collapsed = True
                entry["collapsed_in"] = t.collapsed
            tables[t.path] = entry
        return {
            "bytes": fwd + bwd,
            "fwd_bytes": fwd,
            "bwd_bytes": bwd,
            "own_flags": ["hash_reduced", *(["hash_collapsed"] if collapsed else [])],
            "hash_size": {
                "tables": tables,
                "times": "from the reduced tables, not scaled to the real ones",
                "from_reduced": list(FROM_REDUCED),
                "from_real": list(FROM_REAL),
                "table_sized_bytes": {"reduced": self.reduced, "real": self.reduced + sum(self.extra.values())},
            },
        }


class ReducedTableMetric:
    """Flags and completes every row whose subtree holds a table that ``ReduceHashSize`` shrank.

    See the module docstring for what it fills; a row without such a table gets nothing.
    """

    name = "torchrec_hash_size"

    def from_census(self, counted: Mapping[str, object]) -> dict[str, Any] | None:
        """Nothing to add to a row the census counted while no table is reduced (``{}``); with reduced
        tables, ``None``: it observes each row's own pass."""
        return None if ACTIVE else {}

    def instrument(self, ctx: cb_callback.plugins.MeasureContext) -> cb_callback.plugins.Instrument:
        """Observe the pass of a row that holds a reduced (remapped) table; nothing for any other row."""
        if not ACTIVE:
            return _Nothing()
        found = ((m, ACTIVE.get(m)) for m in ctx.module.modules())
        tables = [(m, t) for m, t in found if t is not None and t.reduced_rows < t.original_rows]
        if not tables:
            return _Nothing()
        return _ReducedInstrument(ctx.path, tables, cb_callback.plugins.TrafficMetric().instrument(ctx))


_registered = False


def register_reduced_table_metric() -> None:
    """Register :class:`ReducedTableMetric` with the engine (idempotent)."""
    global _registered
    if not _registered:
        cb_callback.plugins.register_metric(ReducedTableMetric())
        _registered = True
