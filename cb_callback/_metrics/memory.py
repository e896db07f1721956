"""Memory of one isolated call: activations saved for backward and the allocator's peak."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils import _pytree as pytree

from cb_callback._isolate import ReplayInputs
from cb_callback._metrics._observing import ObservingMetric
from cb_callback._plugins import MeasureContext

__all__ = ["MemoryMetric"]

_MIB = 1024.0 * 1024.0


def _storage_key(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


def _cpu_allocation_peak(prof: Any) -> int:
    """Peak of ``total_allocated`` over a profile's CPU allocation events, above the start."""
    from torch._C._profiler import _EventType

    events: list[tuple[int, int, int]] = []

    def walk(nodes: Any) -> None:
        for e in nodes:
            if e.tag == _EventType.Allocation and e.extra_fields.device.type == "cpu":
                events.append((e.start_time_ns, e.extra_fields.alloc_size, e.extra_fields.total_allocated))
            walk(e.children)

    walk(prof.profiler.kineto_results.experimental_event_tree())
    if not events:
        return 0
    events.sort()
    _, first_size, first_total = events[0]
    baseline = first_total - first_size
    return max(0, max(total for _, _, total in events) - baseline)


@contextlib.contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """Silence file descriptor 2 (kineto prints a line at each profiler start and stop)."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@contextlib.contextmanager
def _cpu_peak() -> Iterator[list[int]]:
    from torch.profiler import ProfilerActivity, profile

    result: list[int] = []
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False)
    with _native_stderr_silenced():  # only the start: the component's own output stays visible
        prof.__enter__()
    try:
        yield result
    finally:
        with _native_stderr_silenced():
            prof.__exit__(None, None, None)
    result.append(_cpu_allocation_peak(prof))


class _MemoryInstrument:
    def __init__(self, ctx: MeasureContext) -> None:
        self.ctx = ctx
        self.saved: dict[int, int] = {}
        self.peak: int | None = None
        self.source = "unsupported device"

    def _excluded(self, inputs: ReplayInputs | None) -> set[int]:
        module = self.ctx.module
        given: list[Any] = list(module.parameters()) + list(module.buffers())
        if inputs is not None:
            given += pytree.tree_leaves((inputs.args, inputs.kwargs)) + list(inputs.leaves)
        keys = {_storage_key(t) for t in given if isinstance(t, torch.Tensor)}
        return {k for k in keys if k is not None}

    @contextlib.contextmanager
    def observe(self, phase: str) -> Iterator[None]:
        device = self.ctx.device
        if phase == "forward":
            excluded = self._excluded(self.ctx.replay.current_inputs)

            def pack(t: torch.Tensor) -> torch.Tensor:
                key = _storage_key(t)
                if key is not None and key != 0 and key not in excluded:
                    self.saved[key] = t.untyped_storage().nbytes()
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                yield
        elif phase == "pass" and device.type == "cuda":
            torch.cuda.synchronize(device)
            before = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            yield
            torch.cuda.synchronize(device)
            self.peak = max(0, torch.cuda.max_memory_allocated(device) - before)
            self.source = "cuda_caching_allocator"
        elif phase == "pass" and device.type == "cpu":
            with _cpu_peak() as result:
                yield
            self.peak = result[0]
            self.source = "cpu_profiler_allocations"
        else:
            yield

    def values(self) -> Mapping[str, Any]:
        out: dict[str, Any] = {"activation_mb": sum(self.saved.values()) / _MIB, "peak_mem_source": self.source}
        if self.peak is not None:
            out["peak_mem_mb"] = self.peak / _MIB
        return out


class MemoryMetric(ObservingMetric):
    """``activation_mb`` and ``peak_mem_mb`` of one forward + backward.

    Notes:
        ``activation_mb``: storages autograd saves for backward (MiB, each once),
        without parameters, buffers and the component's inputs. ``peak_mem_mb``:
        the allocator's peak during one forward and backward above the level
        before it — on CUDA the caching allocator's ``max_memory_allocated``, on
        CPU the profiler's allocation events. It includes the output, the output
        gradient and the gradients computed. Isolation cannot see what the rest
        of the model holds at that moment in a real step.
    """

    name = "memory"

    def instrument(self, ctx: MeasureContext) -> _MemoryInstrument:
        """An observer of the engine's shared instrumented pass."""
        return _MemoryInstrument(ctx)
