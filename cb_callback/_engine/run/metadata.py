"""What a report says about its own run: device, peaks, versions, options, how its time was spent."""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
import platform
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import torch

from cb_callback._engine.clocks.insitu import InSituTimes
from cb_callback._engine.run.config import BenchmarkConfig
from cb_callback._hardware.peaks import Peaks
from cb_callback._report.model import ComponentRow

__all__ = ["insitu_ratio", "run_cost", "run_metadata", "versions"]


def versions() -> dict[str, str]:
    """Python's and torch's version, and those of the packages a report's numbers depend on."""
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for dist in ("cb-callback", "numpy", "lightning", "torchrec", "fbgemm-gpu-cpu", "fbgemm-gpu"):
        with contextlib.suppress(PackageNotFoundError):
            out[dist] = version(dist)
    return out


def run_metadata(
    *,
    device: torch.device,
    peaks: Peaks,
    dtype: str,
    cfg: BenchmarkConfig,
    captured_batch_size: int | None,
    wall_s: float,
    timed_s: float,
    calibration_s: float,
) -> dict[str, Any]:
    """The run's part of ``report.metadata``.

    ``timing`` holds ``wall_s`` (the whole run), ``timed_s`` (inside timed
    regions), ``harness_efficiency`` (their ratio) and ``calibration_s`` (the
    peak calibration, outside ``max_total_time_s``).
    """
    return {
        "device": str(device),
        "device_name": peaks.device_name,
        "dtype": dtype,
        "peaks": peaks.to_metadata(),
        "versions": versions(),
        "config": cfg.to_metadata(),
        "torch_threads": torch.get_num_threads(),
        "captured_batch_size": captured_batch_size,
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "timing": {
            "wall_s": wall_s,
            "timed_s": timed_s,
            "harness_efficiency": timed_s / wall_s if wall_s > 0 else None,
            "calibration_s": calibration_s,
        },
    }


def run_cost(
    *,
    wall_s: float,
    timed_s: float,
    calibration_s: float,
    insitu_s: float,
    insitu_timed_s: float,
    instrumented_s: float,
    floor_s: float,
    compile_s: float,
    artifacts_s: float,
    census_s: float = 0.0,
) -> dict[str, Any]:
    """Where the run's wall time went (``report.metadata["cost"]``), seconds.

    ``timed_s`` is inside timed regions: the components' timed runs and the
    in-situ passes' measured forwards and backwards (``insitu_timed_s`` of
    them); ``insitu_s`` the in-situ passes' wall (warm-up and hooks included);
    ``instrumented_s`` the observed passes (FLOPs, bytes, memory), of them
    ``census_s`` the census of the step's FLOPs that proves repeated structure
    (:mod:`cb_callback._engine.counting.census`);
    ``floor_s`` the harness floors; ``calibration_s`` the peak calibration;
    ``compile_s`` and ``artifacts_s`` the what-ifs and artifact passes;
    ``other_s`` the rest (warm-ups, input copies between runs, the timing loop,
    the roll-up, reporters). ``efficiency`` is ``timed_s ÷ wall_s``, and
    ``efficiency_profiling`` the same without the one-off calibration.
    """
    parts = {
        "timed_s": timed_s, "insitu_s": insitu_s, "insitu_timed_s": insitu_timed_s, "instrumented_s": instrumented_s,
        "floor_s": floor_s, "calibration_s": calibration_s, "compile_s": compile_s, "artifacts_s": artifacts_s,
        "census_s": census_s,
    }  # fmt: skip
    spent = timed_s - insitu_timed_s + insitu_s + instrumented_s + floor_s + calibration_s + compile_s + artifacts_s
    other = wall_s - spent
    profiling = wall_s - calibration_s
    return {
        "wall_s": wall_s,
        **parts,
        "other_s": other,
        "efficiency": timed_s / wall_s if wall_s > 0 else None,
        "efficiency_profiling": timed_s / profiling if profiling > 0 else None,
    }


def insitu_ratio(rows: Mapping[str, ComponentRow], insitu: InSituTimes | None) -> dict[str, Any] | None:
    """The first top component's isolated ÷ in-situ times (``metadata["quality"]["insitu_ratio"]``).

    ``fwd``: ``fwd_ms ÷ insitu_ms``; ``total``: ``total_ms ÷`` the in-situ
    forward + backward (when the backward was timed). ``None`` without an in-situ pass.
    """
    if insitu is None or not insitu.tops or insitu.tops[0] not in rows:
        return None
    top = insitu.tops[0]
    row, mine = rows[top], insitu.times.get(top)
    if mine is None or row.status != "ok" or not mine.fwd_ms > 0:
        return None
    out: dict[str, Any] = {"path": top, "fwd": row.fwd_ms / mine.fwd_ms}
    whole = mine.fwd_ms + mine.bwd_ms
    if math.isfinite(row.total_ms) and math.isfinite(whole) and whole > 0:
        out["total"] = row.total_ms / whole
    return out
