"""Hardware peaks (FLOP/s and bytes/s) that MFU and bandwidth utilisation divide by.

Four sources, in order of precedence: the user's overrides (``peak_flops=``,
``peak_bandwidth=``), the GPU entries (the sourced datasheet table in
:mod:`cb_callback._hardware.table` plus the user's :func:`register_device_peaks`
entries, matched by :mod:`cb_callback._hardware.names`), and a short measured
calibration on CPU (:mod:`cb_callback._hardware.calibration`). Whatever the source, it is
recorded in :class:`Peaks` and so in the report's metadata. This module resolves;
the data, the matching and the measuring live in those modules and are
re-exported here.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from cb_callback._hardware.calibration import (
    CALIBRATION_SPREAD_LIMIT,
    CPU_GEMM_DTYPES,
    CacheLevel,
    calibration_notes,
    calibration_spread,
    cpu_device_name,
    measure_cpu_bandwidth,
    measure_cpu_cache_bandwidths,
    measure_cpu_flops,
    recalibrate_cpu_flops,
)
from cb_callback._hardware.calibration import _clear_caches as _clear_calibration
from cb_callback._hardware.registry import gpu_spec, is_registered, register_device_peaks
from cb_callback._hardware.table import DTYPES, GPU_SPECS, GpuSpec

__all__ = [
    "CALIBRATION_SPREAD_LIMIT",
    "DTYPES",
    "GPU_SPECS",
    "CacheLevel",
    "GpuSpec",
    "Peaks",
    "bandwidth_ceiling",
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
        levels: the bandwidth ceiling of each cache level and of DRAM, smallest
            first (CPU; empty elsewhere, where ``bandwidth`` is the only ceiling):
            see :func:`bandwidth_ceiling`.
        calibration: for measured peaks, how each figure was obtained
            (:func:`cb_callback._hardware.calibration.calibration_notes`): measured now or the
            best kept for this machine, on a quiet or busy machine.

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
    levels: tuple[CacheLevel, ...] = ()
    calibration: dict[str, Any] = field(default_factory=dict)

    def to_metadata(self) -> dict[str, Any]:
        """The fields as a JSON-friendly dict (floats, strings, booleans and ``None``).

        ``"verified"`` is present only when a table entry supplied a figure;
        ``"levels"`` (a list of ``{name, size_bytes, bandwidth}``) and
        ``"calibration"`` only when there are some.
        """
        metadata = asdict(self)
        if self.verified is None:
            del metadata["verified"]
        if not self.levels:
            del metadata["levels"]
        if not self.calibration:
            del metadata["calibration"]
        return metadata


def bandwidth_ceiling(peaks: Peaks, working_set_bytes: float | None) -> CacheLevel | None:
    """The bandwidth ceiling a component of this working set is judged against.

    The smallest level of ``peaks.levels`` that holds ``working_set_bytes`` and has
    a measured bandwidth (a level too small to time defers to the next one);
    DRAM when the working set is larger than every cache or unknown. ``None``
    when ``peaks`` has no levels (a GPU: its one ceiling is ``peaks.bandwidth``).
    """
    if not peaks.levels:
        return None
    known = working_set_bytes is not None and math.isfinite(working_set_bytes)
    for level in peaks.levels:
        if level.bandwidth is None:
            continue
        if level.size_bytes is None or (known and working_set_bytes <= level.size_bytes):  # type: ignore[operator]
            return level
    return None


# --- warn once per process ---------------------------------------------------

_WARNED: set[tuple[str, ...]] = set()


def _warn_once(key: tuple[str, ...], message: str) -> None:
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(message, UserWarning, stacklevel=3)


def _clear_caches() -> None:
    """Forget this process's measured peaks and issued warnings (for tests); registrations stay."""
    _clear_calibration()
    _WARNED.clear()


# --- device names --------------------------------------------------------------


