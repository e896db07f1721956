"""Hardware peaks: datasheet matching, warn-once, user overrides, CPU calibration."""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Iterator

import pytest
import torch

from cb_callback._hardware import calibration as _calibration
from cb_callback._hardware import peaks as hw
from cb_callback._hardware.peaks import Peaks, gpu_spec, resolve_peaks


@pytest.fixture(autouse=True)
def _fresh_caches() -> Iterator[None]:
    hw._clear_caches()
    yield
    hw._clear_caches()


class FakeClock:
    """Stands in for ``_best_seconds``: every timed call takes ``best`` seconds."""

    def __init__(self, best: float = 1e-3) -> None:
        self.best = best
        self.calls = 0

    def __call__(self, fn: object, min_repeats: int, budget_s: float) -> tuple[float, float]:
        self.calls += 1
        return self.best, self.best * (min_repeats + 1)


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    clock = FakeClock()
    monkeypatch.setattr(_calibration, "_best_seconds", clock)
    # Three cache levels, whatever this machine's sysfs says (each level's copies and their
    # overhead are timed: 2 more calls each; with every call taking the same time the net
    # copy time is 0, so no level has a bandwidth and DRAM is the only ceiling).
    monkeypatch.setattr(_calibration, "cpu_cache_levels", lambda: (("L1", 48 << 10), ("L2", 1 << 20), ("L3", 32 << 20)))
    return clock


# --- datasheet table -----------------------------------------------------------

# (real torch.cuda.get_device_name() string, entry, dtype key, dense FLOP/s, bytes/s)
# Sparse datasheet figures appear as "sparse / 2".
REAL_NAMES = [
    ("NVIDIA B200", "B200", "bf16", 4.5e15 / 2, 7.7e12),
    ("NVIDIA B200", "B200", "fp8", 9e15 / 2, 7.7e12),
    ("NVIDIA H200", "H200 SXM", "bf16", 1979e12 / 2, 4.8e12),
    ("NVIDIA H200", "H200 SXM", "fp8", 3958e12 / 2, 4.8e12),
    ("NVIDIA H200 NVL", "H200 NVL", "bf16", 1671e12 / 2, 4.8e12),
    ("NVIDIA H100 80GB HBM3", "H100 SXM", "bf16", 1979e12 / 2, 3.35e12),
    ("NVIDIA H100 80GB HBM3", "H100 SXM", "tf32", 989e12 / 2, 3.35e12),
    ("NVIDIA H100 80GB HBM3", "H100 SXM", "fp32", 67e12, 3.35e12),
    ("NVIDIA H100 PCIe", "H100 PCIe", "bf16", 1513e12 / 2, 2.0e12),
    ("NVIDIA H100 NVL", "H100 NVL", "bf16", 1671e12 / 2, 3.9e12),
    ("NVIDIA A100-SXM4-40GB", "A100 SXM 40GB", "bf16", 312e12, 1.555e12),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB", "bf16", 312e12, 2.039e12),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB", "tf32", 156e12, 1.935e12),
    ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB", "fp32", 19.5e12, 1.555e12),
    ("NVIDIA L40S", "L40S", "bf16", 733e12 / 2, 864e9),
    ("NVIDIA L40S", "L40S", "fp8", 1466e12 / 2, 864e9),
    ("NVIDIA L4", "L4", "bf16", 242e12 / 2, 300e9),
    ("NVIDIA L4", "L4", "fp8", 485e12 / 2, 300e9),
    ("NVIDIA A10", "A10", "bf16", 125e12, 600e9),
    ("Tesla V100-SXM2-16GB", "V100 SXM2", "fp16", 125e12, 900e9),
    ("Tesla V100-PCIE-32GB", "V100 PCIe", "fp16", 112e12, 900e9),
]


@pytest.mark.parametrize(("name", "entry", "dtype", "flops", "bandwidth"), REAL_NAMES)
def test_real_device_names_resolve_to_their_entry(
    name: str, entry: str, dtype: str, flops: float, bandwidth: float
) -> None:
    spec = gpu_spec(name)
    assert spec is not None
    assert spec.name == entry
    assert spec.flops_for(dtype) == flops
    assert spec.bandwidth == bandwidth


def test_h100_sxm_bf16_is_the_dense_half_of_the_sparse_datasheet_figure() -> None:
    spec = gpu_spec("NVIDIA H100 80GB HBM3")
    assert spec is not None
    assert spec.bf16 == 989.5e12  # 1,979 TFLOPS "with sparsity" / 2


