"""Hardware peaks (FLOP/s and bytes/s) that MFU and bandwidth utilisation divide by.

Four sources, in order of precedence: the user's overrides (``peak_flops=``,
``peak_bandwidth=``), the GPU entries (the sourced datasheet table in
:mod:`cb_callback._peaks_table` plus the user's :func:`register_device_peaks`
entries, matched by :mod:`cb_callback._device_names`), and a short measured
calibration on CPU (:mod:`cb_callback._calibration`). Whatever the source, it is
recorded in :class:`Peaks` and so in the report's metadata. This module resolves;
the data, the matching and the measuring live in those modules and are
re-exported here.
"""

from __future__ import annotations

import math
import platform
import sys
import types
import warnings
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

# The calibration's private seams (``_best_seconds``, ``_FLOPS_CACHE``, ...) are
# re-exported explicitly: tests replace them through this module (``_HardwareModule``).
from cb_callback import _calibration
from cb_callback._calibration import _BANDWIDTH_CACHE as _BANDWIDTH_CACHE
from cb_callback._calibration import _FLOPS_CACHE as _FLOPS_CACHE
from cb_callback._calibration import _FLOPS_RUNS as _FLOPS_RUNS
from cb_callback._calibration import _FLOPS_SPREAD as _FLOPS_SPREAD
from cb_callback._calibration import _LAST_SPREAD as _LAST_SPREAD
from cb_callback._calibration import (
    CALIBRATION_SPREAD_LIMIT,
    COPY_BYTES,
    CPU_GEMM_DTYPES,
    calibration_spread,
    measure_cpu_bandwidth,
    measure_cpu_flops,
    recalibrate_cpu_flops,
)
from cb_callback._calibration import _best_seconds as _best_seconds
from cb_callback._gpu_registry import gpu_spec, is_registered, register_device_peaks
from cb_callback._peaks_table import DTYPES, GPU_SPECS, GpuSpec

__all__ = [
    "CALIBRATION_SPREAD_LIMIT",
    "DTYPES",
    "GPU_SPECS",
    "GpuSpec",
    "Peaks",
    "calibration_spread",
    "gpu_spec",
    "measure_cpu_bandwidth",
    "measure_cpu_flops",
    "recalibrate_cpu_flops",
    "register_device_peaks",
    "resolve_peaks",
]


@dataclass(frozen=True)
class Peaks:
    """The peaks one report's MFU and bandwidth utilisation are relative to.

    Args:
        device_name: the CUDA device name, or the CPU model name.
        dtype: the peak key (one of :data:`DTYPES`), or the full name of a torch
            dtype that has none (``"torch.int8"``).
        flops: peak FLOP/s, dense; ``None`` when unknown.
        bandwidth: peak memory bandwidth in bytes/s; ``None`` when unknown.
        flops_source: ``"datasheet"`` (the built-in table), ``"registered"`` (an
            entry added with :func:`register_device_peaks`), ``"measured"``,
            ``"user"`` or ``"unknown"``.
        bandwidth_source: same vocabulary.
        reference: which table entry, or how the peak was measured; a table entry
            not checked against its datasheet is marked ``"unverified"``.
        verified: whether the table figures used were checked against their
            datasheet: ``False`` if any was not, ``None`` when no table entry
            supplied a figure (user overrides, measured or unknown peaks).

    Notes:
        A datasheet peak is the vendor's theoretical maximum, so MFU against it is
        an upper-bound-relative figure that real kernels stay well below. A measured
        CPU peak is the best GEMM / copy this process reached on this machine with
        its current thread count, so CPU MFU reads "fraction of the best GEMM here"
        and can approach 1; it is not comparable across machines.
    """

    device_name: str
    dtype: str
    flops: float | None
    bandwidth: float | None
    flops_source: str
    bandwidth_source: str
    reference: str
    verified: bool | None = None

    def to_metadata(self) -> dict[str, Any]:
        """The fields as a JSON-friendly dict (floats, strings, booleans and ``None``).

        ``"verified"`` is present only when a table entry supplied a figure.
        """
        metadata = asdict(self)
        if self.verified is None:
            del metadata["verified"]
        return metadata


# --- warn once per process ---------------------------------------------------

_WARNED: set[tuple[str, ...]] = set()


def _warn_once(key: tuple[str, ...], message: str) -> None:
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(message, UserWarning, stacklevel=3)


def _clear_caches() -> None:
    """Forget measured peaks and issued warnings (for tests); registrations stay."""
    _calibration._clear_caches()
    _WARNED.clear()