def _cuda_device_name(device: torch.device) -> str:
    """``torch.cuda.get_device_name`` for ``device`` (a seam tests replace)."""
    return torch.cuda.get_device_name(device)


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
    return "pass peak_flops=<FLOP/s, dense> and peak_bandwidth=<bytes/s> to set them"


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
            :func:`cb_callback._engine.run.config.resolve_dtype` gives it): its FLOP peak is
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
        gives ``None`` and one warning per device name (and dtype) per process. CPU
        peaks are measured (:func:`measure_cpu_flops`,
        :func:`measure_cpu_bandwidth`) and cached; ``"tf32"`` uses the fp32 GEMM,
        ``"fp64"`` a float64 GEMM, and ``"fp8"`` is unknown. Other device types
        are unknown. Overrides are never measured or looked up.
    """
    keyless = _checked_request(dtype, peak_flops, peak_bandwidth)
    device = torch.device(device)
    found = _overridden(peak_flops, peak_bandwidth)
    needs_flops, needs_bandwidth = peak_flops is None, peak_bandwidth is None
    if keyless and needs_flops:
        _warn_once(
            ("no peak key", dtype),
            f"cb_callback: no peak FLOP/s is known for {dtype} (peaks exist for {DTYPES}), so "
            "MFU is left empty; pass peak_flops=<FLOP/s> to set it.",
        )
        needs_flops = False
    name = _resolve_on_device(found, device, dtype, needs_flops, needs_bandwidth)
    return Peaks(
        device_name=name,
        dtype=dtype,
        flops=found.flops,
        bandwidth=found.bandwidth,
        flops_source=found.flops_source,
        bandwidth_source=found.bandwidth_source,
        reference=f"flops: {found.flops_ref}; bandwidth: {found.bandwidth_ref}",
        verified=found.verified,
        levels=found.levels,
        calibration=found.notes,
    )


def _checked_request(dtype: str, peak_flops: float | None, peak_bandwidth: float | None) -> bool:
    """Whether ``dtype`` is keyless (a torch dtype's full name, no peak key), once it and the overrides are valid.

    Raises:
        ValueError: ``dtype`` neither a peak key nor a torch dtype's full name, or a non-positive override.
    """
    keyless = dtype not in DTYPES
    if keyless and not _torch_dtype_name(dtype):
        raise ValueError(
            f"dtype={dtype!r} is not a peak key; use one of {DTYPES} (or a torch dtype's full "
            "name, e.g. 'torch.int8', for one without a peak)"
        )
    _check_override("peak_flops", peak_flops)
    _check_override("peak_bandwidth", peak_bandwidth)
    return keyless


def _overridden(peak_flops: float | None, peak_bandwidth: float | None) -> _Found:
    """The peaks the user set (source ``"user"``), the others still unknown."""
    found = _Found(flops=peak_flops, bandwidth=peak_bandwidth)
    if peak_flops is not None:
        found.flops_source, found.flops_ref = "user", "user override"
    if peak_bandwidth is not None:
        found.bandwidth_source, found.bandwidth_ref = "user", "user override"
    return found


def _resolve_on_device(
    found: _Found, device: torch.device, dtype: str, needs_flops: bool, needs_bandwidth: bool
) -> str:
    """Fill what ``found`` still needs by the device's type: CUDA from the tables, CPU measured, others unknown.

    Returns:
        The device's name (the CUDA device name, the CPU's, else ``str(device)``).
    """
    if device.type == "cuda":
        name = _cuda_device_name(device)
        _from_table(found, name, dtype, needs_flops, needs_bandwidth)
    elif device.type == "cpu":
        name = cpu_device_name()
        _measured(found, name, dtype, needs_flops, needs_bandwidth)
    else:
        name = str(device)
        if needs_flops or needs_bandwidth:
            _warn_once(
                (device.type,),
                f"cb_callback: no peaks are known for {device.type!r} devices, so MFU and "
                f"bandwidth utilisation are left empty; {_fix_hint()}.",
            )
    return name


@dataclass
class _Found:
    """The peaks as far as resolved (see :class:`Peaks` for each field)."""

    flops: float | None = None
    bandwidth: float | None = None
    flops_source: str = "unknown"
    bandwidth_source: str = "unknown"
    flops_ref: str = "unknown"
    bandwidth_ref: str = "unknown"
    verified: bool | None = None  # whether the table figures used were checked
    levels: tuple[CacheLevel, ...] = ()
    notes: dict[str, Any] = field(default_factory=dict)


def _from_table(found: _Found, name: str, dtype: str, needs_flops: bool, needs_bandwidth: bool) -> None:
    """A GPU's peaks from its datasheet or registered entry; one warning for what is missing."""
    if not (needs_flops or needs_bandwidth):
        return
    spec = gpu_spec(name)
    if spec is None:
        _warn_once(
            ("cuda", name),
            f"cb_callback: GPU {name!r} is not in the datasheet table, so MFU and "
            f"bandwidth utilisation are left empty; {_fix_hint()}, or add the GPU once "
            "with cb_callback.register_device_peaks(...).",
        )
        return
    if needs_flops:
        found.flops = spec.flops_for(dtype)
        if found.flops is None:
            if is_registered(spec):
                what = f"registered {spec.name} entry has no {dtype} peak"
            elif dtype == "fp64":
                what = f"{spec.name} datasheet has no {dtype} peak (the table records no FP64 rates)"
            else:
                what = f"{spec.name} datasheet has no {dtype} peak (the GPU lacks it)"
            _warn_once(
                ("cuda", name, dtype),
                f"cb_callback: the {what}, so MFU is left empty; pass peak_flops=<FLOP/s> to set it.",
            )
        else:
            found.flops_source = _entry_source(spec)
            found.flops_ref = _entry_reference(spec, f"{spec.name} {dtype}")
            found.verified = spec.verified
    if needs_bandwidth:
        found.bandwidth = spec.bandwidth
        found.bandwidth_source = _entry_source(spec)
        found.bandwidth_ref = _entry_reference(spec, spec.name)
        found.verified = spec.verified


