"""The sourced datasheet table of GPU peaks: data only, no matching or resolution.

Every figure carries its source in a comment; an entry whose figures were not
checked against the vendor's datasheet says so with ``verified=False``, which
:func:`cb_callback._hardware.peaks.resolve_peaks` carries into ``report.metadata["peaks"]``.
Name matching lives in :mod:`cb_callback._hardware.names`, user entries in
:mod:`cb_callback._hardware.registry`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DTYPES", "GPU_SPECS", "GpuSpec"]

#: The peak keys a caller may ask for. ``fp32`` is the non-tensor-core FP32 rate;
#: ``tf32`` / ``bf16`` / ``fp16`` / ``fp8`` are dense tensor-core rates; ``fp64``
#: is measured on CPU and not in the built-in GPU table (unknown there).
DTYPES: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp64")


@dataclass(frozen=True)
class GpuSpec:
    """One table entry: dense peak FLOP/s per dtype key and memory bandwidth.

    Args:
        name: the entry's name, e.g. ``"H100 SXM"``.
        model: the model token a device name must contain, e.g. ``"h100"``.
        form: the form-factor token (``"sxm"``, ``"pcie"``, ``"nvl"``) the device
            name must carry, or ``None`` if the model has one form only.
        memory_gb: the memory-size token (``40`` for ``"40GB"``) the device name
            must carry, or ``None`` if all memory sizes share the figures.
        default_form: whether a device name without any form token means this entry
            (``"NVIDIA H100 80GB HBM3"`` is the SXM part, ``"NVIDIA H200"`` too).
        fp32: non-tensor FP32 FLOP/s, ``None`` if unknown (only a registered entry
            may leave it out).
        tf32: dense TF32 tensor-core FLOP/s, ``None`` if the GPU has none.
        bf16: dense BF16 tensor-core FLOP/s, ``None`` if the GPU has none.
        fp16: dense FP16 tensor-core FLOP/s (FP32 accumulate).
        fp8: dense FP8 tensor-core FLOP/s, ``None`` if the GPU has none.
        bandwidth: peak memory bandwidth in bytes/s (1 TB/s = 1e12 bytes/s).
        reference: the datasheet the figures come from.
        verified: whether the figures were checked against that datasheet; an
            entry copied from secondary sources or from memory is ``False``.
        fp64: dense FP64 FLOP/s; the built-in entries record none (``None``), a
            registered entry may.

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
    fp32: float | None
    tf32: float | None
    bf16: float | None
    fp16: float | None
    fp8: float | None
    bandwidth: float
    reference: str
    verified: bool
    fp64: float | None = None

    def flops_for(self, dtype: str) -> float | None:
        """The dense peak FLOP/s for the dtype key (one of :data:`DTYPES`), ``None`` if absent."""
        values: dict[str, float | None] = {
            "fp32": self.fp32,
            "tf32": self.tf32,
            "bf16": self.bf16,
            "fp16": self.fp16,
            "fp8": self.fp8,
            "fp64": self.fp64,
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
    # itself), hence verified=False. The DGX B200 datasheet lists 64 TB/s per 8 GPUs
    # (8 TB/s each); the lower per-GPU HGX figure is used.
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
        verified=False,
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
        verified=True,
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
        verified=True,
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
        verified=True,
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
        verified=True,
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
        verified=True,
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
        verified=True,
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
        verified=True,
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
        verified=True,
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
        verified=True,
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
        verified=True,
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
        verified=True,
    ),
    # A10, NVIDIA A10 datasheet, dense | sparse columns: FP32 31.2 TF; TF32 62.5 | 125;
    # BF16/FP16 125 | 250; no FP8; 24 GB GDDR6 at 600 GB/s. Only the bandwidth and
    # FP32 were confirmed against copies found here; the tensor figures are from the
    # datasheet as recalled and as cited by Lightning's table, not re-read: hence
    # verified=False for the entry.
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
        verified=False,
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
        verified=True,
    ),
    # V100 PCIe, V100 datasheet: FP32 14 TF; Tensor 112 TF (FP16, dense); 900 GB/s.
    # These PCIe figures were not re-read against the datasheet PDF: verified=False.
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
        verified=False,
    ),
)
