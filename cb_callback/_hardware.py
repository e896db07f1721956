"""Hardware peaks (FLOP/s and bytes/s) that MFU and bandwidth utilisation divide by.

Three sources, in order of precedence: the user's overrides, a sourced datasheet
table for NVIDIA data-center GPUs, and a short measured calibration on CPU.
Whatever the source, it is recorded in :class:`Peaks` and so in the report's
metadata.
"""

from __future__ import annotations

import math
import platform
import re
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "DTYPES",
    "GPU_SPECS",
    "GpuSpec",
    "Peaks",
    "calibration_spread",
    "gpu_spec",
    "measure_cpu_bandwidth",
    "measure_cpu_flops",
    "recalibrate_cpu_flops",
    "resolve_peaks",
]

#: The peak keys a caller may ask for. ``fp32`` is the non-tensor-core FP32 rate;
#: ``tf32`` / ``bf16`` / ``fp16`` / ``fp8`` are dense tensor-core rates; ``fp64``
#: is measured on CPU and not in the GPU table (unknown there).
DTYPES: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp64")

#: Every value ``Peaks.flops_source`` / ``Peaks.bandwidth_source`` can take.
SOURCES: tuple[str, ...] = ("datasheet", "measured", "user", "unknown")


@dataclass(frozen=True)
class GpuSpec:
    """One datasheet entry: dense peak FLOP/s per dtype key and memory bandwidth.

    Args:
        name: the entry's name, e.g. ``"H100 SXM"``.
        model: the model token a device name must contain, e.g. ``"h100"``.
        form: the form-factor token (``"sxm"``, ``"pcie"``, ``"nvl"``) the device
            name must carry, or ``None`` if the model has one form only.
        memory_gb: the memory-size token (``40`` for ``"40GB"``) the device name
            must carry, or ``None`` if all memory sizes share the figures.
        default_form: whether a device name without any form token means this entry
            (``"NVIDIA H100 80GB HBM3"`` is the SXM part, ``"NVIDIA H200"`` too).
        fp32: non-tensor FP32 FLOP/s.
        tf32: dense TF32 tensor-core FLOP/s, ``None`` if the GPU has none.
        bf16: dense BF16 tensor-core FLOP/s, ``None`` if the GPU has none.
        fp16: dense FP16 tensor-core FLOP/s (FP32 accumulate).
        fp8: dense FP8 tensor-core FLOP/s, ``None`` if the GPU has none.
        bandwidth: peak memory bandwidth in bytes/s (1 TB/s = 1e12 bytes/s).
        reference: the datasheet the figures come from.

    Notes:
        A peak is the vendor's theoretical maximum at boost clock, never reached by
        real kernels; a GEMM that sustains 70-80 % of it is doing well. The figures
        are dense: NVIDIA quotes tensor-core rates "with sparsity" (2:4 structured),
        which are exactly twice the dense rate, and this table stores them halved.
    """

    name: str
    model: str
    form: str | None
    memory_gb: int | None
    default_form: bool
    fp32: float
    tf32: float | None
    bf16: float | None
    fp16: float | None
    fp8: float | None
    bandwidth: float
    reference: str

    def flops_for(self, dtype: str) -> float | None:
        """The dense peak FLOP/s for the dtype key, ``None`` if the GPU lacks it.

        ``fp64`` is always ``None``: the table records no FP64 rates.
        """
        values: dict[str, float | None] = {
            "fp32": self.fp32,
            "tf32": self.tf32,
            "bf16": self.bf16,
            "fp16": self.fp16,
            "fp8": self.fp8,
            "fp64": None,
        }
        return values[dtype]


_H100_REF = (
    "NVIDIA H100 Tensor Core GPU datasheet / product page spec table, "
    "https://www.nvidia.com/en-us/data-center/h100/ (tensor-core rates 'with sparsity', halved)"
)
_H200_REF = (
    "NVIDIA H200 product page spec table, https://www.nvidia.com/en-us/data-center/h200/ "
    "(tensor-core rates 'with sparsity', halved)"
)
_A100_REF = (
    "NVIDIA A100 Tensor Core GPU datasheet, https://www.nvidia.com/content/dam/en-zz/Solutions/"
    "Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf (dense column)"
)
_V100_REF = (
    "NVIDIA Tesla V100 datasheet, https://images.nvidia.com/content/technologies/volta/pdf/"
    "volta-v100-datasheet-update-us-1165301-r5.pdf ('Tensor Performance' is dense FP16)"
)

