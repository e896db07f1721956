"""The best CPU peak calibrations seen on this machine, kept in a small JSON file.

A CPU's peak is a property of the machine, but one calibration reads whatever the
machine gives it at that moment: under two CPU hogs a GEMM calibration read 7x
too low here, and every MFU 7x too high. Load only ever slows a GEMM or a copy
down, so the best figure ever measured for the same CPU model, thread count and
torch version is the best estimate of the peak. This module keeps that best per
key; :mod:`cb_callback._hardware.calibration` decides when to measure.

The file is ``$CB_CACHE_DIR/peaks.json`` (default ``$XDG_CACHE_HOME/cb_callback``,
else ``~/.cache/cb_callback``). ``CB_PEAK_CACHE=0`` turns it off (every process
measures afresh, as before). Delete the file to forget a machine's figures (a
laptop that calibrated on mains power and now runs on battery reads low MFU).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["cache_file", "enabled", "lookup", "record"]


def enabled() -> bool:
    """Whether the persistent cache is on (``CB_PEAK_CACHE`` is not ``0``/``off``/``false``)."""
    return os.environ.get("CB_PEAK_CACHE", "1").strip().lower() not in ("0", "off", "false", "no")


def cache_file() -> Path:
    """Where the best calibrations are kept (see the module docstring)."""
    base = os.environ.get("CB_CACHE_DIR")
    if base:
        return Path(base) / "peaks.json"
    xdg = os.environ.get("XDG_CACHE_HOME")
    root = Path(xdg) if xdg else Path.home() / ".cache"
    return root / "cb_callback" / "peaks.json"


def _read() -> dict[str, Any]:
    try:
        data = json.loads(cache_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def lookup(key: str) -> dict[str, Any] | None:
    """The entry for ``key`` (``{"value", "runs", "first", "last"}``), or ``None``.

    An entry whose value is not a positive number is ignored.
    """
    if not enabled():
        return None
    entry = _read().get(key)
    if not isinstance(entry, dict):
        return None
    value = entry.get("value")
    if not isinstance(value, (int, float)) or not value > 0:
        return None
    return entry


def record(key: str, value: float) -> dict[str, Any] | None:
    """Merge a new measurement of ``key``: the entry keeps the best value and counts the runs.

    Returns the entry as written, or ``None`` when the cache is off or cannot be
    written (a read-only home: the calibration goes on without it).
    """
    if not enabled() or not value > 0:
        return None
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    data = _read()
    found = data.get(key)
    old: dict[str, Any] = found if isinstance(found, dict) else {}
    best = old.get("value")
    runs = old.get("runs")
    entry = {
        "value": max(float(value), float(best) if isinstance(best, (int, float)) else 0.0),
        "runs": runs + 1 if isinstance(runs, int) else 1,
        "first": old.get("first", now),
        "last": now,
    }
    data[key] = entry
    path = cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written whole and renamed: a concurrent reader never sees half a file.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".peaks-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError, UnboundLocalError):
            os.unlink(tmp)
        return None
    return entry
