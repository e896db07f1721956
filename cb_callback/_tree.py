"""The component tree: one node per distinct module, in breadth-first order."""

from __future__ import annotations

import fnmatch
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from torch import nn

from cb_callback._inputs import ComponentInputs

__all__ = ["Node", "build_tree", "filter_reasons"]


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


def _ancestors(path: str) -> list[str]:
    """``"a.b.c"`` -> ``["", "a", "a.b"]``; the root has none."""
    if path == "":
        return []
    parts = path.split(".")
    return ["", *(".".join(parts[:i]) for i in range(1, len(parts)))]


def filter_reasons(paths: Sequence[str], include: Sequence[str], exclude: Sequence[str]) -> dict[str, str]:
    """Why each filtered-out path is filtered out; the paths that are kept are absent.

    A path is kept when it is not matched by an ``exclude`` pattern and either
    ``include`` is empty, it is matched by an ``include`` pattern, or it is an
    ancestor of a kept matching path (the parents that lead to it, the root
    included). Exclude wins: an excluded path is never kept, and an excluded
    match does not keep its ancestors.

    Args:
        paths: every component's dotted path (the root's is ``""``).
        include: :mod:`fnmatch` glob patterns (``*`` also matches dots).
        exclude: same.

    Returns:
        ``{path: reason}`` for the paths filtered out.

    Warns:
        RuntimeWarning: once per call, naming the ``include`` patterns that match
            no path and a few real paths.
    """
    excluded: dict[str, str] = {}
    for path in paths:
        hit = next((p for p in exclude if fnmatch.fnmatchcase(path, p)), None)
        if hit is not None:
            excluded[path] = f"matched exclude pattern {hit!r}"
    if not include:
        return excluded
    matched = {p: [path for path in paths if fnmatch.fnmatchcase(path, p)] for p in include}
    unmatched = [p for p, hits in matched.items() if not hits]
    if unmatched:
        examples = [path for path in paths if path != ""][:5]
        warnings.warn(
            f"cb_callback: include pattern(s) {unmatched} match no component, so they profile "
            f"nothing; component paths look like {examples} (fnmatch globs on the dotted path, "
            "the root is '')",
            RuntimeWarning,
            stacklevel=3,
        )
    kept: set[str] = set()
    for hits in matched.values():
        for path in hits:
            if path not in excluded:
                kept.add(path)
                kept.update(_ancestors(path))
    out = dict(excluded)
    for path in paths:
        if path not in kept and path not in out:
            out[path] = f"not matched by include={list(include)}"
    return out