def _measured(found: _Found, name: str, dtype: str, needs_flops: bool, needs_bandwidth: bool) -> None:
    """A CPU's peaks, calibrated here (or the best kept for this machine); one warning for what cannot be."""
    threads = torch.get_num_threads()
    gemm_dtype = CPU_GEMM_DTYPES.get(dtype)
    kind = f"gemm {str(gemm_dtype).removeprefix('torch.')}"
    if needs_flops and gemm_dtype is None:
        _warn_once(
            ("cpu", name, dtype),
            f"cb_callback: no {dtype} peak is known for CPUs, so MFU is left empty; "
            f"pass peak_flops=<FLOP/s> to set it.",
        )
    elif needs_flops and gemm_dtype is not None:
        try:
            found.flops = measure_cpu_flops(gemm_dtype)
        except RuntimeError as err:
            _warn_once(
                ("cpu", name, dtype),
                f"cb_callback: could not measure a {dtype} GEMM on this CPU ({err}); "
                f"MFU is left empty; pass peak_flops=<FLOP/s> to set it.",
            )
        else:
            found.flops_source = "measured"
            found.flops_ref = f"best torch.mm {gemm_dtype} GEMM, {threads} threads{_kept(kind)}"
    if needs_bandwidth:
        found.levels = measure_cpu_cache_bandwidths()
        found.bandwidth = measure_cpu_bandwidth()
        found.bandwidth_source = "measured"
        found.bandwidth_ref = f"best DRAM-sized copy_ (read + write), {threads} threads{_kept('copy DRAM')}"
    notes = calibration_notes()
    found.notes = {k: v for k, v in notes.items() if k.startswith("copy") and needs_bandwidth}
    if found.flops_source == "measured":
        found.notes.update({k: v for k, v in notes.items() if k == kind})


def _kept(kind: str) -> str:
    """``" (the best kept for this machine: 3 runs since 2026-12-01)"`` when the figure is the cache's."""
    note = calibration_notes().get(kind, {})
    if note.get("used") != "cache":
        return ""
    why = "the machine was busy: not measured" if note.get("measured") is None else "higher than measured now"
    runs, last = note.get("cached_runs"), str(note.get("cached_last") or "")[:10]
    return f" (the best kept for this machine, {runs} runs, last {last}; {why})"