@pytest.mark.parametrize(
    ("name", "entry"),
    [
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB"),
        ("nvidia   l4", "L4"),  # case and separators do not matter
        ("NVIDIA_H100_PCIe", "H100 PCIe"),
        ("Tesla V100-SXM3-32GB", "V100 SXM2"),  # any SXM generation token is "sxm"
    ],
)
def test_token_matching_disambiguates(name: str, entry: str) -> None:
    spec = gpu_spec(name)
    assert spec is not None
    assert spec.name == entry


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA L40",  # not the L40S, not the L4
        "NVIDIA A10G",  # the AWS part, not the A10
        "NVIDIA H20",  # not the H200
        "NVIDIA GH200 480GB",  # not the H200
        "Tesla V100S-PCIE-32GB",  # not the V100
        "NVIDIA A100",  # ambiguous: four SKUs, three bandwidths
        "NVIDIA A100-SXM4",  # memory size missing
        "NVIDIA H200 PCIe",  # no such entry
        "NVIDIA GeForce RTX 4090",
        "",
    ],
)
def test_names_outside_the_table_are_none(name: str) -> None:
    assert gpu_spec(name) is None


def test_table_names_are_unique_and_figures_positive() -> None:
    names = [spec.name for spec in hw.GPU_SPECS]
    assert len(names) == len(set(names))
    for spec in hw.GPU_SPECS:
        assert spec.bandwidth > 0
        for dtype in hw.DTYPES:
            value = spec.flops_for(dtype)
            assert value is None or value > 0


# --- resolve_peaks on CUDA -------------------------------------------------------


def test_cuda_device_resolves_from_the_datasheet(cuda_name: Callable[[str], None]) -> None:
    cuda_name("NVIDIA H100 80GB HBM3")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        peaks = resolve_peaks(torch.device("cuda", 0), "bf16")
    assert peaks.device_name == "NVIDIA H100 80GB HBM3"
    assert peaks.dtype == "bf16"
    assert peaks.flops == 989.5e12
    assert peaks.bandwidth == 3.35e12
    assert (peaks.flops_source, peaks.bandwidth_source) == ("datasheet", "datasheet")
    assert "H100 SXM" in peaks.reference


