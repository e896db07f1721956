"""Replay one component alone on its captured inputs: forward, and backward."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn
from torch.utils import _pytree as pytree

from cb_callback._inputs import ComponentInputs, copy_call, holds_objects

__all__ = [
    "Backward",
    "Instrument",
    "PassResult",
    "Replay",
    "ReplayInputs",
    "instrumented_pass",
    "register_grad_targets",
]

_GRAD_TARGETS: list[Callable[[nn.Module], Iterable[torch.Tensor]]] = []


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
    """

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    leaves: list[torch.Tensor] = field(default_factory=list)


class Backward:
    """A forward's graph, kept to replay its backward many times.

    Calling it runs ``torch.autograd.grad(outputs, targets, grad_outputs,
    retain_graph=True)``: the gradient w.r.t. the inputs that required grad in the
    real step and the component's parameters that require grad. ``.grad`` fields
    are not touched.
    """

    def __init__(
        self,
        outputs: list[torch.Tensor],
        grad_outputs: list[torch.Tensor],
        targets: list[torch.Tensor],
    ) -> None:
        self.outputs = outputs
        self.grad_outputs = grad_outputs
        self.targets = targets

    def __call__(self, _: Any = None) -> tuple[torch.Tensor | None, ...]:
        return torch.autograd.grad(
            self.outputs, self.targets, self.grad_outputs, retain_graph=True, allow_unused=True
        )


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

    Notes:
        Every module of the subtree runs with the ``training`` flag it had in the
        real step (``inputs.modes``; a frozen ``eval()`` child stays in eval
        during its parent's replay); the flags are set before each forward and
        left so (the caller's guard restores them). Each run gets its own deep
        copy of the captured call, objects such as a KV cache included, so no run
        sees what another appended. The caller guards state
        (:class:`cb_callback._state.StateGuard`): a replay's forward may update
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
        forward_context: Callable[[], AbstractContextManager[Any]] | None = None,
        grad_enabled: bool = True,
    ) -> None:
        self.module = module
        self.inputs = inputs
        self.device = device
        self.seed = seed
        self.grad_enabled = grad_enabled
        self._context = forward_context or contextlib.nullcontext
        self._reuse = False
        # Objects other than pytree containers and tensors can change without a
        # version counter seeing it: their copies are never reused.
        self._objects = holds_objects((inputs.args, inputs.kwargs))
        self._cached: ReplayInputs | None = None
        self._grad_outputs: tuple[tuple[Any, ...], list[torch.Tensor]] | None = None
        self._flags = self._subtree_flags()
        #: Why :meth:`backward` found no backward (set when it returns ``None``).
        self.no_backward: str | None = None
        #: The inputs of the instrumented pass in progress (for instruments).
        self.current_inputs: ReplayInputs | None = None

    @property
    def reuse_inputs(self) -> bool:
        """Reuse one copy of the inputs for every run (the engine sets it after the
        first pass when the forward changed no input in place).

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

    def fresh_inputs(self) -> ReplayInputs:
        """A new deep copy of the inputs: nothing one run changes leaks to the next.

        Tensors that required grad in the real step become new leaves (listed in
        ``leaves``) and the arguments hold a clone of each; the captured copy is
        never changed. With ``reuse_inputs`` the same copy is returned every time.
        """
        if self.reuse_inputs and self._cached is not None:
            return self._cached
        leaves: list[torch.Tensor] = []

        def tensor(t: torch.Tensor) -> torch.Tensor:
            out = t.detach().clone()
            if not t.requires_grad:
                return out
            out.requires_grad_(True)
            leaves.append(out)
            return out.clone()

        args, kwargs = copy_call(self.inputs.args, self.inputs.kwargs, tensor)
        fresh = ReplayInputs(args, kwargs, leaves)
        if self.reuse_inputs:
            self._cached = fresh
        return fresh

    def forward(self, inputs: ReplayInputs | None = None) -> Any:
        """One forward on ``inputs`` (fresh ones if ``None``), with grad enabled
        unless ``grad_enabled`` is ``False``."""
        inp = inputs if inputs is not None else self.fresh_inputs()
        if self._flags is None:
            self.module.train(self.inputs.training)
        else:
            for m, flag in self._flags:
                m.training = flag
        with torch.set_grad_enabled(self.grad_enabled), self._context():
            return self.module(*inp.args, **inp.kwargs)

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

    def backward(self, inputs: ReplayInputs | None = None, out: Any = None) -> Backward | None:
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
            t for t in pytree.tree_leaves(out)
            if isinstance(t, torch.Tensor) and t.requires_grad and t.grad_fn is not None
        ]
        targets = self.grad_targets(inputs)
        if not outputs or not targets:
            self.no_backward = (
                ("replayed without grad, as the real step ran it (no_grad)" if not self.grad_enabled
                 else "no output requires grad") if not outputs
                else "no input or parameter of the component requires grad"
            )
            return None
        key = tuple((t.shape, t.dtype, t.device) for t in outputs)
        if self._grad_outputs is None or self._grad_outputs[0] != key:
            # Seeded, so every run would draw the same values: draw them once (randn
            # is slow on CPU; drawing per run cost more than a small component's backward).
            gen = torch.Generator(device=self.device)
            gen.manual_seed(self.seed)
            grads = [torch.randn(t.shape, generator=gen, device=t.device, dtype=t.dtype) for t in outputs]
            self._grad_outputs = (key, grads)
        return Backward(outputs, list(self._grad_outputs[1]), targets)

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


@runtime_checkable
class Instrument(Protocol):
    """Observes the one instrumented forward + backward of a component.

    ``observe(phase)`` returns a context manager entered around the whole pass
    (``"pass"``), then around its forward (``"forward"``) and its backward
    (``"backward"``); ``values()`` is read after the pass. Metric plugins that
    can observe rather than run their own replays (FLOPs, bytes, memory) offer an
    ``instrument(ctx)`` method, so all of them share a single pass.
    """

    def observe(self, phase: str) -> AbstractContextManager[Any]: ...

    def values(self) -> Mapping[str, Any]: ...


@dataclass
class PassResult:
    """What the instrumented pass learned about the component.

    Attributes:
        has_backward: whether some output required grad.
        mutates_inputs: whether the forward changed an input in place, or added
            to or removed from a list or dict of its inputs (then every timed run
            needs a fresh copy of the inputs). Changes inside other objects (a
            cache object) are not seen; such inputs are copied for every run.
    """

    has_backward: bool
    mutates_inputs: bool


def _versions(inputs: ReplayInputs) -> tuple[Any, list[tuple[int, int]]]:
    """What an in-place change of the inputs changes: the pytree's structure (a list
    appended to), its leaves and the tensors' version counters."""
    leaves, spec = pytree.tree_flatten((inputs.args, inputs.kwargs))
    return spec, [(id(x), x._version if isinstance(x, torch.Tensor) else 0) for x in leaves]


def instrumented_pass(replay: Replay, instruments: Sequence[Instrument], backward: bool = True) -> PassResult:
    """One forward and (if ``backward`` and there is one) one backward, observed.

    Raises what the component raises.
    """
    inputs = replay.fresh_inputs()
    replay.current_inputs = inputs
    before = _versions(inputs)
    has_backward = False
    with contextlib.ExitStack() as whole:
        for ins in instruments:
            whole.enter_context(ins.observe("pass"))
        with contextlib.ExitStack() as fwd:
            for ins in instruments:
                fwd.enter_context(ins.observe("forward"))
            out = replay.forward(inputs)
        mutated = _versions(inputs) != before
        bwd = replay.backward(inputs, out) if backward else None
        del out
        if bwd is not None:
            has_backward = True
            with contextlib.ExitStack() as bw:
                for ins in instruments:
                    bw.enter_context(ins.observe("backward"))
                torch.autograd.grad(bwd.outputs, bwd.targets, bwd.grad_outputs, allow_unused=True)
            del bwd
    return PassResult(has_backward, mutated)
