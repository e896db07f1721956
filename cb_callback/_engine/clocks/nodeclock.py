"""Which autograd nodes each module call built, and a clock on them: every module's backward inside the step.

A module's backward is the work of the autograd nodes its forward built. After each call the module
claims them, walking back from its outputs' ``grad_fn`` to its inputs' (:func:`claim_nodes`, shared
with the census, which charges FLOPs the same way). :class:`NodeClock` then times each claimed node's
own work in the backward, between the engine's pre-hook and post-hook on that node, and charges it to
every module on the stack that built it (a block holds its children's).

What the clock cannot see, or sees only in part:

- **The gradient sums.** A tensor read twice (a residual's input, a weight of a module called twice)
  gets its gradients summed by the engine after a reader's node has run, outside any node: no module
  is charged for it. A top's whole backward (timed around the backward) includes it; a block's own
  in-situ backward is then the sum of its nodes' (a little less than the block alone replayed).
- **An asynchronous device.** On CUDA a node's hooks run when its kernels are queued, not when they
  run: no per-module backward there (only the top's whole backward, timed by events).
- **Hooks of the user's.** A tensor's gradient hook runs as a pre-hook of the node that reads that
  gradient, before this clock's: its time is in no module's. A ``register_full_backward_hook`` runs
  as a hook on the module's own nodes, after the node's work: its time is in the node's module (as
  in that module's replay). A node the forward made outside every tracked module (the loss, in the
  root) belongs to the top.
- **Calls outside their parent's.** A node is charged to the calls on the stack that built it, not
  to the module tree: ``self.enc.norm(self.enc(x))`` charges ``enc.norm``'s nodes to it and the
  root, not to ``enc`` (flagged ``slower_than_parent`` where it matters).
- **Recompute of an activation checkpoint.** It runs inside the backward node that unpacks a saved
  tensor (non-reentrant) or inside the checkpoint's own node (reentrant) and is charged to that
  node's modules (as the census charges its FLOPs). A reentrant checkpoint's inner backward runs
  the recomputed graph's nodes inside that node: the calls of the recompute claim them for
  themselves and for the running node's owners, and they are timed (and left out of the outer
  node's own time) like any other.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable
from typing import TypeVar

import torch
from torch.autograd.graph import Node
from torch.utils import _pytree as pytree
from torch.utils.hooks import RemovableHandle

from cb_callback._engine.replay.isolate import flatten_output

__all__ = ["NodeClock", "backward_prefix", "claim_nodes", "input_nodes", "next_node_number"]

#: Who built a node: the chain of module calls running when it was claimed, outermost first, each as
#: ``(key, call number)`` (the key: a module's ``id`` in the census, a node's path in the clock):
#: ``Chain[int]``, ``Chain[str]``.
_K = TypeVar("_K", bound=Hashable)
Chain = tuple[tuple[_K, int], ...]


def input_nodes(args: object, kwargs: object = None) -> set[Node]:
    """The ``grad_fn`` of every tensor in a call's arguments: where a module's claim walk stops."""
    leaves = pytree.tree_leaves((args, kwargs or {}))
    return {t.grad_fn for t in leaves if isinstance(t, torch.Tensor) and t.grad_fn is not None}


def next_node_number() -> int:
    """The sequence number autograd gives the next node built on this thread: a node numbered below
    what a call read as it started was built before the call (an accumulator of a leaf, built lazily,
    has none of its own: the largest number)."""
    return int(torch._C._autograd._get_sequence_nr())


def backward_prefix(owners: dict[Node, Chain[_K]]) -> Chain[_K]:
    """Who owns the autograd node running now, when a forward runs inside the backward (a reentrant
    checkpoint's recompute, whose nodes its own inner backward runs): a call claiming there claims for
    them too. ``()`` in a forward outside the backward."""
    if torch._C._current_graph_task_id() == -1:
        return ()
    return owners.get(torch._C._current_autograd_node(), ())


def claim_nodes(
    outputs: Iterable[object],
    stop: set[Node],
    owners: dict[Node, Chain[_K]],
    chain: Chain[_K],
    on_new: Callable[[Node], None],
    since: int | None = None,
) -> None:
    """Claim for the call ``chain[-1]`` the autograd nodes its forward built.

    Walks back from ``outputs``' ``grad_fn`` to the nodes in ``stop`` (its inputs') and to the nodes
    built before the call started (numbered below ``since``, :func:`next_node_number` as it started:
    an input inside an object ``stop`` could not see into, a tensor kept on a module or a global).
    A node nobody owns is the call's (``owners[node] = chain``; ``on_new(node)``); a node a call
    nested in this one claimed first (its chain holds this call) is walked through; a node another,
    finished call claimed ends the walk there (it is that call's, reached through a tensor this call read).
    """
    call = chain[-1][1]
    todo: list[Node | None] = [t.grad_fn for t in outputs if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    seen: set[Node] = set()
    while todo:
        node = todo.pop()
        if node is None or node in stop or node in seen:
            continue
        if since is not None and node._sequence_nr() < since:
            continue  # built before the call: not its work
        seen.add(node)
        owned = owners.get(node)
        if owned is None:
            owners[node] = chain
            on_new(node)
        elif all(c != call for _, c in owned):
            continue
        todo.extend(nxt for nxt, _ in node.next_functions)


class NodeClock:
    """Times the backward of every module call it saw in a forward, by the nodes each call built (CPU).

    The forward hooks call :meth:`pre` and :meth:`post` around each tracked call (inside their hook
    region, so the claim walk is no module's forward time); the backward then runs the pre-hook and
    post-hook this clock put on each claimed node. A node's time runs from the end of its pre-hook to
    the start of its post-hook, less the nodes timed inside it (a reentrant checkpoint's inner
    backward); ``hooks_s`` is what the hooks themselves took (to leave out of a backward timed whole).

    Attributes:
        seconds: ``{path: seconds}``, the nodes each path's calls built, over all of its calls.
        hooks_s: the node hooks' own time in the backward (their work, not the Python call around it).
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self.owners: dict[Node, Chain[str]] = {}
        self._stack: list[tuple[str, int, set[Node], int]] = []
        self._calls = 0
        self._open: list[list[float]] = []  # [pre-hook entered, own work started, nested spans]
        self._handles: list[RemovableHandle] = []
        self.seconds: dict[str, float] = {}
        self.hooks_s = 0.0

    def pre(self, path: str, args: object, kwargs: object) -> None:
        """A tracked call of ``path`` starts (its inputs' nodes, and every node built before it, end its
        claim walk)."""
        self._calls += 1
        self._stack.append((path, self._calls, input_nodes(args, kwargs), next_node_number()))

    def post(self, path: str, output: object) -> None:
        """A tracked call of ``path`` ended: it claims the nodes it built. Inside the backward (an
        activation checkpoint's recompute) they are also the running node's owners': a reentrant
        checkpoint's inner backward runs them inside that node."""
        if not self._stack or self._stack[-1][0] != path:
            return
        _, _, stop, since = self._stack[-1]
        chain: Chain[str] = backward_prefix(self.owners) + tuple((p, c) for p, c, _, _ in self._stack)
        claim_nodes(flatten_output(output)[0], stop, self.owners, chain, self._watch, since)
        self._stack.pop()
        self.seconds.setdefault(path, 0.0)

    def _watch(self, node: Node) -> None:
        self._handles.append(node.register_prehook(self._node_pre))
        self._handles.append(node.register_hook(lambda gi, go, node=node: self._node_post(node)))

    def _node_pre(self, grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
        entered = self._clock()
        self._open.append([entered, 0.0, 0.0])
        started = self._clock()
        self._open[-1][1] = started
        self.hooks_s += started - entered

    def _node_post(self, node: Node) -> None:
        ended = self._clock()
        if not self._open:
            return
        entered, started, nested = self._open.pop()
        own = max(ended - started - nested, 0.0)
        for path in {p for p, _ in self.owners.get(node, ())}:
            self.seconds[path] = self.seconds.get(path, 0.0) + own
        left = self._clock()
        self.hooks_s += left - ended
        if self._open:  # inside another timed node: this one's whole span is not that one's own work
            self._open[-1][2] += left - entered

    def close(self) -> None:
        """Let go of the step's graph (the nodes and their hooks)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.owners.clear()
        self._stack.clear()
        self._open.clear()
