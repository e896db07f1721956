"""A component's first lockstep pass, written down as it runs, so that a rank whose pass raises can finish it.

Every later run of a lockstep component is drained from the first pass's own
record (:func:`cb_callback._engine.distributed.comm.drain`). The first pass has no record yet:
a rank that raises between two of its collectives (an out-of-memory on one rank)
would leave the others waiting in the model's next collective until the model's
process group times out. So in the first pass every rank writes each collective
it is about to issue to the process group's store (:class:`Ledger`): the op,
its tensors as shapes and dtypes, its process group by name. A rank that raised
reads the rest of the sequence from a rank that went on and issues it on zero
tensors (:meth:`Ledger.finish_for_others`), until every other rank has ended its
pass; then every rank fails the component at the agreement point, and the
profile goes on.

What cannot be written down (an op argument that is neither a tensor, a plain
value, a process group nor a reduce op) makes the ledger stop: the rank that
raised then cannot finish the pass, and the others come back at the
coordinator's timeout (``lockstep_timeout_s``) with the rank named.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch._ops import OpOverload
from torch.utils import _pytree as pytree

from cb_callback._types import OpValue

__all__ = ["Ledger"]

#: How often a rank that raised looks for the next collective of the others (s).
_POLL_S = 0.002


@dataclass(frozen=True)
class _Tensor:
    shape: tuple[int, ...]
    dtype: torch.dtype
    device_type: str


@dataclass(frozen=True)
class _Group:
    name: str


@dataclass(frozen=True)
class _ReduceOp:
    pass


class _Unwritable(Exception):
    """An op argument the ledger cannot write down."""


def _encode(leaf: OpValue) -> OpValue:
    if isinstance(leaf, torch.Tensor):
        return _Tensor(tuple(leaf.shape), leaf.dtype, leaf.device.type)
    if isinstance(leaf, torch.ScriptObject):
        kind = str(leaf._type().qualified_name()) if hasattr(leaf, "_type") else ""
        if kind.endswith("c10d.ProcessGroup"):
            return _Group(torch.distributed.ProcessGroup.unbox(leaf).group_name)
        if kind.endswith("c10d.ReduceOp"):
            return _ReduceOp()  # the drained values are thrown away on every rank: any reduction will do
        raise _Unwritable(kind or type(leaf).__name__)
    if leaf is None or isinstance(leaf, (bool, int, float, str, torch.dtype, torch.device)):
        return leaf
    raise _Unwritable(type(leaf).__name__)


def _decode(leaf: OpValue) -> OpValue:
    if isinstance(leaf, _Tensor):
        device: torch.device | str = leaf.device_type
        if leaf.device_type == "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
        return torch.zeros(leaf.shape, dtype=leaf.dtype, device=device)
    if isinstance(leaf, _Group):
        c10d = torch.distributed.distributed_c10d
        return c10d._resolve_process_group(c10d.GroupName(leaf.name)).boxed()
    if isinstance(leaf, _ReduceOp):
        return torch.classes.c10d.ReduceOp()
    return leaf


def _op_name(func: OpOverload) -> str:
    return f"{func.namespace}::{func.overloadpacket.__name__}.{func._overloadname}"


def _op(name: str) -> OpOverload:
    namespace, rest = name.split("::", 1)
    packet, overload = rest.rsplit(".", 1)
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)


def _issue(func: OpOverload, args: Sequence[OpValue], kwargs: Mapping[str, OpValue]) -> None:
    """Run one collective on zeros and wait for it (a functional collective: its result)."""
    out = func(*args, **kwargs)
    items = out if isinstance(out, (tuple, list)) else [out]
    for o in items:
        if isinstance(o, torch.ScriptObject) and hasattr(o, "wait"):
            o.wait()
        elif isinstance(o, torch.Tensor) and func.namespace != "c10d":
            torch.ops._c10d_functional.wait_tensor(o)


class Ledger:
    """One lockstep pass's collectives on every rank, in the process group's store.

    Args:
        store: the default process group's store.
        key: the pass's key, the same on every rank (the plan's step).
        rank: this rank.
        world: the number of ranks.
        timeout_s: how long a rank that raised waits for the others' next collective.
    """

    def __init__(self, store: torch.distributed.Store, key: str, rank: int, world: int, timeout_s: float) -> None:
        self.store = store
        self.prefix = f"cb_callback/ledger/{key}"
        self.rank, self.world, self.timeout_s = rank, world, timeout_s
        self.issued = 0
        self.unwritable: str | None = None

    def _key(self, rank: int, what: int | str) -> str:
        return f"{self.prefix}/{rank}/{what}"

    def write(self, func: OpOverload, args: Sequence[OpValue], kwargs: Mapping[str, OpValue] | None) -> None:
        """Before this rank issues a collective: write it down (the others may need it to finish)."""
        if self.unwritable is None:
            try:
                entry = (_op_name(func), pytree.tree_map(_encode, (tuple(args), dict(kwargs or {}))))
                # torch's stub types Store.set's value as str; the binding takes bytes, as c10d's own callers pass
                self.store.set(self._key(self.rank, self.issued), pickle.dumps(entry))  # type: ignore[arg-type]
            except _Unwritable as e:
                self.unwritable = str(e)
                self.store.set(self._key(self.rank, self.issued), b"")  # type: ignore[arg-type]  # bytes: as above
        self.issued += 1

    def end(self) -> None:
        """This rank's pass is over (finished, or raised after ``issued`` collectives)."""
        self.store.set(self._key(self.rank, "end"), str(self.issued).encode())  # type: ignore[arg-type]  # bytes: as in write

    def finish_for_others(self) -> str | None:
        """After this rank's pass raised: issue the collectives the others issue after the ones this rank
        did, on zeros, until every other rank has ended its pass. ``None`` when done; else why it could
        not (an unwritable op, or no other rank's next collective within ``timeout_s``)."""
        others = [r for r in range(self.world) if r != self.rank]
        deadline = time.monotonic() + self.timeout_s
        k = self.issued
        while True:
            source = next((r for r in others if self.store.check([self._key(r, k)])), None)
            if source is not None:
                raw = self.store.get(self._key(source, k))
                if not raw:
                    return "another rank's collective could not be written down for this rank to issue"
                name, (args, kwargs) = pickle.loads(raw)
                _issue(_op(name), *pytree.tree_map(_decode, (args, kwargs)))
                k += 1
                deadline = time.monotonic() + self.timeout_s
                continue
            ended = [r for r in others if self.store.check([self._key(r, "end")])]
            if len(ended) == len(others) and all(int(self.store.get(self._key(r, "end"))) <= k for r in ended):
                return None
            if time.monotonic() > deadline:
                return f"no other rank's next collective within {self.timeout_s:g} s"
            time.sleep(_POLL_S)
