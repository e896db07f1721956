"""Memory of one isolated call: activations saved for backward and the allocator's peak."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.utils import _pytree as pytree

from cb_callback._plugins import MeasureContext

__all__ = ["MemoryMetric", "cpu_peak_bytes", "saved_activation_bytes"]

_MIB = 1024.0 * 1024.0


def _storage_key(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


def saved_activation_bytes(replay: Any, inputs: Any) -> int:
    """Bytes autograd saves for backward in one forward, deduplicated by storage.

    Tensors sharing storage with a parameter, a buffer or an input are excluded
    (they exist anyway); each remaining storage counts once, whole.
    """
    module = replay.module
    excluded: set[int] = set()
    given = pytree.tree_leaves((inputs.args, inputs.kwargs)) + list(inputs.leaves)
    for t in list(module.parameters()) + list(module.buffers()) + [
        x for x in given if isinstance(x, torch.Tensor)
    ]:
        key = _storage_key(t)
        if key is not None:
            excluded.add(key)
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key is not None and key not in excluded and key != 0:
            saved[key] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = replay.forward(inputs)
    del out
    return sum(saved.values())


def cpu_peak_bytes(fn: Any) -> int:
    """Peak bytes the CPU allocator held during ``fn()``, above the level before it.

    Read from the allocator's own accounting as the profiler reports it
    (``total_allocated`` of each allocation event), never process RSS.
    """
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False) as prof:
        fn()
    events: list[tuple[int, int, int]] = []

    def walk(nodes: Any) -> None:
        for e in nodes:
            if e.tag == _EventType.Allocation and e.extra_fields.device.type == "cpu":
                events.append((e.start_time_ns, e.extra_fields.alloc_size, e.extra_fields.total_allocated))
            walk(e.children)

    walk(prof.profiler.kineto_results.experimental_event_tree())  # type: ignore[union-attr]
    if not events:
        return 0
    events.sort()
    _, first_size, first_total = events[0]
    baseline = first_total - first_size
    return max(0, max(total for _, _, total in events) - baseline)


class MemoryMetric:
    """``activation_mb`` and ``peak_mem_mb`` of one forward + backward.

    Notes:
        ``activation_mb``: storages autograd saves for backward (MiB), without
        parameters, buffers and the component's inputs. ``peak_mem_mb``: the
        allocator's peak during one forward and backward above the level before
        it — on CUDA the caching allocator's ``max_memory_allocated``, on CPU the
        profiler's allocation events. Isolation cannot see what the rest of the
        model holds at that moment in a real step.
    """

    name = "memory"

    def measure(self, ctx: MeasureContext) -> Mapping[str, Any]:
        replay = ctx.replay
        act = saved_activation_bytes(replay, replay.fresh_inputs())
        inputs = replay.fresh_inputs()

        def step() -> None:
            out = replay.forward(inputs)
            if not ctx.config.backward:
                return
            outputs = [
                t for t in pytree.tree_leaves(out)
                if isinstance(t, torch.Tensor) and t.requires_grad and t.grad_fn is not None
            ]
            targets = replay.grad_targets(inputs)
            if outputs and targets:
                grads = [torch.ones_like(t) for t in outputs]
                torch.autograd.grad(outputs, targets, grads, allow_unused=True)

        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
            before = torch.cuda.memory_allocated(ctx.device)
            torch.cuda.reset_peak_memory_stats(ctx.device)
            step()
            torch.cuda.synchronize(ctx.device)
            peak = max(0, torch.cuda.max_memory_allocated(ctx.device) - before)
            source = "cuda_caching_allocator"
        elif ctx.device.type == "cpu":
            peak = cpu_peak_bytes(step)
            source = "cpu_profiler_allocations"
        else:
            return {"activation_mb": act / _MIB, "peak_mem_source": "unsupported device"}
        return {"activation_mb": act / _MIB, "peak_mem_mb": peak / _MIB, "peak_mem_source": source}
