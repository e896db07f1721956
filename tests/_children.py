"""Fork mode's child forked from the test's process, for tests of what the child does rather than how it starts."""

from __future__ import annotations

import multiprocessing
from typing import Any


def forked_children(monkeypatch: Any) -> None:
    """Start fork mode's profiling child with ``fork``, not the product's ``spawn``.

    A real ``spawn`` child imports torch, Lightning and the model's module again: 4-5 CPU-seconds a child. A
    forked one starts with what the test's process imported. It still loads the snapshot from disk, profiles it
    and writes the report, and the parent still waits for it, reads its files and exit code. What it does not
    test is the start itself: the re-import, the ``__main__`` guard, an unimportable class. The real ``spawn``
    child stays under test in tests/callback/test_callback.py's MLP case, tests/callback/test_callback_fork.py's
    crashing child and the FSDP2 script's fork mode (tests/_fsdp_lightning_script.py).
    """
    from cb_callback._lightning import child as child_module

    monkeypatch.setattr(child_module, "spawn_context", lambda: multiprocessing.get_context("fork"))
