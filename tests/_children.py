"""Fork mode's child forked from the test's process, for tests of what the child does rather than how it starts."""

from __future__ import annotations

import multiprocessing
from typing import Any


def forked_children(monkeypatch: Any) -> None:
    """Start fork mode's profiling child with ``fork``, not the product's ``spawn``.

    A real ``spawn`` child imports torch, Lightning and the model's module again: 4-5 CPU-seconds a child. A
    forked one starts with what the test's process imported. It still loads the snapshot from disk, profiles it
    and writes the report, and the parent still waits for it, reads its files and exit code. What it does not
    test is the start itself: the re-import, pickling the process's arguments, the ``__main__`` guard, an
    unimportable class. A real ``spawn`` child that writes a report stays under test in
    tests/callback/test_callback.py's MLP case; one that crashes in tests/callback/test_callback_fork.py.

    Only for children that replay small tensors on one thread (the suite's ``torch.set_num_threads(1)``): a
    forked child whose parent had already run torch's OpenMP pool on several threads can hang in its first op
    large enough to use that pool (seen with 2000x2000 matmuls in both; that hang fails the test at
    ``fork_timeout_s`` or pytest-timeout, never passes it).
    """
    from cb_callback._lightning import child as child_module

    monkeypatch.setattr(child_module, "spawn_context", lambda: multiprocessing.get_context("fork"))
