"""House rules the whole package keeps, read from its source with ``ast``.

A function's length is ``end_lineno - lineno + 1`` of its ``def`` (its decorators not
counted, its docstring counted). A nested function counts within its parent and on
its own, so a parent cannot hide a long step inside itself.

An annotation is *bare* ``Any`` when it is the name ``Any`` (or ``typing.Any``) itself: a
parameter's (``*args`` and ``**kwargs`` included), a return's, an annotated assignment's.
Where a value's type is arbitrary by nature the package names why with an alias of
``cb_callback/_types.py`` (``UserValue``, ``OpValue``, ``OptionValue``,
``RankValue``); every other annotation names the type. ``Any`` nested in a generic
(``Callable[..., Any]``) is not bare.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

import cb_callback
import cb_callback.integrations

#: The longest a function may be, in lines (issue 25): past it, name the steps.
MOST_LINES = 80


class LongFunction(NamedTuple):
    """A function over the limit: its file (relative to the root searched), line, name and length."""

    path: str
    line: int
    name: str
    lines: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line} {self.name} ({self.lines} lines)"


def long_function_defs(root: Path, most: int = MOST_LINES) -> list[LongFunction]:
    """Every function (``def`` or ``async def``, nested ones too) under ``root`` longer than ``most`` lines.

    In file order (files sorted by path), then in ``ast.walk`` order within a file.
    """
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > most:
                    found.append(LongFunction(path.relative_to(root).as_posix(), node.lineno, node.name, lines))
    return found


def long_functions(root: Path, most: int = MOST_LINES) -> list[str]:
    """``path:line name (N lines)`` for every function under ``root`` longer than ``most`` lines."""
    return [str(f) for f in long_function_defs(root, most)]


def _is_any(annotation: ast.expr | None) -> bool:
    """Whether ``annotation`` is ``Any``: quoted or not, ``typing.Any``, or ``Any`` made optional
    (``Any | None``, ``Optional[Any]``), or ``Annotated[Any, ...]``."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):  # a quoted annotation
        annotation = ast.parse(annotation.value, mode="eval").body
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        sides = [annotation.left, annotation.right]
        others = [x for x in sides if not (isinstance(x, ast.Constant) and x.value is None)]
        return len(others) == 1 and _is_any(others[0])
    if isinstance(annotation, ast.Subscript) and _name(annotation.value) in ("Optional", "Annotated"):
        inner = annotation.slice
        return _is_any(inner.elts[0] if isinstance(inner, ast.Tuple) else inner)
    return _name(annotation) == "Any"


