"""torchrec's own planner estimate (``Perf``) of each sharded module, for the plan a DMP model uses."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner.types import ParameterConstraints, Perf, Shard, Topology
    from torchrec.distributed.types import ModuleSharder, ParameterSharding

__all__ = ["PERF_FIELDS", "default_topology", "module_perf", "planned_perf", "rank_topology"]

# torchrec's Perf fields (ms each), in the order of the keys planned_perf writes
PERF_FIELDS = ("fwd_compute", "fwd_comms", "bwd_compute", "bwd_comms", "input_dist_comms", "prefetch_compute")


def _zero() -> dict[str, float]:
    return {f"{f}_ms": 0.0 for f in (*PERF_FIELDS, "total")}


def _add(acc: dict[str, float], perf: Perf) -> None:
    for f in PERF_FIELDS:
        acc[f"{f}_ms"] += float(getattr(perf, f))
    acc["total_ms"] += float(perf.total)


def _find_dmp(model: nn.Module) -> tuple[str, DistributedModelParallel]:
    """(its path, the module) of the first ``DistributedModelParallel`` in ``model``'s tree."""
    from torchrec.distributed.model_parallel import DistributedModelParallel

    for path, m in model.named_modules():
        if isinstance(m, DistributedModelParallel):
            return path, m
    raise ValueError(
        f"planned_perf: no torchrec DistributedModelParallel in {type(model).__name__}'s tree; "
        "pass the DMP-wrapped model (or a module that holds one)"
    )


def _world_size(dmp: DistributedModelParallel) -> int:
    env = getattr(dmp, "_env", None)
    if env is not None and getattr(env, "world_size", None):
        return int(env.world_size)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return int(torch.distributed.get_world_size())
    return 1


def rank_topology(world: int, device_type: str) -> Topology:
    """The ``Topology`` DMP builds when it plans by itself for ``world`` ranks of ``device_type``.

    Its local world size is ``LOCAL_WORLD_SIZE`` (else the world size); the bandwidths are torchrec's defaults.
    """
    from torchrec.distributed.comm import get_local_size
    from torchrec.distributed.planner import Topology

    return Topology(world_size=world, compute_device=device_type, local_world_size=get_local_size(world))


def default_topology(dmp: DistributedModelParallel) -> Topology:
    """The ``Topology`` DMP builds when it plans by itself: its world size, its device type, the default bandwidths."""
    return rank_topology(_world_size(dmp), dmp.device.type)


def _unsharded_twin(sharded: nn.Module) -> nn.Module | None:
    """An unsharded ``EmbeddingBagCollection`` / ``EmbeddingCollection`` on ``meta`` with the sharded one's tables."""
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    bag_configs = getattr(sharded, "_embedding_bag_configs", None)
    if bag_configs is not None:
        weighted = bool(getattr(sharded, "_is_weighted", False))
        return EmbeddingBagCollection(tables=list(bag_configs), is_weighted=weighted, device=torch.device("meta"))
    configs = getattr(sharded, "_embedding_configs", None)
    if configs is not None:
        return EmbeddingCollection(tables=list(configs), device=torch.device("meta"))
    return None


def _shards(sharding: ParameterSharding, shape: list[int], world: int) -> list[Shard]:
    """The plan's shards of one table (size, offset, rank); data-parallel: a full replica per rank."""
    from torchrec.distributed.planner.types import Shard

    spec = sharding.sharding_spec
    if spec is not None and getattr(spec, "shards", None):
        return [
            Shard(size=list(md.shard_sizes), offset=list(md.shard_offsets), rank=md.placement.rank())
            for md in spec.shards
        ]
    ranks = sharding.ranks if sharding.ranks else list(range(world))
    return [Shard(size=list(shape), offset=[0] * len(shape), rank=r) for r in ranks]