# NVIDIA datasheets quote tensor-core TFLOPS "with sparsity" (2:4 structured
# sparsity doubles the rate); MFU of a dense model must divide by the dense rate,
# so every sparse figure below is halved and the comment shows the arithmetic.
# FP32 is the CUDA-core (non-tensor) rate, never sparse. Bandwidth is in bytes/s
# with NVIDIA's decimal units (3.35 TB/s = 3.35e12).
GPU_SPECS: tuple[GpuSpec, ...] = (
    # B200, HGX B200 per-GPU column of the NVIDIA Blackwell datasheet / HGX page,
    # https://www.nvidia.com/en-us/data-center/hgx/ (per GPU, with sparsity):
    # FP8 9 PF, FP16/BF16 4.5 PF, TF32 2.2 PF; FP32 75 TF; 180 GB HBM3e at 7.7 TB/s.
    # Dense: 9/2 = 4.5 PF, 4.5/2 = 2.25 PF, 2.2/2 = 1.1 PF.
    # Verified only through secondary copies of the datasheet table (not the PDF
    # itself). The DGX B200 datasheet lists 64 TB/s per 8 GPUs (8 TB/s each); the
    # lower per-GPU HGX figure is used.
    GpuSpec(
        name="B200",
        model="b200",
        form=None,
        memory_gb=None,
        default_form=True,
        fp32=75e12,
        tf32=1.1e15,
        bf16=2.25e15,
        fp16=2.25e15,
        fp8=4.5e15,
        bandwidth=7.7e12,
        reference="NVIDIA Blackwell datasheet, HGX B200 per-GPU column, "
        "https://www.nvidia.com/en-us/data-center/hgx/ (tensor-core rates 'with sparsity', halved)",
    ),
    # H200 SXM, H200 product page: FP32 67 TF; TF32 989*, BF16/FP16 1,979*, FP8 3,958*
    # (* with sparsity); 141 GB HBM3e at 4.8 TB/s. Dense: 494.5, 989.5, 989.5, 1,979 TF.
    # The device name is plain "NVIDIA H200": this is the default H200 entry.
    GpuSpec(
        name="H200 SXM",
        model="h200",
        form="sxm",
        memory_gb=None,
        default_form=True,
        fp32=67e12,
        tf32=494.5e12,
        bf16=989.5e12,
        fp16=989.5e12,
        fp8=1979e12,
        bandwidth=4.8e12,
        reference=_H200_REF,
    ),
    # H200 NVL, same page: FP32 60 TF; TF32 835*, BF16/FP16 1,671*, FP8 3,341*;
    # 141 GB at 4.8 TB/s. Dense: 417.5, 835.5, 835.5, 1,670.5 TF.
    GpuSpec(
        name="H200 NVL",
        model="h200",
        form="nvl",
        memory_gb=None,
        default_form=False,
        fp32=60e12,
        tf32=417.5e12,
        bf16=835.5e12,
        fp16=835.5e12,
        fp8=1670.5e12,
        bandwidth=4.8e12,
        reference=_H200_REF,
    ),
    # H100 SXM, H100 datasheet: FP32 67 TF; TF32 989*, BF16/FP16 1,979*, FP8 3,958*;
    # 80 GB HBM3 at 3.35 TB/s. Dense: 494.5, 989.5, 989.5, 1,979 TF. The SXM part
    # reports itself as "NVIDIA H100 80GB HBM3" (no form token): default entry.
    GpuSpec(
        name="H100 SXM",
        model="h100",
        form="sxm",
        memory_gb=None,
        default_form=True,
        fp32=67e12,
        tf32=494.5e12,
        bf16=989.5e12,
        fp16=989.5e12,
        fp8=1979e12,
        bandwidth=3.35e12,
        reference=_H100_REF,
    ),
    # H100 PCIe, H100 datasheet: FP32 51 TF; TF32 756*, BF16/FP16 1,513*, FP8 3,026*;
    # 80 GB HBM2e at 2 TB/s. Dense: 378, 756.5, 756.5, 1,513 TF.
    GpuSpec(
        name="H100 PCIe",
        model="h100",
        form="pcie",
        memory_gb=None,
        default_form=False,
        fp32=51e12,
        tf32=378e12,
        bf16=756.5e12,
        fp16=756.5e12,
        fp8=1513e12,
        bandwidth=2.0e12,
        reference=_H100_REF,
    ),
    # H100 NVL (94 GB, per GPU; the current page, not the launch-time two-card
    # figures), H100 product page: FP32 60 TF; TF32 835*, BF16/FP16 1,671*,
    # FP8 3,341*; 94 GB HBM3 at 3.9 TB/s. Dense: 417.5, 835.5, 835.5, 1,670.5 TF.
    GpuSpec(
        name="H100 NVL",
        model="h100",
        form="nvl",
        memory_gb=None,
        default_form=False,
        fp32=60e12,
        tf32=417.5e12,
        bf16=835.5e12,
        fp16=835.5e12,
        fp8=1670.5e12,
        bandwidth=3.9e12,
        reference=_H100_REF,
    ),
    # A100, A100 datasheet (r4), dense column (sparse = 2x): FP32 19.5 TF; TF32 156 TF;
    # BF16/FP16 312 TF; no FP8. Same FLOPs for all four SKUs; bandwidth differs:
    # 40GB PCIe 1,555 GB/s, 40GB SXM 1,555 GB/s, 80GB PCIe 1,935 GB/s, 80GB SXM 2,039 GB/s.
    # A device name without a form or memory token is ambiguous and stays unknown.
    GpuSpec(
        name="A100 SXM 40GB",
        model="a100",
        form="sxm",
        memory_gb=40,
        default_form=False,
        fp32=19.5e12,
        tf32=156e12,
        bf16=312e12,
        fp16=312e12,
        fp8=None,
        bandwidth=1.555e12,
        reference=_A100_REF,
    ),
    GpuSpec(
        name="A100 PCIe 40GB",
        model="a100",
        form="pcie",
        memory_gb=40,
        default_form=False,
        fp32=19.5e12,
        tf32=156e12,
        bf16=312e12,
        fp16=312e12,
        fp8=None,
        bandwidth=1.555e12,
        reference=_A100_REF,
    ),
    GpuSpec(
        name="A100 SXM 80GB",
        model="a100",
        form="sxm",
        memory_gb=80,
        default_form=False,
        fp32=19.5e12,
        tf32=156e12,
        bf16=312e12,
        fp16=312e12,
        fp8=None,
        bandwidth=2.039e12,
        reference=_A100_REF,
    ),
    GpuSpec(
        name="A100 PCIe 80GB",
        model="a100",
        form="pcie",
        memory_gb=80,
        default_form=False,
        fp32=19.5e12,
        tf32=156e12,
        bf16=312e12,
        fp16=312e12,
        fp8=None,
        bandwidth=1.935e12,
        reference=_A100_REF,
    ),
    # L40S, NVIDIA L40S datasheet / https://www.nvidia.com/en-us/data-center/l40s/:
    # FP32 91.6 TF; TF32 366*, BF16/FP16 733*, FP8 1,466*; 48 GB GDDR6 at 864 GB/s.
    # Dense: 183, 366.5, 366.5, 733 TF. (Some copies of the datasheet print a dense
    # BF16 of 362.05 TF, the L40's figure; 733/2 matches 142 SMs x 1024 FLOP/clk x
    # 2.52 GHz = 366.4 TF, so the halved sparse figure is used.)
    GpuSpec(
        name="L40S",
        model="l40s",
        form=None,
        memory_gb=None,
        default_form=True,
        fp32=91.6e12,
        tf32=183e12,
        bf16=366.5e12,
        fp16=366.5e12,
        fp8=733e12,
        bandwidth=864e9,
        reference="NVIDIA L40S datasheet, https://www.nvidia.com/en-us/data-center/l40s/ "
        "(tensor-core rates 'with sparsity', halved)",
    ),
    # L4, NVIDIA L4 datasheet / https://www.nvidia.com/en-us/data-center/l4/:
    # FP32 30.3 TF; TF32 120*, BF16/FP16 242*, FP8 485*; 24 GB GDDR6 at 300 GB/s.
    # Dense: 60, 121, 121, 242.5 TF.
    GpuSpec(
        name="L4",
        model="l4",
        form=None,
        memory_gb=None,
        default_form=True,
        fp32=30.3e12,
        tf32=60e12,
        bf16=121e12,
        fp16=121e12,
        fp8=242.5e12,
        bandwidth=300e9,
        reference="NVIDIA L4 datasheet, https://www.nvidia.com/en-us/data-center/l4/ "
        "(tensor-core rates 'with sparsity', halved)",
    ),
    # A10, NVIDIA A10 datasheet, dense | sparse columns: FP32 31.2 TF; TF32 62.5 | 125;
    # BF16/FP16 125 | 250; no FP8; 24 GB GDDR6 at 600 GB/s. Only the bandwidth and
    # FP32 were confirmed against copies found here; the tensor figures are from the
    # datasheet as recalled and as cited by Lightning's table, not re-read.
    # (The AWS "A10G" is a different part and is not this entry.)
    GpuSpec(
        name="A10",
        model="a10",
        form=None,
        memory_gb=None,
        default_form=True,
        fp32=31.2e12,
        tf32=62.5e12,
        bf16=125e12,
        fp16=125e12,
        fp8=None,
        bandwidth=600e9,
        reference="NVIDIA A10 datasheet, https://www.nvidia.com/content/dam/en-zz/Solutions/"
        "Data-Center/a10/pdf/a10-datasheet.pdf (dense column)",
    ),
    # V100 SXM2, V100 datasheet: FP32 15.7 TF; Tensor 125 TF (FP16, dense: Volta has no
    # sparsity); no TF32/BF16/FP8; 16/32 GB HBM2 at 900 GB/s. "SXM3" (DGX-2) parts
    # match this entry too and may run slightly above it.
    GpuSpec(
        name="V100 SXM2",
        model="v100",
        form="sxm",
        memory_gb=None,
        default_form=False,
        fp32=15.7e12,
        tf32=None,
        bf16=None,
        fp16=125e12,
        fp8=None,
        bandwidth=900e9,
        reference=_V100_REF,
    ),
    # V100 PCIe, V100 datasheet: FP32 14 TF; Tensor 112 TF (FP16, dense); 900 GB/s.
    # (V100S reports "V100S", another token, and is not matched.)
    GpuSpec(
        name="V100 PCIe",
        model="v100",
        form="pcie",
        memory_gb=None,
        default_form=False,
        fp32=14e12,
        tf32=None,
        bf16=None,
        fp16=112e12,
        fp8=None,
        bandwidth=900e9,
        reference=_V100_REF,
    ),
)

