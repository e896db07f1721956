"""Sharded models (``DistributedModelParallel``): their paths, unwrapping, and refusing what would deadlock."""

from __future__ import annotations

import sys

import torch
from torch import nn

import cb_callback

__all__ = ["ShardedModelCheck", "dmp_unwrapper", "register_dmp_paths", "sharded_modules", "unwrap_model"]


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module tree inside ``DistributedModelParallel`` / ``DistributedDataParallel`` wrappers.

    Paths of the result are the unsharded model's (``sparse_arch.…`` instead of
    ``_dmp_wrapped_module.module.sparse_arch.…``). Other modules are returned as
    they are.
    """
    seen = 0
    while seen < 8:
        seen += 1
        dmp_mod = sys.modules.get("torchrec.distributed.model_parallel")
        dmp_cls = getattr(dmp_mod, "DistributedModelParallel", None) if dmp_mod else None
        if dmp_cls is not None and isinstance(model, dmp_cls):
            model = model.module
            continue
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
            continue
        break
    return model


def dmp_unwrapper(module: nn.Module) -> nn.Module | None:
    """The model a ``DistributedModelParallel`` wraps (past its DDP wrapper); ``None`` for any other module.

    The function this integration gives the engine so that a DMP's path segments
    (``_dmp_wrapped_module.module``) vanish from report paths, wherever the DMP
    sits in the tree (the root, or a LightningModule's attribute).
    """
    dmp_mod = sys.modules.get("torchrec.distributed.model_parallel")
    dmp_cls = getattr(dmp_mod, "DistributedModelParallel", None) if dmp_mod else None
    if dmp_cls is not None and isinstance(module, dmp_cls):
        inner = module.module
        return inner if isinstance(inner, nn.Module) else None
    return None


def register_dmp_paths() -> bool:
    """Have the engine report a DMP model under the unsharded model's paths (idempotent).

    Returns:
        ``True`` once :func:`dmp_unwrapper` is registered; ``False`` while
        ``cb_callback`` has no public way to register it (then pass
        :class:`ShardedModelCheck` to get the unsharded paths at the root).
    """
    global _paths_registered
    if _paths_registered:
        return True
    # TODO(issue 16 §4, lead): `cb_callback.register_module_unwrapper(fn)` is the proposed public API
    # (docs/torchrec.md, "Paths of a DMP model"): fn(module) returns the module a wrapper stands for, or None;
    # the engine puts it at the wrapper's path wherever it names components (capture, tree, report).
    # This is the one place the integration calls it; until the engine has it, this is a no-op.
    register = getattr(cb_callback, "register_module_unwrapper", None)
    if register is None:
        return False
    register(dmp_unwrapper)
    _paths_registered = True
    return True


_paths_registered = False


def sharded_modules(model: nn.Module) -> list[str]:
    """Paths of torchrec ``ShardedModule``s (their forward runs input/output collectives)."""
    types_mod = sys.modules.get("torchrec.distributed.types")
    sharded_cls = getattr(types_mod, "ShardedModule", None) if types_mod else None
    if sharded_cls is None:
        return []
    return [path for path, m in model.named_modules() if isinstance(m, sharded_cls)]


def _world_size() -> int:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    return 1


class ShardedModelCheck(cb_callback.Preprocessor):
    """Unwrap ``DistributedModelParallel``; refuse a sharded model on more than one rank.

    ``prepare_model`` returns the module inside the DMP wrapper (paths as in the
    unsharded model). With one rank (``world_size == 1``, e.g. ``gloo`` on a
    CPU), sharded modules run their collectives against themselves and profile
    like any module. With several ranks, replaying a sharded module (or any
    ancestor of one) on one rank alone would wait forever for the others, so it
    raises ``NotImplementedError`` naming the sharded modules and the fix:
    profile the unsharded model (tables on ``meta`` plus :class:`ReduceHashSize`)
    on one process.

    Notes:
        A sharded embedding's fused backward (its TBE is hidden inside the
        sharded lookups) is not reached by the isolated backward, which
        differentiates only w.r.t. the module's visible parameters: its
        ``bwd_ms`` covers no embedding update. The report's metadata
        ``"torchrec_sharded"`` lists the sharded modules and the world size.
    """

    name = "sharded_model_check"

    def prepare_model(self, model: nn.Module, ctx: cb_callback.PrepareContext) -> nn.Module:
        inner = unwrap_model(model)
        paths = sharded_modules(inner)
        world = _world_size()
        if paths:
            ctx.metadata["torchrec_sharded"] = {"world_size": world, "sharded_modules": paths}
        if paths and world > 1:
            raise NotImplementedError(
                f"cb_callback: {len(paths)} sharded module(s) ({', '.join(paths[:3])}) issue collectives "
                f"across {world} ranks; replaying one on a single rank would deadlock. Profile the "
                "unsharded model on one process instead (declare the tables on the 'meta' device and "
                "add ReduceHashSize(max_rows=...)), or run with world_size=1."
            )
        return inner
