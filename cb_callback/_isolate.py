"""Replay one component alone on its captured inputs: forward, and backward."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from cb_callback._inputs import ComponentInputs, clone_tree

__all__ = ["Backward", "Replay", "ReplayInputs"]


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

    Notes:
        The module runs with the ``training`` flag it had when captured. The
        caller guards state (:class:`cb_callback._state.StateGuard`): a replay's
        forward may update BatchNorm statistics or consume RNG.
    """

    def __init__(
        self,
        module: nn.Module,
        inputs: ComponentInputs,
        *,
        device: torch.device,
        seed: int = 0,
        forward_context: Callable[[], AbstractContextManager[Any]] | None = None,
    ) -> None:
        self.module = module
        self.inputs = inputs
        self.device = device
        self.seed = seed
        self._context = forward_context or contextlib.nullcontext

    def fresh_inputs(self) -> ReplayInputs:
        """A new copy of the inputs: in-place ops in one run can't leak to the next."""
        leaves: list[torch.Tensor] = []

        def leaf(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and x.requires_grad:
                leaves.append(x)
                return x.clone()
            return x

        args, kwargs = pytree.tree_map(leaf, clone_tree((self.inputs.args, self.inputs.kwargs)))
        return ReplayInputs(tuple(args), dict(kwargs), leaves)

    def forward(self, inputs: ReplayInputs | None = None) -> Any:
        """One forward on ``inputs`` (fresh ones if ``None``), with grad enabled."""
        inp = inputs if inputs is not None else self.fresh_inputs()
        self.module.train(self.inputs.training)
        with torch.enable_grad(), self._context():
            return self.module(*inp.args, **inp.kwargs)

    def grad_targets(self, inputs: ReplayInputs) -> list[torch.Tensor]:
        """Inputs that required grad (their leaves), then the component's parameters that do."""
        params = [p for p in self.module.parameters() if p.requires_grad]
        return list(inputs.leaves) + params

    def backward(self) -> Backward | None:
        """Run one forward and return its backward, or ``None`` if there is none.

        There is no backward when no output requires grad (the component runs
        under ``no_grad`` in effect, or only on integer data) or nothing to
        differentiate against.
        """
        inputs = self.fresh_inputs()
        out = self.forward(inputs)
        outputs = [
            t for t in pytree.tree_leaves(out)
            if isinstance(t, torch.Tensor) and t.requires_grad and t.grad_fn is not None
        ]
        targets = self.grad_targets(inputs)
        if not outputs or not targets:
            return None
        gen = torch.Generator(device=self.device)
        gen.manual_seed(self.seed)
        grads = [
            torch.randn(t.shape, generator=gen, device=t.device, dtype=t.dtype) for t in outputs
        ]
        return Backward(outputs, grads, targets)

    def probe(self) -> bool:
        """One forward and (if any) one backward; raises what they raise.

        Returns:
            Whether the component has a backward.
        """
        bwd = self.backward()
        if bwd is None:
            return False
        bwd()
        return True
