"""Components that communicate across ranks are never replayed alone: it would hang.

Under DDP a component's forward may call a collective (``SyncBatchNorm``
gathers statistics; a user's ``dist.all_reduce`` of a metric). Replayed on one
rank while the others wait at the callback's barrier (``ranks="zero"``), or a
different number of times on each rank (``ranks="all"``), that collective never
completes. While the process group has more than one rank, every replay runs
under :func:`refuse_collectives`: the first collective op (any ``c10d`` /
``_c10d_functional`` op) raises :class:`CollectiveInReplay` *instead of*
running, so nothing waits on the other ranks; the engine skips that component
(and estimates its parents from their other children).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Mapping
from contextlib import AbstractContextManager

import torch
from torch import nn
from torch._ops import OpOverload
from torch.utils._python_dispatch import TorchDispatchMode

from cb_callback._types import OpValue

__all__ = [
    "CollectiveInReplay",
    "distributed_world_size",
    "lockstep_reasons",
    "refuse_collectives",
    "register_lockstep_module",
]

_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")


class CollectiveInReplay(RuntimeError):
    """A replayed component called a collective (which was not run).

    Attributes:
        op: the collective's name, e.g. ``"c10d.allreduce_"``.
    """

    def __init__(self, op: str) -> None:
        super().__init__(
            f"it communicates across ranks ({op} during its replay): replaying it on one rank "
            "would wait forever for the others, so it is not replayed"
        )
        self.op = op


class _RefuseCollectives(TorchDispatchMode):
    def __torch_dispatch__(
        self,
        func: OpOverload,
        types: Collection[type],
        args: tuple[OpValue, ...] = (),
        kwargs: dict[str, OpValue] | None = None,
    ) -> OpValue:
        if getattr(func, "namespace", None) in _NAMESPACES:
            raise CollectiveInReplay(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def distributed_world_size() -> int:
    """The default process group's size, 1 when there is none."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    return 1


def refuse_collectives() -> AbstractContextManager[object]:
    """A context in which collectives raise :class:`CollectiveInReplay` (only with > 1 rank)."""
    if distributed_world_size() > 1:
        return _RefuseCollectives()
    return contextlib.nullcontext()


def _is_ddp(module: nn.Module) -> bool:
    return isinstance(module, nn.parallel.DistributedDataParallel)


#: (predicate, why): a component holding a module the predicate accepts is replayed in lockstep.
_LOCKSTEP: list[tuple[Callable[[nn.Module], bool], str]] = [
    (_is_ddp, "DistributedDataParallel all-reduces its gradients in the backward"),
]


def register_lockstep_module(predicate: Callable[[nn.Module], bool], why: str) -> None:
    """Replay every component that holds a module ``predicate`` accepts on all ranks together.

    For modules whose collectives a rank-local probe cannot see: the probe's
    backward does not reach them (DDP's reducer all-reduces from gradient
    hooks, which fire on ``loss.backward()``-style backwards only). Under a
    process group of several ranks such a component, and every ancestor of it,
    is replayed in lockstep (:mod:`cb_callback._engine.distributed.lockstep`), whose backward
    runs every node as ``loss.backward()`` does; ``why`` is the row's
    ``details["lockstep"]`` reason. ``DistributedDataParallel`` is registered
    by default; the torchrec integration registers sharded embedding modules
    (a data-parallel table's lookup is a DDP kept outside the module tree).
    """
    entry = (predicate, why)
    if entry not in _LOCKSTEP:
        _LOCKSTEP.append(entry)


def lockstep_reasons(modules: Mapping[str, nn.Module]) -> dict[str, str]:
    """For each component (``modules``: by path), why it must be replayed in lockstep, if it must.

    A component must when it, or a module of its subtree, matches a registered
    predicate (:func:`register_lockstep_module`).
    """
    matched: dict[int, str | None] = {}

    def why(m: nn.Module) -> str | None:
        if id(m) not in matched:
            matched[id(m)] = next((f"it holds a {type(m).__name__}: {w}" for p, w in _LOCKSTEP if p(m)), None)
        return matched[id(m)]

    out: dict[str, str] = {}
    for path, module in modules.items():
        reason = next((r for m in module.modules() if (r := why(m)) is not None), None)
        if reason is not None:
            out[path] = reason
    return out