# --- device names --------------------------------------------------------------


def _cuda_device_name(device: torch.device) -> str:
    """``torch.cuda.get_device_name`` for ``device`` (a seam tests replace)."""
    return torch.cuda.get_device_name(device)


@lru_cache(maxsize=1)
def _cpu_device_name() -> str:
    """The CPU's model name from ``/proc/cpuinfo``, else ``platform.processor()``."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.lower().startswith("model name") and ":" in line:
                name = line.split(":", 1)[1].strip()
                if name:
                    return name
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


# --- resolution ------------------------------------------------------------------


def _entry_source(spec: GpuSpec) -> str:
    return "registered" if is_registered(spec) else "datasheet"


def _entry_reference(spec: GpuSpec, what: str) -> str:
    """``"H100 SXM bf16: <datasheet>"``, marked when registered or unverified."""
    kind = " (registered)" if is_registered(spec) else ""
    checked = "" if spec.verified else " (unverified: not checked against its source)"
    return f"{what}{kind}: {spec.reference}{checked}"


def _torch_dtype_name(key: str) -> bool:
    """Whether ``key`` is a torch dtype's full name, as ``str(torch.int8)`` gives it."""
    return key.startswith("torch.") and isinstance(getattr(torch, key[len("torch.") :], None), torch.dtype)


def _check_override(name: str, value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}={value!r} must be a positive finite number (per second)")


def _fix_hint() -> str:
    return "pass peak_flops= (FLOP/s, dense) and peak_bandwidth= (bytes/s) to set them"


