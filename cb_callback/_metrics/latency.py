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
        The forward runs on a fresh copy of the inputs each time (the copy is not
        timed). The backward is one forward's graph replayed with
        ``retain_graph=True``, so it includes no forward. A component without a
        backward (no output requires grad) has ``bwd_ms = 0``.
    """

    name = "latency"

    def measure(self, ctx: MeasureContext) -> Mapping[str, Any]:
        cfg = ctx.config
        knobs = dict(
            device=ctx.device,
            warmup=cfg.warmup,
            min_run_time_s=cfg.min_run_time_s,
            min_repeats=cfg.min_repeats,
            max_repeats=cfg.max_repeats,
        )
        fwd = time_fn(ctx.replay.forward, setup=ctx.replay.fresh_inputs, **knobs)  # type: ignore[arg-type]
        out: dict[str, Any] = {
            "fwd_ms": fwd.median,
            "fwd_iqr_ms": fwd.iqr,
            "fwd_repeats": fwd.repeats,
            "bwd_ms": 0.0 if cfg.backward else float("nan"),
            "cpu_ms": fwd.host_median,
            "device_ms": fwd.median,
        }
        backward = ctx.replay.backward() if cfg.backward else None
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
            out["no_backward"] = "no output requires grad"
        return out
