"""Which captured calls built graph the step's backward ran through: a walk of the autograd graph.

The capture keeps, for every call, the autograd node of each leaf of its output
(its ``grad_fn``; for a leaf tensor that requires grad, the tensor). When the
step's backward is about to run (:meth:`cb_callback._engine.capture.capture.Capture.mark_backward`
with the loss), :func:`walk` walks ``next_functions`` from the loss's nodes;
a call whose output node is met reaches the loss. This is decided from the graph
the step built, not from ``requires_grad``: a probe whose output is only logged
with ``.item()`` requires grad and still reaches nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch.autograd.graph import Node

from cb_callback._engine.capture.inputs import ComponentInputs

__all__ = ["CallOutputs", "call_outputs", "fill_reach", "mark", "walk"]

_PLAIN = (int, float, bool, complex, str, bytes, type(None), torch.dtype, torch.device, torch.Size)


@dataclass
class CallOutputs:
    """One call's outputs as autograd nodes, kept until the capture's hooks come off.

    Attributes:
        kind: the record it counts in (the component's first call or one of its ``variants``).
        grad: whether grad mode was on in the call.
        nodes: per output leaf, its ``grad_fn``, the tensor itself when it is a leaf
            that requires grad, or ``None`` (no graph: it cannot reach a loss).
        unknown: whether its reach cannot be decided (an output the capture cannot
            see into, or a reentrant checkpoint, whose graph is built in the backward).
        reached: per output leaf, whether a marked backward ran through it.
    """

    kind: ComponentInputs
    grad: bool
    nodes: list[Node | torch.Tensor | None]
    unknown: bool = False
    reached: list[bool] = field(default_factory=list)

    @property
    def reaches(self) -> bool:
        return any(self.reached)


def call_outputs(kind: ComponentInputs, leaves: Iterable[object], grad: bool, unknown: bool = False) -> CallOutputs:
    """The nodes of one call's output leaves.

    ``leaves``: :func:`cb_callback._engine.replay.isolate.flatten_output`'s.
    """
    nodes: list[Node | torch.Tensor | None] = []
    opaque = False
    for x in leaves:
        if isinstance(x, torch.Tensor):
            nodes.append(x.grad_fn if x.grad_fn is not None else (x if x.requires_grad else None))
        else:
            opaque = opaque or not isinstance(x, _PLAIN)
            nodes.append(None)
    # Objects the capture cannot see into (an awaitable, an unregistered container) may hold graph.
    unknown = unknown or (opaque and all(n is None for n in nodes))
    return CallOutputs(kind, grad, nodes, unknown, [False] * len(nodes))


def walk(roots: Iterable[object]) -> tuple[set[int], set[int]]:
    """The ids of the autograd nodes reached from ``roots`` (tensors), and of the leaf tensors
    their ``AccumulateGrad`` nodes accumulate into."""
    stack = [t.grad_fn for t in roots if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    nodes: set[int] = set()
    leaves = {id(t) for t in roots if isinstance(t, torch.Tensor) and t.grad_fn is None and t.requires_grad}
    while stack:
        node = stack.pop()
        if id(node) in nodes:
            continue
        nodes.add(id(node))
        var = getattr(node, "variable", None)
        if isinstance(var, torch.Tensor):
            leaves.add(id(var))
        for nxt, _ in node.next_functions:
            if nxt is not None and id(nxt) not in nodes:
                stack.append(nxt)
    return nodes, leaves


def mark(outs: Iterable[CallOutputs], nodes: set[int], leaves: set[int]) -> None:
    """Set each call's ``reached`` from one backward's walk (a union over several backwards)."""
    for out in outs:
        for i, n in enumerate(out.nodes):
            if n is not None and not out.reached[i]:
                out.reached[i] = id(n) in (leaves if isinstance(n, torch.Tensor) else nodes)
            if out.reached[i]:
                out.nodes[i] = None  # decided: its node is not needed for a later backward


def _kind_fields(kind: ComponentInputs, outs: list[CallOutputs]) -> None:
    """``reaches_loss``, ``grad_calls`` (over ``outs``) and ``output_mask`` (over ``kind``'s own calls)."""
    kind.reaches_loss = True if any(o.reaches for o in outs) else (None if any(o.unknown for o in outs) else False)
    grad = [o for o in outs if o.grad]
    kind.grad_calls = None if any(o.unknown for o in grad) else sum(1 for o in grad if o.reaches)
    mine = [o for o in outs if o.kind is kind]
    sizes = {len(o.reached) for o in mine}
    if mine and len(sizes) == 1 and not any(o.unknown for o in mine):
        n = sizes.pop()
        kind.output_mask = tuple(any(o.reached[i] for o in mine) for i in range(n))
    else:
        kind.output_mask = None


def fill_reach(first: ComponentInputs, outs: list[CallOutputs]) -> None:
    """Fill ``reaches_loss``, ``grad_calls`` and ``output_mask`` of a component's first call (over
    all of the step's calls; the mask over its own kind's) and of each of its variants (over theirs)."""
    _kind_fields(first, outs)
    for v in first.variants:
        _kind_fields(v, [o for o in outs if o.kind is v])
