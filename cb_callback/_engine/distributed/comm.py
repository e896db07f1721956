"""The collectives a component runs: each op, its payload as nccl-tests counts it, and its time.

A :class:`CommCounter` is a dispatch mode that sees every ``c10d`` and
``_c10d_functional`` op (the legacy ``torch.distributed`` calls dispatch to the
former, ``torch.distributed._functional_collectives`` and DTensor to the latter).
For each it records the op, the phase it ran in, its payload and, when asked to,
its time: the op and the wait on its work, taken at once (a collective waited
for as it is issued, so its own time, with no overlap). Waiting early changes no
value, only when the wait happens.

Payload (``bytes``), as nccl-tests counts its ``size``: all-gather the full
gathered tensor; reduce-scatter the full tensor before scattering; all-reduce
and broadcast the tensor; all-to-all the bytes this rank sends; send, recv,
gather, scatter and reduce the tensors this rank passes; a barrier or a wait 0.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import torch
from torch._ops import OpOverload
from torch.distributed import ProcessGroup
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from cb_callback._engine.distributed.ledger import Ledger
from cb_callback._types import OpValue

__all__ = [
    "COLLECTIVE_NAMESPACES",
    "CollectiveCall",
    "CommCounter",
    "collective_bytes",
    "comm_table",
    "drain",
    "payload_bytes",
]

#: One collective as a :class:`CommCounter` with ``keep`` records it for :func:`drain`: the op, its
#: positional and keyword arguments (tensors as their specs).
KeptCall: TypeAlias = "tuple[OpOverload, tuple[OpValue, ...], dict[str, OpValue]]"

#: The op namespaces collectives dispatch through.
COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")

#: Which argument holds the payload, by what the op's name says it is (first match wins).
_PAYLOAD_ARGS: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("allgather", "all_gather"), ("output_tensor", "output_tensors", "outputs", "output_lists", "<out>")),
    (("reduce_scatter",), ("input_tensor", "input_tensors", "inputs", "input")),
    (("alltoall", "all_to_all"), ("input", "input_tensors", "input_tensor", "inputs")),
    (("barrier", "wait"), ()),
    (("",), ("tensors", "tensor", "input", "inputs", "input_tensors", "input_tensor", "output_tensors")),
)


@dataclass
class CollectiveCall:
    """One collective a component ran.

    Attributes:
        op: the op's name (``"c10d._allgather_base_"``, ``"_c10d_functional.all_reduce"``).
        phase: ``"forward"`` or ``"backward"`` (or ``""`` outside a pass's phases).
        bytes: its payload (see the module docstring).
        ms: the op and the wait on its work, when the counter waits; NaN otherwise.
        shapes: the shapes of its tensors, for draining a run another rank could not finish.
    """

    op: str
    phase: str
    bytes: int
    ms: float = float("nan")
    shapes: list[tuple[int, ...]] = field(default_factory=list)


def _tensor_bytes(tree: object) -> int:
    return sum(t.numel() * t.element_size() for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor))


def payload_bytes(func: OpOverload, args: Sequence[OpValue], kwargs: Mapping[str, OpValue], out: OpValue) -> int:
    """The payload of one collective op call, as nccl-tests counts it (module docstring)."""
    name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
    try:
        names = [a.name for a in func._schema.arguments]
    except AttributeError:
        names = []
    given = dict(zip(names, args, strict=False)) | dict(kwargs)
    for words, candidates in _PAYLOAD_ARGS:
        if not any(w in name for w in words):
            continue
        for arg in candidates:
            if arg == "<out>":
                return _tensor_bytes(out)
            if arg in given:
                return _tensor_bytes(given[arg])
        return 0
    return 0


def collective_bytes(
    func: OpOverload, args: Sequence[OpValue], kwargs: Mapping[str, OpValue], out: OpValue = None
) -> int | None:
    """The payload of one dispatched op if it is a collective (nccl-tests' count, module docstring), else ``None``.

    For a ``TorchDispatchMode`` of a plugin that attributes collectives itself
    (the torchrec integration splits a sharded module's into its stages).
    """
    namespace = getattr(func, "namespace", None)
    if namespace not in COLLECTIVE_NAMESPACES:
        return None
    return payload_bytes(func, args, kwargs, out)


def _works(out: OpValue) -> list[OpValue]:
    """The work handles an op returned (to wait on): ``ScriptObject``s whose ``wait`` torch's stubs do not declare."""
    items = out if isinstance(out, (tuple, list)) else [out]
    return [o for o in items if isinstance(o, torch.ScriptObject) and hasattr(o, "wait")]


class CommCounter(TorchDispatchMode):
    """Records every collective dispatched while active (see the module docstring).

    Args:
        wait: wait on each collective's work as it is issued, timing op and wait
            (``ms``); ``False`` only counts (no change to when anything waits).
        keep: keep each call's op and arguments (``kept``, for :func:`drain`).
        ledger: write each collective down before issuing it (a lockstep component's first pass).
    """

    def __init__(self, wait: bool = False, keep: bool = False, ledger: Ledger | None = None) -> None:
        super().__init__()
        #: A :class:`cb_callback._engine.distributed.ledger.Ledger` each collective is written to before it is issued.
        self.ledger = ledger
        self.wait = wait
        self.phase = ""
        self.calls: list[CollectiveCall] = []
        #: With ``keep``: each call's op and arguments, tensors as their specs (:func:`drain`).
        self.kept: list[KeptCall] = []
        self._keep = keep

    def __torch_dispatch__(
        self,
        func: OpOverload,
        types: Collection[type],
        args: tuple[OpValue, ...] = (),
        kwargs: dict[str, OpValue] | None = None,
    ) -> OpValue:
        kwargs = kwargs or {}
        if getattr(func, "namespace", None) not in COLLECTIVE_NAMESPACES:
            return func(*args, **kwargs)
        if self.ledger is not None and func.overloadpacket.__name__ != "wait_tensor":
            self.ledger.write(func, args, kwargs)
        t0 = time.perf_counter()
        out = func(*args, **kwargs)
        ms = float("nan")
        if self.wait:
            for work in _works(out):
                work.wait()
            if func.namespace != "c10d" and func.overloadpacket.__name__ != "wait_tensor":
                for t in pytree.tree_leaves(out):  # a functional collective: its result waited for now
                    if isinstance(t, torch.Tensor):
                        torch.ops._c10d_functional.wait_tensor(t)
            ms = (time.perf_counter() - t0) * 1e3
        shapes = [tuple(t.shape) for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if self._keep:
            specs = pytree.tree_map_only(torch.Tensor, _spec_of, (args, kwargs))
            self.kept.append((func, specs[0], specs[1]))
        name = f"{func.namespace}.{func.overloadpacket.__name__}"
        self.calls.append(CollectiveCall(name, self.phase, payload_bytes(func, args, kwargs, out), ms, shapes))
        return out

    @contextlib.contextmanager
    def in_phase(self, phase: str) -> Iterator[None]:
        """Calls recorded inside this context carry ``phase``."""
        before, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = before


@dataclass(frozen=True)
class _Spec:
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device


def _spec_of(t: torch.Tensor) -> _Spec:
    return _Spec(tuple(t.shape), t.dtype, t.device)


def drain(kept: Sequence[KeptCall]) -> None:
    """Issue the collectives ``kept`` (a :class:`CommCounter` ``keep``'s record) again on zero tensors of
    the same shapes, waiting on each: what lets the other ranks finish a run this rank could not.

    The values the others receive are meaningless; the run is thrown away on every rank.
    """
    for func, args, kwargs in kept:

        def fresh(spec: OpValue) -> OpValue:
            return torch.zeros(spec.shape, dtype=spec.dtype, device=spec.device) if isinstance(spec, _Spec) else spec

        call_args, call_kwargs = pytree.tree_map(fresh, (args, kwargs), is_leaf=lambda x: isinstance(x, _Spec))
        out = func(*call_args, **call_kwargs)
        for work in _works(out):
            work.wait()


def issued_collectives(exclude: ProcessGroup | None = None) -> int | None:
    """The collectives this process issued so far on every process group but ``exclude`` (the sum of
    each group's sequence number: gloo and NCCL count every collective as it is issued, no dispatch
    mode needed); ``None`` when a group cannot say."""
    total = 0
    try:
        for group in list(torch.distributed.distributed_c10d._world.pg_map):
            if group is not exclude:
                total += int(group._get_sequence_number_for_group())  # type: ignore[attr-defined]
    except Exception:
        return None
    return total


class RunCount:
    """How many collectives one run issued, to drain the rest of a reference record after it raised
    (:meth:`rest`): by the process groups' sequence numbers (:func:`issued_collectives`; nothing is
    added to the run's ops, whose time is being measured), or, where a group cannot say, by a counting
    :class:`CommCounter` around the run (a Python call on every op).

    Args:
        exclude: a group whose collectives are not the run's (the lockstep coordinator's).
    """

    def __init__(self, exclude: ProcessGroup | None = None) -> None:
        self._exclude = exclude
        self._start = issued_collectives(exclude)
        self._counter = CommCounter() if self._start is None else None

    def __enter__(self) -> RunCount:
        if self._counter is not None:
            self._counter.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._counter is not None:
            self._counter.__exit__(*exc)

    def rest(self, kept: Sequence[KeptCall]) -> list[KeptCall]:
        """What of ``kept`` (a reference run's record) the run did not issue."""
        if self._counter is not None:
            return list(kept[len(self._counter.calls) :])
        now = issued_collectives(self._exclude)
        issuing = [k for k in kept if k[0].overloadpacket.__name__ != "wait_tensor"]  # what a sequence counts
        return issuing[now - self._start :] if now is not None and self._start is not None else issuing


def comm_table(calls: Sequence[CollectiveCall]) -> list[dict[str, Any]]:
    """One row per collective op and phase: ``op``, ``phase``, ``count``, ``bytes`` (total), ``ms`` (total)."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for c in calls:
        row = rows.setdefault((c.op, c.phase), {"op": c.op, "phase": c.phase, "count": 0, "bytes": 0, "ms": 0.0})
        row["count"] += 1
        row["bytes"] += c.bytes
        row["ms"] += c.ms
    return list(rows.values())