_MODELS = frozenset(spec.model for spec in GPU_SPECS)
_VENDOR_TOKENS = frozenset({"nvidia", "tesla", "geforce", "quadro"})
_MEMORY_TOKEN = re.compile(r"^(\d+)gb$")


def _tokens(device_name: str) -> list[str]:
    """Lower-case alphanumeric tokens: ``"NVIDIA A100-SXM4-80GB"`` -> ``[a100, sxm4, 80gb]``."""
    return [
        t for t in re.split(r"[^a-z0-9]+", device_name.lower()) if t and t not in _VENDOR_TOKENS
    ]


def _form(tokens: list[str]) -> str | None:
    if "nvl" in tokens:
        return "nvl"
    if any(t in ("pcie", "pci") for t in tokens):
        return "pcie"
    if any(re.fullmatch(r"sxm\d*", t) for t in tokens):
        return "sxm"
    return None


def gpu_spec(device_name: str) -> GpuSpec | None:
    """The datasheet entry for a CUDA device name, or ``None`` if it is not in the table.

    Args:
        device_name: what ``torch.cuda.get_device_name()`` returns, e.g.
            ``"NVIDIA H100 80GB HBM3"`` or ``"Tesla V100-SXM2-16GB"``.

    Returns:
        The single entry whose model token, form factor and memory size the name
        matches, or ``None`` when none or several do.

    Notes:
        Matching is by whole tokens after lower-casing and splitting on anything
        that is not a letter or digit, so ``"L4"`` never matches ``"L40S"``,
        ``"A10"`` never matches ``"A100"`` and ``"H20"`` never matches ``"H200"``.
        A name without a form-factor token means the model's default entry
        (``"NVIDIA H200"`` is the SXM part); an A100 name must say its form factor
        and memory size, because the bandwidths of the four SKUs differ.
    """
    tokens = _tokens(device_name)
    model = next((t for t in tokens if t in _MODELS), None)
    if model is None:
        return None
    form = _form(tokens)
    memory = next((int(m.group(1)) for t in tokens if (m := _MEMORY_TOKEN.match(t))), None)
    matches = [
        spec
        for spec in GPU_SPECS
        if spec.model == model
        and (spec.form is None or spec.form == form or (form is None and spec.default_form))
        and (spec.memory_gb is None or spec.memory_gb == memory)
    ]
    return matches[0] if len(matches) == 1 else None