def resolve_peaks(
    device: torch.device | str,
    dtype: str,
    *,
    peak_flops: float | None = None,
    peak_bandwidth: float | None = None,
) -> Peaks:
    """The peak FLOP/s and bandwidth of ``device`` for the dtype key, with their sources.

    Args:
        device: where the components run.
        dtype: the peak key, one of :data:`DTYPES` (the caller decides, e.g. fp32
            matmuls with TF32 enabled on Ampere or later are ``"tf32"``), or the
            full name of a torch dtype without one (``"torch.int8"``, as
            :func:`cb_callback._config.resolve_dtype` gives it): its FLOP peak is
            unknown, with one warning; the bandwidth is resolved as usual.
        peak_flops: a user override in FLOP/s; wins over any other source.
        peak_bandwidth: a user override in bytes/s; wins over any other source.

    Returns:
        The :class:`Peaks`; a value that cannot be known is ``None`` with source
        ``"unknown"``.

    Raises:
        ValueError: for a string that is neither a peak key nor a torch dtype's
            full name (a typo such as ``"float32"``), or a non-positive override.

    Notes:
        CUDA peaks come from the datasheet table or a :func:`register_device_peaks`
        entry (:func:`gpu_spec`; source ``"datasheet"`` or ``"registered"``, and
        :attr:`Peaks.verified` says whether the entry was checked against its
        source); a GPU missing from both, or a dtype its entry lacks (V100 bf16,
        A100 fp8; every built-in GPU's fp64, which the table does not record),
        gives ``None`` and one warning per device name (and dtype) per process. CPU peaks are measured (:func:`measure_cpu_flops`,
        :func:`measure_cpu_bandwidth`) and cached; ``"tf32"`` uses the fp32 GEMM,
        ``"fp64"`` a float64 GEMM, and ``"fp8"`` is unknown. Other device types
        are unknown. Overrides are never measured or looked up.
    """
    keyless = dtype not in DTYPES
    if keyless and not _torch_dtype_name(dtype):
        raise ValueError(
            f"dtype={dtype!r} is not a peak key; use one of {DTYPES} (or a torch dtype's full "
            "name, e.g. 'torch.int8', for one without a peak)"
        )
    _check_override("peak_flops", peak_flops)
    _check_override("peak_bandwidth", peak_bandwidth)
    device = torch.device(device)

    flops: float | None = peak_flops
    bandwidth: float | None = peak_bandwidth
    flops_source = "user" if peak_flops is not None else "unknown"
    bandwidth_source = "user" if peak_bandwidth is not None else "unknown"
    flops_ref = "user override" if peak_flops is not None else "unknown"
    bandwidth_ref = "user override" if peak_bandwidth is not None else "unknown"
    needs_flops, needs_bandwidth = peak_flops is None, peak_bandwidth is None
    verified: bool | None = None  # whether the table figures used were checked
    if keyless and needs_flops:
        _warn_once(
            ("no peak key", dtype),
            f"cb_callback: no peak FLOP/s is known for {dtype} (peaks exist for {DTYPES}), so "
            "MFU is left empty; pass peak_flops= (FLOP/s) to set it.",
        )
        needs_flops = False

    if device.type == "cuda":
        name = _cuda_device_name(device)
        spec = gpu_spec(name) if (needs_flops or needs_bandwidth) else None
        if spec is None and (needs_flops or needs_bandwidth):
            _warn_once(
                ("cuda", name),
                f"cb_callback: GPU {name!r} is not in the datasheet table, so MFU and "
                f"bandwidth utilisation are left empty; {_fix_hint()}, or add the GPU once "
                "with cb_callback.register_device_peaks(...).",
            )
        if spec is not None:
            if needs_flops:
                flops = spec.flops_for(dtype)
                if flops is None:
                    if is_registered(spec):
                        what = f"registered {spec.name} entry has no {dtype} peak"
                    elif dtype == "fp64":
                        what = (
                            f"{spec.name} datasheet has no {dtype} peak "
                            "(the table records no FP64 rates)"
                        )
                    else:
                        what = f"{spec.name} datasheet has no {dtype} peak (the GPU lacks it)"
                    _warn_once(
                        ("cuda", name, dtype),
                        f"cb_callback: the {what}, so MFU is left empty; pass peak_flops= "
                        "(FLOP/s) to set it.",
                    )
                else:
                    flops_source = _entry_source(spec)
                    flops_ref = _entry_reference(spec, f"{spec.name} {dtype}")
                    verified = spec.verified
            if needs_bandwidth:
                bandwidth = spec.bandwidth
                bandwidth_source = _entry_source(spec)
                bandwidth_ref = _entry_reference(spec, spec.name)
                verified = spec.verified
    elif device.type == "cpu":
        name = _cpu_device_name()
        threads = torch.get_num_threads()
        gemm_dtype = CPU_GEMM_DTYPES.get(dtype)
        if needs_flops and gemm_dtype is None:
            _warn_once(
                ("cpu", name, dtype),
                f"cb_callback: no {dtype} peak is known for CPUs, so MFU is left empty; "
                f"pass peak_flops= (FLOP/s) to set it.",
            )
        elif needs_flops and gemm_dtype is not None:
            try:
                flops = measure_cpu_flops(gemm_dtype)
            except RuntimeError as err:
                _warn_once(
                    ("cpu", name, dtype),
                    f"cb_callback: could not measure a {dtype} GEMM on this CPU ({err}); "
                    f"MFU is left empty; pass peak_flops= (FLOP/s) to set it.",
                )
            else:
                flops_source = "measured"
                flops_ref = f"best torch.mm {gemm_dtype} GEMM, {threads} threads"
        if needs_bandwidth:
            bandwidth = measure_cpu_bandwidth()
            bandwidth_source = "measured"
            bandwidth_ref = (
                f"best copy_ of {COPY_BYTES >> 20} MiB (read + write), {threads} threads"
            )
    else:
        name = str(device)
        if needs_flops or needs_bandwidth:
            _warn_once(
                (device.type,),
                f"cb_callback: no peaks are known for {device.type!r} devices, so MFU and "
                f"bandwidth utilisation are left empty; {_fix_hint()}.",
            )

    return Peaks(
        device_name=name,
        dtype=dtype,
        flops=flops,
        bandwidth=bandwidth,
        flops_source=flops_source,
        bandwidth_source=bandwidth_source,
        reference=f"flops: {flops_ref}; bandwidth: {bandwidth_ref}",
        verified=verified,
    )


# --- the calibration's seams, settable through this module -----------------------

#: Calibration state and clock that tests replace through this module
#: (``monkeypatch.setattr(_hardware, "_best_seconds", fake)``): the calibration
#: reads them from :mod:`cb_callback._calibration`, so setting one here sets it there.
_CALIBRATION_SEAMS = frozenset(
    {
        "_best_seconds",
        "_FLOPS_CACHE",
        "_BANDWIDTH_CACHE",
        "_FLOPS_SPREAD",
        "_FLOPS_RUNS",
        "_LAST_SPREAD",
    }
)


class _HardwareModule(types.ModuleType):
    """This module's type: setting a calibration seam also sets it where it is read."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _CALIBRATION_SEAMS:
            setattr(_calibration, name, value)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _HardwareModule
