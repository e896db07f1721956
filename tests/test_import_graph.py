"""The package's import structure: no import cycle of any kind, the layers kept, Lightning in one file.

Every module of ``cb_callback`` (and ``cb_callback.integrations``) is parsed with
``ast``; an edge ``a -> b`` is any import of ``b`` written in ``a``, wherever it
stands: at module level, in a function (a lazy import), under ``if
TYPE_CHECKING:``. ``from pkg import name`` is an edge to ``pkg.name`` when that
is a module, else to ``pkg``. The implicit import of a module's parent packages
is not an edge: every submodule would otherwise sit in a cycle with its
package's ``__init__`` (the folders' ``__init__`` files import nothing).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import itertools
import subprocess
import sys
from pathlib import Path

import pytest

import cb_callback

Graph = dict[str, set[str]]


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
    """Every import edge among ``modules``, wherever the import stands (see the module docstring)."""
    known = set(modules)
    graph: Graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        graph[name] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
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


@functools.cache
def package_graph() -> Graph:
    """The package's import graph, parsed once, on first use (not at collection in every xdist worker: ~1 s)."""
    return import_graph(_package_modules())


#: Each module's layer, by the longest matching prefix; a module may import its own layer or lower.
#: DESIGN.md's layers: the model of results at the bottom (beside the hardware tables), the engine
#: and the renderers above it, the metric plugins written against the engine's contracts, then the
#: what-ifs (the compile what-if is installed into the engine by ``_api``, not imported by it), the
#: Lightning wing, the entry points and the integrations.
LAYERS: dict[str, int] = {
    "cb_callback._report.schema": 0,
    "cb_callback._report.model": 0,
    "cb_callback._report.discover": 0,  # finding reports on disk (stdlib only): what Report.load resolves with
    "cb_callback._report.context": 0,
    "cb_callback._report.finite": 0,  # which values are numbers (stdlib only): the engine's and the renderers' rule
    "cb_callback._report.headroom": 0,  # headroom_ms's formula: the engine derives with it, Report.from_dict on load
    "cb_callback._hardware": 0,
    "cb_callback._types": 0,  # the named Any aliases (typing only)
    "cb_callback._report": 1,
    "cb_callback._engine": 1,
    "cb_callback._metrics": 2,
    "cb_callback._whatif": 3,
    "cb_callback._lightning": 4,
    "cb_callback._api": 5,
    "cb_callback._cli": 5,
    "cb_callback.reporters": 5,
    "cb_callback.plugins": 5,
    "cb_callback.testing": 5,  # assert_no_regression: an entry point for test suites, over the gate
    "cb_callback": 6,
    "cb_callback.integrations": 7,
}


def _layer(module: str) -> int:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[best]


def test_there_is_no_import_cycle_of_any_kind() -> None:
    found = cycles(package_graph())
    assert not found, "import cycles (every import counts):\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_graph_sees_the_package_and_every_kind_of_import() -> None:
    # A checker that parsed nothing would pass the test above: pin what it must see.
    assert {"cb_callback", "cb_callback._lightning.callback", "cb_callback.reporters",
            "cb_callback.integrations.torchrec", "cb_callback._engine.run.profile"} <= set(package_graph())  # fmt: skip
    assert "cb_callback._report.schema" in package_graph()["cb_callback._report.model"]
    assert "cb_callback._report.model" in package_graph()["cb_callback._report.table"]  # under TYPE_CHECKING there
    assert "cb_callback" in package_graph()["cb_callback.integrations.torchrec._fused"]  # `import cb_callback`
    assert package_graph()["cb_callback._report.schema"] == set()


def test_the_checker_counts_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("from . import c\n")
    (pkg / "c.py").write_text("def f():\n    import pkg.a\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n")
    graph = import_graph(_modules(pkg, "pkg"))
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.c"}, "pkg.c": {"pkg.a"}, "pkg.d": {"pkg.a"}}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]


def test_every_import_goes_to_its_own_layer_or_below() -> None:
    graph = package_graph()
    upward = sorted(
        f"{a} ({_layer(a)}) -> {b} ({_layer(b)})" for a, bs in graph.items() for b in bs if _layer(b) > _layer(a)
    )
    assert not upward, "imports of a higher layer:\n" + "\n".join(upward)


def test_the_results_model_and_the_hardware_tables_import_only_their_own_folder() -> None:
    for module, deps in package_graph().items():
        if module.startswith(("cb_callback._report.", "cb_callback._hardware.")):
            folder = module.rsplit(".", 1)[0]
            assert all(d.startswith(folder + ".") for d in deps), (module, deps)


def test_the_results_model_imports_no_renderer() -> None:
    # the statuses, and finding a report on disk (Report.load accepts what `cb report` does); no renderer
    # and headroom_ms's formula, which a report written before the column is given on load (issue 26)
    assert package_graph()["cb_callback._report.model"] == {
        "cb_callback._report.schema", "cb_callback._report.discover", "cb_callback._report.headroom",
    }  # fmt: skip
    assert package_graph()["cb_callback._report.headroom"] == {"cb_callback._report.finite"}
    assert package_graph()["cb_callback._report.discover"] == set()  # the standard library only


