"""Repeated structure: siblings of one class, parameter shapes and input signature form a group."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor, nn
from torch.utils import _pytree as pytree

from cb_callback._engine.batches import input_signature
from cb_callback._engine.inputs import ComponentInputs
from cb_callback._engine.tree import Node
from cb_callback._report.model import ComponentRow

#: What a row keeps of its own when it takes a representative's measurement.
_OWN = frozenset({"path", "module_type", "depth", "parent", "calls", "params_mb", "share", "insitu_ms", "details"})
#: ... and of its details.
_OWN_DETAILS = frozenset({"aliases", "shared_with", "insitu", "sharded", "group", "as", "from", "artifacts"})

__all__ = ["corresponding", "group_key", "sibling_groups", "subtree", "take_row"]


def group_key(module: nn.Module, inputs: ComponentInputs) -> tuple[Any, ...]:
    """What makes two siblings the same component: class, subtree (names and classes), parameter
    and buffer shapes, dtypes and ``requires_grad``, the call's input signature, which of its
    tensors required grad (the first block of a stack gets no input gradient, the others do: their
    backwards differ) and its flags."""
    cls = type(module)
    tree = tuple((rel, type(m).__qualname__) for rel, m in module.named_modules())
    params = tuple((n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in module.named_parameters())
    buffers = tuple((n, tuple(b.shape), b.dtype) for n, b in module.named_buffers())
    modes = tuple(sorted(inputs.modes.items()))
    grads = tuple(t.requires_grad for t in pytree.tree_leaves((inputs.args, inputs.kwargs)) if isinstance(t, Tensor))
    return (
        f"{cls.__module__}.{cls.__qualname__}", tree, params, buffers, input_signature(inputs), grads,
        inputs.training, inputs.grad_enabled, modes,
    )  # fmt: skip


def sibling_groups(
    node: Node,
    modules: Mapping[str, nn.Module],
    calls: Mapping[str, ComponentInputs],
    batches: Sequence[Mapping[str, ComponentInputs]] = (),
) -> list[list[str]]:
    """``node``'s children partitioned into groups, in the children's order (a group of one: no repetition).

    Only children the step called (and whose call was captured) can be grouped;
    a child that shares its module with another node (``shared_with``) stays
    alone, and so does one whose key cannot be computed. With several captured
    ``batches``, members also ran in the same batches on the same input
    signatures (two experts each routed one batch are not one group).
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
            key = group_key(module, inputs)
            if len(batches) > 1:
                key += tuple(input_signature(b[child]) if child in b else None for b in batches)
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
    or the one ``source`` itself was taken from). Returns ``row``.
    """
    for name in ComponentRow.__dataclass_fields__:
        if name not in _OWN:
            setattr(row, name, getattr(source, name))
    kept = {k: v for k, v in row.details.items() if k in _OWN_DETAILS}
    taken = {k: v for k, v in source.details.items() if k not in _OWN_DETAILS}
    # A source that took its own row from another (an expert of a block that is itself a copy) names that one.
    origin = source.details.get("from", source.path) if source.details.get("as") == "representative" else source.path
    row.details = {**taken, **kept, "as": "representative", "from": origin}
    if row.status in ("ok", "estimated"):
        row.note = f"taken from {origin or 'root'}, a representative of its repeated structure"
    elif row.note:
        row.note = f"as {origin or 'root'}: {row.note}"
    return row
