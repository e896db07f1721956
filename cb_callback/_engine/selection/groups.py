"""Repeated structure: siblings that do the same work form a group; a member's descendants are compared
with the representative's by their own calls before any row is copied."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from torch import Tensor, nn
from torch.utils import _pytree as pytree

from cb_callback._engine.capture.inputs import ComponentInputs
from cb_callback._engine.capture.tree import Node, scripted
from cb_callback._engine.replay.batches import input_signature
from cb_callback._report.model import ComponentRow
from cb_callback._report.schema import RowDetails

#: What a row keeps of its own when it takes a representative's measurement.
_OWN = frozenset({"path", "module_type", "depth", "parent", "calls", "params_mb", "share", "insitu_ms", "details"})
#: ... and of its details.
_OWN_DETAILS = frozenset({"aliases", "shared_with", "insitu", "sharded", "group", "as", "from", "artifacts"})
#: Non-tensor arguments compared by value (a tuple of them is walked by pytree).
_VALUES = (int, float, bool, complex, str, bytes, type(None))

__all__ = ["call_difference", "call_signature", "corresponding", "group_key", "sibling_groups", "subtree", "take_row"]


def call_signature(inputs: ComponentInputs) -> tuple[Any, ...]:
    """What one call's arguments set of the work: the tensors' shapes and dtypes
    (:func:`input_signature`), which of them required grad, and every other leaf: the value of an
    immutable (``int``, ``float``, ``bool``, ``str``, ``None``; ``forward(x, n)`` with ``n`` loop
    steps), the type's name of any other object, and the arguments' structure (keyword names)."""
    leaves, spec = pytree.tree_flatten((inputs.args, inputs.kwargs))
    grads = tuple(t.requires_grad for t in leaves if isinstance(t, Tensor))
    others = tuple(
        (type(x).__name__, repr(x)) if isinstance(x, _VALUES) else type(x).__qualname__
        for x in leaves
        if not isinstance(x, Tensor)
    )
    return (input_signature(inputs), grads, others, str(spec))


def _configuration(module: nn.Module) -> tuple[tuple[str, str], ...]:
    """``extra_repr()`` of every module of the subtree, by relative path (a ``Conv2d``'s padding and
    dilation, a ``Dropout``'s p): the configuration its constructor gave it; for a TorchScript module
    also its code (every one is a ``RecursiveScriptModule``, and a trace bakes in the branches its
    Python attributes chose)."""
    out = []
    for rel, m in module.named_modules():
        try:
            out.append((rel, m.extra_repr()))
        except Exception:  # an extra_repr that raises says nothing: the class and shapes still decide
            out.append((rel, "?"))
        if scripted(m):
            try:
                out.append((rel, str(m.code)))
            except Exception:  # code it cannot show: like no other module's
                out.append((rel, f"code unknown ({id(m)})"))
    return tuple(out)


def _wrapped_below(path: str, module: nn.Module, calls: Mapping[str, ComponentInputs]) -> tuple[Any, ...]:
    """Each called descendant's autograd wrapper (``ComponentInputs.wrapped``: a checkpoint), by relative path."""
    out = []
    for rel, _ in module.named_modules():
        mine = calls.get(f"{path}.{rel}" if path and rel else (rel or path))
        wrapped = getattr(mine, "wrapped", None) if mine is not None else None
        if wrapped is not None:
            out.append((rel, wrapped))
    return tuple(out)


def group_key(
    module: nn.Module, inputs: ComponentInputs, path: str = "", calls: Mapping[str, ComponentInputs] | None = None
) -> tuple[Any, ...]:
    """What makes two siblings the same component: class, subtree (names and classes), every module's
    configuration (``extra_repr()``), parameter and buffer shapes, dtypes and ``requires_grad``, the
    call's :func:`call_signature` (shapes, which tensors required grad, non-tensor values: the first
    block of a stack gets no input gradient, the others do, so their backwards differ), its flags,
    grad mode and autograd wrapper, and, with ``calls`` (the step's, ``module`` at ``path``), which
    descendants ran under an autograd wrapper (a checkpointed child)."""
    cls = type(module)
    tree = tuple((rel, type(m).__qualname__) for rel, m in module.named_modules())
    params = tuple((n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in module.named_parameters())
    buffers = tuple((n, tuple(b.shape), b.dtype) for n, b in module.named_buffers())
    modes = tuple(sorted(inputs.modes.items()))
    wrapped = _wrapped_below(path, module, calls) if calls is not None else ()
    return (
        f"{cls.__module__}.{cls.__qualname__}", tree, _configuration(module), params, buffers,
        call_signature(inputs), inputs.training, inputs.grad_enabled, modes, getattr(inputs, "wrapped", None),
        wrapped,
    )  # fmt: skip


def _variants(inputs: ComponentInputs) -> tuple[Any, ...]:
    """The other distinct calls (``ComponentInputs.variants``), each by what sets its work."""
    out: list[Any] = []
    for v in getattr(inputs, "variants", None) or ():
        if isinstance(v, ComponentInputs):
            out.append((call_signature(v), v.calls, v.grad_enabled, getattr(v, "wrapped", None)))
        else:
            out.append(repr(v))
    return tuple(out)


#: The calls' fields compared one by one (the name the reason uses, how it is read).
_FIELDS: tuple[tuple[str, Any], ...] = (
    ("call count", lambda c: c.calls),
    ("grad mode", lambda c: c.grad_enabled),
    ("training flag", lambda c: c.training),
    ("autograd wrapper", lambda c: getattr(c, "wrapped", None)),
    ("reach of the loss", lambda c: getattr(c, "reaches_loss", None)),
    ("calls with a backward", lambda c: getattr(c, "grad_calls", None)),
    ("other calls", _variants),
    ("input signature", call_signature),
)


def call_view(inputs: ComponentInputs | None) -> tuple[Any, ...] | None:
    """What :func:`call_difference` compares of one call, as plain values (``None``: not called): what
    another rank gathers of its calls, so that every rank compares members on every rank's calls."""
    if inputs is None:
        return None
    if inputs.capture_error is not None:
        return (_UNCAPTURED,)
    return tuple(read(inputs) for _, read in _FIELDS)


#: A call's view when its capture failed.
_UNCAPTURED = "a call that could not be captured"


class ViewsOf(dict[str, "tuple[Any, ...] | None"]):
    """Another rank's :func:`call_view` of each path in one batch, named (``where``: ``" (rank 1)"``) in
    the difference a member's comparison finds in them."""

    def __init__(self, views: Mapping[str, tuple[Any, ...] | None], where: str) -> None:
        super().__init__(views)
        self.where = where


def call_difference(mine: ComponentInputs | None, theirs: ComponentInputs | None) -> str | None:
    """How a member's descendant was called unlike the representative's at the same relative path
    (``None``: alike, or neither called): called or not, call count, grad mode, flags, autograd wrapper,
    whether its output reached the loss, its calls with a backward, its other calls, its arguments."""
    return view_difference(call_view(mine), call_view(theirs))


def view_difference(mine: tuple[Any, ...] | None, theirs: tuple[Any, ...] | None) -> str | None:
    """:func:`call_difference` on two calls' views (:func:`call_view`)."""
    if mine is None or theirs is None:
        if mine is theirs:
            return None
        return "called in the step where its counterpart was not" if theirs is None else "not called in the step"
    if mine == (_UNCAPTURED,) or theirs == (_UNCAPTURED,):
        return _UNCAPTURED
    for (name, _), a, b in zip(_FIELDS, mine, theirs, strict=True):
        if a != b:
            if name == "input signature":
                return f"called on {a[0]} where its counterpart on {b[0]}" if a[0] != b[0] else "other arguments"
            if name == "other calls":
                return f"{len(a)} other kind(s) of call where its counterpart has {len(b)}"
            return f"{name} {a!r} where its counterpart has {b!r}"
    return None


def sibling_groups(
    node: Node,
    modules: Mapping[str, nn.Module],
    calls: Mapping[str, ComponentInputs],
    batches: Sequence[Mapping[str, ComponentInputs]] = (),
    others: Sequence[Mapping[str, Any]] = (),
) -> list[list[str]]:
    """``node``'s children partitioned into groups, in the children's order (a group of one: no repetition).

    Only children the step called (and whose call was captured) can be grouped;
    a child that shares its module with another node (``shared_with``) stays
    alone, and so does one whose key cannot be computed. With several captured
    ``batches``, members also ran in the same batches on the same input
    signatures (two experts each routed one batch are not one group). With
    ``others`` (every other rank's :class:`ViewsOf` each batch), members were
    also called alike on every rank.
    """
    by_key: dict[tuple[Any, ...], list[str]] = {}
    out: list[list[str]] = []
    seen_modules: set[int] = set()
    for child in node.children:
        inputs = calls.get(child)
        module = modules.get(child)
        if inputs is None or module is None or inputs.capture_error is not None or id(module) in seen_modules:
            out.append([child])
            continue
        seen_modules.add(id(module))
        try:
            key = group_key(module, inputs, child, calls)
            if len(batches) > 1:
                key += tuple(call_signature(b[child]) if child in b else None for b in batches)
            key += tuple(views.get(child) for views in others)
        except Exception:
            out.append([child])
            continue
        if key in by_key:
            by_key[key].append(child)
        else:
            by_key[key] = [child]
            out.append(by_key[key])
    return out


def corresponding(path: str, member: str, representative: str) -> str:
    """The node under ``representative`` that stands where ``path`` stands under ``member``."""
    if path == member:
        return representative
    return representative + path[len(member) :]


def subtree(path: str, nodes: Mapping[str, Node]) -> list[str]:
    """``path`` and every node below it, parents first."""
    out, todo = [], [path]
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(nodes[p].children if p in nodes else ())
    return out


def take_row(row: ComponentRow, source: ComponentRow) -> ComponentRow:
    """``row`` with ``source``'s measurement: status, times, FLOPs, bytes, memory and their details.

    ``row`` keeps its identity (path, type, depth, parent), its own ``calls``,
    ``params_mb``, ``insitu_ms`` and in-situ details; ``details["as"]`` becomes
    ``"representative"`` and ``details["from"]`` names the measured row (``source``,
    or the one ``source`` itself was taken from). ``row`` was never replayed: it
    carries no ``error`` (the source's stays on the source's row); its ``note``
    says where its numbers come from. Returns ``row``.
    """
    for name in ComponentRow.__dataclass_fields__:
        if name not in _OWN:
            setattr(row, name, getattr(source, name))
    # Some of a RowDetails' items are a RowDetails (a type checker cannot follow the filter).
    kept = cast(RowDetails, {k: v for k, v in row.details.items() if k in _OWN_DETAILS})
    taken = cast(RowDetails, {k: v for k, v in source.details.items() if k not in _OWN_DETAILS})
    # A source that took its own row from another (an expert of a block that is itself a copy) names that one.
    origin = source.details.get("from", source.path) if source.details.get("as") == "representative" else source.path
    row.details = {**taken, **kept, "as": "representative", "from": origin}
    row.error = None
    if row.status in ("ok", "estimated"):
        row.note = f"taken from {origin or 'root'}, a representative of its repeated structure"
    elif row.note:
        row.note = f"as {origin or 'root'}: {row.note}"
    return row
