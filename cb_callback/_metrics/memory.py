"""Memory of one isolated call: activations saved for backward and the allocator's peak."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.utils import _pytree as pytree

from cb_callback._engine.capture.storage import storage_key
from cb_callback._engine.clocks.stderr import quiet_session
from cb_callback._engine.replay.isolate import PassContext, Phase
from cb_callback._engine.run.plugins import MeasureContext
from cb_callback._metrics._observing import ObservingMetric

if TYPE_CHECKING:
    from torch._C._profiler import _ProfilerEvent

__all__ = ["MemoryMetric"]

_MIB = 1024.0 * 1024.0


def _allocation_events(prof: torch.profiler.profile, device: torch.device) -> list[tuple[int, int, int]]:
    """``(start ns, size, allocator total after)`` of a profile's allocation events on ``device``.

    A free has a negative size. CUDA events are those of ``device``'s index.
    """
    from torch._C._profiler import _EventType, _ExtraFields_Allocation

    events: list[tuple[int, int, int]] = []

    def walk(nodes: Iterable[_ProfilerEvent]) -> None:
        for e in nodes:
            # an Allocation event's fields are always _ExtraFields_Allocation: the isinstance narrows for mypy
            if e.tag == _EventType.Allocation and isinstance(fields := e.extra_fields, _ExtraFields_Allocation):
                where = fields.device
                if where.type == device.type and (device.type != "cuda" or where.index == device.index):
                    events.append((e.start_time_ns, fields.alloc_size, fields.total_allocated))
            walk(e.children)

    session = prof.profiler  # set, with its results, once the profiled session has run
    assert session is not None and session.kineto_results is not None
    walk(session.kineto_results.experimental_event_tree())
    events.sort()
    return events


def _peak_of_cpu_events(events: list[tuple[int, int, int]]) -> int:
    """Peak of ``total_allocated`` over CPU allocation events, above the level before the first."""
    if not events:
        return 0
    _, first_size, first_total = events[0]
    baseline = first_total - first_size
    return max(0, max(total for _, _, total in events) - baseline)


_STAT_CURRENT = "allocated_bytes.all.current"
_STAT_PEAK = "allocated_bytes.all.peak"
_STAT_ALLOCATED = "allocated_bytes.all.allocated"  # cumulative bytes ever allocated


def _cuda_pass_peak(
    before: Mapping[str, int], after: Mapping[str, int], events: list[tuple[int, int, int]] | None
) -> tuple[int | None, str | None]:
    """``(peak above the level before, None)`` of one CUDA pass, or ``(None, why unknown)``.

    ``before`` / ``after`` are ``torch.cuda.memory_stats`` around the pass;
    ``events`` the profiler's allocation events of the device (``None``: none
    were recorded). Nothing is reset, so the process's peak statistics stay as
    they were; the peak comes from, in order:

    1. the allocation events, when they account for every byte the allocator
       handed out during the pass (``allocated_bytes.all.allocated`` grew by the
       sum of their sizes): the peak of their ``total_allocated``;
    2. else the allocator's process-wide peak, when the pass raised it (then the
       new peak is the pass's);
    3. else nothing: the pass stayed below an earlier peak of the process, and
       that counter cannot tell by how much.
    """
    level = int(before.get(_STAT_CURRENT, 0))
    handed_out = int(after.get(_STAT_ALLOCATED, 0)) - int(before.get(_STAT_ALLOCATED, 0))
    if events is not None and sum(size for _, size, _ in events if size > 0) == handed_out:
        return max([0, *(total - level for _, _, total in events)]), None
    peak_before, peak_after = int(before.get(_STAT_PEAK, 0)), int(after.get(_STAT_PEAK, 0))
    if peak_after > peak_before:
        return peak_after - level, None
    seen = "no allocation events were recorded" if events is None else "the allocation events missed some allocations"
    return None, (
        f"{seen} and the pass stayed below the process's earlier CUDA peak "
        "(torch.cuda.max_memory_allocated), which cb_callback never resets"
    )


@contextlib.contextmanager
def _allocations(device: torch.device) -> Iterator[list[list[tuple[int, int, int]]]]:
    """Record the allocation events of ``device`` with the torch profiler (CPU activity only).

    The yielded list receives the events on exit; it stays empty when another
    torch profiler is already running (starting a second one would end the
    user's session), so the caller can tell "not recorded" from "no events".
    """
    from torch.profiler import ProfilerActivity, profile

    result: list[list[tuple[int, int, int]]] = []
    if torch.autograd._profiler_enabled():
        yield result
        return
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False)
    with quiet_session(prof):
        yield result
    result.append(_allocation_events(prof, device))


_WARNED: set[str] = set()


def _warn_unknown_peak_once(device_type: str, path: str, why: str) -> None:
    if device_type in _WARNED:
        return
    _WARNED.add(device_type)
    warnings.warn(
        f"cb_callback: the {device_type} peak memory of {path or 'root'!r} (and of any other "
        f"component where this happens) is unknown, so peak_mem_mb is left empty: {why}. Profile "
        "with no other torch profiler running, or in a fresh process (mode='fork', `cb replay`).",
        RuntimeWarning,
        stacklevel=2,
    )


def _excluded(ctx: PassContext) -> set[int]:
    """Storages of the component's parameters, buffers and this pass's inputs."""
    inputs = ctx.inputs
    given: list[Any] = [*ctx.module.parameters(), *ctx.module.buffers()]
    given += pytree.tree_leaves((inputs.args, inputs.kwargs)) + list(inputs.leaves)
    keys = {storage_key(t) for t in given if isinstance(t, torch.Tensor)}
    return {k for k in keys if k is not None}


class _MemoryInstrument:
    def __init__(self) -> None:
        self.saved: dict[int, int] = {}
        self.peak: int | None = None
        self.unknown: str | None = None
        self.source = "unsupported device"

    @contextlib.contextmanager
    def observe(self, ctx: PassContext) -> Iterator[None]:
        device, phase = ctx.device, ctx.phase
        if phase is Phase.FORWARD:
            excluded = _excluded(ctx)

            def pack(t: torch.Tensor) -> torch.Tensor:
                key = storage_key(t)
                if key is not None and key not in excluded:
                    self.saved[key] = t.untyped_storage().nbytes()
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                yield
        elif phase is Phase.PASS and device.type == "cuda":
            if device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
            torch.cuda.synchronize(device)
            before = torch.cuda.memory_stats(device)
            with _allocations(device) as recorded:
                yield
            torch.cuda.synchronize(device)
            after = torch.cuda.memory_stats(device)
            self.peak, self.unknown = _cuda_pass_peak(before, after, recorded[0] if recorded else None)
            self.source = "cuda_caching_allocator"
        elif phase is Phase.PASS and device.type == "cpu":
            with _allocations(device) as recorded:
                yield
            if recorded:
                self.peak = _peak_of_cpu_events(recorded[0])
            else:
                self.unknown = "another torch profiler is running (a second one would end it)"
            self.source = "cpu_profiler_allocations"
        else:
            yield
        if phase is Phase.PASS and self.unknown is not None:
            _warn_unknown_peak_once(device.type, ctx.path, self.unknown)

    def values(self) -> Mapping[str, Any]:
        out: dict[str, Any] = {"activation_mb": sum(self.saved.values()) / _MIB, "peak_mem_source": self.source}
        if self.peak is not None:
            out["peak_mem_mb"] = self.peak / _MIB
        if self.unknown is not None:
            out["peak_mem_unknown"] = self.unknown
        return out


class MemoryMetric(ObservingMetric):
    """``activation_mb`` and ``peak_mem_mb`` of one forward + backward.

    Notes:
        ``activation_mb``: storages autograd saves for backward (MiB, each once),
        without parameters, buffers and the component's inputs. ``peak_mem_mb``:
        the allocator's peak during one forward and backward above the level
        before it, from the torch profiler's allocation events (CPU, and CUDA's
        caching allocator). It includes the output, the output gradient and the
        gradients computed. Isolation cannot see what the rest of the model holds
        at that moment in a real step.

        The process's CUDA statistics are left as they were: nothing calls
        ``torch.cuda.reset_peak_memory_stats`` (CUDA has no way to set a peak
        back), so ``torch.cuda.max_memory_allocated`` still reads the user's
        training peak afterwards. The CUDA events are checked against the
        allocator's own count of bytes handed out; when they miss some (or
        another torch profiler is running, which a second one would end), the
        peak is the process's new peak if the pass raised it, else unknown:
        ``peak_mem_mb`` empty, the reason in ``details["peak_mem_unknown"]``, one
        warning.
    """

    name = "memory"

    def instrument(self, ctx: MeasureContext) -> _MemoryInstrument:
        """An observer of the engine's shared instrumented pass."""
        return _MemoryInstrument()
