"""The census: every module's FLOPs and bytes in the captured step, in one forward + backward of each top.

The triage copies a representative's rows onto the other members of a group only where the two
do the same work; the FLOPs each module counts in the step, forward and backward, are part of that
proof (:func:`cb_callback._engine.selection.triage.triage`), and so are its bytes. Each op is counted with
the formulas ``torch.utils.flop_counter.FlopCounterMode`` counts with (the project's rules
included) and the ``bytes`` metric's per-op rule, and attributed to the modules that built it: in
the forward the modules running; in the backward the modules whose forward built the autograd
node running. (``FlopCounterMode``'s own module tracker ends a module's backward when its inputs'
gradients are complete: of siblings reading one tensor, each would hold the backward of those that
run after it, and their counts would differ by order.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import time
import weakref
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch._ops import OpOverload
from torch.autograd.graph import Node as GradNode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode
from torch.utils.hooks import RemovableHandle

from cb_callback._engine.capture.inputs import ComponentInputs, call_signature
from cb_callback._engine.capture.storage import storage_key
from cb_callback._engine.capture.tree import Node, scripted
from cb_callback._engine.clocks.nodeclock import backward_prefix, claim_nodes, input_nodes, next_node_number
from cb_callback._engine.counting import flop_rules
from cb_callback._engine.counting.byte_rules import op_bytes, storage_bytes
from cb_callback._engine.distributed.collectives import refuse_collectives
from cb_callback._engine.distributed.fsdp import has_unit
from cb_callback._engine.replay.isolate import (
    Instrument,
    PassContext,
    PassResult,
    Phase,
    Replay,
    flatten_output,
    no_collection,
    unobserved,
    versions,
)
from cb_callback._engine.replay.state import StateGuard
from cb_callback._engine.run.component import ComponentRun
from cb_callback._engine.run.plugins import InstrumentingMetric
from cb_callback._report.model import error_text
from cb_callback._types import OpValue, UserValue

__all__ = ["Census", "CountsOf", "TopPass", "census_of", "count_step", "with_grad"]


@dataclass
class Census:
    """What the census counted.

    Attributes:
        flops: per captured batch, ``{path: (forward FLOPs, backward FLOPs, bytes)}``
            of every node under a counted top, over all of its calls in the step
            (bytes: the ``bytes`` metric's per-op count over both passes; a module
            that counted nothing: ``(0, 0, 0)``). A node whose module is
            reachable from several paths (a shared module) is absent: its counts
            are its module's over every path, not the node's. A node under a top
            whose census raised (also on the step's own inputs) maps to ``None``:
            uncounted, so nothing proves it does its counterpart's work and the
            triage copies no row onto it or from it.
        seconds: what the passes cost (wall).
        tops: the tops counted.
        errors: ``{top: error}`` for a top whose pass raised (its nodes are absent).
    """

    flops: list[dict[str, tuple[int, int, int] | None]] = field(default_factory=list)
    #: Per captured batch, ``{path: values}`` of each node the census counted as its replay alone would
    #: (called once in the pass, not shared, no :attr:`Tally.inexact` reason): the values the built-in
    #: FLOPs and bytes metrics give a row (``fwd_flops``, ``bwd_flops``, ``uncounted_ops``, ``bytes``,
    #: ``fwd_bytes``, ``bwd_bytes``, ``top_bytes_ops``, ``working_set_bytes``), so that its replay only
    #: times (:meth:`cb_callback._engine.run.component.ComponentRun.start`).
    values: list[dict[str, dict[str, Any]]] = field(default_factory=list)
    #: Per captured batch, ``{path: why}`` of each counted node whose counts its replay would not repeat.
    inexact: list[dict[str, str]] = field(default_factory=list)
    #: Per captured batch, ``{path: (call_signature, backward)}`` of each node in :attr:`values`: its call in
    #: the census, and whether a gradient reached one of its outputs there.
    signatures: list[dict[str, tuple[tuple[object, ...], bool]]] = field(default_factory=list)
    #: ``{batch: {top: its pass}}``: a top whose census pass the row's other instruments observed
    #: (:class:`TopPass`); its replay then needs no instrumented pass of its own.
    tops_observed: dict[int, dict[str, TopPass]] = field(default_factory=dict)
    seconds: float = 0.0
    tops: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)

    def to_metadata(self) -> dict[str, object]:
        return {"seconds": self.seconds, "tops": list(self.tops), "errors": dict(self.errors)}


class CountsOf(dict[str, "tuple[int, int, int] | None"]):
    """One batch's counts (as :attr:`Census.flops` holds them) named for the triage's messages: ``where``
    follows the counts in a difference it finds (``" (rank 1)"``: another rank's counts)."""

    def __init__(self, counts: Mapping[str, tuple[int, int, int] | None], where: str) -> None:
        super().__init__(counts)
        self.where = where


class _Attribution:
    """Which modules each FLOP belongs to: in the forward, every tracked module running (forward
    hooks keep the stack); in the backward, the modules whose forward built the autograd node
    running (``torch._C._current_autograd_node()``).

    After each call a module claims the nodes its forward built
    (:func:`cb_callback._engine.clocks.nodeclock.claim_nodes`: walking back from its outputs' ``grad_fn`` to
    its inputs', or to nodes another, finished call claimed), each new node owned by every module on
    the stack. Torch's own module tracker ends a module's backward when its inputs'
    gradients are complete, so a module whose input feeds several (the branches of one tensor) holds
    the others' backward. An activation checkpoint's recompute runs inside the backward node that
    needs it: it counts as that node's modules' backward.

    The gradient of a tensor read several times (a residual's input, one input to ``q``, ``k`` and ``v``,
    a weight used by several calls) is summed by the autograd engine after a reader's node has run, on
    that node's thread: those adds belong to the modules that hold *every* reader (the block around the
    residual, the attention around ``q``, ``k`` and ``v``; for a weight read by several calls of its
    module, that module), not to the reader that happened to finish last, which replayed alone receives
    one gradient and sums nothing. A post-hook on each claimed node marks its own
    work done (what follows on it is that summing) and records it as a reader of its inputs' nodes.
    """

    def __init__(self, tracked: set[int]) -> None:
        self.tracked = tracked
        # (module id, call, its inputs' nodes, next node number)
        self.stack: list[tuple[int, int, set[GradNode], int]] = []
        self.owner: dict[GradNode, tuple[tuple[int, int], ...]] = {}  # node -> its (module id, call number)s
        self.readers: dict[GradNode, list[frozenset[int]]] = {}  # node -> its readers' modules, as they ran
        # the backward node whose own work is done (its outputs' gradients being summed)
        self.done: GradNode | None = None
        self.handles: list[RemovableHandle] = []
        self.calls = 0
        #: ``{"fwd" | "bwd" | "bytes": {module id: count}}``; bytes over both passes.
        self.flops: dict[str, dict[int, int]] = {"fwd": {}, "bwd": {}, "bytes": {}}
        #: Each module's work in detail (what its replay's instrumented pass would observe).
        self.tally: dict[int, Tally] = {}
        # (its module's tally, a weak reference to an output)
        self.outputs: list[tuple[Tally, weakref.ref[torch.Tensor]]] = []
        self.autocast = _autocast()  # the top's (set at its call): its replay's and every component's
        self.hooks_on: dict[int, int] = {}  # id of an output tensor -> the census's own hooks on it

    def _tally(self, key: int) -> Tally:
        mine = self.tally.get(key)
        if mine is None:
            mine = self.tally[key] = Tally()
        return mine

    def pre(self, module: nn.Module, args: tuple[UserValue, ...], kwargs: dict[str, UserValue]) -> None:
        if id(module) not in self.tracked:
            return
        self.calls += 1
        forward = torch._C._current_graph_task_id() == -1  # not a checkpoint's recompute in the backward
        if not self.stack and forward:  # the top's own call: its autocast (a forward context's) is every replay's
            self.autocast = _autocast()
        mine = self._tally(id(module))
        if forward:
            mine.calls += 1
            if mine.calls == 1:
                mine.signature = call_signature(args, kwargs)
        if mine.inexact is None:
            with unobserved():
                mine.inexact = self._call_differs(args, kwargs)
        self.stack.append((id(module), self.calls, input_nodes(args, kwargs), next_node_number()))

    def _call_differs(self, args: tuple[UserValue, ...], kwargs: dict[str, UserValue]) -> str | None:
        """Why this call's inputs, or its context, are not what its replay gets (``None``: they are): the
        replay gets a copy of each tensor (``clone``: each its own storage, dense) under the top's autocast."""
        tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if any(not _own_dense(t) for t in tensors):
            return "an input is a view into a larger storage, expanded or overlapping; its replay gets a copy"
        keys = [k for k in (storage_key(t) for t in tensors) if k is not None]
        if len(set(keys)) < len(keys):
            return "two of its inputs share a storage; its replay copies each"
        if self.stack and _autocast() != self.autocast:
            return "called under an autocast its parent entered; its replay runs without it"
        return None

    def post(self, module: nn.Module, args: tuple[UserValue, ...], output: UserValue) -> None:
        if id(module) not in self.tracked or not self.stack or self.stack[-1][0] != id(module):
            return
        _, _, stop, since = self.stack[-1]
        chain = backward_prefix(self.owner) + tuple((m, c) for m, c, _, _ in self.stack)
        outputs = flatten_output(output)[0]
        claim_nodes(outputs, stop, self.owner, chain, self._watch, since)
        self.stack.pop()
        if torch._C._current_graph_task_id() != -1:
            return  # a recompute (already marked) inside the backward
        mine = self._tally(id(module))
        for t in outputs:
            if isinstance(t, torch.Tensor) and t.requires_grad and mine.inexact is None:
                self.handles.append(t.register_hook(functools.partial(self._gradient, mine)))
                self.outputs.append((mine, weakref.ref(t)))
                self.hooks_on[id(t)] = self.hooks_on.get(id(t), 0) + 1

    @staticmethod
    def _gradient(mine: Tally, grad: torch.Tensor | None) -> None:
        """An output's gradient as the step gives it, against the replay's (a contiguous tensor of its own
        for each output): a view into a larger storage (a slice of ``cat``'s, ``sum``'s expanded one), a
        transposed one (the parent transposed the output: the backward copies it), or one tensor given to
        two outputs (the bytes rule counts it once) would be counted otherwise."""
        if grad is not None:
            mine.backward = True
        if grad is None or mine.inexact is not None:
            return
        with unobserved():
            if not grad.is_contiguous() or not _own_dense(grad):
                mine.inexact = "an output's gradient in the step is not contiguous, or a view into a larger storage"
                return
            key = storage_key(grad)
            if key is not None and key in mine.grads:
                mine.inexact = "two of its outputs get one gradient tensor in the step; its replay gives each its own"
            elif key is not None:
                mine.grads.add(key)

    def top_reads(self, leaves: Sequence[object], top: nn.Module) -> None:
        """The backward's starting views of the top's outputs read them as the top: a tensor both returned
        and read inside (``return head(h), h``) has its two gradients summed in the top, not in the module
        whose backward delivered the second (which, replayed alone, receives one and sums nothing)."""
        if id(top) not in self.tracked:
            return
        chain = ((id(top), 1),)  # the top's own call, the pass's first
        for t in leaves:
            node = t.grad_fn if isinstance(t, torch.Tensor) else None
            if node is not None and node not in self.owner:
                self.owner[node] = chain
                self._watch(node)

    def discarded(self, outputs: Sequence[object]) -> bool:
        """Whether a node a call claimed leads to none of the top's ``outputs`` (a branch whose result was
        dropped): the census holds it, and what it saved, where the step would have freed it."""
        reached: set[GradNode] = set()
        todo: list[GradNode | None] = [
            t.grad_fn for t in outputs if isinstance(t, torch.Tensor) and t.grad_fn is not None
        ]
        while todo:
            node = todo.pop()
            if node is None or node in reached:
                continue
            reached.add(node)
            todo.extend(nxt for nxt, _ in node.next_functions)
        return any(node not in reached for node in self.owner)

    def hooked_outputs(self) -> None:
        """After the forward: an output the step hooks (``register_hook``, ``retain_grad``: the parent's, or
        the module's own) runs that hook inside the module's backward; its replay alone has none."""
        for mine, ref in self.outputs:
            t = ref()
            ours = self.hooks_on.get(id(t), 0) if t is not None else 0
            if t is not None and mine.inexact is None and (t.retains_grad or len(t._backward_hooks or {}) > ours):
                mine.inexact = (
                    "its output has a gradient hook in the step (register_hook, retain_grad); its replay has none"
                )
        self.outputs.clear()
        self.hooks_on.clear()

    def _watch(self, node: GradNode) -> None:
        self.handles.append(node.register_hook(functools.partial(self._ran, node)))

    def _ran(
        self, node: GradNode, grad_inputs: Sequence[torch.Tensor | None], grad_outputs: Sequence[torch.Tensor | None]
    ) -> None:
        """A claimed node's own backward is done: it reads each of its inputs' nodes, and what runs next on
        it sums the gradients it gave them with the earlier readers'."""
        self.done = node
        mine = frozenset(m for m, _ in self.owner.get(node, ()))
        for nxt, _ in node.next_functions:
            if nxt is not None:
                self.readers.setdefault(nxt, []).append(mine)

    def _summing(self, node: GradNode) -> tuple[int, ...]:
        """The modules a gradient sum after ``node`` belongs to: those that hold every reader of the
        tensors it gave gradients to (which another reader gave one to before)."""
        common: frozenset[int] | None = None
        for nxt, _ in node.next_functions:
            if nxt is None:
                continue  # no reader recorded (``_ran`` records none for ``None``)
            readers = self.readers.get(nxt, [])
            if len(readers) >= 2:
                both = frozenset.intersection(*readers)
                common = both if common is None else common & both
        return tuple(common) if common is not None else tuple(m for m, _ in self.owner.get(node, ()))

    def _recomputing(self, owned: tuple[tuple[int, int], ...]) -> tuple[int, ...]:
        """The modules of an op a checkpoint's recompute runs: the calls running it (the recomputed
        module and those inside it) and, of the backward node running the recompute, the owners outside
        them (a reentrant checkpoint's own node: its caller's; a saved tensor's unpacking node, a sibling
        inside the checkpointed module: that module's ancestors, not the sibling)."""
        running = [m for m, *_ in self.stack]
        outer = [m for m, _ in owned]
        if running[0] in outer:
            outer = outer[: outer.index(running[0])]
        return tuple(dict.fromkeys(outer + running))

    def count(
        self, flops: int, moved: int, op: str = "", uncounted: bool = False, touched: Iterable[tuple[object, int]] = ()
    ) -> None:
        """One op's FLOPs and bytes, to every module it belongs to (``op``: its name, ``uncounted``: no
        FLOP formula, ``touched``: ``(storage, bytes)`` of the tensors it moved, for the working set)."""
        forward = torch._C._current_graph_task_id() == -1
        recompute = False
        if forward:
            modules: tuple[int, ...] = tuple(m for m, *_ in self.stack)
            phase = self.flops["fwd"]
        else:
            node = torch._C._current_autograd_node()
            owned = self.owner.get(node)
            if self.stack:  # an activation checkpoint's recompute: a forward inside the backward
                modules = self._recomputing(owned or ())
                recompute = True  # for the modules it runs (whose forward, alone, calls no checkpoint)
            elif node is not None and node is self.done:
                modules = self._summing(node)
            else:
                modules = tuple(m for m, _ in owned) if owned is not None else ()
            phase = self.flops["bwd"]
        traffic = self.flops["bytes"]
        running = {m for m, *_ in self.stack} if recompute else set()
        for m in set(modules):
            phase[m] = phase.get(m, 0) + flops
            traffic[m] = traffic.get(m, 0) + moved
            self._tally(m).add(forward, moved, op, uncounted, touched, m in running)


class _CountingMode(TorchDispatchMode):
    """Every op's FLOPs (the formulas ``FlopCounterMode`` counts with, the project's rules included)
    and bytes (the ``bytes`` metric's per-op rule), attributed by an :class:`_Attribution`."""

    def __init__(self, attribution: _Attribution) -> None:
        super().__init__()
        self.attribution = attribution
        self.registry = FlopCounterMode(display=False, custom_mapping=flop_rules.custom_mapping()).flop_registry

    def __torch_dispatch__(
        self,
        func: OpOverload,
        types: Collection[type],
        args: tuple[OpValue, ...] = (),
        kwargs: dict[str, OpValue] | None = None,
    ) -> OpValue:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func.overloadpacket
        formula = self.registry.get(packet)
        with unobserved():  # a rule's own tensor ops are not the step's
            flops = int(formula(*args, **kwargs, out_val=out)) if formula is not None else 0
            moved = int(op_bytes(func, args, kwargs, out))
            name = str(packet)
            uncounted = formula is None and name not in flop_rules.NO_COMPUTE
            touched = _touched((args, kwargs, out)) if moved else ()
        if flops or moved or uncounted:
            self.attribution.count(flops, moved, name, uncounted, touched)
        return out


def _touched(tree: object) -> list[tuple[object, int]]:
    """``(storage, bytes)`` of each tensor an op that moves data touched (as the ``bytes`` metric's working
    set keys them)."""
    out: list[tuple[object, int]] = []
    for t in pytree.tree_leaves(tree):
        if isinstance(t, torch.Tensor):
            key = storage_key(t)
            out.append((("tensor", id(t)) if key is None else key, storage_bytes(t)))
    return out


def _own_dense(t: torch.Tensor) -> bool:
    """Whether ``t`` is the whole of its own storage, laid out densely without overlap: a replay's copy of
    it (``clone``, which keeps such strides) is then alike, and the bytes rule counts the two alike. Not
    so: a view into a larger storage, an expanded tensor (stride 0), an overlapping one."""
    try:
        if t.untyped_storage().nbytes() != t.numel() * t.element_size():
            return False
    except (RuntimeError, NotImplementedError):
        return True  # no storage to compare (a subclass): nothing to tell
    expected = 1
    for stride, size in sorted((st, sz) for st, sz in zip(t.stride(), t.shape, strict=True) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _autocast() -> tuple[tuple[bool, torch.dtype | None], ...]:
    """The autocast state a call runs under (CPU and CUDA: enabled, dtype)."""
    return tuple(
        (torch.is_autocast_enabled(d), torch.get_autocast_dtype(d) if torch.is_autocast_enabled(d) else None)
        for d in ("cpu", "cuda")
    )


@dataclass(slots=True)
class Tally:
    """One module's work in the census, over its calls in the pass: what its replay's instrumented pass
    observes (:class:`cb_callback._metrics.flops.FlopsMetric`, :class:`cb_callback._metrics.traffic.TrafficMetric`),
    counted inside the step.

    ``inexact`` says why these counts are not what the module replayed alone would count (an input or an
    output's gradient is a view into a larger storage, its forward recomputed by an activation
    checkpoint inside the backward); ``None``: they are."""

    calls: int = 0
    fwd_bytes: int = 0
    bwd_bytes: int = 0
    by_op: dict[str, int] = field(default_factory=dict)
    uncounted: set[str] = field(default_factory=set)
    storages: dict[object, int] = field(default_factory=dict)
    grads: set[int] = field(default_factory=set)  # its outputs' gradients' storages
    inexact: str | None = None
    signature: tuple[object, ...] = ()  # of its (first) call in the pass: :func:`call_signature`
    backward: bool = False  # a gradient reached one of its outputs in the pass

    def add(
        self,
        forward: bool,
        moved: int,
        op: str,
        uncounted: bool,
        touched: Iterable[tuple[object, int]],
        recompute: bool,
    ) -> None:
        if forward:
            self.fwd_bytes += moved
        else:
            self.bwd_bytes += moved
        if moved:
            self.by_op[op] = self.by_op.get(op, 0) + moved
            self.storages.update(touched)
        if uncounted:
            self.uncounted.add(op)
        if recompute and self.inexact is None:
            self.inexact = "an activation checkpoint recomputes its forward inside the step's backward"


def with_grad(inputs: ComponentInputs) -> ComponentInputs:
    """``inputs`` whose floating tensors all require grad: the census's second try at a top whose call,
    as the step made it, raised under counting (a backward needs a graph to start from)."""

    def grad(x: UserValue) -> UserValue:
        if isinstance(x, torch.Tensor) and x.is_floating_point() and not x.requires_grad:
            return x.detach().requires_grad_(True)
        return x

    args, kwargs = pytree.tree_map(grad, (inputs.args, inputs.kwargs))
    return dataclasses.replace(inputs, args=args, kwargs=kwargs)


def _view(x: UserValue) -> UserValue:
    return x.view_as(x) if isinstance(x, torch.Tensor) and x.requires_grad else x


@dataclass
class TopPass:
    """A top's census pass as its own instrumented pass: the census replays the top whole on its call, as
    the top's replay does, so the instruments that observed it (memory) hold the top's values.

    Attributes:
        instruments: ``(plugin, its instrument)`` of each observer (their ``values()`` the top's).
        mutates_inputs: whether the forward changed an input in place (its timed runs then copy them).
        seconds: what the pass took (under the counters: an upper bound of one run).
    """

    instruments: list[tuple[InstrumentingMetric, Instrument]]
    mutates_inputs: bool
    seconds: float
    #: A branch of the forward led to no output (a probe logged with ``.item()``): the census kept its
    #: autograd nodes (its attribution's), so the pass held their saved tensors longer than the top's own
    #: pass would, and its peak is not the top's. Its own pass then observes it.
    discarded: bool = False


def _count_top(
    replay: Replay,
    backward: bool,
    tracked: Sequence[nn.Module],
    collectives: bool = False,
    observers: Sequence[tuple[InstrumentingMetric, Instrument]] = (),
    path: str = "",
) -> tuple[_Attribution, TopPass]:
    """One forward and (``backward``, when there is one) one backward of ``replay``, every op's FLOPs
    attributed to the ``tracked`` modules (by ``id``) that built it; ``observers`` (``(plugin,
    instrument)``) observe it as :func:`cb_callback._engine.replay.isolate.instrumented_pass` would."""
    attribution = _Attribution({id(m) for m in tracked})
    inputs = replay.fresh_inputs()
    handles = []
    whole = PassContext(Phase.PASS, path, replay.module, replay.device, inputs, backward)
    fwd_ctx, bwd_ctx = dataclasses.replace(whole, phase=Phase.FORWARD), dataclasses.replace(whole, phase=Phase.BACKWARD)
    observing = [ins for _, ins in observers]
    t0 = time.perf_counter()
    mutated = dead = False
    try:
        for m in tracked:
            if scripted(m):  # a ScriptModule refuses hooks: its ops are its parent's own
                continue
            # first of its pre-hooks, as the in-situ clock's: a hook's ops are the module's call (its replay runs them)
            handles.append(m.register_forward_pre_hook(attribution.pre, with_kwargs=True, prepend=True))
            handles.append(m.register_forward_hook(attribution.post, always_call=True))
        refuse = contextlib.nullcontext if collectives else refuse_collectives
        with refuse(), _CountingMode(attribution), _observed(observing, whole):
            before = versions(inputs)
            with _observed(observing, fwd_ctx):
                out = replay.forward(inputs)
            mutated = versions(inputs) != before
            attribution.hooked_outputs()
            dead = attribution.discarded(flatten_output(out)[0])
            # The backward starts from a view of each output (the top's own output is then a node it built).
            leaves = [_view(t) for t in flatten_output(out)[0]]
            attribution.top_reads(leaves, replay.module)
            del out
            bwd = replay.backward(inputs, leaves) if backward else None
            del leaves
            if bwd is not None:
                with _observed(observing, bwd_ctx):
                    bwd.run()
            result = PassResult(mutates_inputs=mutated, backward_ran=bwd is not None, output=None)
            for ctx in (whole, fwd_ctx, bwd_ctx):
                ctx.result = result
            del bwd
    finally:
        for h in [*handles, *attribution.handles]:
            h.remove()
        attribution.owner.clear()  # the step's graph nodes
        attribution.readers.clear()
        attribution.done = None
    return attribution, TopPass(list(observers), mutated, time.perf_counter() - t0, discarded=dead)


@contextlib.contextmanager
def _observed(instruments: Sequence[Instrument], ctx: PassContext) -> Iterator[None]:
    """Every instrument entered around one phase of the pass (none: nothing; the garbage collector held
    off around the whole pass, as in an instrumented pass, so that no other work's memory is freed in it)."""
    if not instruments:
        yield
        return
    with contextlib.ExitStack() as stack:
        if ctx.phase is Phase.PASS:
            stack.enter_context(no_collection())
        for ins in instruments:
            stack.enter_context(ins.observe(ctx))
        yield


def count_step(
    tops: Sequence[Sequence[str]],
    replay_of: Callable[[str, int, bool], Replay],
    model: nn.Module,
    nodes: Sequence[Node],
    modules: Mapping[str, nn.Module],
    batches: int,
    *,
    backward: bool = True,
    collectives: bool = False,
    observers_of: Callable[[str, nn.Module, Replay], Sequence[tuple[InstrumentingMetric, Instrument]] | None]
    | None = None,
) -> Census:
    """Count every node's FLOPs in each captured batch: each top replayed whole once, forward and backward.

    Args:
        tops: per batch, the components run whole (as the in-situ pass runs them).
        replay_of: ``replay_of(top, batch, every_grad)``, the top's replay on that batch's captured
            call (with ``every_grad``, its floating inputs requiring grad: :func:`with_grad`). A top
            is counted on its call as the step made it; one whose pass raises so is counted again
            with every floating input requiring grad; if that raises too, its nodes are uncounted
            (``None``) and the first error is in ``errors``.
        model: guarded (:class:`StateGuard`): the passes leave weights, buffers, grads and RNG as they were.
        nodes: every node (which are under which top).
        modules: each node's module.
        batches: how many captured batches.
        backward: count the backward too.
        collectives: let the passes communicate (several ranks, every rank
            counting the same tops: :mod:`cb_callback._engine.selection.ranked_triage`);
            then a top whose pass raises is not tried again (its second try
            would issue collectives the other ranks do not) and ends the census.
    """
    out = Census(tops=list(dict.fromkeys(t for mine in tops for t in mine)))
    t0 = time.perf_counter()
    seen: dict[int, int] = {}
    for n in nodes:
        if n.path in modules:
            seen[id(modules[n.path])] = seen.get(id(modules[n.path]), 0) + 1
    shared = {key for key, k in seen.items() if k > 1}  # one module, several nodes: its counts are not one node's
    for b in range(batches):
        if collectives and out.errors:
            break
        found: dict[str, tuple[int, int, int] | None] = {}
        values: dict[str, dict[str, Any]] = {}
        signatures: dict[str, tuple[tuple[object, ...], bool]] = {}
        inexact: dict[str, str] = {}
        for top in tops[b]:
            below = [n.path for n in nodes if top == "" or n.path == top or n.path.startswith(top + ".")]
            tracked = list({id(modules[p]): modules[p] for p in below if p in modules}.values())
            observers = (lambda replay, top=top: observers_of(top, modules[top], replay)) if observers_of else None
            ran = _counted(top, b, replay_of, model, backward, tracked, out.errors, collectives, observers)
            counted = ran[0] if ran is not None else None
            if ran is not None and ran[1] is not None:
                out.tops_observed.setdefault(b, {})[top] = ran[1]
            if counted is None:
                found.update(dict.fromkeys(below))  # uncounted: never proven equal to anything
                if collectives:
                    break
                continue
            fwd, bwd, moved = counted.flops["fwd"], counted.flops["bwd"], counted.flops["bytes"]
            for path in below:
                module = modules.get(path)
                if module is not None and scripted(module):  # no hook saw it: its ops are its parent's own
                    found[path], inexact[path] = None, _UNHOOKED
                elif module is not None and id(module) not in shared:
                    key = id(module)
                    mine = found[path] = (fwd.get(key, 0), bwd.get(key, 0), moved.get(key, 0))
                    tally = counted.tally.get(key)
                    why = _why_inexact(tally)
                    if why is not None:
                        inexact[path] = why
                    elif tally is not None:
                        values[path] = _values(mine, tally, backward)
                        signatures[path] = (tally.signature, tally.backward)
        out.flops.append(found)
        out.values.append(values)
        out.signatures.append(signatures)
        out.inexact.append(inexact)
    out.seconds = time.perf_counter() - t0
    return out


#: Why a TorchScript module's counts are not the census's (it refuses module hooks).
_UNHOOKED = "a TorchScript module: the census cannot hook it"


def _why_inexact(tally: Tally | None) -> str | None:
    if tally is None or tally.calls == 0:
        return "not called in the census's pass"
    if tally.calls > 1:
        return f"called {tally.calls} times in the census's pass (its replay times one call, or a call set)"
    return tally.inexact


def _values(counts: tuple[int, int, int], tally: Tally, backward: bool) -> dict[str, Any]:
    """A node's row values, as :class:`~cb_callback._metrics.flops.FlopsMetric` and
    :class:`~cb_callback._metrics.traffic.TrafficMetric` give them from one call's instrumented pass."""
    fwd, bwd, _ = counts
    top = dict(sorted(tally.by_op.items(), key=lambda kv: -kv[1])[:5])
    return {
        "fwd_flops": float(fwd), "bwd_flops": float(bwd) if backward else math.nan,
        "uncounted_ops": sorted(tally.uncounted),
        "bytes": float(tally.fwd_bytes + tally.bwd_bytes), "fwd_bytes": tally.fwd_bytes,
        "bwd_bytes": tally.bwd_bytes, "top_bytes_ops": top, "working_set_bytes": sum(tally.storages.values()),
    }  # fmt: skip


def _counted(
    top: str,
    batch: int,
    replay_of: Callable[[str, int, bool], Replay],
    model: nn.Module,
    backward: bool,
    tracked: Sequence[nn.Module],
    errors: dict[str, str],
    collectives: bool = False,
    observers: Callable[[Replay], Sequence[tuple[InstrumentingMetric, Instrument]] | None] | None = None,
) -> tuple[_Attribution, TopPass | None] | None:
    """``top``'s counts on its call as the step made it, else (not with ``collectives``) with its
    floating inputs requiring grad; ``None`` (the first error in ``errors``) when the tries raised. On its
    call as the step made it, ``observers(replay)`` (if any) observe the pass: its :class:`TopPass`."""
    for every_grad in (False,) if collectives else (False, True):
        try:
            with StateGuard(model):
                replay = replay_of(top, batch, every_grad)
                mine = observers(replay) if observers is not None and not every_grad else None
                counted, seen = _count_top(replay, backward, tracked, collectives, mine or (), top)
                return counted, seen if mine is not None and not seen.discarded else None
        except Exception as e:
            if not every_grad:
                errors.setdefault(top, error_text(e))
    return None


def census_of(
    run: ComponentRun,
    nodes: Sequence[Node],
    modules: Mapping[str, nn.Module],
    batches: Sequence[Mapping[str, ComponentInputs]],
    tops: Sequence[Sequence[str]],
    *,
    collectives: bool = False,
) -> Census:
    """:func:`count_step` of a run: each top replayed as the in-situ pass replays it (``run.inputs_for``:
    its preprocessed call, kept for its own replay; ``run.replay``), as :func:`count_step` says."""

    def replay_of(top: str, b: int, every_grad: bool) -> Replay:
        inputs = run.inputs_for(top, modules[top], batches[b], b, keep=True)
        accumulate = collectives or has_unit(modules[top])  # every node runs, as in the in-situ pass
        return run.replay(
            modules[top], with_grad(inputs) if every_grad else inputs, batches[b][top], accumulate=accumulate
        )  # fmt: skip

    return count_step(
        tops, replay_of, run.model, nodes, modules, len(batches), backward=run.cfg.backward, collectives=collectives,
        observers_of=None if collectives else run.top_observers,
    )  # fmt: skip
