"""House rules the whole package keeps, read from its source with ``ast``.

A function's length is ``end_lineno - lineno + 1`` of its ``def`` (its decorators not
counted, its docstring counted). A nested function counts within its parent and on
its own, so a parent cannot hide a long step inside itself.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

import cb_callback

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
