"""The component tree: one node per distinct module, in breadth-first order."""

from __future__ import annotations

import fnmatch
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from cb_callback._engine.capture.inputs import ComponentInputs

__all__ = [
    "SCRIPTED",
    "SCRIPTED_UNREAD",
    "Node",
    "Placement",
    "build_tree",
    "component_paths",
    "filter_reasons",
    "owner",
    "register_module_unwrapper",
    "scripted",
]

#: The note of a TorchScript module's row.
SCRIPTED = (
    "a TorchScript module (torch.jit.script / torch.jit.trace): it refuses module hooks, so it is replayed "
    "whole from the calls a global hook captured, has no in-situ time of its own (a parent's counts it) and "
    "the modules inside it get no rows (profile the nn.Module before scripting or tracing it to see them)"
)
#: Why a TorchScript module's row fails when its call's keyword arguments could not be read.
SCRIPTED_UNREAD = (
    "a TorchScript module (torch.jit.script / torch.jit.trace) cannot be hooked (register_forward_pre_hook "
    "is not supported on ScriptModules), and the keyword arguments of its call could not be read: its inputs "
    "were not captured, so it is not replayed alone; its time is in its parent's own time"
)


def scripted(module: nn.Module) -> bool:
    """Whether ``module`` is a TorchScript module (``torch.jit.script`` or ``torch.jit.trace`` output).

    Notes:
        Such a module refuses module hooks: the engine hooks none of them. The capture takes its calls
        with global forward hooks (:class:`cb_callback._engine.capture.capture.Capture`), so it is
        replayed whole; it is a leaf of the component tree (:func:`component_paths`): the modules
        compiled inside it get no rows (their calls run inside TorchScript, where no Python hook sees
        them). Neither the in-situ clock nor the census sees it apart: its in-situ time and its
        census counts are its parent's own.
    """
    return isinstance(module, torch.jit.ScriptModule)


_UNWRAPPERS: list[Callable[[nn.Module], nn.Module | None]] = []


def register_module_unwrapper(fn: Callable[[nn.Module], nn.Module | None]) -> None:
    """Have a wrapper module stand for the module it wraps, in every path the engine names.

    ``fn(module)`` returns the module a wrapper stands for (a descendant of it), or
    ``None`` for any other module. The wrapper keeps its own path and row; the
    wrapped module's children take paths below the wrapper's, and the modules
    in between (the wrapper's plumbing, e.g. ``_dmp_wrapped_module.module`` of
    torchrec's ``DistributedModelParallel``) get no path and no row. Register at
    import time (an integration does on import).

    Raises:
        ValueError: ``fn`` is already registered, or is not callable.
    """
    if not callable(fn):
        raise ValueError(f"register_module_unwrapper({fn!r}): expected a callable fn(module) -> module or None")
    if fn in _UNWRAPPERS:
        raise ValueError(f"module unwrapper {fn!r} is already registered")
    _UNWRAPPERS.append(fn)


def _renames(root: nn.Module) -> list[tuple[str, str]]:
    """``(chain, wrapper)`` raw names: below ``chain`` (the wrapped module) names start at ``wrapper``."""
    if not _UNWRAPPERS:
        return []
    out = []
    for raw, module in root.named_modules(remove_duplicate=False):
        for fn in _UNWRAPPERS:
            inner = fn(module)
            if inner is None or inner is module:
                continue
            rel = next((r for r, m in module.named_modules() if m is inner and r), None)
            if rel is not None:
                out.append((f"{raw}.{rel}" if raw else rel, raw))
    return out


def _renamed(name: str, renames: list[tuple[str, str]]) -> str | None:
    """``name`` with each wrapper's plumbing taken out; ``None`` for a module of that plumbing."""
    for chain, wrapper in renames:
        inside = wrapper == "" or name.startswith(wrapper + ".")
        if name != wrapper and inside and (name == chain or chain.startswith(name + ".")):
            return None
        if name.startswith(chain + "."):
            rest = name[len(chain) + 1 :]
            name = f"{wrapper}.{rest}" if wrapper else rest
    return name


@dataclass
class Node:
    """One component.

    Attributes:
        path: first dotted name of the module in ``named_modules()`` (root ``""``).
        module_type: the class name.
        depth: number of dots + 1 (root 0).
        parent: the parent's path, ``None`` for the root.
        children: child paths in report order.
        index: position in ``named_modules(remove_duplicate=False)`` (ties in the ordering).
        aliases: the module's other paths under the same parent (``nn.ModuleList([block] * 4)``:
            ``blocks.1`` … of ``blocks.0``).
        shared_with: the module's nodes under other parents (one ``Linear`` used by
            ``a`` and ``b``: ``b.lin`` for ``a.lin``).
    """

    path: str
    module_type: str
    depth: int
    parent: str | None
    index: int
    children: list[str] = field(default_factory=list)
    aliases: list[str] = field(default_factory=list)
    shared_with: list[str] = field(default_factory=list)


