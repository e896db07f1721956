"""Kineto's start/stop lines, kept out of the process's standard error."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.profiler import profile

__all__ = ["kineto_lines_dropped", "quiet_session"]

# "USDT:2026-12-01 16:16:59 17147:17147 SyncActivityProfilerHandler.cpp:52] profiler_start"
_KINETO_LINE = re.compile(rb"(?:STAGE|USDT):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ [\w.]+\.cpp:\d+\] [^\n]*\n?")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


@contextlib.contextmanager
def kineto_lines_dropped() -> Iterator[None]:
    """Around a torch profiler's start or stop: kineto's informational lines leave fd 2, nothing else does.

    kineto (torch 2.13) writes ``USDT:… profiler_start`` and ``profiler_stop``
    straight to file descriptor 2 at every start and stop of a profiler (the
    memory metric starts one per component), and only ``KINETO_LOG_LEVEL=6``
    — read once per process, hiding kineto's errors too — stops it. File
    descriptor 2 belongs to the whole process: pointing it at ``/dev/null``
    would also swallow what other threads write meanwhile. So it points at an
    anonymous temporary file for the duration, and afterwards everything
    written there — by any thread, through ``sys.stderr`` or the C library — is
    copied to the real fd 2, except kineto's ``STAGE:``/``USDT:`` lines.

    Notes:
        Another thread's output written inside the window (a profiler start or
        stop: milliseconds) reaches the terminal at its end, in order. If the
        process dies inside the window, that output is lost with the file.
    """
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 at all: nothing to keep clean
        yield
        return
    try:
        window = tempfile.TemporaryFile()  # noqa: SIM115 - closed in the finally below
    except OSError:
        os.close(saved)
        yield
        return
    try:
        os.dup2(window.fileno(), 2)
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()  # Python-level writes made in the window belong to it
        os.dup2(saved, 2)
        os.close(saved)
        window.seek(0)
        kept = _KINETO_LINE.sub(b"", window.read())
        window.close()
        if kept:
            with contextlib.suppress(OSError):
                _write_all(2, kept)


@contextlib.contextmanager
def quiet_session(prof: profile) -> Iterator[profile]:
    """Run a torch profiler session with kineto's start/stop lines dropped (only those two moments).

    What the profiled code itself writes to fd 2 is left as it is.
    """
    with kineto_lines_dropped():
        prof.__enter__()
    try:
        yield prof
    finally:
        with kineto_lines_dropped():
            prof.__exit__(None, None, None)
