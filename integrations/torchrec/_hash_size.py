"""``ReduceHashSize``: profile embedding tables too large for the profiling machine."""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

import cb_callback
import cb_callback.plugins

from ._copy import copy_paths, shallow_copy
from ._reduced import ACTIVE, ReducedTable

if TYPE_CHECKING:
    from torchrec.modules.embedding_configs import BaseEmbeddingConfig

__all__ = ["ReduceHashSize"]

METADATA_KEY = "hash_size_reduction"


@dataclass
class _Table:
    path: str  # dotted path of the table module (e.g. "sparse_arch.ebc.embedding_bags.t0")
    collection: str  # path of its EBC / EC
    name: str  # table name (key in the collection's ModuleDict)
    module: nn.Module  # the original nn.EmbeddingBag / nn.Embedding
    config: BaseEmbeddingConfig | None  # its EmbeddingBagConfig / EmbeddingConfig, or None


def _configs(collection: nn.Module) -> dict[str, BaseEmbeddingConfig]:
    configs: Sequence[BaseEmbeddingConfig]
    if isinstance(collection, EmbeddingBagCollection):
        configs = collection.embedding_bag_configs()
    elif isinstance(collection, EmbeddingCollection):
        configs = collection.embedding_configs()
    else:  # pragma: no cover - filtered by the caller
        configs = []
    return {c.name: c for c in configs}


def _tables(model: nn.Module) -> Iterator[_Table]:
    """Every table of every (unfused, unsharded) EBC / EC of ``model``, by path."""
    seen: set[int] = set()
    for path, mod in model.named_modules():
        if isinstance(mod, EmbeddingBagCollection):
            attr = "embedding_bags"
        elif isinstance(mod, EmbeddingCollection):
            attr = "embeddings"
        else:
            continue
        tables = getattr(mod, attr, None)
        if not isinstance(tables, nn.ModuleDict):
            continue
        configs = _configs(mod)
        for name, table in tables.items():
            if id(table) in seen or not isinstance(table, (nn.EmbeddingBag, nn.Embedding)):
                continue
            seen.add(id(table))
            prefix = f"{path}." if path else ""
            yield _Table(f"{prefix}{attr}.{name}", path, name, table, configs.get(name))