def _module_perf(
    path: str,
    module_plan: Mapping[str, ParameterSharding],
    sharded: nn.Module,
    sharders: Sequence[ModuleSharder[nn.Module]],
    topology: Topology,
    batch_size: int,
    constraints: Mapping[str, ParameterConstraints] | None,
) -> dict[str, Any]:
    from torchrec.distributed.planner.constants import POOLING_FACTOR
    from torchrec.distributed.planner.enumerators import get_partition_by_type
    from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator
    from torchrec.distributed.planner.types import ShardingOption
    from torchrec.distributed.planner.utils import build_sharder_data_map, sharder_name

    twin = _unsharded_twin(sharded)
    if twin is None:
        return {"module_type": type(sharded).__name__, "error": "not an embedding (bag) collection: no estimate"}
    sharder = next((s for s in sharders if isinstance(twin, s.module_type)), None)
    if sharder is None:
        return {"module_type": type(sharded).__name__, "error": f"no sharder for {type(twin).__name__} in the DMP"}
    params = sharder.shardable_parameters(twin)  # table name -> its (meta) weight, as the planner sees it
    cons = dict(constraints or {})
    options = []
    for table, ps in module_plan.items():
        if table not in params:
            continue
        c = cons.get(table)
        options.append(
            ShardingOption(
                name=table,
                tensor=params[table],
                module=(path, twin),
                input_lengths=list(c.pooling_factors) if c is not None else [POOLING_FACTOR],
                batch_size=batch_size,
                sharding_type=ps.sharding_type,
                partition_by=get_partition_by_type(ps.sharding_type),
                compute_kernel=ps.compute_kernel,
                shards=_shards(ps, list(params[table].shape), topology.world_size),
                cache_params=ps.cache_params,
                enforce_hbm=ps.enforce_hbm,
                stochastic_rounding=ps.stochastic_rounding,
                bounds_check_mode=ps.bounds_check_mode,
                is_pooled=ShardingOption.module_pooled(twin, table),
                feature_names=c.feature_names if c is not None else None,
                output_dtype=ps.output_dtype,
                key_value_params=ps.key_value_params,
            )
        )
    data_map = build_sharder_data_map({sharder_name(type(twin)): sharder})
    EmbeddingPerfEstimator(topology=topology, constraints=cons or None).estimate(options, data_map)
    entry: dict[str, Any] = {"module_type": type(sharded).__name__, **_zero(), "ranks": {}, "tables": {}}
    for opt in options:
        table_entry: dict[str, Any] = {
            "sharding_type": opt.sharding_type,
            "compute_kernel": opt.compute_kernel,
            **_zero(),
            "shards": [],
        }
        for shard in opt.shards:
            shard_entry: dict[str, Any] = {"rank": shard.rank, "size": list(shard.size), "offset": list(shard.offset)}
            shard_entry.update(_zero())
            _add(shard_entry, shard.perf)
            table_entry["shards"].append(shard_entry)
            _add(table_entry, shard.perf)
            _add(entry, shard.perf)
            _add(entry["ranks"].setdefault(str(shard.rank), _zero()), shard.perf)
        entry["tables"][opt.name] = table_entry
    return entry


def module_perf(
    path: str,
    module_plan: Mapping[str, ParameterSharding],
    sharded: nn.Module,
    topology: Topology,
    batch_size: int,
    constraints: Mapping[str, ParameterConstraints] | None = None,
    sharders: Sequence[ModuleSharder[nn.Module]] | None = None,
) -> dict[str, Any]:
    """One sharded module's entry of :func:`planned_perf` (with ``assumptions``), from its plan alone.

    ``sharders``: default torchrec's embedding (bag) collection sharders, which
    is what DMP shards with unless given others.
    """
    if sharders is None:
        from torchrec.distributed.embedding import EmbeddingCollectionSharder
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

        sharders = [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()]
    entry = _module_perf(path, module_plan, sharded, sharders, topology, batch_size, constraints)
    entry["assumptions"] = _assumptions(topology, batch_size, constraints)
    return entry


def _assumptions(
    topology: Topology, batch_size: int, constraints: Mapping[str, ParameterConstraints] | None
) -> dict[str, Any]:
    return {
        "batch_size": batch_size,
        "pooling_factors": {k: list(c.pooling_factors) for k, c in (constraints or {}).items()},
        "world_size": topology.world_size,
        "local_world_size": topology.local_world_size,
        "compute_device": topology.compute_device,
        "bwd_compute_multiplier": topology.bwd_compute_multiplier,
        "ddr_mem_bw_bytes_per_ms": topology.ddr_mem_bw,
        "hbm_mem_bw_bytes_per_ms": topology.hbm_mem_bw,
        "intra_host_bw_bytes_per_ms": topology.intra_host_bw,
        "inter_host_bw_bytes_per_ms": topology.inter_host_bw,
    }


