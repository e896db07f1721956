"""A clock for module hooks: each call's time, less the hooks' own work inside it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["HookClock", "HookCost"]

_OPEN, _CLOSE, _HOOK_START, _HOOK_END = range(4)


@dataclass(frozen=True)
class HookCost:
    """What hooking a call adds to the times the clock reads, per call, in seconds.

    The hooks bracket their own work (:meth:`HookClock.hook_start`), but not the
    Python around it: a hooked ``Module.__call__`` takes PyTorch's slow path (the
    hook lists walked, each hook entered and left), and part of it falls inside
    the call's own span and part inside every enclosing call's. On a 2-vCPU VM
    that was 2-4 µs a call: a container of 90 hooked modules read twice its
    unhooked forward. :func:`cb_callback._engine.clocks.insitu.measure_hook_cost`
    measures both on ``nn.Identity`` calls.

    Attributes:
        own_s: inside a hooked call's own span, from its pre-hook's last mark to
            the forward and from the forward to its post-hook's first: what a
            hooked ``nn.Identity`` reads (its isolated replay, net of the harness
            floor, reads about 0).
        nested_s: what each hooked call inside a call adds to that call, beyond
            the same inner call unhooked.
    """

    own_s: float = 0.0
    nested_s: float = 0.0


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

    def __init__(
        self,
        device: torch.device | None = None,
        clock: Callable[[], float] = time.perf_counter,
        cost: HookCost | None = None,
    ) -> None:
        self.cuda = device is not None and device.type == "cuda" and torch.cuda.is_available()
        self._clock = clock
        self.cost = cost or HookCost()
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
        """Each path's call times, in seconds, in call order: from its ``open`` to its ``close``, less the
        hook regions inside it and :attr:`cost` (its own ``own_s``, ``nested_s`` per hooked call inside it),
        at least 0.

        A call whose ``close`` never came (its forward raised) is dropped.
        """
        seconds = self._seconds()
        out: dict[str, list[float]] = {}
        own, nested = self.cost.own_s, self.cost.nested_s
        # Open calls, innermost last: (path, open time, hook seconds accumulated inside it, calls inside it).
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
                for entry in stack:
                    entry[3] += 1
                stack.append([path, t, 0.0, 0])
            elif kind == _CLOSE:
                # The innermost open call of this path (a call that raised may have left others open).
                for i in range(len(stack) - 1, -1, -1):
                    if stack[i][0] == path:
                        _, t_open, hooks, inner = stack.pop(i)
                        del stack[i:]
                        took = t - t_open - hooks - own - nested * inner
                        out.setdefault(str(path), []).append(max(took, 0.0))
                        break
        return out