@dataclass
class Placement:
    """Where one module stands in the tree: one per distinct parent it is reachable from.

    Attributes:
        path: the node's path: the module's first name under ``parent``.
        module: the module.
        parent: the parent node's path (``None`` for the root).
        index: position in ``named_modules(remove_duplicate=False)``.
        aliases: its other names under the same parent.
    """

    path: str
    module: nn.Module
    parent: str | None
    index: int
    aliases: list[str] = field(default_factory=list)


def component_paths(root: nn.Module) -> dict[str, Placement]:
    """The tree's nodes by path: a module once per distinct parent it is reachable from.

    A module registered once is one node under its name. A module reachable from
    several parents (one ``Linear`` inside both ``a`` and ``b``) is one node under
    each (``a.lin`` and ``b.lin``): the calls made inside ``a`` are ``a.lin``'s, those
    inside ``b`` are ``b.lin``'s (see :class:`cb_callback._engine.capture.capture.Capture`), so
    calls, shares, estimates and the parent checks stay per parent. Several names
    under the same parent (``nn.ModuleList([block] * 4)``: ``blocks.0`` …
    ``blocks.3``) cannot be told apart by who calls them: they are one node under
    the first name, the others its ``aliases``, and a descendant reached through
    an alias is the first name's descendant. Ordered as ``named_modules``
    enumerates them (parents before children). A TorchScript module is a leaf
    (:func:`scripted`): the modules inside it get no node.
    """
    out: dict[str, Placement] = {}
    canon: dict[str, str] = {}  # every name -> the node it is
    node_of: dict[tuple[int, str | None], str] = {}  # (module, parent node) -> node path
    renames = _renames(root)
    sealed: list[str] = []  # raw names of the TorchScript modules met: nothing below them is a node
    for index, (raw, mod) in enumerate(root.named_modules(remove_duplicate=False)):
        if any(raw.startswith(f"{s}.") if s else raw != "" for s in sealed):
            continue
        if scripted(mod):
            sealed.append(raw)
        renamed = _renamed(raw, renames)
        if renamed is None:  # a wrapper's plumbing (register_module_unwrapper)
            continue
        name = renamed
        if name == "":
            canon[""] = ""
            node_of[(id(mod), None)] = ""
            out[""] = Placement("", mod, None, index)
            continue
        up, _, last = name.rpartition(".")
        parent = canon.get(up, up)
        key = (id(mod), parent)
        if key in node_of:
            canon[name] = node_of[key]
            if canon.get(up, up) == up:  # a name of its own under a real parent: an alias
                out[node_of[key]].aliases.append(name)
            continue
        path = last if parent == "" else f"{parent}.{last}"
        canon[name] = node_of[key] = path
        out[path] = Placement(path, mod, parent, index)
    return out


def owner(places: Sequence[tuple[str, str | None]], running: Sequence[str]) -> str:
    """The node a call of a module belongs to, given its ``(path, parent)`` nodes and the nodes running
    now (innermost last): the node whose parent is the innermost running one, else its first node."""
    if len(places) > 1:
        for outer in reversed(running):
            for path, parent in places:
                if parent == outer:
                    return path
    return places[0][0]


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
    ``params_mb`` and its replay. A module reachable from several parents is one
    node under each, several names under one parent are one node
    (:func:`component_paths`). A
    node's execution order is its own first call, or, if never called itself (a
    ``ModuleList``), its earliest-called descendant; never-run nodes come last,
    in registration order.
    """
    nodes: dict[str, Node] = {}
    modules: dict[str, nn.Module] = {}
    placed = component_paths(root)
    holders = [p for p, at in placed.items() if isinstance(at.module, _PARAMETER_HOLDERS) and p not in calls]
    by_module: dict[int, list[str]] = {}
    for path, at in placed.items():
        depth = _depth(path)
        if max_depth is not None and depth > max_depth:
            continue
        if any(path == h or path.startswith(h + ".") for h in holders):
            continue
        nodes[path] = Node(path, type(at.module).__name__, depth, at.parent, at.index, aliases=list(at.aliases))
        modules[path] = at.module
        by_module.setdefault(id(at.module), []).append(path)
    for paths in by_module.values():
        for p in paths if len(paths) > 1 else ():
            nodes[p].shared_with = [q for q in paths if q != p]
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
