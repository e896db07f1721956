"""Captured inputs: deep copies, fresh replay copies, device moves, batch slicing.

A captured call is deep-copied when the module is entered: tensors become
detached clones that keep the ``requires_grad`` flag the real step gave them;
pytree containers, dataclasses, caches and any other object holding tensors are
copied with :func:`copy.deepcopy`, their tensors cloned the same way; modules,
types, functions and immutables are kept by reference. Each replay gets its own
copy again, so a forward that appends to a cache object cannot leak into the
next run or into another component's replay.

Batch slicing, replication and device moves walk pytrees (tuples, lists, dicts,
namedtuples and any type registered with ``torch.utils._pytree``). Types that
must be sliced or replicated as a whole (a ``KeyedJaggedTensor`` holds one batch
across several tensors) register a :func:`register_batch_rule`.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch.utils import _pytree as pytree

from cb_callback._types import UserValue

__all__ = [
    "ComponentInputs",
    "InputCopyError",
    "call_signature",
    "clone_tree",
    "copy_call",
    "holds_objects",
    "leading_batch_size",
    "register_batch_rule",
    "replicate_batch",
    "slice_batch",
    "tensor_copier",
    "to_device",
]

_IMMUTABLE = (int, float, bool, complex, str, bytes, type(None), torch.dtype, torch.device, torch.Size)


# Kept by reference in a copy: a module passed as an argument stays the same
# object (its parameters are the component's state, not its input), and handles
# (functions, types, streams, events, process groups) are not data to copy.
def _by_reference_types() -> tuple[type, ...]:
    kinds: list[type] = [
        torch.nn.Module,
        type,
        types.FunctionType,
        types.BuiltinFunctionType,
        types.ModuleType,
        torch.Stream,
        torch.Event,
        torch.cuda.Stream,
        torch.cuda.Event,
    ]
    if torch.distributed.is_available():
        kinds.append(torch.distributed.ProcessGroup)
    return tuple(kinds)


_BY_REFERENCE = _by_reference_types()


@dataclass
class ComponentInputs:
    """The first captured call of one component (and copies of the calls unlike it).

    Attributes:
        args: positional arguments (tensors are detached clones whose
            ``requires_grad`` is the flag they had in the real step; other objects
            are deep copies, see :func:`copy_call`).
        kwargs: keyword arguments, likewise.
        calls: how many times the real step called the component.
        training: the component's ``training`` flag during the call.
        order: index of its first call among all captured calls (execution order).
        unknown_leaves: the arguments that could not be copied, as
            ``"args[1]: Cache"`` (then ``capture_error`` says why and the component
            cannot be replayed).
        modes: the ``training`` flag of every module of the component's subtree,
            by path relative to it (``""`` is the component, names as its
            ``named_modules()`` gives them): for a descendant the real step called,
            its flag when it was first entered; for the others, their flag when
            the capture's hooks went on. Empty (inputs captured before this field existed,
            or built by hand): the whole subtree replays with ``training``.
        grad_enabled: whether grad mode was on when the real step entered the
            component (``False`` under ``torch.no_grad()``, e.g. a frozen
            encoder): then it is replayed without grad and has no backward.
        insitu_ms: the component's forward per call in the captured step (ms;
            the capture's copies left out), ``None`` when not timed there.
        capture_error: why the call could not be captured (the capture hook
            failed: an object that cannot be copied, out of memory while cloning),
            or ``None``. A component with one is not replayed; its row fails with
            this error.
        variants: copies of the step's calls unlike this first one (another
            :func:`cb_callback._engine.replay.batches.input_signature`, other inputs that
            require grad, other non-tensor arguments, another grad mode or
            autograd wrapper), in the order first
            seen, each with its own ``args``/``kwargs``/``grad_enabled`` and its
            ``calls`` the number of the step's calls it stands for (the first
            call's own kind stands for ``calls - sum(v.calls for v in variants)``).
            At most :data:`cb_callback._engine.capture.capture.MAX_VARIANTS` (a call of a
            grad mode or wrapper not yet kept is kept all the same); calls of
            further kinds are counted in the last kept kind of their grad mode and
            wrapper (its ``calls`` and ``unrepresented``). Empty: every call is like the first.
        unrepresented: the calls counted in this kind (the first call's own, or a
            variant's) that are of another kind, beyond the cap on ``variants``
            (replayed as this kind: an approximation the row states).
        reaches_loss: whether the outputs of the step's calls (on a variant: of
            its calls) reach a tensor the step's backward ran through, decided from
            the captured step's autograd graph
            (:meth:`cb_callback._engine.capture.capture.Capture.mark_backward`): ``True`` if
            one call's did, ``False`` if none did, ``None`` when unknown (no
            backward was marked, or the outputs hold no tensor the capture sees).
        grad_calls: how many of the step's calls (on a variant: of its calls)
            built graph that the step's backward ran through (with grad and
            reaching the loss); ``None``: unknown, every call with grad counts
            (the behaviour before this field existed).
        output_mask: per leaf of the output (:func:`cb_callback._engine.replay.isolate.flatten_output`),
            whether the step's backward ran through it; ``None``: every leaf
            (unknown, or no backward marked). The isolated backward differentiates
            only the leaves marked ``True``.
        wrapped: the autograd wrapper the call ran under: ``"checkpoint"``
            (non-reentrant ``torch.utils.checkpoint``: saved-tensor hooks),
            ``"checkpoint (reentrant)"``, ``"saved_tensors_hooks"`` (another pack
            hook, e.g. ``save_on_cpu``), or ``None``. Calls made during a backward
            (a checkpoint's recomputation) are neither recorded nor counted: the
            backward of the call that checkpointed them holds that work.
    """

    args: tuple[UserValue, ...]
    kwargs: dict[str, UserValue]
    calls: int = 1
    training: bool = True
    order: int = 0
    unknown_leaves: list[str] = field(default_factory=list)
    modes: dict[str, bool] = field(default_factory=dict)
    capture_error: str | None = None
    grad_enabled: bool = True
    insitu_ms: float | None = None
    variants: list[ComponentInputs] = field(default_factory=list)
    unrepresented: int = 0
    reaches_loss: bool | None = None
    grad_calls: int | None = None
    output_mask: tuple[bool, ...] | None = None
    wrapped: str | None = None

    @property
    def own_calls(self) -> int:
        """The step's calls this first call's kind stands for (``calls`` less the variants')."""
        return max(self.calls - sum(v.calls for v in self.variants), 0)

    @property
    def own_grad_calls(self) -> int | None:
        """``grad_calls`` of the first call's kind alone (``None``: unknown)."""
        if self.grad_calls is None or any(v.grad_calls is None for v in self.variants):
            return None
        return max(self.grad_calls - sum(v.grad_calls or 0 for v in self.variants), 0)


@dataclass(frozen=True)
class _BatchRule:
    size: Callable[[UserValue], int | None]
    slice: Callable[[UserValue, int], UserValue]
    replicate: Callable[[UserValue, int], UserValue]


_BATCH_RULES: dict[type, _BatchRule] = {}


def register_batch_rule(
    cls: type,
    *,
    size: Callable[[UserValue], int | None],
    slice: Callable[[UserValue, int], UserValue],
    replicate: Callable[[UserValue, int], UserValue],
) -> None:
    """Teach batch slicing/replication a type that holds a batch across tensors.

    Args:
        cls: the type (exact match, not subclasses).
        size: ``size(obj)`` -> its batch size, or ``None``.
        slice: ``slice(obj, k)`` -> an object holding the first ``k`` samples.
        replicate: ``replicate(obj, n)`` -> an object of batch size ``n`` made by
            tiling the samples (``n`` may be smaller, then it slices).

    Raises:
        ValueError: if ``cls`` already has a rule.
    """
    if cls in _BATCH_RULES:
        raise ValueError(f"a batch rule for {cls.__qualname__} is already registered")
    _BATCH_RULES[cls] = _BatchRule(size, slice, replicate)


def _has_rule(x: object) -> bool:
    return type(x) in _BATCH_RULES


def tensor_copier(
    *,
    leaf: Literal["always", "as_given", "never"] = "always",
    keep: Iterable[torch.Tensor] = (),
    leaves: list[torch.Tensor] | None = None,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """How a copy of a call copies one tensor (:func:`copy_call`'s ``tensor_fn``).

    Every tensor is detached and cloned. A clone of a tensor that requires grad
    is made a leaf that requires grad (appended to ``leaves``, where the
    gradients of a backward through the copy land), and what the copy holds is,
    by ``leaf``:

    - ``"always"``: that leaf (the captured copy: :func:`copy_call`'s default);
    - ``"as_given"``: that leaf where the tensor was a leaf, else a clone of it,
      a non-leaf as the tensor was (the capture forward's copy of the caller's
      inputs: ``ReLU(inplace=True)`` on an upstream output works on the copy as
      on the original);
    - ``"never"``: a clone of it, a non-leaf (each replay's copy: an in-place op
      on an input works, and the input's gradient lands on the leaf).

    Args:
        leaf: whether a copy that requires grad is held as a leaf (see above).
        keep: tensors kept by reference, not copied (the model's own parameters
            and buffers, which an argument may be or be keyed by).
        leaves: where each leaf that requires grad is appended, in copy order.
    """
    kept = {id(t) for t in keep}

    def copy_one(t: torch.Tensor) -> torch.Tensor:
        if id(t) in kept:
            return t
        out = t.detach().clone()
        if not t.requires_grad:
            return out
        out.requires_grad_(True)
        if leaves is not None:
            leaves.append(out)
        return out if leaf == "always" or (leaf == "as_given" and t.is_leaf) else out.clone()

    return copy_one


#: :func:`copy_call`'s default: a detached clone, a leaf that keeps ``requires_grad``.
_copy_tensor = tensor_copier()


class InputCopyError(RuntimeError):
    """An argument of a captured call could not be copied.

    Attributes:
        where: the argument, ``"args[1]"`` or ``"kwargs['cache']"``.
        type_name: its type's qualified name.
        uncopyable: ``True`` when the object itself cannot be deep-copied (a lock,
            a ``__deepcopy__`` that raises), ``False`` when cloning one of its
            tensors failed (out of memory).
    """

    def __init__(self, where: str, value: object, cause: BaseException, *, uncopyable: bool) -> None:
        self.where = where
        self.type_name = type(value).__qualname__
        self.uncopyable = uncopyable
        text = f"{type(cause).__name__}: {cause}".strip()
        if len(text) > 300:
            text = text[:297] + "..."
        hint = (
            f"; each replay needs its own copy of the call (give {self.type_name} a working __deepcopy__)"
            if uncopyable
            else ""
        )
        super().__init__(f"could not copy {where} ({self.type_name}) of the captured call: {text}{hint}")


def _children(x: object) -> list[object]:
    """What a deep copy of ``x`` copies along with it, as far as plain Python can see."""
    out: list[object] = []
    try:
        if isinstance(x, dict):
            for k, v in x.items():
                out += (k, v)
        elif isinstance(x, (list, tuple, set, frozenset)):
            out += x
        if isinstance(x, types.MethodType):
            return [x.__self__]  # its __dict__ is the function's
        if isinstance(x, functools.partial):
            out += (x.func, x.args, x.keywords)
        state = getattr(x, "__dict__", None)
        if isinstance(state, dict):
            out += state.values()
        for klass in type(x).__mro__:
            slots = klass.__dict__.get("__slots__", ())
            for name in (slots,) if isinstance(slots, str) else slots:
                if name not in ("__dict__", "__weakref__") and hasattr(x, name):
                    out.append(getattr(x, name))
    except Exception:  # an odd __getattr__: copy.deepcopy will say what it cannot copy
        pass
    return out


def _seed(
    root: object, memo: dict[int, object], keep: list[object], tensor_fn: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    """Pre-fill ``memo`` so that ``copy.deepcopy(root, memo)`` clones tensors with
    ``tensor_fn`` (once each) and returns by-reference objects as they are.

    Walks containers, ``__dict__`` and ``__slots__`` depth-first; the objects seen
    are kept alive in ``keep`` so that their ids stay unique while ``memo`` is used.
    """
    seen: set[int] = set()
    stack = [root]
    while stack:
        x = stack.pop()
        if id(x) in memo or id(x) in seen or isinstance(x, _IMMUTABLE):
            continue
        keep.append(x)
        if isinstance(x, torch.Tensor):
            memo[id(x)] = tensor_fn(x)
        elif isinstance(x, _BY_REFERENCE):
            memo[id(x)] = x
        else:
            seen.add(id(x))
            stack.extend(reversed(_children(x)))


def _outside_inference() -> contextlib.AbstractContextManager[object]:
    """Leave ``torch.inference_mode`` (copies must be normal tensors), without grad."""
    if torch.is_inference_mode_enabled():
        stack = contextlib.ExitStack()
        stack.enter_context(torch.inference_mode(False))
        stack.enter_context(torch.no_grad())
        return stack
    return contextlib.nullcontext()


def copy_call(
    args: tuple[UserValue, ...],
    kwargs: dict[str, UserValue],
    tensor_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[tuple[UserValue, ...], dict[str, UserValue]]:
    """A deep copy of one call's arguments, with its tensors cloned.

    Every tensor is replaced by ``tensor_fn(tensor)`` (default: a detached clone
    that keeps ``requires_grad``), once: a tensor that appears twice (in two
    arguments, or inside a cache object and as an argument) is one tensor in the
    copy. Containers, dataclasses and other objects (``__dict__``, ``__slots__``)
    are copied with :func:`copy.deepcopy`; modules, types, functions, streams and
    immutables are kept by reference. Inference tensors are cloned outside
    ``torch.inference_mode`` so that the copies can be replayed.

    Args:
        args: positional arguments.
        kwargs: keyword arguments.
        tensor_fn: how to copy one tensor.

    Returns:
        The copied ``(args, kwargs)``.

    Raises:
        InputCopyError: naming the first argument that could not be copied.

    Notes:
        Tensors held where ``__dict__``/``__slots__`` and containers do not reach
        (an extension object's own state) are copied by their owner's
        ``__deepcopy__``/pickling protocol instead, so ``tensor_fn`` does not see
        them; a non-leaf tensor there cannot be copied (the argument is named in
        the error). The whole object graph an argument reaches is copied: an
        argument that holds a large object (a dataset, a trainer) costs its copy.
    """
    fn = tensor_fn or _copy_tensor
    memo: dict[int, object] = {}
    keep: list[object] = []
    memo[id(memo)] = keep  # copy.deepcopy keeps its own references alive here too
    named = [(f"args[{i}]", a) for i, a in enumerate(args)] + [(f"kwargs[{k!r}]", v) for k, v in kwargs.items()]
    out: list[UserValue] = []
    with _outside_inference():
        for where, value in named:
            try:
                _seed(value, memo, keep, fn)
            except Exception as e:
                raise InputCopyError(where, value, e, uncopyable=False) from e
            try:
                out.append(copy.deepcopy(value, memo))
            except Exception as e:
                raise InputCopyError(where, value, e, uncopyable=True) from e
    n = len(args)
    return tuple(out[:n]), dict(zip(kwargs, out[n:], strict=True))


def clone_tree(tree: UserValue) -> UserValue:
    """A deep copy of ``tree``: tensors detached and cloned, ``requires_grad`` kept.

    The copy rules of :func:`copy_call` (one argument).

    Raises:
        InputCopyError: when ``tree`` cannot be copied.
    """
    (out,), _ = copy_call((tree,), {})
    return out


def holds_objects(tree: object) -> bool:
    """Whether ``tree`` holds objects other than pytree containers, tensors, immutables
    and by-reference objects (a forward may change those without a tensor's version
    counter seeing it)."""
    return any(not isinstance(x, (torch.Tensor, *_IMMUTABLE, *_BY_REFERENCE)) for x in pytree.tree_leaves(tree))


def to_device(tree: UserValue, device: torch.device, dtype: torch.dtype | None = None) -> UserValue:
    """Move tensor leaves to ``device`` (floats cast to ``dtype`` if given).

    ``requires_grad`` flags are kept; the results are new leaves.

    Notes:
        Only the pytree's tensor leaves move: tensors inside other objects (a
        cache object, a dataclass that is not a pytree node) stay where they were
        captured, so a replay on another device fails on them (the row says so).
    """

    def leaf(x: UserValue) -> UserValue:
        if not isinstance(x, torch.Tensor):
            return x
        cast = dtype if (dtype is not None and x.is_floating_point()) else None
        if x.device == device and cast in (None, x.dtype):
            return x
        out = x.detach().to(device=device, dtype=cast)
        if x.requires_grad:
            out.requires_grad_(True)
        return out

    return pytree.tree_map(leaf, tree)


def leading_batch_size(tree: object) -> int | None:
    """Batch size of a pytree: its first batch-ruled object's, else its first tensor's dim 0."""
    for x in pytree.tree_leaves(tree, is_leaf=_has_rule):
        if _has_rule(x):
            return _BATCH_RULES[type(x)].size(x)
        if isinstance(x, torch.Tensor) and x.dim() > 0:
            return int(x.size(0))
    return None


def _map_batch(
    tree: UserValue, batch: int, tensor_fn: Callable[[torch.Tensor], torch.Tensor], rule_fn: str, n: int
) -> UserValue:
    def leaf(x: UserValue) -> UserValue:
        if _has_rule(x):
            rule = _BATCH_RULES[type(x)]
            return getattr(rule, rule_fn)(x, n) if rule.size(x) == batch else x
        if isinstance(x, torch.Tensor) and x.dim() > 0 and x.size(0) == batch:
            out = tensor_fn(x.detach())
            if x.requires_grad:
                out.requires_grad_(True)
            return out
        return x

    return pytree.tree_map(leaf, tree, is_leaf=_has_rule)


def slice_batch(tree: UserValue, batch: int, k: int) -> UserValue:
    """Keep the first ``k`` samples of every leaf whose batch size is ``batch``.

    Tensors with ``shape[0] == batch`` are sliced (and cloned, so the big batch
    can be freed); registered types use their rule; everything else is kept.

    Notes:
        Only pytree leaves are sliced: tensors inside other objects (a cache
        object, a dataclass that is not a pytree node) keep their full batch.
    """
    if k >= batch:
        return tree
    return _map_batch(tree, batch, lambda t: t[:k].clone(), "slice", k)


def replicate_batch(tree: UserValue, batch: int, n: int) -> UserValue:
    """Tile every leaf whose batch size is ``batch`` along dim 0 to ``n`` samples.

    Tiling (``[x0..xb, x0..xb, …]`` cut to ``n``) keeps the captured samples'
    distribution, unlike padding or random data.

    Notes:
        Only leaves whose leading dimension equals the captured batch size are
        replicated; a tensor laid out ``[B*T, …]`` or batch-second is left as is,
        and so are tensors inside objects that are not pytree nodes (a cache
        object): register the type with ``torch.utils._pytree`` or a
        :func:`register_batch_rule` to have them replicated.
    """
    if n == batch:
        return tree

    def tile(t: torch.Tensor) -> torch.Tensor:
        reps = -(-n // batch)
        return t.repeat((reps,) + (1,) * (t.dim() - 1))[:n].contiguous()

    return _map_batch(tree, batch, tile, "replicate", n)


def call_signature(args: object, kwargs: object) -> tuple[object, ...]:
    """What decides a call's work, to tell the census's call of a module from its replay's: each tensor
    argument's shape, dtype and whether it requires grad; a number, string or ``None`` by value; anything
    else by type. (The census replays the top on its call: a child's call in it can differ from the child's
    own captured call, after the optimizer step moved a router's weights, or where the top's inputs were
    tiled to ``batch_size`` and the child's were not.)"""
    out: list[object] = []
    for x in pytree.tree_leaves((args, kwargs)):
        if isinstance(x, torch.Tensor):
            out.append((tuple(x.shape), x.dtype, x.requires_grad))
        elif x is None or isinstance(x, (bool, int, float, str)):
            out.append(x)
        else:
            out.append(type(x).__qualname__)
    return tuple(out)
