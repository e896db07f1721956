"""A clock for module hooks: each call's time, less the hooks' own work inside it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["HookClock"]

_OPEN, _CLOSE, _HOOK_START, _HOOK_END = range(4)


class HookClock:
    """Marks a timeline during a forward and reads each module call's time after it.

    Module hooks call :meth:`open` when a module's own work starts (after the
    pre-hook did its work) and :meth:`close` when it ends (as the post-hook
    starts), and bracket everything the hooks themselves do (copying a captured
    call, resolving which node runs) with :meth:`hook_start` / :meth:`hook_end`.
    :meth:`durations` walks the timeline afterwards: a call's time is from its
    ``open`` to its ``close`` less every hook region inside it, so a parent's time
    excludes what its children's hooks copied.

    On CPU a mark is ``time.perf_counter()``. On CUDA a mark is a CUDA event
    recorded on the current stream: nothing synchronises during the forward, the
    events are read once in :meth:`durations` (after the step); a hook region's
    device time is what the hooks enqueued (a captured call's clone kernels).

    Notes:
        What this cannot see: the host time the hooks take on CUDA (a forward
        bound by kernel launches is delayed by them, a few µs per module call),
        and work a module does outside its ``forward`` (a backward, a
        ``register_forward_hook`` of the user's that runs after ours).
    """

    def __init__(self, device: torch.device | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.cuda = device is not None and device.type == "cuda" and torch.cuda.is_available()
        self._clock = clock
        self._marks: list[Any] = []  # float seconds, or torch.cuda.Event
        self._events: list[tuple[int, str | None]] = []  # (kind, path)

    def _mark(self, kind: int, path: str | None) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self._marks.append(ev)
        else:
            self._marks.append(self._clock())
        self._events.append((kind, path))

    def open(self, path: str) -> None:
        self._mark(_OPEN, path)

    def close(self, path: str) -> None:
        self._mark(_CLOSE, path)

    def hook_start(self) -> None:
        self._mark(_HOOK_START, None)

    def hook_end(self) -> None:
        self._mark(_HOOK_END, None)

    def clear(self) -> None:
        self._marks.clear()
        self._events.clear()

    def _seconds(self) -> list[float]:
        if not self._marks:
            return []
        if not self.cuda:
            return [float(m) for m in self._marks]
        self._marks[-1].synchronize()
        first = self._marks[0]
        return [first.elapsed_time(m) / 1e3 for m in self._marks]

    def durations(self) -> dict[str, list[float]]:
        """Each path's call times, in seconds, in call order (hook regions inside a call excluded).

        A call whose ``close`` never came (its forward raised) is dropped.
        """
        seconds = self._seconds()
        out: dict[str, list[float]] = {}
        # Open calls, innermost last: (path, open time, hook seconds accumulated inside it).
        stack: list[list[Any]] = []
        hook_t0: float | None = None
        for (kind, path), t in zip(self._events, seconds, strict=True):
            if kind == _HOOK_START:
                hook_t0 = t
            elif kind == _HOOK_END and hook_t0 is not None:
                spent = t - hook_t0
                for entry in stack:
                    entry[2] += spent
                hook_t0 = None
            elif kind == _OPEN:
                stack.append([path, t, 0.0])
            elif kind == _CLOSE:
                # The innermost open call of this path (a call that raised may have left others open).
                for i in range(len(stack) - 1, -1, -1):
                    if stack[i][0] == path:
                        _, t_open, hooks = stack.pop(i)
                        del stack[i:]
                        out.setdefault(str(path), []).append(max(t - t_open - hooks, 0.0))
                        break
        return out