def _remap_hook(rows: int, record: ReducedTable) -> Callable[..., Any]:
    def remap(ids: object) -> object:
        if not isinstance(ids, torch.Tensor) or ids.is_floating_point():
            return ids
        with cb_callback.plugins.unobserved():  # the id remap is not the component's work
            out = torch.remainder(ids, rows)
            record.count(ids, out)  # only in an observed (untimed) pass: distinct ids before and after
            return out

    def reduce_hash_size_remap(
        module: nn.Module, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> tuple[tuple[object, ...], dict[str, object]] | None:
        if args:
            return (remap(args[0]), *args[1:]), kwargs
        if "input" in kwargs:
            return args, {**kwargs, "input": remap(kwargs["input"])}
        return None

    return reduce_hash_size_remap


def _rebuild(old: nn.Module, rows: int, device: torch.device, config: BaseEmbeddingConfig | None) -> nn.Module:
    """A table like ``old`` (dim, dtype, pooling, options) with ``rows`` rows on ``device``."""
    weight: torch.Tensor = old.weight  # type: ignore[assignment]
    padding_idx: int | None = getattr(old, "padding_idx", None)
    if padding_idx is not None and padding_idx >= rows:
        padding_idx = None
    common: dict[str, Any] = dict(
        num_embeddings=rows,
        embedding_dim=old.embedding_dim,  # type: ignore[union-attr]
        max_norm=old.max_norm,  # type: ignore[union-attr]
        norm_type=old.norm_type,  # type: ignore[union-attr]
        scale_grad_by_freq=old.scale_grad_by_freq,  # type: ignore[union-attr]
        sparse=old.sparse,  # type: ignore[union-attr]
        padding_idx=padding_idx,
        device=device,
        dtype=weight.dtype,
    )
    new: nn.Module
    if isinstance(old, nn.EmbeddingBag):
        new = nn.EmbeddingBag(mode=old.mode, include_last_offset=old.include_last_offset, **common)
    else:
        new = nn.Embedding(**common)
    init = getattr(config, "init_fn", None)
    if init is not None:
        with torch.no_grad():
            init(new.weight)
    new.weight.requires_grad_(weight.requires_grad)
    new.train(old.training)
    return new


class ReduceHashSize(cb_callback.plugins.Preprocessor):
    """Rebuild embedding tables with more than ``max_rows`` rows (or on ``meta``) smaller.

    Every table of every ``EmbeddingBagCollection`` / ``EmbeddingCollection``
    whose weight has more than ``max_rows`` rows becomes a table of ``max_rows``
    rows, on the profiling device, with the same dim, dtype, pooling mode and
    options, initialised by its config's ``init_fn`` (torchrec's default:
    uniform in ``±sqrt(1 / original rows)``) under a fixed seed. Its ids are
    remapped ``id % max_rows`` by a forward pre-hook on the new table. Tables
    declared on the ``meta`` device are materialised (at ``min(rows,
    max_rows)`` rows), so a model whose tables total hundreds of GiB profiles on
    one CPU machine.

    ``prepare_model`` does not change ``model``: it returns a copy that shares
    every other module, parameter and buffer with it, in which only the
    modules on the way to a rebuilt table are (shallow) copies. Paths are
    unchanged, so the report reads as the original model and inputs captured on
    the original model (the Lightning callback) replay on the copy. Per table,
    the original and reduced rows are recorded in
    ``ctx.metadata["hash_size_reduction"]`` (in the report's metadata).

    The remap hooks live on the rebuilt tables only and come off in
    :meth:`restore_model`, which the engine runs after the run's last replay
    (also on error). Pickling keeps only ``max_rows``: a snapshot's options
    carry the preprocessor, not a run's hooks or flags, and the process that
    profiles the snapshot reduces the tables afresh.

    Args:
        max_rows: the most rows a profiled table keeps (>= 1).

    Notes:
        What reduction changes, and how the report says it (the integration's
        :class:`~._reduced.ReducedTableMetric`): every measured row whose
        subtree holds a remapped table is flagged ``hash_reduced`` and its
        ``details["hash_size"]`` gives each such table's real and reduced rows
        and which columns come from which table. A lookup touches the same
        number of rows of the same width, so bytes and FLOPs are those of the
        real table; an op over a whole table-sized tensor (the sum of a shared
        table's dense gradients, one per call) is counted at the real size (its
        table-sized tensors scaled by ``real / reduced`` rows). Times are *not*
        scaled: the rows come from a table of ``max_rows`` rows, so more of them
        are in cache (and TLB) than in the real table and reduced tables read
        as faster than the original, most when the ids are spread (uniform) and
        least when a few hot ids dominate (Zipf); the rates derived from times
        (TFLOP/s, GB/s, ``bw_util``, MFU), ``params_mb``, the memory columns and
        the working set (so the bandwidth ceiling: often a cache level where the
        real table would be served from DRAM) are the reduced table's too. The
        original sizes are in the metadata and the summary. The remap (``id %
        max_rows``) can fall distinct ids onto one row (a strided id space):
        the observed pass counts the distinct ids before and after it, and a row
        where fewer remain is flagged ``hash_collapsed`` (its lookups touch
        fewer distinct rows than the real step's). The remap runs outside the
        FLOP and byte counters but inside the timed forward (one elementwise
        pass over the ids), and its output (the remapped ids) is in the table's
        ``peak_mem_mb``. Fused (``FusedEmbeddingBagCollection``, fbgemm TBE)
        and sharded tables are
        not rebuilt; they are listed under ``"not_reduced"``.
    """

    name = "reduce_hash_size"

    def __init__(self, max_rows: int) -> None:
        if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
            raise ValueError(f"ReduceHashSize(max_rows={max_rows!r}): expected an integer >= 1")
        self.max_rows = max_rows
        self._handles: list[RemovableHandle] = []
        self._active: list[weakref.ref[nn.Module]] = []  # the tables this run rebuilt, in ACTIVE while it runs
        self._prepared = False
        self._warned = False

    def __repr__(self) -> str:
        return f"ReduceHashSize(max_rows={self.max_rows})"

    def __getstate__(self) -> dict[str, int]:
        """Only the option is pickled (a snapshot's config): a run's hooks and flags stay behind."""
        return {"max_rows": self.max_rows}

    def __setstate__(self, state: dict[str, int]) -> None:
        self.__init__(state["max_rows"])  # type: ignore[misc]

    def plan(self, model: nn.Module) -> list[tuple[str, int, int]]:
        """``(table path, original rows, new rows)`` of each table :meth:`prepare_model` rebuilds."""
        out = []
        for t in _tables(model):
            weight: torch.Tensor = t.module.weight  # type: ignore[assignment]
            rows = int(weight.shape[0])
            if rows > self.max_rows or weight.device.type == "meta":
                out.append((t.path, rows, min(rows, self.max_rows)))
        return out

    def prepare_model(self, model: nn.Module, ctx: cb_callback.plugins.PrepareContext) -> nn.Module:
        """The model to capture and profile: ``model`` itself if no table needs rebuilding."""
        self._prepared = True
        todo = {path: (rows, new) for path, rows, new in self.plan(model)}
        tables = [t for t in _tables(model) if t.path in todo]
        record: dict[str, Any] = {"max_rows": self.max_rows, "tables": {}, "not_reduced": _not_reduced(model)}
        if not tables:
            ctx.metadata[METADATA_KEY] = record
            return model
        new_model = copy_paths(model, sorted({t.collection for t in tables}))
        modules = dict(new_model.named_modules())
        devices = [ctx.device] if ctx.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            for i, t in enumerate(tables):
                rows, new_rows = todo[t.path]
                torch.manual_seed(ctx.config.seed + i)
                table = _rebuild(t.module, new_rows, ctx.device, t.config)
                if new_rows < rows:
                    record_t = ReducedTable(t.path, rows, new_rows)
                    hook = _remap_hook(new_rows, record_t)
                    self._handles.append(table.register_forward_pre_hook(hook, with_kwargs=True))
                    ACTIVE[table] = record_t
                    self._active.append(weakref.ref(table))
                owner = modules[t.collection]
                attr = "embedding_bags" if isinstance(owner, EmbeddingBagCollection) else "embeddings"
                container = shallow_copy(getattr(owner, attr))
                container._modules[t.name] = table
                owner._modules[attr] = container
                modules = dict(new_model.named_modules())
                old_w: torch.Tensor = t.module.weight  # type: ignore[assignment]
                record["tables"][t.path] = {
                    "collection": t.collection,
                    "table": t.name,
                    "original_rows": rows,
                    "reduced_rows": new_rows,
                    "embedding_dim": int(old_w.shape[1]),
                    "dtype": str(old_w.dtype).replace("torch.", ""),
                    "original_device": str(old_w.device),
                    "remapped": new_rows < rows,
                }
        ctx.metadata[METADATA_KEY] = record
        return new_model

    def process_inputs(
        self, inputs: cb_callback.plugins.ComponentInputs, ctx: cb_callback.plugins.PrepareContext
    ) -> cb_callback.plugins.ComponentInputs:
        """Inputs unchanged; warns once if :meth:`prepare_model` was never called."""
        if not self._prepared and not self._warned:
            self._warned = True
            warnings.warn(
                "cb_callback: ReduceHashSize.prepare_model was not called on this model, so no table was "
                "reduced; call it on the model and profile the model it returns "
                "(profile_components does this for you)",
                RuntimeWarning,
                stacklevel=2,
            )
        return inputs

    def restore_model(self, model: nn.Module, ctx: cb_callback.plugins.PrepareContext) -> None:
        """After the run (the engine calls it, also on error): take the id-remap hooks off."""
        self.remove()
        self._prepared = False

    def remove(self) -> None:
        """Remove the id-remap hooks this preprocessor installed (on the copies it made)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for ref in self._active:
            table = ref()
            if table is not None:
                ACTIVE.pop(table, None)
        self._active.clear()


def _not_reduced(model: nn.Module) -> list[str]:
    """Paths of embedding modules this preprocessor does not rebuild (fused, sharded)."""
    out = []
    for path, mod in model.named_modules():
        name = type(mod).__name__
        if name.startswith(("Fused", "Sharded")) and "Embedding" in name:
            out.append(path)
    return out
