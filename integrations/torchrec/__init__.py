"""torchrec integration: jagged inputs, embedding traffic, hash-size reduction, fused optimizers.

Importing this module registers, once per process, everything the engine
needs to profile torchrec models (through ``cb_callback``'s public API only):

* batch rules for ``KeyedJaggedTensor``, ``JaggedTensor`` and ``KeyedTensor``
  (slicing and replication per key; see :mod:`._jagged`), and torchrec's
  ``Batch`` as a pytree node;
* memory-traffic rules for fbgemm's table-batched embedding kernels (the rows
  touched, not the whole table; see :mod:`._traffic`);
* a state saver for fused optimizers' Python-level state and hidden TBEs (see
  :mod:`._fused`);
* grad targets for fbgemm TBEs kept outside the module tree (torchrec's
  ``FusedEmbeddingBagCollection``, sharded lookups): their placeholder tensor,
  or a dense TBE's weights, so the isolated backward of every component that
  holds one (and of its parents) runs and measures the fused backward — the
  gradient scatter and the optimizer update (see :mod:`._grad_targets`);
* the unsharded paths of ``DistributedModelParallel`` models (``sparse_arch.…``,
  not ``_dmp_wrapped_module.module.sparse_arch.…``; see :func:`register_dmp_paths`),
  and replays that wait on a sharded module's ``LazyAwaitable`` output;
* the :class:`ReducedTableMetric` (see :mod:`._reduced`): every row holding a
  table that :class:`ReduceHashSize` shrank is flagged ``hash_reduced`` (and
  ``hash_collapsed`` when the remap fell distinct ids onto one row), says which
  columns come from the shrunk table, and has its bytes at the real size;
* the :class:`ShardedEmbeddingMetric` (see :mod:`._stages`): a sharded
  embedding module's row split into its input all-to-all, local lookups (with
  bytes and bandwidth) and output all-to-all, and torchrec's planner estimate
  beside it.

:func:`planned_perf` gives torchrec's planner estimate of each sharded module
(see :mod:`._planner`).

Then use::

    import cb_callback
    from cb_callback.integrations.torchrec import ReduceHashSize

    report = cb_callback.profile_components(
        model, (dense, kjt), preprocessors=[ReduceHashSize(max_rows=100_000)]
    )

``import cb_callback`` never imports torchrec; only this module does.
"""

from __future__ import annotations

from ._fused import fused_tbe_state_saver, register_fused_state_saver
from ._grad_targets import hidden_tbe_grad_targets, register_hidden_tbe_grad_targets
from ._hash_size import ReduceHashSize
from ._hidden import tbe_modules
from ._jagged import (
    register_jagged_batch_rules,
    take_jt,
    take_kjt,
    take_kt,
)
from ._planner import planned_perf
from ._reduced import ReducedTableMetric, register_reduced_table_metric
from ._sharded import ShardedModelCheck, dmp_unwrapper, register_awaitable_outputs, register_dmp_paths, unwrap_model
from ._stages import ShardedEmbeddingMetric, register_default_sharded_metric, register_sharded_metric
from ._traffic import (
    register_tbe_traffic_rules,
    tbe_backward_bytes,
    tbe_forward_bytes,
)

__all__ = [
    "ReduceHashSize",
    "ReducedTableMetric",
    "ShardedEmbeddingMetric",
    "ShardedModelCheck",
    "dmp_unwrapper",
    "fused_tbe_state_saver",
    "hidden_tbe_grad_targets",
    "planned_perf",
    "register",
    "register_dmp_paths",
    "register_sharded_metric",
    "take_jt",
    "take_kjt",
    "take_kt",
    "tbe_backward_bytes",
    "tbe_forward_bytes",
    "tbe_modules",
    "unwrap_model",
]


def register() -> None:
    """Register the integration's rules, state saver, grad targets, DMP paths and sharded metric (idempotent).

    Called on import; call it again after loading more fbgemm operator
    libraries so their TBE ops get traffic rules too.
    """
    register_jagged_batch_rules()
    register_tbe_traffic_rules()
    register_fused_state_saver()
    register_hidden_tbe_grad_targets()
    register_dmp_paths()
    register_awaitable_outputs()
    register_default_sharded_metric()
    register_reduced_table_metric()


register()
