"""What a report says about its own run: device, peaks, versions, options, how its time was spent."""

from __future__ import annotations

import contextlib
import datetime as _dt
import platform
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import torch

from cb_callback._engine.config import BenchmarkConfig
from cb_callback._hardware.peaks import Peaks

__all__ = ["run_metadata", "versions"]


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
