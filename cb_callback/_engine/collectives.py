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
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["CollectiveInReplay", "distributed_world_size", "refuse_collectives"]

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
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if getattr(func, "namespace", None) in _NAMESPACES:
            raise CollectiveInReplay(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def distributed_world_size() -> int:
    """The default process group's size, 1 when there is none."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    return 1


def refuse_collectives() -> AbstractContextManager[Any]:
    """A context in which collectives raise :class:`CollectiveInReplay` (only with > 1 rank)."""
    if distributed_world_size() > 1:
        return _RefuseCollectives()
    return contextlib.nullcontext()