def test_integrations_use_the_public_surface_only() -> None:
    public = {"cb_callback", "cb_callback.plugins", "cb_callback.reporters"}
    for module, deps in package_graph().items():
        if module.startswith("cb_callback.integrations"):
            assert {d for d in deps if not d.startswith("cb_callback.integrations")} <= public, (module, deps)


def test_the_package_folders_import_nothing_themselves() -> None:
    for module, path in _package_modules().items():
        if path.name == "__init__.py" and module.count(".") == 1 and module.startswith("cb_callback._"):
            assert package_graph()[module] == set(), module


def test_reporters_import_only_the_reporting_folder() -> None:
    # Rendering is the last layer: nothing the public reporters import reaches the engine.
    reached = _closure(package_graph(), "cb_callback.reporters") - {"cb_callback.reporters"}
    assert reached and all(m.startswith("cb_callback._report.") for m in reached), sorted(reached)


def test_only_the_callback_module_imports_lightning() -> None:
    importers = set()
    for name, path in _package_modules().items():
        for node in ast.walk(ast.parse(path.read_text())):  # in functions too
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            if any(n.split(".")[0] in ("lightning", "pytorch_lightning") for n in names):
                importers.add(name)
    assert importers == {"cb_callback._lightning.callback"}


HEAVY = ("lightning", "pytorch_lightning", "pandas", "matplotlib", "tensorboard", "torchrec", "fbgemm_gpu")

#: Each import, and what it must not import: the engine alone is torch and nothing heavy beside it (issue 15).
LIGHT_IMPORTS: list[tuple[str, tuple[str, ...]]] = [
    # torchrec (and its fbgemm_gpu) only once a model holds its types (cb_callback.integrations.torchrec)
    ("import cb_callback", (*HEAVY, "plotly")),
    ("from cb_callback import *", HEAVY),
    ("import cb_callback.plugins", HEAVY),
    ("import cb_callback.reporters", ("lightning", "pytorch_lightning", "torchrec", "fbgemm_gpu")),
]


def test_importing_does_not_import_what_it_does_not_need() -> None:
    # The imports one after another in one fresh process (one torch import, not four), each checked against
    # everything imported so far. That is at least as strict as a fresh process each: every statement imports
    # `cb_callback` first (what the first one did), and each list of absent packages is within the one
    # before it, so a package the earlier statements brought in fails the later check too.
    lines = ["import sys", "found = []"]
    for statement, absent in LIGHT_IMPORTS:
        lines += [statement, f"found.append(sorted({{m.split('.')[0] for m in sys.modules}} & set({absent!r})))"]
    lines.append("print(found)")
    out = subprocess.run([sys.executable, "-c", "\n".join(lines)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == repr([[] for _ in LIGHT_IMPORTS]), (LIGHT_IMPORTS, out.stdout)
    assert all(set(b) <= set(a) for (_, a), (_, b) in itertools.pairwise(LIGHT_IMPORTS))  # (the argument above)


def test_the_engine_is_rooms_each_a_documented_folder_that_imports_nothing() -> None:
    engine = Path(cb_callback.__file__).parent / "_engine"
    loose = sorted(p.name for p in engine.glob("*.py") if p.name != "__init__.py")
    assert loose == [], f"engine modules outside a room: {loose}"
    rooms = sorted(p.name for p in engine.iterdir() if (p / "__init__.py").exists())
    assert rooms == ["capture", "clocks", "counting", "derive", "distributed", "replay", "run", "selection"]
    for room in rooms:
        module = f"cb_callback._engine.{room}"
        assert package_graph()[module] == set(), module
        doc = ast.get_docstring(ast.parse((engine / room / "__init__.py").read_text())) or ""
        assert "Takes" in doc and "gives" in doc, f"{module}'s docstring says what it takes and what it gives"


def test_the_engine_imports_neither_its_metric_plugins_nor_the_what_ifs() -> None:
    # The arrows that ran up (issue 25): the built-ins are installed into the engine by _api.
    up = sorted(
        f"{a} -> {b}"
        for a, bs in package_graph().items()
        if a.startswith("cb_callback._engine")
        for b in bs
        if b.startswith(("cb_callback._metrics", "cb_callback._whatif"))
    )
    assert up == []


def test_an_extension_nothing_installed_says_which_and_how() -> None:
    # The engine calls up through EXTENSIONS; _api installs every field on `import cb_callback`.
    from cb_callback._engine.run.extensions import EXTENSIONS, Extensions

    assert all(getattr(EXTENSIONS, f) is not None for f in Extensions.__dataclass_fields__)
    with pytest.raises(RuntimeError, match=r"extension 'compile_what_if' is not set; import cb_callback"):
        Extensions().get("compile_what_if")
