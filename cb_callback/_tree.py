"""The component tree: one node per distinct module, in breadth-first order."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from torch import nn

from cb_callback._inputs import ComponentInputs

__all__ = ["Node", "build_tree", "filter_reason"]


@dataclass
class Node:
    """One component.

    Attributes:
        path: first dotted name of the module in ``named_modules()`` (root ``""``).
        module_type: the class name.
        depth: number of dots + 1 (root 0).
        parent: the parent's path, ``None`` for the root.
        children: child paths in report order.
        index: position in ``named_modules()`` (ties in the ordering).
    """

    path: str
    module_type: str
    depth: int
    parent: str | None
    index: int
    children: list[str] = field(default_factory=list)


_PARAMETER_HOLDERS = (nn.ParameterList, nn.ParameterDict)


def _depth(path: str) -> int:
    return 0 if path == "" else path.count(".") + 1


def build_tree(
    root: nn.Module,
    calls: Mapping[str, ComponentInputs],
    max_depth: int | None = None,
) -> tuple[list[Node], dict[str, nn.Module]]:
    """Nodes in breadth-first order (depth, then first execution), and their modules.

    Parameter holders (``nn.ParameterList``, ``nn.ParameterDict``) are not
    components: they have no forward; their parameters count in the parent's
    ``params_mb`` and its replay. A module registered under several names is one
    node, under its first name. A
    node's execution order is its own first call, or, if never called itself (a
    ``ModuleList``), its earliest-called descendant; never-run nodes come last,
    in registration order.
    """
    nodes: dict[str, Node] = {}
    modules: dict[str, nn.Module] = {}
    holders = [
        p for p, m in root.named_modules() if isinstance(m, _PARAMETER_HOLDERS) and p not in calls
    ]
    for i, (path, mod) in enumerate(root.named_modules()):
        depth = _depth(path)
        if max_depth is not None and depth > max_depth:
            continue
        if any(path == h or path.startswith(h + ".") for h in holders):
            continue
        parent = None if path == "" else (path.rsplit(".", 1)[0] if "." in path else "")
        nodes[path] = Node(path, type(mod).__name__, depth, parent, i)
        modules[path] = mod
    never = float("inf")
    first: dict[str, float] = {p: (calls[p].order if p in calls else never) for p in nodes}
    for path in sorted(nodes, key=lambda p: -nodes[p].depth):
        parent = nodes[path].parent
        if parent is not None and parent in first:
            first[parent] = min(first[parent], first[path])
    ordered = sorted(nodes.values(), key=lambda n: (n.depth, first[n.path], n.index))
    for n in ordered:
        if n.parent is not None and n.parent in nodes:
            nodes[n.parent].children.append(n.path)
    return ordered, modules


def filter_reason(path: str, include: Sequence[str], exclude: Sequence[str]) -> str | None:
    """Why ``path`` is filtered out by the glob patterns, or ``None`` if it is kept.

    The root's path is matched as ``""``; patterns use :mod:`fnmatch` (``*`` also
    matches dots).
    """
    if include and not any(fnmatch.fnmatchcase(path, p) for p in include):
        return f"not matched by include={list(include)}"
    for p in exclude:
        if fnmatch.fnmatchcase(path, p):
            return f"matched exclude pattern {p!r}"
    return None
