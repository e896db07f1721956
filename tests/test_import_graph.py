"""The package's import structure: no module-level import cycle, layers kept, Lightning in one file.

Every module of ``cb_callback`` (and ``cb_callback.integrations``) is parsed with
``ast``; an edge ``a -> b`` is an import of ``b`` that runs when ``a`` is
imported: at module level or in a class body, inside ``if``/``try``/``with``,
but not under ``if TYPE_CHECKING:`` and not inside a function (a lazy import
runs when called, after both modules exist). ``from pkg import name`` is an
edge to ``pkg.name`` when that is a module, else to ``pkg``. The implicit
import of a module's parent packages is not an edge: every submodule would
otherwise sit in a cycle with its package's ``__init__``.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import cb_callback

Graph = dict[str, set[str]]
_TRY = tuple(t for t in (getattr(ast, "Try", None), getattr(ast, "TryStar", None)) if t is not None)


def _modules(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``root`` (the package ``package``)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join([package, *parts])] = path
    return out


def _package_modules() -> dict[str, Path]:
    found = _modules(Path(cb_callback.__file__).parent, "cb_callback")
    spec = importlib.util.find_spec("cb_callback.integrations")
    assert spec is not None and spec.submodule_search_locations
    for location in spec.submodule_search_locations:
        found.update(_modules(Path(location), "cb_callback.integrations"))
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_time_nodes(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements that run when the module body runs."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _import_time_nodes(node.body)
            yield from _import_time_nodes(node.orelse)
        elif isinstance(node, ast.ClassDef):
            yield from _import_time_nodes(node.body)
        elif isinstance(node, _TRY):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _import_time_nodes(block)
        elif isinstance(node, (ast.With, ast.AsyncWith, ast.For, ast.AsyncFor, ast.While)):
            yield from _import_time_nodes(node.body)
            yield from _import_time_nodes(getattr(node, "orelse", []))


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in known}
    base = node.module or ""
    if node.level:
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join([*parts, *([node.module] if node.module else [])])
    out = set()
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        if sub in known:
            out.add(sub)
        elif base in known:
            out.add(base)
    return out


def import_graph(modules: dict[str, Path]) -> Graph:
    """The module-level import edges among ``modules`` (see the module docstring)."""
    known = set(modules)
    graph: Graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        graph[name] = set()
        for node in _import_time_nodes(tree.body):
            graph[name] |= _targets(node, name, is_package, known) - {name}
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_one_cycle(graph, component) for component in components]


def _one_cycle(graph: Graph, component: set[str]) -> list[str]:
    """A concrete cycle ``[a, b, ..., a]`` inside ``component``."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth-first: the shortest way back to start
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start} in {sorted(component)}")


def _closure(graph: Graph, start: str) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for w in graph[todo.pop()]:
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


GRAPH = import_graph(_package_modules())


def test_the_package_has_no_module_level_import_cycle() -> None:
    found = cycles(GRAPH)
    assert not found, "module-level import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_graph_sees_the_package() -> None:
    # A checker that parsed nothing would pass the test above: pin what it must see.
    assert {"cb_callback", "cb_callback._callback", "cb_callback.reporters", "cb_callback.integrations.torchrec"} <= set(GRAPH)
    assert "cb_callback._schema" in GRAPH["cb_callback._report"]  # STATUSES, from the leaf module
    assert "cb_callback._schema" in GRAPH["cb_callback._table"]
    assert "cb_callback._report" not in GRAPH["cb_callback._table"]  # only under TYPE_CHECKING there
    assert "cb_callback._table" not in GRAPH["cb_callback._report"]  # Report.summary calls it via RENDERERS
    assert "cb_callback" in GRAPH["cb_callback.integrations.torchrec._fused"]  # `import cb_callback`
    assert GRAPH["cb_callback._schema"] == set()


def test_the_checker_finds_a_cycle_and_prints_it(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("from . import c\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    (pkg / "d.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n"
        "def f():\n    from pkg import a\n"
    )
    graph = import_graph(_modules(pkg, "pkg"))
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.c"}, "pkg.c": {"pkg.a"}, "pkg.d": set()}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]


def test_reporters_import_only_the_model_of_results_layer() -> None:
    # Rendering is the last layer: nothing the public reporters import reaches the engine.
    reached = _closure(GRAPH, "cb_callback.reporters")
    assert reached == {
        "cb_callback.reporters", "cb_callback._files", "cb_callback._icicle", "cb_callback._table",
        "cb_callback._tensorboard", "cb_callback._schema",
        "cb_callback._html",  # issue 9: FileReporter writes report.html (a renderer, same layer)
    }  # fmt: skip


def test_only_the_callback_module_imports_lightning() -> None:
    importers = set()
    for name, path in _package_modules().items():
        for node in ast.walk(ast.parse(path.read_text())):  # in functions too
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            if any(n.split(".")[0] in ("lightning", "pytorch_lightning") for n in names):
                importers.add(name)
    assert importers == {"cb_callback._callback"}


@pytest.mark.parametrize("module", ["cb_callback", "cb_callback.reporters"])
def test_importing_does_not_import_lightning(module: str) -> None:
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