def _name(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else None


def bare_any(root: Path) -> list[str]:
    """``path:line name`` for every bare ``Any`` annotation under ``root`` (the module docstring's rule).

    Files sorted by path; within a file in ``ast.walk`` order (breadth-first: a function's parameters
    before the annotated assignments in its body).
    """
    found = []
    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
                found += [f"{where}:{p.lineno} {node.name}({p.arg})" for p in params if _is_any(p.annotation)]
                if _is_any(node.returns):
                    found.append(f"{where}:{node.lineno} {node.name} -> Any")
            elif isinstance(node, ast.AnnAssign) and _is_any(node.annotation):
                found.append(f"{where}:{node.lineno} {ast.unparse(node.target)}")
    return found


def test_no_annotation_in_the_package_or_the_integrations_is_a_bare_any() -> None:
    roots = [Path(cb_callback.__file__).parent, *map(Path, cb_callback.integrations.__path__)]
    found = [f"{root.name}/{f}" for root in roots for f in bare_any(root)]
    assert not found, "bare Any (name the type, or the _types alias that says why it is arbitrary):\n" + "\n".join(
        found
    )


def test_bare_any_finds_each_kind_of_annotation_and_only_those(tmp_path: Path) -> None:
    # A checker that found nothing would pass the test above: pin what it finds.
    (tmp_path / "a.py").write_text(
        """\
import typing
from typing import Any, Callable

def f(x: Any, *args: Any, y: int, **kw: typing.Any) -> Any:
    z: Any = 1
    w: "Any" = 2
    return z

def g(c: Callable[..., Any], d: list[Any], e: UserValue, o: int | None) -> int:
    v: dict[str, Any] = {}
    return 0

def h(p: Any | None, q: Optional[Any], r: Annotated[Any, "x"], t: "typing.Any | None") -> None:
    class K:
        k: Any
"""
    )
    assert bare_any(tmp_path) == [
        *("a.py:4 f(x)", "a.py:4 f(args)", "a.py:4 f(kw)", "a.py:4 f -> Any"),
        *("a.py:13 h(p)", "a.py:13 h(q)", "a.py:13 h(r)", "a.py:13 h(t)"),
        *("a.py:5 z", "a.py:6 w", "a.py:15 k"),
    ]


#: Package folders whose tests live elsewhere, and where: the counting room's FLOP and byte rules
#: are tested through the metrics that share them.
TESTED_ELSEWHERE = {"_engine/counting": "metrics", "_report/viewer_assets": "report"}
#: The test folder of ``_lightning``: a ``tests/lightning`` package would shadow Lightning in the
#: scripts run from ``tests/``.
RENAMED = {"_lightning": "callback"}
#: Test folders for what is not a folder of ``cb_callback/``: the integrations (their own
#: folder, mapped into the package) and the ``cb`` command (``cb_callback/_cli.py``).
BESIDE = {"integrations", "cli"}


def _package_folders(root: Path) -> set[str]:
    """The folders under ``root`` that hold a file: not ``__pycache__``, not hidden (``.ruff_cache``),
    not one a branch switch left with nothing but ``__pycache__``."""
    out = set()
    for p in root.rglob("*"):
        rel = p.relative_to(root)
        hidden = any(part.startswith(".") or part == "__pycache__" for part in rel.parts)
        if p.is_dir() and not hidden and any(f.is_file() for f in p.iterdir()):
            out.add(rel.as_posix())
    return out


def _subfolders(folder: str, folders: set[str]) -> list[str]:
    return [f.removeprefix(folder + "/") for f in folders if f.startswith(folder + "/")]


def test_the_tests_folders_mirror_the_packages() -> None:
    package = _package_folders(Path(cb_callback.__file__).parent)
    tests = _package_folders(Path(__file__).parent) - {"report/data", "report/data/report_v1"}
    expected = {
        "/".join(RENAMED.get(part, part.lstrip("_")) for part in folder.split("/"))
        for folder in package
        if folder not in TESTED_ELSEWHERE
    } | BESIDE
    assert tests == expected
    assert all((Path(__file__).parent / TESTED_ELSEWHERE[f]).is_dir() for f in TESTED_ELSEWHERE if f in package)
    # a folder split into rooms keeps its tests in them: none left beside them (tests/engine/test_x.py)
    here = Path(__file__).parent
    beside = [
        p.relative_to(here).as_posix()
        for folder in tests
        if _subfolders(folder, tests)
        for p in (here / folder).glob("test_*.py")
    ]
    assert not beside, f"test files beside their folder's rooms (move them into the room they test): {beside}"
    # every mirrored folder holds tests (an empty one mirrors nothing)
    assert all(list((here / f).rglob("test_*.py")) for f in tests if not f.startswith("report/data")), tests


def test_no_function_in_the_package_is_over_80_lines() -> None:
    found = long_function_defs(Path(cb_callback.__file__).parent)
    assert not found, f"functions over {MOST_LINES} lines (split them into named steps):\n" + "\n".join(map(str, found))


def test_the_length_counts_from_the_def_and_nested_functions_on_their_own(tmp_path: Path) -> None:
    # A checker that measured nothing would pass the test above: pin what it counts.
    source = """\
@decorator
def f():
    \"\"\"Doc.\"\"\"
    a = 1
    b = 2
    return a + b


async def g():
    a = 1
    b = 2
    return a + b


class C:
    def h(self):
        def inner():
            a = 1
            b = 2
            return a + b

        return inner
"""
    (tmp_path / "a.py").write_text(source)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.py").write_text("def short():\n    return 1\n")
    # f (line 2): def + docstring + 3 = 5, the decorator not counted; g (line 9): async def + 3 = 4;
    # h (line 16): def + inner's 4 + blank + return = 7; inner (line 17): def + 3 = 4; short: 2
    assert long_functions(tmp_path, most=3) == [
        "a.py:2 f (5 lines)",
        "a.py:9 g (4 lines)",
        "a.py:16 h (7 lines)",
        "a.py:17 inner (4 lines)",
    ]
    assert long_functions(tmp_path, most=4) == ["a.py:2 f (5 lines)", "a.py:16 h (7 lines)"]
    assert long_functions(tmp_path, most=1) == [
        "a.py:2 f (5 lines)",
        "a.py:9 g (4 lines)",
        "a.py:16 h (7 lines)",
        "a.py:17 inner (4 lines)",
        "sub/b.py:1 short (2 lines)",
    ]
    assert long_functions(tmp_path, most=7) == []
