"""Whether a ``spawn``-ed child process can profile a snapshot of a model class.

Fork mode starts its child with ``multiprocessing``'s ``spawn``: a fresh
interpreter that re-imports the training script and unpickles the model. These
checks run before training, so the callback can say the fix (and fall back to
profiling in-process) instead of failing in the child.
"""

from __future__ import annotations

import multiprocessing
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

__all__ = ["fork_problem", "fork_sharded_problem", "refuse_training_in_spawned_child", "spawn_problem"]

_GUARD_RE = re.compile(r"""__name__\s*==\s*["']__main__["']""")


def refuse_training_in_spawned_child() -> None:
    """Fail fast when this process is a ``spawn`` child still importing ``__main__``.

    Raises:
        RuntimeError: the training script trains at import (no ``__main__`` guard),
            so the profiling child is about to train again.
    """
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise RuntimeError(
            "cb_callback: training started while the profiling child process was importing the "
            'training script: put the training code under an `if __name__ == "__main__":` guard'
        )


def spawn_problem(model_cls: type) -> str | None:
    """Why a spawned child could not profile a snapshot of ``model_cls``, or ``None``.

    ``spawn`` re-imports the parent's ``__main__`` in the child (unless it was run
    as ``python -m pkg`` / ``pkg.__main__``): an unguarded script would train
    again there, and a class defined in a ``__main__`` that is not re-imported
    (a notebook, ``python -c``, ``python -m pkg``) cannot be unpickled.

    Returns:
        The problem and its fix, in words, or ``None`` when there is none.
    """
    main = sys.modules.get("__main__")
    spec_name = getattr(getattr(main, "__spec__", None), "name", None)
    main_file = getattr(main, "__file__", None)
    reimported = (spec_name is not None and spec_name != "__main__" and not spec_name.endswith(".__main__")) or (
        spec_name is None and main_file is not None
    )
    name = f"{model_cls.__module__}.{model_cls.__qualname__}"
    if "<locals>" in model_cls.__qualname__:
        return (
            f"the LightningModule class {name} is defined inside a function, so the spawned profiling "
            "process cannot import it; define it at the top level of a module (or use mode='pause')"
        )
    if model_cls.__module__ == "__main__" and not reimported:
        where = main_file or "an interactive session or notebook"
        return (
            f"the LightningModule class {name} is defined in `__main__` ({where}), which the spawned "
            "profiling process cannot import; move the class into an importable module "
            "(or use mode='pause')"
        )
    if reimported and main_file is not None and str(main_file).endswith(".py"):
        try:
            source = Path(main_file).read_text(errors="replace")
        except OSError:
            return None
        if not _GUARD_RE.search(source):
            return (
                f"mode='fork' starts the profiling process with multiprocessing's 'spawn', which "
                f"re-imports the training script {main_file}; it has no "
                '`if __name__ == "__main__":` guard, so the child would run the training again. '
                "Put the training code under that guard (or use mode='pause')"
            )
    return None


def fork_problem(model_cls: type) -> str | None:
    """The warning for a fork-mode run that must profile in-process instead, or ``None``.

    Raises:
        RuntimeError: this process is the spawned child importing the training
            script (see :func:`refuse_training_in_spawned_child`).
    """
    refuse_training_in_spawned_child()
    problem = spawn_problem(model_cls)
    if problem is None:
        return None
    return (
        f"cb_callback: ComponentBenchmark(mode='fork') cannot fork: {problem}. Profiling in-process "
        "(mode='pause') instead."
    )


def fork_sharded_problem(module: nn.Module, world_size: int) -> str | None:
    """The warning for a fork-mode capture of a sharded model over several ranks, or ``None``.

    A forked child has no process group: it could not replay an FSDP2 unit, a
    torchrec sharded module or anything else that must run on every rank
    together. Such a capture is profiled in-process, in lockstep, instead.
    """
    if world_size <= 1:
        return None
    from cb_callback._engine.distributed.collectives import lockstep_reasons
    from cb_callback._engine.distributed.fsdp import has_unit

    why = "it holds FSDP2 units" if has_unit(module) else lockstep_reasons({"": module}).get("")
    if why is None:
        return None
    return (
        f"cb_callback: ComponentBenchmark(mode='fork') cannot fork a sharded model over {world_size} ranks ({why}): "
        "its child process has no process group. Profiling in-process (mode='pause'), every rank in lockstep, instead."
    )
