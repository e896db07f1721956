"""Sharded models (``DistributedModelParallel``): their paths, unwrapping, and waiting on their outputs."""

from __future__ import annotations

import sys

import torch
from torch import nn

import cb_callback
import cb_callback.plugins

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

    Registers :func:`dmp_unwrapper` with :func:`cb_callback.plugins.register_module_unwrapper`.

    Returns:
        ``True`` once registered.
    """
    global _paths_registered
    if not _paths_registered:
        cb_callback.plugins.register_module_unwrapper(dmp_unwrapper)
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


class ShardedModelCheck(cb_callback.plugins.Preprocessor):
    """Unwrap ``DistributedModelParallel`` at the root and record the sharded modules.

    ``prepare_model`` returns the module inside the DMP wrapper (paths as in the
    unsharded model; importing the integration does that anyway, wherever the
    DMP sits: :func:`register_dmp_paths`) and writes the report's metadata
    ``"torchrec_sharded"``: the sharded modules' paths and the world size. On
    several ranks the sharded modules (they run all-to-alls) are replayed on
    every rank together (the engine's lockstep replay), so nothing is refused.
    """

    name = "sharded_model_check"

    def prepare_model(self, model: nn.Module, ctx: cb_callback.plugins.PrepareContext) -> nn.Module:
        inner = unwrap_model(model)
        paths = sharded_modules(inner)
        if paths:
            ctx.metadata["torchrec_sharded"] = {"world_size": _world_size(), "sharded_modules": paths}
        return inner


def register_awaitable_outputs() -> bool:
    """Have replays wait on torchrec's ``LazyAwaitable`` outputs (a sharded module's forward returns one:
    its collectives issued, ``.wait()`` finishes them), inside the timed forward (idempotent).

    Returns:
        ``True`` once registered; ``False`` when torchrec's distributed types cannot be imported.
    """
    global _awaitables_registered
    if _awaitables_registered:
        return True
    try:
        from torchrec.distributed.types import LazyAwaitable
    except ImportError:
        return False
    cb_callback.plugins.register_output_resolver(LazyAwaitable, lambda a: a.wait())
    _awaitables_registered = True
    return True


_awaitables_registered = False
