"""Latency of the isolated forward and backward."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cb_callback._plugins import MeasureContext
from cb_callback._timing import time_fn

__all__ = ["LatencyMetric"]


class LatencyMetric:
    """Median time of the isolated forward and backward, with their IQR.

    Fills ``fwd_ms``, ``bwd_ms``, ``cpu_ms`` (host time of both passes) and
    ``device_ms`` (device time of both passes; wall time on CPU), plus details
    ``fwd_iqr_ms``, ``bwd_iqr_ms``, ``fwd_repeats``, ``bwd_repeats``.

    Notes:
        The forward runs on a fresh copy of the inputs each time it could change
        them in place (the copy is not timed), else on one copy. The backward is
        the last timed forward's graph replayed with ``retain_graph=True``, so it
        includes no forward. A component without a
        backward (no output requires grad) has ``bwd_ms = 0``.
    """

    name = "latency"

    def measure(self, ctx: MeasureContext) -> Mapping[str, Any]:
        cfg = ctx.config
        # The engine's instrumented pass already ran the component once.
        warmup = max(cfg.warmup - 1, 0) if "mutates_inputs" in ctx.values else cfg.warmup
        knobs = dict(
            device=ctx.device,
            warmup=warmup,
            min_run_time_s=cfg.min_run_time_s,
            min_repeats=cfg.min_repeats,
            max_repeats=cfg.max_repeats,
        )
        fwd = time_fn(
            ctx.replay.forward, setup=ctx.replay.fresh_inputs, keep_last=cfg.backward, **knobs  # type: ignore[arg-type]
        )
        out: dict[str, Any] = {
            "fwd_ms": fwd.median,
            "fwd_iqr_ms": fwd.iqr,
            "fwd_repeats": fwd.repeats,
            "bwd_ms": 0.0 if cfg.backward else float("nan"),
            "cpu_ms": fwd.host_median,
            "device_ms": fwd.median,
        }
        # The last timed forward's graph is the one whose backward is timed.
        backward = ctx.replay.backward(fwd.last_arg, fwd.last_out) if cfg.backward else None
        fwd.last_arg = fwd.last_out = None
        if backward is not None:
            bwd = time_fn(backward, **knobs)  # type: ignore[arg-type]
            out.update(
                bwd_ms=bwd.median,
                bwd_iqr_ms=bwd.iqr,
                bwd_repeats=bwd.repeats,
                cpu_ms=fwd.host_median + bwd.host_median,
                device_ms=fwd.median + bwd.median,
            )
        elif cfg.backward:
            out["no_backward"] = ctx.replay.no_backward or "no output requires grad"
        return out
