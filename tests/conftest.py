"""Shared fixtures: every test proves hooks never leak."""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn

# Tests never read or write the user's kept CPU peak calibrations (cb_callback._hardware.cache):
# a cache of their own for this run, inherited by the processes they start; each test
# starts from an empty one (_own_peak_cache), so a fake clock's figure never reaches the next.
os.environ["CB_CACHE_DIR"] = tempfile.mkdtemp(prefix="cb-test-cache-")

# One compute thread, here and in the processes the tests start (examples, 2-rank scripts, fork
# mode's child): on a 2-CPU machine shared with other work, two OpenMP threads wait at every op's
# barrier for the one the scheduler took away (the what-if example took 35 s on 2 threads under
# load, 9 s on 1). Tests about thread counts set their own (torch.set_num_threads).
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _own_peak_cache(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    monkeypatch.setenv("CB_CACHE_DIR", str(tmp_path_factory.mktemp("peak-cache")))


# Settings that make a replay cheap and deterministic: one untimed warm-up-free run.
FAST: dict[str, Any] = dict(warmup=0, min_run_time_s=0.0, min_repeats=1, max_repeats=1, load_plugins=False)


@pytest.fixture(autouse=True)
def no_leaked_hooks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail a test that leaves a forward (pre-)hook installed by cb_callback."""
    installed: list[tuple[weakref.ref[nn.Module], int, str]] = []
    for kind in ("register_forward_pre_hook", "register_forward_hook"):
        original = getattr(nn.Module, kind)

        def wrapper(self: nn.Module, *args: Any, _orig: Any = original, _kind: str = kind, **kwargs: Any) -> Any:
            handle = _orig(self, *args, **kwargs)
            hook = args[0] if args else kwargs.get("hook")
            if str(getattr(hook, "__module__", "")).startswith("cb_callback"):
                installed.append((weakref.ref(self), handle.id, _kind))
            return handle

        monkeypatch.setattr(nn.Module, kind, wrapper)
    yield
    leaked = []
    for ref, hid, kind in installed:
        mod = ref()
        if mod is None:
            continue
        table = mod._forward_pre_hooks if kind == "register_forward_pre_hook" else mod._forward_hooks
        if hid in table:
            leaked.append(f"{type(mod).__name__}.{kind}#{hid}")
    assert not leaked, f"hooks left installed: {leaked}"


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def load_example(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` once (the examples are scripts, not a package)."""
    path = Path(__file__).resolve().parents[1] / "examples" / f"{name}.py"
    key = f"cb_examples_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


@pytest.fixture
def cuda_name(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """Make ``resolve_peaks`` see a CUDA device of the given name (there is no GPU here)."""
    import cb_callback._hardware.peaks as hw

    def set_name(name: str) -> None:
        monkeypatch.setattr(hw, "_cuda_device_name", lambda device: name)

    return set_name


def _file_seconds() -> dict[str, float]:
    """tests/durations.txt: what each test file took (scripts/test_durations.py writes it)."""
    table = Path(__file__).with_name("durations.txt")
    out: dict[str, float] = {}
    for line in table.read_text().splitlines() if table.is_file() else []:
        seconds, _, name = line.partition(" ")
        if not line.startswith("#") and name:
            out[name] = float(seconds)
    return out


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The costliest test files first (tests/durations.txt), each file's tests in their own order.

    ``make test`` hands whole files to the xdist workers in this order (``--dist loadfile
    --no-loadscope-reorder``): the long files start at once and the last to run are short, so at the
    end no worker waits long for the other. A file not in the table comes after, in collection order.
    """
    seconds = _file_seconds()
    order = {item.nodeid: i for i, item in enumerate(items)}
    items.sort(key=lambda item: (-seconds.get(item.nodeid.partition("::")[0], 0.0), order[item.nodeid]))
