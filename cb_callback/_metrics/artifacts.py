"""Per-component artifacts: a profiler trace, an operator table, a memory record.

Opt-in with ``BenchmarkConfig.artifacts=("trace", "ops", "memory")``. Each is an
:class:`cb_callback.plugins.ArtifactMetric`: the engine runs it in a forward + backward
pass of its own, after every component's timed runs, so the timings never carry
a profiler's overhead; its files go under ``<output_dir>/artifacts/<path or
"root">/`` and the row records them in ``details["artifacts"]``. A third-party
plugin adds its own kind the same way.

- ``trace``: ``trace.json.gz``, a PyTorch profiler (Kineto) trace of the pass in
  the Chrome/Perfetto JSON format (open it in ui.perfetto.dev or
  chrome://tracing); the component's path is in its ``cb_component`` metadata.
- ``ops``: ``ops.csv``, the pass's operator table from the profiler grouped by
  input shapes: name, calls, self CPU time, self device time (CUDA kernels on
  GPU), CPU and device totals, input shapes, FLOPs where the profiler counts
  them (matmuls, convolutions).
- ``memory``: on CUDA ``memory_snapshot.pickle``, the caching allocator's
  history of the pass (``torch.cuda.memory._record_memory_history`` /
  ``_snapshot``; drag it into pytorch.org/memory_viz); on CPU
  ``memory_timeline.csv``, the profiler's allocation events (µs since the
  first, bytes allocated (+) or freed (−), running total relative to the level
  before the pass: frees of tensors made before it make it negative).

Notes:
    A profiler cannot nest: when the user's own torch profiler is running, the
    trace/ops/memory (CPU) artifacts raise and the row says so in
    ``details["metric_errors"]``. The CUDA memory history is process-wide: it is
    turned off after the pass, so a history the user recorded is ended too.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import json
import pickle
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from cb_callback._engine.clocks.stderr import quiet_session
from cb_callback._engine.replay.isolate import PassContext, Phase
from cb_callback._engine.run.plugins import MeasureContext
from cb_callback._types import OptionValue

__all__ = ["MemoryArtifact", "OpsArtifact", "TraceArtifact", "artifact_plugins"]

#: Operator-table columns (``ops.csv``), in order.
OPS_COLUMNS: tuple[str, ...] = (
    "name", "calls", "self_cpu_us", "self_device_us", "cpu_total_us", "device_total_us", "input_shapes", "flops",
)  # fmt: skip


@contextlib.contextmanager
def _profiler(device: torch.device, **options: OptionValue) -> Iterator[torch.profiler.profile]:
    from torch.profiler import ProfilerActivity, profile

    if torch.autograd._profiler_enabled():
        raise RuntimeError("a torch profiler is already running; its session is left alone")
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with quiet_session(profile(activities=activities, **options)) as prof:
        yield prof


class _ProfiledPass:
    """Profiles the whole pass (``Phase.PASS``); ``finish(prof)`` writes the file."""

    def __init__(self, ctx: MeasureContext, kind: str, **options: OptionValue) -> None:
        self.ctx = ctx
        self.kind = kind
        self.options = options
        self.files: dict[str, Path] = {}

    @contextlib.contextmanager
    def observe(self, pass_ctx: PassContext) -> Iterator[None]:
        if pass_ctx.phase is not Phase.PASS:
            yield
            return
        with _profiler(self.ctx.device, **self.options) as prof:
            if hasattr(prof, "add_metadata"):
                prof.add_metadata("cb_component", self.ctx.path or "root")
            yield
        self.files[self.kind] = self.finish(prof)

    def finish(self, prof: torch.profiler.profile) -> Path:
        raise NotImplementedError

    def values(self) -> Mapping[str, Any]:
        return dict(self.files)


class _Trace(_ProfiledPass):
    def finish(self, prof: torch.profiler.profile) -> Path:
        raw = self.ctx.artifact_path("trace.json")
        prof.export_chrome_trace(str(raw))
        data = json.loads(raw.read_text())
        data["cb_component"] = self.ctx.path or "root"  # also in the trace's own metadata
        out = self.ctx.artifact_path("trace.json.gz")
        with gzip.open(out, "wt", encoding="utf-8") as f:
            json.dump(data, f)
        raw.unlink()
        return out


class _Ops(_ProfiledPass):
    def finish(self, prof: torch.profiler.profile) -> Path:
        out = self.ctx.artifact_path("ops.csv")
        rows = []
        for e in prof.key_averages(group_by_input_shape=True):
            rows.append(
                {
                    "name": e.key,
                    "calls": e.count,
                    "self_cpu_us": round(e.self_cpu_time_total, 3),
                    "self_device_us": round(getattr(e, "self_device_time_total", 0.0), 3),
                    "cpu_total_us": round(e.cpu_time_total, 3),
                    "device_total_us": round(getattr(e, "device_time_total", 0.0), 3),
                    "input_shapes": json.dumps(e.input_shapes) if e.input_shapes else "",
                    "flops": int(e.flops) if getattr(e, "flops", 0) else "",
                }
            )
        rows.sort(key=lambda r: -(r["self_device_us"] or r["self_cpu_us"]))
        with out.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(OPS_COLUMNS))
            writer.writeheader()
            writer.writerows(rows)
        return out


class _Memory(_ProfiledPass):
    @contextlib.contextmanager
    def observe(self, pass_ctx: PassContext) -> Iterator[None]:
        if self.ctx.device.type != "cuda":
            with super().observe(pass_ctx):
                yield
            return
        if pass_ctx.phase is not Phase.PASS:
            yield
            return
        torch.cuda.memory._record_memory_history(max_entries=100_000)
        try:
            yield
            snapshot = torch.cuda.memory._snapshot()
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
        out = self.ctx.artifact_path("memory_snapshot.pickle")
        with out.open("wb") as f:
            pickle.dump(snapshot, f)
        self.files[self.kind] = out

    def finish(self, prof: torch.profiler.profile) -> Path:
        out = self.ctx.artifact_path("memory_timeline.csv")
        events = [e for e in prof.events() if e.name == "[memory]"]
        events.sort(key=lambda e: e.time_range.start)
        t0 = events[0].time_range.start if events else 0
        total = 0
        with out.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["time_us", "bytes", "total_bytes"])
            for e in events:
                delta = int(e.cpu_memory_usage)
                total += delta
                writer.writerow([round(e.time_range.start - t0, 3), delta, total])
        return out


class TraceArtifact:
    """``trace``: a Kineto trace of one isolated forward + backward (``trace.json.gz``)."""

    name = "trace_artifact"

    def artifacts(self, ctx: MeasureContext) -> _Trace:
        return _Trace(ctx, "trace", record_shapes=True)


class OpsArtifact:
    """``ops``: the operator table of one isolated forward + backward (``ops.csv``)."""

    name = "ops_artifact"

    def artifacts(self, ctx: MeasureContext) -> _Ops:
        return _Ops(ctx, "ops", record_shapes=True, with_flops=True)


class MemoryArtifact:
    """``memory``: the CUDA allocator history (``memory_snapshot.pickle``) or, on CPU, the allocation timeline."""

    name = "memory_artifact"

    def artifacts(self, ctx: MeasureContext) -> _Memory:
        return _Memory(ctx, "memory", profile_memory=True)


#: One plugin per kind of ``cb_callback._engine.run.config.ARTIFACT_KINDS`` (a test checks they agree).
_BY_KIND = {"trace": TraceArtifact, "ops": OpsArtifact, "memory": MemoryArtifact}


def artifact_plugins(kinds: Sequence[str]) -> list[Any]:
    """The built-in artifact plugins for ``kinds`` (validated by ``BenchmarkConfig``)."""
    return [_BY_KIND[k]() for k in kinds]
