"""``python -m cb_callback._cli ARGS`` in processes forked from one that imported what the CLI imports, once.

Started by ``tests/test_trust_misc.py`` as ``python tests/_cli_forks.py`` (no ``PYTHONPATH``); it imports
:data:`PRELOAD` (everything a ``cb replay`` imports, lazily too: seconds a process), then reads commands from stdin,
one JSON list a line, each ``[cwd, stdout_path, stderr_path, arg, ...]``, or an empty line for "wait": it forks a
process for each command as it comes (they run at once); on the empty line it waits for them and writes their exit
codes, in order, as one JSON list a line on stdout. A fork is what ``python -m cb_callback._cli ARGS`` run in
``cwd`` is: ``sys.argv``, ``sys.path[0]`` (``cwd``; this file's folder is not on the path), ``__main__`` (the
module, run by ``runpy`` as ``-m`` runs it), its own stdout and stderr; only the imports were done before.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys

#: What ``cb replay`` imports: the package and the CLI's own imports (not the CLI: ``-m`` runs it anew as
#: ``__main__``), and, lazily, torch._inductor (torch.profiler's trace imports it), the report's writers.
PRELOAD = (
    "cb_callback", "cb_callback._report.diff", "cb_callback._report.discover", "cb_callback._report.gate",
    "cb_callback._report.listing", "cb_callback._report.model", "cb_callback._whatif.snapshot",
    "cb_callback._lightning.publish", "cb_callback._engine.run.schedule_count", "cb_callback._report.files",
    "torch._inductor.standalone_compile", "numpy.random", "pandas", "plotly",
)  # fmt: skip


def _child(cwd: str, out: str, err: str, args: list[str]) -> None:
    """Become ``python -m cb_callback._cli ARGS`` in ``cwd``: its exit (a ``SystemExit``, an uncaught exception)
    is this process's, at the interpreter's top level as there (its exit code, traceback, ``atexit``)."""
    os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    sys.argv = ["-m", *args]
    sys.path[0] = cwd  # what `python -m` puts first
    runpy.run_module("cb_callback._cli", run_name="__main__", alter_sys=True)
    sys.exit(0)  # (the CLI always exits with its status: not reached)


def main() -> None:
    sys.path[0] = os.getcwd()  # not this file's folder (tests/): the forks replace it with their own cwd
    for name in PRELOAD:
        importlib.import_module(name)
    print("ready", flush=True)
    pids: list[int] = []
    for line in sys.stdin:
        if not line.strip():
            codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
            pids = []
            print(json.dumps(codes), flush=True)
            continue
        cwd, out, err, *args = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(cwd, out, err, args)
        pids.append(pid)


if __name__ == "__main__":
    main()
