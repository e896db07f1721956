"""Ranks forked from the calling process, started as ``torchrun`` starts them (for the 2-rank Lightning scripts).

Each rank is a fork of the caller with ``MASTER_ADDR``, ``MASTER_PORT``, ``NODE_RANK``, ``WORLD_SIZE`` and its own
``LOCAL_RANK`` set: Lightning's environment then finds the processes made (``creates_processes_externally``) and
launches none; each rank's Trainer joins the others in a real process group (gloo). Whatever the caller imported
before is imported once, not again in a rank that Lightning's subprocess launcher would start by running the
script anew (``tests/_ddp_collective_script.py`` keeps that launcher under test).
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import socket
import sys
from collections.abc import Callable
from multiprocessing.connection import wait


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, target: Callable[[], None]) -> None:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: a rank ends with the process that forked it
    os.environ["LOCAL_RANK"] = str(rank)
    target()


def fork_ranks(target: Callable[[], None], world: int = 2) -> int:
    """``target()`` on ``world`` forked ranks; 0 once every rank returned from it, else 1 (the first rank that
    failed ends the others: they may wait for it in a collective). The caller must have started no thread and
    no process group."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), NODE_RANK="0", WORLD_SIZE=str(world))
    sys.stdout.flush()
    sys.stderr.flush()
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_rank, args=(r, target)) for r in range(world)]
    for p in procs:
        p.start()
    while alive := [p for p in procs if p.exitcode is None]:
        if any(p.exitcode not in (None, 0) for p in procs):
            for p in alive:
                p.kill()
            break
        wait([p.sentinel for p in alive])  # until a rank ends
    for p in procs:
        p.join()
    codes = [p.exitcode for p in procs]
    if codes != [0] * world:
        print(f"the ranks' exit codes: {codes}", file=sys.stderr, flush=True)
        return 1
    return 0