@dataclass(frozen=True)
class Peaks:
    """The peaks one report's MFU and bandwidth utilisation are relative to.

    Args:
        device_name: the CUDA device name, or the CPU model name.
        dtype: the peak key (one of :data:`DTYPES`), or the full name of a torch
            dtype that has none (``"torch.int8"``).
        flops: peak FLOP/s, dense; ``None`` when unknown.
        bandwidth: peak memory bandwidth in bytes/s; ``None`` when unknown.
        flops_source: ``"datasheet"``, ``"measured"``, ``"user"`` or ``"unknown"``.
        bandwidth_source: same vocabulary.
        reference: which datasheet entry, or how the peak was measured.

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

    def to_metadata(self) -> dict[str, Any]:
        """The fields as a JSON-friendly dict (floats, strings and ``None``)."""
        return asdict(self)


# --- warn once per process ---------------------------------------------------

_WARNED: set[tuple[str, ...]] = set()


def _warn_once(key: tuple[str, ...], message: str) -> None:
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(message, UserWarning, stacklevel=3)


# --- CPU calibration -----------------------------------------------------------

_GEMM_SIZES: tuple[int, ...] = (256, 512, 1024, 2048)
_GEMM_MIN_REPEATS = 5
_GEMM_SIZE_BUDGET_S = 0.05  # keep repeating one size until this much time was spent
_GEMM_BUDGET_S = 0.3  # do not start a size that would take the total past this
_GEMM_LONG_ENOUGH_S = 0.02  # one GEMM this long is representative; stop growing
_COPY_BYTES = 128 * 2**20  # 128 MiB source (and as much destination)
_COPY_MIN_REPEATS = 4
_COPY_BUDGET_S = 0.1
_MAX_REPEATS = 50

_FLOPS_CACHE: dict[tuple[torch.dtype, int], float] = {}
_BANDWIDTH_CACHE: dict[int, float] = {}
#: Per ``(dtype, threads)``: how much the calibration disagreed with itself (median
#: of the winning size's timed calls ÷ its best - 1), and how often it ran.
_FLOPS_SPREAD: dict[tuple[torch.dtype, int], float] = {}
_FLOPS_RUNS: dict[tuple[torch.dtype, int], int] = {}
_LAST_SPREAD: list[float | None] = [None]
#: A calibration whose calls disagree by more than this ran on a busy machine: it is
#: measured again on the next profile (at most ``_MAX_CALIBRATIONS`` times a process).
CALIBRATION_SPREAD_LIMIT = 0.25
_MAX_CALIBRATIONS = 3


def _best_seconds(
    fn: Callable[[], object], min_repeats: int, budget_s: float
) -> tuple[float, float]:
    """Time calls of ``fn`` after one warm-up call: ``(best call, total spent)`` in seconds.

    Calls until at least ``min_repeats`` were timed and ``budget_s`` was spent (at
    most ``_MAX_REPEATS``), so a call slowed by other load is outlived by a later one.
    """
    begin = time.perf_counter()
    fn()
    best = math.inf
    times = []
    for count in range(1, _MAX_REPEATS + 1):
        start = time.perf_counter()
        fn()
        end = time.perf_counter()
        times.append(end - start)
        best = min(best, end - start)
        if count >= min_repeats and end - begin >= budget_s:
            break
    times.sort()
    _LAST_SPREAD[0] = times[len(times) // 2] / best - 1 if best > 0 else None
    return best, time.perf_counter() - begin


def measure_cpu_flops(dtype: torch.dtype) -> float:
    """Best GEMM throughput of this CPU in FLOP/s for ``dtype``, measured once per process.

    Args:
        dtype: the element type of the square ``torch.mm`` operands.

    Returns:
        The highest ``2 * n**3 / seconds`` over square sizes 256, 512, ... 2048 and
        both right-operand layouts (``b`` and ``b.t()``, nn.Linear's), each the
        fastest of several calls; the sizes stop growing once one GEMM
        takes 20 ms or the next size would take the total past about 0.3 s.

    Raises:
        RuntimeError: if ``torch.mm`` does not support ``dtype`` on CPU.

    Notes:
        The result is cached per ``(dtype, torch.get_num_threads())``: changing the
        thread count measures again. :func:`recalibrate_cpu_flops` measures again
        when the calibration disagreed with itself, keeping the best. It is what PyTorch's CPU GEMM reaches here, not
        the silicon's theoretical peak; other load on the machine lowers it, which
        the fastest-of-several only partly undoes.
    """
    key = (dtype, torch.get_num_threads())
    cached = _FLOPS_CACHE.get(key)
    if cached is not None:
        return cached
    return _calibrate_flops(dtype)


def _calibrate_flops(dtype: torch.dtype) -> float:
    key = (dtype, torch.get_num_threads())
    cached = _FLOPS_CACHE.get(key)
    runs = _FLOPS_RUNS.get(key, 0)
    best_rate = 0.0
    best_spread: float | None = None
    spent = 0.0
    for n in _GEMM_SIZES:
        a = torch.randn(n, n).to(dtype)
        b = torch.randn(n, n).to(dtype)
        out = torch.empty(n, n, dtype=dtype)
        best = math.inf
        size_spread: float | None = None
        # Both operand layouts: ``x @ w.t()`` is nn.Linear's, and for bf16 on some
        # CPUs the only fast one (plain bf16 ``a @ b`` ran 10x slower here).
        for rhs in (b, b.t()):
            _LAST_SPREAD[0] = None
            layout_best, size_spent = _best_seconds(
                partial(torch.mm, a, rhs, out=out), _GEMM_MIN_REPEATS, _GEMM_SIZE_BUDGET_S
            )
            if layout_best < best:
                best, size_spread = layout_best, _LAST_SPREAD[0]
            spent += size_spent
        rate = 2 * n**3 / max(best, 1e-9)
        if rate > best_rate:
            best_rate, best_spread = rate, size_spread
        # The next size does 8x the work per call: skip it if it would not fit.
        next_cost = 8 * best * (_GEMM_MIN_REPEATS + 1)
        if best >= _GEMM_LONG_ENOUGH_S or spent + next_cost > _GEMM_BUDGET_S:
            break
    # A repeated calibration keeps the best: load only ever slows a GEMM down.
    best_rate = max(best_rate, cached or 0.0)
    _FLOPS_CACHE[key] = best_rate
    _FLOPS_RUNS[key] = runs + 1
    if best_spread is not None:
        _FLOPS_SPREAD[key] = best_spread
    return best_rate


def recalibrate_cpu_flops(dtype: str) -> float | None:
    """Measure the CPU GEMM peak for the peak key ``dtype`` again if its calibration was unsure.

    When :func:`calibration_spread` exceeds :data:`CALIBRATION_SPREAD_LIMIT` (the
    calibration's calls disagreed: the machine was busy), the calibration runs
    again, at most 3 times a process and thread count; the cached peak becomes
    the best of the runs (load only ever slows a GEMM down).

    Returns:
        The (possibly raised) cached peak, or ``None`` when nothing is calibrated.
    """
    gemm = _CPU_GEMM_DTYPES.get(dtype)
    if gemm is None:
        return None
    key = (gemm, torch.get_num_threads())
    spread = _FLOPS_SPREAD.get(key)
    if (
        key in _FLOPS_CACHE
        and spread is not None
        and spread > CALIBRATION_SPREAD_LIMIT
        and _FLOPS_RUNS.get(key, 0) < _MAX_CALIBRATIONS
    ):
        _calibrate_flops(gemm)
    return _FLOPS_CACHE.get(key)


def calibration_spread(dtype: str) -> float | None:
    """How much the last CPU GEMM calibration for the peak key ``dtype`` disagreed with itself.

    The median ÷ the best of the timed calls of the size that set the peak,
    minus 1 (0.1: the median call was 10 % slower than the best), for the
    current thread count; ``None`` when none ran in this process. Above
    :data:`CALIBRATION_SPREAD_LIMIT` the calibration ran on a busy machine and is
    repeated on the next profile (the peak keeps the best of the runs).
    """
    gemm = _CPU_GEMM_DTYPES.get(dtype)
    return None if gemm is None else _FLOPS_SPREAD.get((gemm, torch.get_num_threads()))


def measure_cpu_bandwidth() -> float:
    """Memory bandwidth of this CPU in bytes/s, from a large copy, measured once per process.

    Returns:
        ``2 * 128 MiB / seconds`` for the fastest of several ``dst.copy_(src)`` of a
        128 MiB float32 tensor (about 0.1 s in all): bytes read plus bytes written.

    Notes:
        Cached per ``torch.get_num_threads()``. A copy is what the memory-bound ops
        of a model do, so it is a fair roof for their bandwidth utilisation; a
        STREAM triad or non-temporal stores can reach somewhat more. A last-level
        cache larger than 128 MiB would inflate the figure.
    """
    key = torch.get_num_threads()
    cached = _BANDWIDTH_CACHE.get(key)
    if cached is not None:
        return cached
    src = torch.ones(_COPY_BYTES // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    best, _ = _best_seconds(lambda: dst.copy_(src), _COPY_MIN_REPEATS, _COPY_BUDGET_S)
    rate = 2 * _COPY_BYTES / max(best, 1e-9)
    _BANDWIDTH_CACHE[key] = rate
    return rate


def _clear_caches() -> None:
    """Forget measured peaks and issued warnings (for tests)."""
    _FLOPS_CACHE.clear()
    _BANDWIDTH_CACHE.clear()
    _FLOPS_SPREAD.clear()
    _FLOPS_RUNS.clear()
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

_CPU_GEMM_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "tf32": torch.float32,  # CPUs have no TF32; fp32 GEMM is what runs
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    # Measured like the others: one more ~0.3 s calibration, once per process, and
    # only for a float64 model; fp64 GEMMs run at about half the fp32 rate on CPUs,
    # so an fp32 peak would halve a float64 model's MFU.
    "fp64": torch.float64,
}


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
        CUDA peaks come from the datasheet table (:func:`gpu_spec`); a GPU missing
        from it, or a dtype it lacks (V100 bf16, A100 fp8; every GPU's fp64, which
        the table does not record), gives ``None`` and one warning per device name
        (and dtype) per process. CPU peaks are measured (:func:`measure_cpu_flops`,
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
                f"bandwidth utilisation are left empty; {_fix_hint()}.",
            )
        if spec is not None:
            if needs_flops:
                flops = spec.flops_for(dtype)
                if flops is None:
                    why = (
                        "the table records no FP64 rates"
                        if dtype == "fp64"
                        else "the GPU lacks it"
                    )
                    _warn_once(
                        ("cuda", name, dtype),
                        f"cb_callback: the {spec.name} datasheet has no {dtype} peak ({why}), "
                        f"so MFU is left empty; pass peak_flops= (FLOP/s) to set it.",
                    )
                else:
                    flops_source, flops_ref = "datasheet", f"{spec.name} {dtype}: {spec.reference}"
            if needs_bandwidth:
                bandwidth = spec.bandwidth
                bandwidth_source, bandwidth_ref = "datasheet", f"{spec.name}: {spec.reference}"
    elif device.type == "cpu":
        name = _cpu_device_name()
        threads = torch.get_num_threads()
        gemm_dtype = _CPU_GEMM_DTYPES.get(dtype)
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
                f"best copy_ of {_COPY_BYTES >> 20} MiB (read + write), {threads} threads"
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
    )
