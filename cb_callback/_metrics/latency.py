"""Latency of the isolated forward and backward."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from cb_callback._engine.clocks.timing import Sample, SampleSet, interleave, record_timed
from cb_callback._engine.replay.isolate import instrumented_pass
from cb_callback._engine.run.plugins import MeasureContext

if TYPE_CHECKING:
    from cb_callback._engine.replay.isolate import Replay

__all__ = ["LatencyMetric"]

_NAN = float("nan")


class _PassSampler:
    """Times one forward of a component and the backward of that forward's graph.

    Fresh inputs are made before the clock starts; the output gradients are
    drawn between the two timed regions. On CUDA the device is synchronised
    first and each pass is bracketed by CUDA events; host time is the time until
    the call returned (launch time).
    """

    def __init__(
        self,
        replay: Replay,
        *,
        backward: bool,
        device: torch.device,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.replay = replay
        self.backward = backward
        self.cuda = device.type == "cuda"
        self.device = device
        self.clock = clock

    def __call__(self) -> Sample:
        replay, clock = self.replay, self.clock
        inputs = replay.fresh_inputs()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)] if self.cuda else []
        if self.cuda:
            torch.cuda.synchronize(self.device)
            ev[0].record()
        t0 = clock()
        out = replay.forward(inputs)
        t1 = clock()
        if self.cuda:
            ev[1].record()
        bwd = replay.backward(inputs, out) if self.backward else None
        del out
        t2 = t3 = 0.0
        if bwd is not None:
            if self.cuda:
                ev[2].record()
            t2 = clock()
            bwd.run()
            t3 = clock()
            if self.cuda:
                ev[3].record()
        del bwd
        if self.cuda:
            torch.cuda.synchronize(self.device)
            fwd_ms = ev[0].elapsed_time(ev[1])
            bwd_ms = ev[2].elapsed_time(ev[3]) if t3 else 0.0
        else:
            fwd_ms, bwd_ms = (t1 - t0) * 1e3, (t3 - t2) * 1e3
        record_timed((t1 - t0) + (t3 - t2))
        if not self.backward:
            return Sample(fwd_ms, _NAN, (t1 - t0) * 1e3, _NAN)
        return Sample(fwd_ms, bwd_ms, (t1 - t0) * 1e3, (t3 - t2) * 1e3)


class LatencyMetric:
    """Median time of the isolated forward and backward, and their spread (a :class:`TimedMetric`).

    Fills ``fwd_ms``, ``bwd_ms``, ``cpu_ms`` (host time of both passes),
    ``device_ms`` (device time of both passes; wall time on CPU) and ``noise``
    (IQR ÷ median of ``fwd_ms + bwd_ms`` over the runs), plus details
    ``fwd_iqr_ms``, ``bwd_iqr_ms``, ``fwd_repeats``, ``bwd_repeats`` and
    ``timing`` (rounds, involuntary context switches per second of sampling,
    whether the component was re-measured, whether a component longer than its
    budget stopped before ``min_repeats`` because its runs agreed: ``settled``).

    Notes:
        A run is one forward on fresh inputs (made outside the timed region, or
        one copy reused when the forward changes no input in place) and one
        backward of that forward's graph (``torch.autograd.grad``, the graph
        freed as it goes, as in a real step). Inside the engine the runs of all
        components are interleaved in rounds (:func:`cb_callback._engine.clocks.timing.interleave`),
        so load from elsewhere spreads over components instead of landing on
        one; :meth:`measure` on its own samples just this component in the same
        rounds. A component without a backward (no output requires grad) has
        ``bwd_ms = 0``. The first warm-up run is always an observed pass
        (:func:`cb_callback._engine.replay.isolate.instrumented_pass`; in the engine the one
        the FLOPs, bytes and memory metrics share): it tells whether one copy of
        the inputs can serve every run.
    """

    name = "latency"

    def sampler(self, ctx: MeasureContext) -> Callable[[], Sample]:
        """A callable that times one run (forward + backward) of ``ctx``'s component (no warm-up)."""
        return _PassSampler(ctx.replay, backward=ctx.config.backward, device=ctx.device)

    def budget_s(self, ctx: MeasureContext) -> float:
        """Timed seconds to aim for: ``min_run_time_s`` per pass."""
        return ctx.config.min_run_time_s * (2 if ctx.config.backward else 1)

    def values(self, samples: SampleSet, ctx: MeasureContext) -> Mapping[str, Any]:
        """Row values from the component's samples."""
        backward = ctx.config.backward
        n = len(samples.samples)
        fwd, bwd = samples.median("fwd_ms"), samples.median("bwd_ms") if backward else _NAN
        out: dict[str, Any] = {
            "fwd_ms": fwd,
            "bwd_ms": bwd,
            "cpu_ms": samples.median("fwd_host_ms") + (samples.median("bwd_host_ms") if backward else 0.0),
            "device_ms": fwd + (bwd if backward else 0.0),
            "noise": samples.noise,
            "fwd_iqr_ms": samples.iqr("fwd_ms"),
            "fwd_repeats": n,
            "timing": {
                "rounds": samples.rounds,
                "switches_per_s": samples.switches_per_s,
                "remeasured": samples.remeasured,
                "settled": samples.settled,
            },
        }
        if backward:
            out.update(bwd_iqr_ms=samples.iqr("bwd_ms"), bwd_repeats=n)
            if ctx.replay.no_backward is not None and bwd == 0.0:
                out["no_backward"] = ctx.replay.no_backward
        return out

    def measure(self, ctx: MeasureContext) -> Mapping[str, Any]:
        """One observed pass and the rest of the warm-up, then sample this component
        alone in ``config.rounds`` rounds (as the engine does for all of them)."""
        cfg = ctx.config
        instrumented_pass(ctx.replay, [], cfg.backward, path=ctx.path)
        run = self.sampler(ctx)
        for _ in range(max(cfg.warmup - 1, 0)):  # the observed pass was the first warm-up run
            run()
        (samples,) = interleave(
            [run],
            budgets_s=[self.budget_s(ctx)],
            rounds=cfg.rounds,
            min_repeats=cfg.min_repeats,
            max_repeats=cfg.max_repeats,
        )
        return self.values(samples, ctx)
