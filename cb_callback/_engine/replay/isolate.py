"""Replay one component alone on its captured inputs: forward, backward, observed pass."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import enum
import gc
import inspect
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, cast, runtime_checkable

import torch
from torch import nn
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils.checkpoint import checkpoint

from cb_callback._engine.capture.inputs import ComponentInputs, copy_call, holds_objects, tensor_copier
from cb_callback._engine.replay.callset import CallPlan, call_plan, reaches_no_loss
from cb_callback._types import UserValue

__all__ = [
    "Backward",
    "Instrument",
    "PassContext",
    "PassResult",
    "Phase",
    "Replay",
    "ReplayInputs",
    "flatten_output",
    "instrumented_pass",
    "no_collection",
    "register_grad_targets",
    "register_output_resolver",
    "unobserved",
    "versions",
]

_GRAD_TARGETS: list[Callable[[nn.Module], Iterable[torch.Tensor]]] = []
_RESOLVERS: dict[type, Callable[[UserValue], UserValue]] = {}


def register_output_resolver(cls: type, fn: Callable[[UserValue], UserValue]) -> None:
    """Resolve outputs of type ``cls`` (and its subclasses) inside the replayed forward.

    A forward that returns a handle to a result still in flight (torchrec's
    ``LazyAwaitable``: its collectives are issued, ``.wait()`` finishes them)
    would be timed without the wait and have no tensor to differentiate.
    ``fn(obj)`` returns the result (``lambda a: a.wait()``); it runs inside the
    timed forward, on the output itself and on each leaf of a returned tuple,
    list or dict, as the real step's consumer would.

    Raises:
        ValueError: ``cls`` is not a class, ``fn`` not callable, or ``cls`` already has a resolver.
    """
    if not isinstance(cls, type) or not callable(fn):
        raise ValueError(f"register_output_resolver({cls!r}, {fn!r}): expected a class and a callable")
    if cls in _RESOLVERS:
        raise ValueError(f"an output resolver for {cls.__qualname__} is already registered")
    _RESOLVERS[cls] = fn


def _resolver(x: object) -> Callable[[UserValue], UserValue] | None:
    return next((_RESOLVERS[c] for c in type(x).__mro__ if c in _RESOLVERS), None) if _RESOLVERS else None


def _resolved(out: UserValue) -> UserValue:
    """``out`` with every registered resolver applied (see :func:`register_output_resolver`)."""
    if not _RESOLVERS:
        return out
    for _ in range(4):  # a resolver may return another handle
        fn = _resolver(out)
        if fn is None:
            break
        out = fn(out)

    def leaf(x: UserValue) -> UserValue:
        resolve = _resolver(x)
        return x if resolve is None else resolve(x)

    return pytree.tree_map(leaf, out)


def register_grad_targets(fn: Callable[[nn.Module], Iterable[torch.Tensor]]) -> None:
    """Add tensors the isolated backward differentiates against, per component.

    ``fn(module)`` returns tensors (requiring grad) that the component's forward
    uses but ``module.parameters()`` does not list — e.g. the placeholder tensor
    of an fbgemm TBE kept outside the module tree, without which the fused
    backward would be pruned from the graph.

    Raises:
        ValueError: if ``fn`` is already registered.
    """
    if fn in _GRAD_TARGETS:
        raise ValueError(f"grad-target function {fn!r} is already registered")
    _GRAD_TARGETS.append(fn)


@dataclass
class ReplayInputs:
    """One fresh copy of a component's inputs.

    Attributes:
        args: positional arguments.
        kwargs: keyword arguments.
        leaves: new leaf tensors for the inputs that required grad in the real
            step; ``args``/``kwargs`` hold ``leaf.clone()`` of each, so an in-place
            op in the forward (``ReLU(inplace=True)``) works as in the real step.
        calls: for a replay of a call set (:mod:`cb_callback._engine.replay.callset`), one
            copy per replayed call; then ``args`` is ``((args, kwargs), …)`` of
            those calls (everything the set takes), ``kwargs`` empty, ``leaves``
            all of theirs. Empty for a replay of one call.
    """

    args: tuple[UserValue, ...]
    kwargs: dict[str, UserValue]
    leaves: list[torch.Tensor] = field(default_factory=list)
    calls: list[ReplayInputs] = field(default_factory=list)


class Backward:
    """A forward's graph, kept to replay its backward.

    :meth:`run` runs ``torch.autograd.grad(outputs, targets, grad_outputs)``:
    the gradient w.r.t. the inputs that required grad in the real step and the
    component's parameters that require grad; ``.grad`` fields are not touched.
    With ``accumulate`` (a component holding FSDP2 units, or any component
    replayed in lockstep) it runs ``torch.autograd.backward`` instead, as the
    real step's ``loss.backward()`` does: every node runs, collectives included,
    and FSDP's post-backward hook reduce-scatters the gradients it finds; the
    targets' ``.grad`` are set aside for the run and put back after it.
    """

    def __init__(
        self,
        outputs: list[torch.Tensor],
        grad_outputs: list[torch.Tensor],
        targets: list[torch.Tensor],
        accumulate: bool = False,
    ) -> None:
        self.outputs = outputs
        self.grad_outputs = grad_outputs
        self.targets = targets
        self.accumulate = accumulate

    def run(self, retain_graph: bool = False) -> tuple[torch.Tensor | None, ...]:
        """The backward once (``retain_graph``: keep the graph for another)."""
        if self.accumulate:
            # Every node of the graph runs, as in ``loss.backward()``: a collective in a backward
            # node that leads to no target (torchrec's output all-to-all on a rank whose shards
            # have no differentiable leaf) still runs, so no rank waits for one the others skip.
            # The targets' ``.grad`` start empty and are put back after: nothing accumulates.
            saved = [t.grad for t in self.targets]
            for t in self.targets:
                t.grad = None
            try:
                torch.autograd.backward(self.outputs, self.grad_outputs, retain_graph=retain_graph)
            finally:
                for t, g in zip(self.targets, saved, strict=True):
                    t.grad = g
            return ()
        return torch.autograd.grad(
            self.outputs, self.targets, self.grad_outputs, retain_graph=retain_graph, allow_unused=True
        )

    def __call__(self, _: object = None) -> tuple[torch.Tensor | None, ...]:
        return self.run(retain_graph=True)


class Replay:
    """Runs a component in isolation on fresh copies of its captured inputs.

    Args:
        module: the component (already on ``device``).
        inputs: its captured (and preprocessed) first call.
        device: where it runs.
        seed: seed of the random output gradients of the backward.
        forward_context: factory of a context entered around each forward (e.g.
            autocast for mixed precision); ``None`` for none.
        grad_enabled: run the forwards with grad enabled (``False``: under
            ``no_grad``, forward only, no autograd overhead timed).
        wrappers: replay a call the step ran under activation checkpointing
            (``ComponentInputs.wrapped``) under it again (``False``: plainly, for
            the harness floor's identity).

    Notes:
        A component whose calls differ (``inputs.variants``) or only some of whose
        calls built graph the step's backward ran through is replayed on its call
        set (:func:`cb_callback._engine.replay.callset.call_plan`, in ``plan``): each
        forward runs every planned call under its own grad mode, and the backward
        differentiates the outputs of the calls that had one; ``replayed_calls``
        is how many calls one run stands for (the engine divides additive values
        by it). A component called one way whose output reached no loss has no
        backward. Only the output leaves of ``output_mask`` are differentiated.

        A call the step ran under ``torch.utils.checkpoint.checkpoint``
        (``wrapped`` ``"checkpoint"`` or ``"checkpoint (reentrant)"``) replays under
        it, with the same ``use_reentrant``, when grad is on: its backward holds the
        recompute and its saved activations are what checkpointing saves. A
        reentrant checkpoint cannot run under ``torch.autograd.grad``: a replay whose
        graph holds one (a ``CheckpointFunctionBackward`` node, also a descendant's)
        runs its backward with ``torch.autograd.backward`` (:class:`Backward`'s
        ``accumulate``, the ``.grad`` fields put back). A reentrant checkpoint takes
        no keyword arguments: those are bound into the checkpointed function (they
        get no gradient, as in a step that had to do the same).

        Every module of the subtree runs with the ``training`` flag it had in the
        real step (``inputs.modes``; a frozen ``eval()`` child stays in eval
        during its parent's replay); the flags are set before each forward and
        left so (the caller's guard restores them). Each run gets its own deep
        copy of the captured call, objects such as a KV cache included, so no run
        sees what another appended. The caller guards state
        (:class:`cb_callback._engine.replay.state.StateGuard`): a replay's forward may update
        BatchNorm statistics or consume RNG. Isolation cannot see state outside
        the inputs and the module (a global cache, a tensor captured in a closure).
    """

    def __init__(
        self,
        module: nn.Module,
        inputs: ComponentInputs,
        *,
        device: torch.device,
        seed: int = 0,
        forward_context: Callable[[], AbstractContextManager[object]] | None = None,
        grad_enabled: bool = True,
        accumulate: bool = False,
        wrappers: bool = True,
    ) -> None:
        self.module = module
        #: Calls the step ran under a checkpoint replay under it (:func:`_checkpointed`).
        self.wrappers = wrappers
        # Whether the graph holds a reentrant checkpoint (its backward cannot run under autograd.grad).
        self._reentrant: bool | None = None
        #: Backwards accumulate into ``.grad`` (:class:`Backward`): an FSDP2 unit's reduce-scatter runs.
        self.accumulate = accumulate
        self.inputs = inputs
        self.device = device
        self.seed = seed
        self.grad_enabled = grad_enabled
        self._context = forward_context or contextlib.nullcontext
        self._reuse = False
        #: The call set one run replays (``None``: one call stands for all of the step's).
        self.plan: CallPlan | None = call_plan(inputs)
        #: How many of the component's calls one run replays (its additive values are divided by it).
        self.replayed_calls = len(self.plan.calls) if self.plan is not None else 1
        # Called one way, with grad, and its output reached no loss: no backward.
        self._unreached = reaches_no_loss(inputs)
        # Objects other than pytree containers and tensors can change without a
        # version counter seeing it: their copies are never reused.
        kinds = [inputs, *inputs.variants] if self.plan is not None else [inputs]
        self._objects = any(holds_objects((k.args, k.kwargs)) for k in kinds)
        self._cached: ReplayInputs | None = None
        # (each output's layout: its shape, dtype and device, or (id,) for a nested one; the gradients)
        self._grad_outputs: (
            tuple[tuple[tuple[torch.Size, torch.dtype, torch.device] | tuple[int], ...], list[torch.Tensor]] | None
        ) = None
        self._flags = self._subtree_flags()
        self._call: Callable[..., Any] | None = None
        #: Why :meth:`backward` found no backward (set when it returns ``None``).
        self.no_backward: str | None = None

    @property
    def reuse_inputs(self) -> bool:
        """Reuse one copy of the inputs for every run (:func:`instrumented_pass` sets
        it: when its forward changed no input in place).

        Always ``False`` when the inputs hold objects other than pytree
        containers, tensors and immutables (a cache object may be appended to).
        """
        return self._reuse and not self._objects

    @reuse_inputs.setter
    def reuse_inputs(self, value: bool) -> None:
        self._reuse = value

    def _subtree_flags(self) -> list[tuple[nn.Module, bool]] | None:
        """Each module of the subtree with the ``training`` flag it replays with
        (``None``: no per-module modes were captured, the subtree takes ``training``)."""
        modes = self.inputs.modes
        if not modes:  # captured before per-module modes existed
            return None
        flags: dict[str, bool] = {}
        out: list[tuple[nn.Module, bool]] = []
        for rel, m in self.module.named_modules():
            parent = rel.rpartition(".")[0]
            flag = modes.get(rel, flags.get(parent, self.inputs.training))
            flags[rel] = flag
            out.append((m, flag))
        return out

    def with_call(self, fn: Callable[..., Any], *, first_only: bool = False) -> Replay:
        """This replay with its forwards calling ``fn(*args, **kwargs)`` instead of the module.

        The module's flags, the inputs (and whether one copy serves every run) and
        the backward's targets stay the module's: ``fn`` is the module wrapped
        (``torch.compile(module)``, ``torch._dynamo.explain(module)``). A call set
        calls ``fn`` once per planned call; with ``first_only`` (``fn`` returns a
        report, not the module's output: ``explain``) only on the first call.
        """
        other = copy.copy(self)
        other._call = fn
        if first_only:  # a report, not the module's output: never under a checkpoint
            other.wrappers = False
        if first_only and other.plan is not None:
            other.plan, other.replayed_calls, other._cached = None, 1, None
            other._objects = holds_objects((self.inputs.args, self.inputs.kwargs))
        return other

    def fresh_inputs(self) -> ReplayInputs:
        """A new deep copy of the inputs: nothing one run changes leaks to the next.

        Tensors that required grad in the real step become new leaves (listed in
        ``leaves``) and the arguments hold a clone of each; the captured copy is
        never changed. With ``reuse_inputs`` the same copy is returned every time.
        """
        if self.reuse_inputs and self._cached is not None:
            return self._cached
        if self.plan is not None:
            subs = [self._fresh_call(c.inputs) for c in self.plan.calls]
            fresh = ReplayInputs(
                tuple((sub.args, sub.kwargs) for sub in subs), {}, [t for sub in subs for t in sub.leaves], subs
            )
        else:
            fresh = self._fresh_call(self.inputs)
        if self.reuse_inputs:
            self._cached = fresh
        return fresh

    def _fresh_call(self, call: ComponentInputs) -> ReplayInputs:
        """A new deep copy of one captured call (see :meth:`fresh_inputs`)."""
        leaves: list[torch.Tensor] = []
        args, kwargs = copy_call(call.args, call.kwargs, tensor_copier(leaf="never", leaves=leaves))
        return ReplayInputs(args, kwargs, leaves)

    def forward(self, inputs: ReplayInputs | None = None) -> UserValue:
        """One forward on ``inputs`` (fresh ones if ``None``), with grad enabled
        unless ``grad_enabled`` is ``False``."""
        inp = inputs if inputs is not None else self.fresh_inputs()
        self._set_modes()
        call = self.module if self._call is None else self._call
        if self.plan is None or not inp.calls:
            with torch.set_grad_enabled(self.grad_enabled), self._context():
                return _resolved(self._wrapped(call, self.inputs)(*inp.args, **inp.kwargs))
        outs = []
        for planned, sub in zip(self.plan.calls, inp.calls, strict=True):
            with torch.set_grad_enabled(self.grad_enabled and planned.grad), self._context():
                outs.append(_resolved(self._wrapped(call, planned.inputs)(*sub.args, **sub.kwargs)))
        return tuple(outs)

    def _set_modes(self) -> None:
        """Each module of the subtree in the mode its call ran in (:meth:`_subtree_flags`), assigning only the
        flags that differ.

        A forward's time includes this (:mod:`cb_callback._metrics.latency` times :meth:`forward`), and
        the harness floor's identity has one module: ``Module.__setattr__`` costs about 1 µs, so setting
        every flag of a 91-module subtree read 87 µs on a 2-vCPU VM, about a third of its forward, where
        reading them reads 2.6 µs. Without per-module modes (a capture from before them) the subtree's
        ``train()`` is called (a user's override of it honoured) unless every module is in that mode
        already."""
        if self._flags is not None:
            for m, flag in self._flags:
                if m.training != flag:
                    m.training = flag
            return
        training = self.inputs.training
        if any(m.training != training for m in self.module.modules()):
            self.module.train(training)

    def _wrapped(self, call: Callable[..., Any], inputs: ComponentInputs) -> Callable[..., Any]:
        """``call`` under the checkpoint the step ran ``inputs``' call under (when grad is on), else ``call``."""
        if not self.wrappers or not torch.is_grad_enabled():
            return call
        return _checkpointed(call, inputs.wrapped)

    def _differentiated(self, out: UserValue) -> list[UserValue]:
        """The output leaves the backward differentiates: those of the calls with a backward, each
        call's ``output_mask`` applied (when its length is the replayed output's)."""
        if self.plan is None:
            return [] if self._unreached else _masked(out, self.inputs.output_mask)
        if not isinstance(out, tuple) or len(out) != len(self.plan.calls):
            return flatten_output(out)[0]  # a wrapped call (with_call) returned something else
        return [
            x for c, o in zip(self.plan.calls, out, strict=True) if c.backward for x in _masked(o, c.inputs.output_mask)
        ]

    def grad_targets(self, inputs: ReplayInputs) -> list[torch.Tensor]:
        """Inputs that required grad (their leaves), the component's parameters that do,
        then what registered :func:`register_grad_targets` functions add (once each)."""
        targets = list(inputs.leaves) + [p for p in self.module.parameters() if p.requires_grad]
        seen = {id(t) for t in targets}
        for fn in _GRAD_TARGETS:
            for t in fn(self.module):
                if id(t) not in seen and t.requires_grad:
                    seen.add(id(t))
                    targets.append(t)
        return targets

    def backward(self, inputs: ReplayInputs | None = None, out: UserValue = None) -> Backward | None:
        """The backward of one forward, or ``None`` if there is none.

        Runs a forward on ``inputs`` (fresh ones if ``None``) unless its output
        ``out`` is given. There is no backward when no output requires grad (the
        component runs under ``no_grad`` in effect, or only on integer data) or
        nothing to differentiate against.
        """
        if inputs is None:
            inputs = self.fresh_inputs()
            out = None
        if out is None:
            out = self.forward(inputs)
        outputs = [
            t
            for t in self._differentiated(out)
            if isinstance(t, torch.Tensor) and t.requires_grad and t.grad_fn is not None
        ]
        targets = self.grad_targets(inputs)
        if not outputs or not targets:
            self.no_backward = (
                self._why_none(out) if targets else "no input or parameter of the component requires grad"
            )
            return None
        if self._reentrant is None:  # decided once: every run builds the same graph
            self._reentrant = not self.accumulate and _holds_reentrant_checkpoint(outputs)
        # A nested output has no fixed shape to draw for (a jagged one's is symbolic): its gradient is ones
        # like it, made for each run (outside the timed regions, as the whole of this method).
        key = tuple((id(t),) if t.is_nested else (t.shape, t.dtype, t.device) for t in outputs)
        if self._grad_outputs is None or self._grad_outputs[0] != key:
            # Seeded, so every run would draw the same values: draw them once (randn
            # is slow on CPU; drawing per run cost more than a small component's backward).
            gen = torch.Generator(device=self.device)
            gen.manual_seed(self.seed)
            grads = [
                torch.ones_like(t)
                if t.is_nested
                else torch.randn(t.shape, generator=gen, device=t.device, dtype=t.dtype)
                for t in outputs
            ]
            self._grad_outputs = (key, grads)
        return Backward(outputs, list(self._grad_outputs[1]), targets, self.accumulate or self._reentrant)

    def _why_none(self, out: object) -> str:
        """Why no output is differentiated (:attr:`no_backward`)."""
        if not self.grad_enabled:
            return "replayed without grad, as the real step ran it (no_grad)"
        if not any(isinstance(t, torch.Tensor) and t.requires_grad for t in flatten_output(out)[0]):
            return "no output requires grad"
        if self._unreached:
            return "its output reaches no loss: the step's backward never ran through it"
        if self.plan is not None and not any(c.backward for c in self.plan.calls):
            return f"none of its calls built graph the step's backward ran through ({self.plan.note})"
        return "no output requires grad"

    def probe(self, backward: bool = True) -> bool:
        """One plain forward and (if any) one backward; raises what they raise.

        Returns:
            Whether the component has a backward.
        """
        bwd = self.backward() if backward else None
        if bwd is None:
            if not backward:
                self.forward()
            return False
        bwd()
        return True


def _checkpointed(call: Callable[..., Any], wrapped: str | None) -> Callable[..., Any]:
    """``call`` under ``torch.utils.checkpoint.checkpoint`` as ``wrapped`` says the step ran it
    (``"checkpoint"``: ``use_reentrant=False``; ``"checkpoint (reentrant)"``: ``True``, the keyword
    arguments bound into the function, which that mode cannot take), else ``call`` itself."""
    if wrapped == "checkpoint":
        return lambda *a, **k: checkpoint(call, *a, use_reentrant=False, **k)
    if wrapped == "checkpoint (reentrant)":

        def reentrant(*a: UserValue, **k: UserValue) -> UserValue:
            fn = (lambda *p: call(*p, **k)) if k else call
            return checkpoint(fn, *a, use_reentrant=True)

        return reentrant
    return call


def _holds_reentrant_checkpoint(outputs: Sequence[torch.Tensor]) -> bool:
    """Whether the graph behind ``outputs`` holds a reentrant checkpoint's node (which
    ``torch.autograd.grad`` cannot run: "incompatible with .grad()")."""
    stack = [t.grad_fn for t in outputs if t.grad_fn is not None]
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if type(node).__name__ == "CheckpointFunctionBackward":
            return True
        stack += [n for n, _ in node.next_functions if n is not None and id(n) not in seen]
    return False


def _masked(out: UserValue, mask: tuple[bool, ...] | None) -> list[UserValue]:
    """``out``'s leaves that ``mask`` keeps (all of them without a mask, or one of another length)."""
    leaves = flatten_output(out)[0]
    if mask is None or len(mask) != len(leaves):
        return leaves
    return [x for x, keep in zip(leaves, mask, strict=True) if keep]


class Phase(str, enum.Enum):
    """The part of an observed pass that an :class:`Instrument` is entered around.

    ``PASS`` is the whole pass (the forward, then the backward if one runs);
    ``FORWARD`` and ``BACKWARD`` are nested inside it. A ``str``:
    ``Phase.FORWARD == "forward"``.
    """

    PASS = "pass"
    FORWARD = "forward"
    BACKWARD = "backward"


@dataclass
class PassResult:
    """What one observed pass learned about the component.

    Attributes:
        mutates_inputs: whether the forward changed an input in place, or added
            to or removed from a list or dict of its inputs (then every timed run
            needs a fresh copy of the inputs). Changes inside other objects (a
            cache object) are not seen; such inputs are copied for every run.
        backward_ran: whether a backward ran: one was asked for, some output
            requires grad and something requires a gradient
            (:attr:`Replay.no_backward` says why not).
        output: what the forward returned when no backward ran; ``None`` after a
            backward (the pass frees the output before it, as the timed runs
            do, so that the memory observed is theirs).
    """

    mutates_inputs: bool
    backward_ran: bool
    output: UserValue = field(default=None, repr=False)


@dataclass
class PassContext:
    """What an :class:`Instrument` sees each time an observed pass enters a phase.

    Attributes:
        phase: which part of the pass the instrument is entered around.
        path: the component's dotted path (``""`` for the root).
        module: the component.
        device: where it runs.
        inputs: this pass's copy of the inputs (the same object in every phase
            of one pass); ``inputs.leaves`` are the tensors that required grad.
        backward: whether the pass runs a backward when the component has one
            (``BenchmarkConfig.backward``).
        result: ``None`` while the pass runs; set on every context of the pass
            once the backward has finished, before the ``PASS`` observers exit
            (so code after their ``yield`` can read it).
    """

    phase: Phase
    path: str
    module: nn.Module
    device: torch.device
    inputs: ReplayInputs
    backward: bool = True
    result: PassResult | None = None


@runtime_checkable
class Instrument(Protocol):
    """Observes one pass of one component (the contract of metric and artifact plugins).

    ``observe(ctx)`` returns a context manager. The pass enters it three times,
    nested, in the order the instruments are given (and exits in reverse):
    around the whole pass (``ctx.phase is Phase.PASS``), around the forward
    (``FORWARD``) and, when a backward runs, around the backward (``BACKWARD``;
    not entered with ``backward=False`` or when the component has none).
    ``values()`` is read once, after the pass.

    Notes:
        Everything an instrument does inside a phase is part of what the other
        instruments observe: do bookkeeping on tensors under :func:`unobserved`.
    """

    def observe(self, ctx: PassContext) -> AbstractContextManager[object]: ...

    def values(self) -> Mapping[str, Any]: ...


class _LegacyInstrument(Protocol):
    """0.1's instrument contract: ``observe`` takes the phase's name."""

    def observe(self, phase: str) -> AbstractContextManager[object]: ...

    def values(self) -> Mapping[str, Any]: ...


def unobserved() -> AbstractContextManager[object]:
    """A context in which tensor ops are invisible to the instruments of a pass.

    Inside it the dispatch modes that are active (FLOP counter, byte counter,
    op recorder) are switched off: a traffic rule reading an offsets tensor, or
    a preprocessor's id remap, is not counted as the component's work.
    """
    return _disable_current_modes()


class _PhaseNameInstrument:
    """An instrument written against 0.1's ``observe(phase: str)``: it gets the phase's name."""

    def __init__(self, legacy: _LegacyInstrument) -> None:
        self.legacy = legacy

    def observe(self, ctx: PassContext) -> AbstractContextManager[object]:
        return self.legacy.observe(ctx.phase.value)

    def values(self) -> Mapping[str, Any]:
        return self.legacy.values()


_WARNED_LEGACY: set[type] = set()


def _adapted(ins: Instrument | _LegacyInstrument) -> Instrument:
    """``ins``, or an adapter when its ``observe`` is annotated ``phase: str`` (0.1's contract).

    Which contract ``ins`` keeps is known only from that annotation, at run time: one not annotated
    ``phase: str`` is taken as today's (``observe(ctx: PassContext)``).
    """
    try:
        params = list(inspect.signature(ins.observe).parameters.values())
    except (TypeError, ValueError):
        return cast(Instrument, ins)
    if not params or params[0].annotation not in (str, "str"):
        return cast(Instrument, ins)
    if type(ins) not in _WARNED_LEGACY:
        _WARNED_LEGACY.add(type(ins))
        warnings.warn(
            f"cb_callback: {type(ins).__name__}.observe(phase: str) is the 0.1 instrument contract; it "
            "still works (it gets the phase's name) but will be removed: take observe(ctx: PassContext) "
            "and read ctx.phase (a Phase), ctx.inputs and ctx.result",
            DeprecationWarning,
            stacklevel=3,
        )
    # Declared an Instrument by whoever passed it, its observe's annotation says it is 0.1's kind.
    return _PhaseNameInstrument(cast(_LegacyInstrument, ins))


_UNSET = object()


#: Containers :func:`flatten_output` opens in one call at most (a larger output keeps the rest whole).
_MAX_OPENED = 256


def flatten_output(out: UserValue) -> tuple[list[UserValue], object]:
    """The leaves of a component's output and its structure (comparable with ``==``).

    :mod:`torch.utils._pytree`'s flattening, with the containers it leaves whole opened, recursively, so
    that their tensors are leaves like a tuple's (the step's loss reads them; a replay that did not see them
    would differentiate nothing): a dataclass instance not registered with pytree (an LLM block's
    ``@dataclass`` output) field by field, a field never set (``field(init=False)``) left out; a mapping
    pytree does not know (a ``dict`` or ``OrderedDict`` subclass, a hand-written ``ModelOutput``) by its
    keys; a ``list`` or ``tuple`` subclass by position; another object (not a module, a class or a tensor)
    by its instance attributes (``vars``: a ``torch.distributions`` object's tensors) when one of them holds a
    tensor (a logger or a config is no output to differentiate).

    Each container is opened once, wherever else it is met (two attributes pointing at one object, a
    cycle: the second stays one leaf), at most :data:`_MAX_OPENED` in all, and one whose items cannot be
    read (a raising ``__getitem__`` or attribute) stays one leaf.
    """
    return _flatten(out, set())


def _flatten(out: UserValue, opened_ids: set[int]) -> tuple[list[UserValue], object]:
    leaves, spec = pytree.tree_flatten(out)
    flat: list[UserValue] = []
    opened: list[tuple[int, str, tuple[object, ...], object]] = []
    for i, x in enumerate(leaves):
        parts = _parts(x, opened_ids)
        if parts is None:
            flat.append(x)
            continue
        opened_ids.add(id(x))
        names, values = parts
        sub, sub_structure = _flatten(tuple(values), opened_ids)
        flat += sub
        opened.append((i, type(x).__qualname__, names, sub_structure))
    return flat, (spec, tuple(opened))


def _parts(x: UserValue, opened: set[int]) -> tuple[tuple[object, ...], list[UserValue]] | None:
    """The names and values :func:`flatten_output` opens a leaf into, or ``None`` (a leaf it keeps)."""
    if isinstance(x, (torch.Tensor, nn.Module, type, str, bytes)) or id(x) in opened or len(opened) >= _MAX_OPENED:
        return None
    try:
        if dataclasses.is_dataclass(x):
            fields = [(f.name, getattr(x, f.name, _UNSET)) for f in dataclasses.fields(x)]
            fields = [(n, v) for n, v in fields if v is not _UNSET]
            return tuple(n for n, _ in fields), [v for _, v in fields]
        if isinstance(x, Mapping):
            keys = list(x.keys())
            return tuple(keys), [x[k] for k in keys]
        if isinstance(x, (list, tuple)):
            return (), list(x)
        attributes = getattr(x, "__dict__", None)
        if isinstance(attributes, dict) and not callable(x) and _holds_tensor(attributes.values()):
            return tuple(attributes), list(attributes.values())
    except Exception:  # an item or attribute that cannot be read: the container stays one leaf
        return None
    return None


def _holds_tensor(values: Iterable[UserValue]) -> bool:
    """Whether one of ``values`` is a tensor, or a pytree container holding one (no deeper look)."""
    return any(
        isinstance(v, torch.Tensor) or any(isinstance(leaf, torch.Tensor) for leaf in pytree.tree_leaves(v))
        for v in values
    )


def versions(inputs: ReplayInputs) -> tuple[pytree.TreeSpec, list[tuple[int, int]]]:
    """What an in-place change of the inputs changes: the pytree's structure (a list
    appended to), its leaves and the tensors' version counters."""
    leaves, spec = pytree.tree_flatten((inputs.args, inputs.kwargs))
    return spec, [(id(x), x._version if isinstance(x, torch.Tensor) else 0) for x in leaves]


def instrumented_pass(
    replay: Replay, instruments: Sequence[Instrument], backward: bool = True, *, path: str = ""
) -> PassResult:
    """One forward and (if ``backward`` and there is one) one backward, observed.

    Each instrument is entered around the whole pass, the forward and the
    backward (see :class:`Instrument`) with a :class:`PassContext` naming
    ``path``. Afterwards ``replay`` reuses one copy of the inputs for its next
    runs exactly when this forward changed none (:attr:`Replay.reuse_inputs`).

    Returns:
        What the pass learned (also in every context's ``result``).

    Raises:
        What the component raises.
    """
    with no_collection():
        return _observed_pass(replay, instruments, backward, path)


@contextlib.contextmanager
def no_collection() -> Iterator[None]:
    """The garbage collector held off during an observed pass: a cycle of earlier work (the user's, torch's,
    a graph of an earlier pass) collected inside it would free tensors that are not this component's, and
    read as its memory going down, its peak too low. (No collection before it: a full one costs tens of ms
    on a large program, once per component.)"""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _observed_pass(replay: Replay, instruments: Sequence[Instrument], backward: bool, path: str) -> PassResult:
    observers = [_adapted(ins) for ins in instruments]
    inputs = replay.fresh_inputs()
    whole_ctx = PassContext(Phase.PASS, path, replay.module, replay.device, inputs, backward)
    fwd_ctx = dataclasses.replace(whole_ctx, phase=Phase.FORWARD)
    bwd_ctx = dataclasses.replace(whole_ctx, phase=Phase.BACKWARD)
    before = versions(inputs)
    with contextlib.ExitStack() as whole:
        for ins in observers:
            whole.enter_context(ins.observe(whole_ctx))
        with contextlib.ExitStack() as fwd:
            for ins in observers:
                fwd.enter_context(ins.observe(fwd_ctx))
            out = replay.forward(inputs)
        mutated = versions(inputs) != before
        bwd = replay.backward(inputs, out) if backward else None
        if bwd is not None:
            out = None  # freed before the backward, as in the timed runs: the same memory is observed
            with contextlib.ExitStack() as bw:
                for ins in observers:
                    bw.enter_context(ins.observe(bwd_ctx))
                bwd.run()
        result = PassResult(mutates_inputs=mutated, backward_ran=bwd is not None, output=out)
        del out, bwd
        for ctx in (whole_ctx, fwd_ctx, bwd_ctx):
            ctx.result = result
    replay.reuse_inputs = not mutated
    return result
