"""The benchmarks' access to ``examples/``: scripts, not a package, imported by path once each."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(name: str) -> ModuleType:
    """``examples/<name>.py`` as the module ``cb_example_<name>`` (imported on the first call)."""
    key = f"cb_example_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, EXAMPLES / f"{name}.py")
        assert spec is not None and spec.loader is not None  # a file that exists
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]