def test_unknown_gpu_gives_none_and_warns_once(cuda_name: Callable[[str], None]) -> None:
    cuda_name("NVIDIA Imaginary X1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # only resolve_peaks' own dedup may hide repeats
        results = [resolve_peaks("cuda", dtype) for dtype in ("bf16", "bf16", "fp32")]
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "NVIDIA Imaginary X1" in message
    assert "peak_flops" in message and "peak_bandwidth" in message
    for peaks in results:
        assert peaks.flops is None and peaks.bandwidth is None
        assert (peaks.flops_source, peaks.bandwidth_source) == ("unknown", "unknown")


def test_each_unknown_gpu_name_warns_once(cuda_name: Callable[[str], None]) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name in ("Mystery A", "Mystery B", "Mystery A"):
            cuda_name(name)
            resolve_peaks("cuda", "fp16")
    assert len(caught) == 2


@pytest.mark.parametrize(
    ("name", "dtype", "bandwidth"),
    [("Tesla V100-SXM2-16GB", "bf16", 900e9), ("NVIDIA A100-SXM4-80GB", "fp8", 2.039e12)],
)
def test_dtype_the_gpu_lacks_gives_none_and_warns_once(
    cuda_name: Callable[[str], None], name: str, dtype: str, bandwidth: float
) -> None:
    cuda_name(name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = resolve_peaks("cuda", dtype)
        second = resolve_peaks("cuda", dtype)
    assert len(caught) == 1
    assert dtype in str(caught[0].message) and "peak_flops" in str(caught[0].message)
    for peaks in (first, second):
        assert peaks.flops is None
        assert peaks.flops_source == "unknown"
        assert peaks.bandwidth == bandwidth  # the bandwidth is still known
        assert peaks.bandwidth_source == "datasheet"


def test_user_overrides_win_over_the_datasheet(cuda_name: Callable[[str], None]) -> None:
    cuda_name("NVIDIA H100 80GB HBM3")
    both = resolve_peaks("cuda", "bf16", peak_flops=5e14, peak_bandwidth=2e12)
    assert (both.flops, both.bandwidth) == (5e14, 2e12)
    assert (both.flops_source, both.bandwidth_source) == ("user", "user")
    only_flops = resolve_peaks("cuda", "bf16", peak_flops=5e14)
    assert (only_flops.flops, only_flops.flops_source) == (5e14, "user")
    assert (only_flops.bandwidth, only_flops.bandwidth_source) == (3.35e12, "datasheet")


def test_user_overrides_silence_the_unknown_gpu_warning(cuda_name: Callable[[str], None]) -> None:
    cuda_name("NVIDIA Imaginary X1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        peaks = resolve_peaks("cuda", "bf16", peak_flops=1e14, peak_bandwidth=1e12)
    assert (peaks.flops_source, peaks.bandwidth_source) == ("user", "user")


# --- resolve_peaks on CPU ----------------------------------------------------------


def test_cpu_calibration_is_measured_positive_and_finite() -> None:
    flops = hw.measure_cpu_flops(torch.float32)
    bandwidth = hw.measure_cpu_bandwidth()
    assert math.isfinite(flops) and flops > 0
    assert math.isfinite(bandwidth) and bandwidth > 0
    peaks = resolve_peaks("cpu", "fp32")
    assert peaks.flops == flops  # the cached measurement, not a new one
    assert peaks.bandwidth == bandwidth
    assert (peaks.flops_source, peaks.bandwidth_source) == ("measured", "measured")
    assert peaks.device_name


def test_cpu_flops_are_cached_per_dtype_and_threads(fake_clock: FakeClock) -> None:
    # With every GEMM taking 1 ms, all four sizes fit the budget and the largest wins.
    first = hw.measure_cpu_flops(torch.float32)
    assert first == 2 * 2048**3 / 1e-3
    assert fake_clock.calls == 8  # sizes 256, 512, 1024, 2048, each with b and b.t()
    assert hw.measure_cpu_flops(torch.float32) == first
    assert resolve_peaks("cpu", "tf32", peak_bandwidth=1.0).flops == first  # tf32 -> fp32 GEMM
    assert fake_clock.calls == 8  # nothing measured again
    hw.measure_cpu_flops(torch.bfloat16)
    assert fake_clock.calls == 16  # another dtype is another measurement
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        hw.measure_cpu_flops(torch.float32)
        assert fake_clock.calls == 24  # another thread count measures again
    finally:
        torch.set_num_threads(threads)


def test_gemm_sizes_stop_growing_once_a_gemm_is_long_enough(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock(best=0.025)  # above the 20 ms "long enough"
    monkeypatch.setattr(_calibration, "_best_seconds", clock)
    assert hw.measure_cpu_flops(torch.float32) == 2 * 256**3 / 0.025
    assert clock.calls == 2  # size 256 in both layouts, then no larger size


def test_cpu_bandwidth_counts_read_plus_write_and_is_cached(fake_clock: FakeClock) -> None:
    assert hw.measure_cpu_bandwidth() == 2 * 128 * 2**20 / 1e-3
    assert hw.measure_cpu_bandwidth() == 2 * 128 * 2**20 / 1e-3
    assert fake_clock.calls == 1


def test_cpu_fp8_is_unknown(fake_clock: FakeClock) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        peaks = resolve_peaks("cpu", "fp8")
    assert peaks.flops is None
    assert peaks.flops_source == "unknown"
    assert peaks.bandwidth_source == "measured"
    assert len(caught) == 1
    assert fake_clock.calls == 1 + 3 * 2  # the bandwidths only: DRAM's copy, each level's copies and overhead


def test_cpu_overrides_skip_the_measurement(fake_clock: FakeClock) -> None:
    peaks = resolve_peaks("cpu", "bf16", peak_flops=3e11, peak_bandwidth=4e10)
    assert (peaks.flops, peaks.bandwidth) == (3e11, 4e10)
    assert (peaks.flops_source, peaks.bandwidth_source) == ("user", "user")
    assert fake_clock.calls == 0


def test_other_device_types_are_unknown_with_one_warning() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = resolve_peaks("meta", "fp32")
        resolve_peaks("meta", "bf16")
    assert len(caught) == 1
    assert first.flops is None and first.bandwidth is None
    assert (first.flops_source, first.bandwidth_source) == ("unknown", "unknown")


# --- validation and metadata -----------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"dtype": "int8"},
        {"dtype": "float32"},
        {"dtype": "bf16", "peak_flops": 0.0},
        {"dtype": "bf16", "peak_flops": -1.0},
        {"dtype": "bf16", "peak_bandwidth": math.nan},
        {"dtype": "bf16", "peak_bandwidth": math.inf},
    ],
)
def test_bad_arguments_raise_value_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        resolve_peaks("cpu", **kwargs)  # type: ignore[arg-type]


def test_to_metadata_is_json_friendly() -> None:
    peaks = Peaks(
        device_name="NVIDIA H200",
        dtype="bf16",
        flops=989.5e12,
        bandwidth=None,
        flops_source="datasheet",
        bandwidth_source="unknown",
        reference="ref",
    )
    metadata = peaks.to_metadata()
    assert metadata == {
        "device_name": "NVIDIA H200",
        "dtype": "bf16",
        "flops": 989.5e12,
        "bandwidth": None,
        "flops_source": "datasheet",
        "bandwidth_source": "unknown",
        "reference": "ref",
    }
    assert json.loads(json.dumps(metadata)) == metadata