def planned_perf(
    model: nn.Module,
    *,
    batch_size: int | None = None,
    topology: Topology | None = None,
    constraints: Mapping[str, ParameterConstraints] | None = None,
) -> dict[str, dict[str, Any]]:
    """torchrec's planner estimate of every sharded module of a DMP model, for the plan it was sharded with.

    For each table of ``model.plan`` (the plan DMP actually used), the shards the
    plan placed (size, offset, rank; a data-parallel table: a full replica on
    each of its ranks) are given to torchrec's ``EmbeddingPerfEstimator`` with
    ``topology``, exactly as its planner rates a proposal; the per-shard ``Perf``
    is then summed per table, per rank and per sharded module.

    Args:
        model: a ``DistributedModelParallel`` model, or a module holding one (the
            first DMP of its tree is used; the keys get its path as a prefix).
        batch_size: the per-rank batch the estimate assumes; default: torchrec's
            planner default (``constants.BATCH_SIZE``, 512), which is what DMP's
            own planner assumed unless it was given another. Pass the batch you
            train (and profile) with to compare with measured rows.
        topology: a torchrec ``Topology``; default: the one DMP builds when it
            plans by itself (its world size, ``LOCAL_WORLD_SIZE`` or the world
            size, the device type of ``model.device``, torchrec's default
            bandwidths).
        constraints: torchrec ``ParameterConstraints`` by table name; only their
            ``pooling_factors``, ``num_poolings``, ``batch_sizes``, ``is_weighted``
            and ``feature_names`` matter here (default: 1 id per bag).

    Returns:
        ``{module path: entry}``, one entry per sharded module of the plan, its
        path the unsharded model's (``"sparse_arch.embedding_bag_collection"``).
        An entry (plain JSON types) holds ``module_type``; ``fwd_compute_ms``,
        ``fwd_comms_ms``, ``bwd_compute_ms``, ``bwd_comms_ms``,
        ``input_dist_comms_ms``, ``prefetch_compute_ms`` and ``total_ms`` summed
        over all its shards on all ranks; ``ranks`` (``"0"``, ``"1"``…: the same
        sums over the shards placed on that rank: what one rank's measured row
        compares to; the planner's perf model rates a plan by its largest
        per-rank total); ``tables`` (per table: ``sharding_type``,
        ``compute_kernel``, the sums, and ``shards``: each shard's ``rank``,
        ``size``, ``offset`` and perf); and ``assumptions`` (batch size, pooling
        factors, world and local world size, compute device, backward
        multiplier, the bandwidths in bytes/ms). A module the estimator cannot
        rate (not an embedding (bag) collection, or one torchrec's estimator
        raises on) has ``error`` (one line, the cause) instead of the figures.

    Raises:
        ValueError: ``model`` holds no ``DistributedModelParallel``.

    Notes:
        What the planner assumes: every time is bytes moved over a fixed
        bandwidth (torchrec's constants: DDR 51 GiB/s, HBM 897 GiB/s,
        intra-host 600 GiB/s, cross-host 12.5 GiB/s, unless ``topology`` says
        otherwise), not a measurement of this machine; the backward compute is
        the forward compute times ``bwd_compute_multiplier`` (2); every bag has
        ``pooling_factors`` ids (1 by default) and the batch is ``batch_size``
        on every rank. ``total_ms`` is torchrec's ``Perf.total``: forward and
        backward compute and comms plus prefetch; ``input_dist_comms_ms`` (the
        KJT all-to-all) is reported apart and, as in torchrec, not in the total.
        Data-parallel tables count once per replica (each rank computes the full
        table), so module sums are device time summed over ranks.
    """
    from torchrec.distributed.planner.constants import BATCH_SIZE

    prefix, dmp = _find_dmp(model)
    topo = topology if topology is not None else default_topology(dmp)
    batch = int(batch_size) if batch_size is not None else BATCH_SIZE
    if batch < 1:
        raise ValueError(f"planned_perf: batch_size={batch_size!r}, expected a positive number of samples per rank")
    inner = dmp.module
    sharders = list(getattr(dmp, "sharders", []))
    out: dict[str, dict[str, Any]] = {}
    for path, module_plan in dmp.plan.plan.items():
        key = f"{prefix}.{path}" if prefix else path
        try:
            sharded = inner.get_submodule(path)
        except AttributeError:
            out[key] = {"module_type": None, "error": f"the plan names {path!r}, which the model lacks"}
            continue
        try:
            entry = _module_perf(path, module_plan, sharded, sharders, topo, batch, constraints)
        except Exception as e:  # torchrec's estimator refusing one module (an odd kernel) fails that entry only
            entry = {"module_type": type(sharded).__name__, "error": f"torchrec's estimator: {type(e).__name__}: {e}"}
        entry["assumptions"] = _assumptions(topo, batch, constraints)
        out[key] = entry
    return out
