"""register_device_peaks: user GPU entries resolve like the table; duplicates and bad values refused.

Also: table entries not checked against their datasheet say so in the peaks metadata.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import cb_callback
from cb_callback._hardware import calibration as _calibration
from cb_callback._hardware import peaks as hw
from cb_callback._hardware import registry
from cb_callback._hardware.peaks import GPU_SPECS, gpu_spec, resolve_peaks


@pytest.fixture(autouse=True)
def _empty_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(registry, "_REGISTERED", [])
    hw._clear_caches()
    yield
    hw._clear_caches()


# Figures as a user would copy them for the GH200's GPU (96 GB HBM3 part, which
# reports itself as "NVIDIA GH200 480GB"); the tests check they come back exactly.
GH200: dict[str, Any] = dict(
    model="gh200",
    flops={"fp32": 67e12, "tf32": 494.5e12, "bf16": 989.5e12, "fp16": 989.5e12, "fp8": 1979e12},
    bandwidth=4.0e12,
    source="NVIDIA GH200 Grace Hopper Superchip datasheet, GPU column (sparse rates halved)",
    verified=True,
)


def test_register_device_peaks_is_public() -> None:
    assert "register_device_peaks" in cb_callback.__all__
    assert cb_callback.register_device_peaks is registry.register_device_peaks


def test_a_registered_gh200_resolves_with_its_exact_figures(
    cuda_name: Callable[[str], None],
) -> None:
    assert gpu_spec("NVIDIA GH200 480GB") is None  # not in the built-in table
    spec = cb_callback.register_device_peaks("GH200 96GB", **GH200)
    assert gpu_spec("NVIDIA GH200 480GB") is spec
    assert registry.registered_specs() == (spec,)

    cuda_name("NVIDIA GH200 480GB")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a registered GPU is known: no warning
        bf16 = resolve_peaks("cuda", "bf16")
        fp8 = resolve_peaks("cuda", "fp8")
    assert (bf16.flops, bf16.bandwidth) == (989.5e12, 4.0e12)
    assert fp8.flops == 1979e12
    assert (bf16.flops_source, bf16.bandwidth_source) == ("registered", "registered")
    assert bf16.reference == (
        "flops: GH200 96GB bf16 (registered): " + GH200["source"] + "; "
        "bandwidth: GH200 96GB (registered): " + GH200["source"]
    )
    metadata = bf16.to_metadata()
    assert metadata["verified"] is True
    assert json.loads(json.dumps(metadata)) == metadata


def test_a_vendor_without_a_tensor_core_name_registers_too(
    cuda_name: Callable[[str], None],
) -> None:
    # ROCm builds of torch report AMD GPUs through torch.cuda as well.
    cb_callback.register_device_peaks(
        "MI300X",
        model="MI300X",
        flops={"bf16": 1.3074e15, "fp64": 163.4e12},
        bandwidth=5.3e12,
        source="AMD Instinct MI300X data sheet",
    )
    cuda_name("AMD Instinct MI300X")
    fp64 = resolve_peaks("cuda", "fp64")
    assert (fp64.flops, fp64.bandwidth) == (163.4e12, 5.3e12)
    assert fp64.flops_source == "registered"
    # verified defaults to False: the metadata and the reference say so
    assert fp64.to_metadata()["verified"] is False
    assert "unverified" in fp64.reference


def test_a_peak_key_the_registration_left_out_is_unknown_with_one_warning(
    cuda_name: Callable[[str], None],
) -> None:
    cb_callback.register_device_peaks("GH200 96GB", **GH200)
    cuda_name("NVIDIA GH200 480GB")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = resolve_peaks("cuda", "fp64")
        resolve_peaks("cuda", "fp64")
    assert [str(w.message) for w in caught] == [
        "cb_callback: the registered GH200 96GB entry has no fp64 peak, so MFU is left "
        "empty; pass peak_flops=<FLOP/s> to set it."
    ]
    assert (first.flops, first.flops_source) == (None, "unknown")
    assert (first.bandwidth, first.bandwidth_source) == (4.0e12, "registered")


def test_user_overrides_win_over_a_registration(cuda_name: Callable[[str], None]) -> None:
    cb_callback.register_device_peaks("GH200 96GB", **GH200)
    cuda_name("NVIDIA GH200 480GB")
    peaks = resolve_peaks("cuda", "bf16", peak_flops=5e14, peak_bandwidth=3e12)
    assert (peaks.flops, peaks.bandwidth) == (5e14, 3e12)
    assert (peaks.flops_source, peaks.bandwidth_source) == ("user", "user")
    assert "verified" not in peaks.to_metadata()  # no table figure was used


# --- duplicates -----------------------------------------------------------------------


def test_registering_the_same_entry_twice_is_refused() -> None:
    cb_callback.register_device_peaks("GH200 96GB", **GH200)
    with pytest.raises(ValueError, match="already has this name"):
        cb_callback.register_device_peaks("GH200 96GB", **GH200)
    with pytest.raises(ValueError, match=r"duplicates the registered entry 'GH200 96GB'"):
        cb_callback.register_device_peaks("GH200 again", **GH200)
    assert len(registry.registered_specs()) == 1


@pytest.mark.parametrize(
    ("kwargs", "existing"),
    [
        ({"name": "My H100", "model": "h100"}, "H100 SXM"),  # every H100 name
        ({"name": "My H100", "model": "H100", "form": "pcie"}, "H100 PCIe"),
        ({"name": "My A100", "model": "a100", "form": "sxm"}, "A100 SXM 40GB"),
        ({"name": "My A100", "model": "a100", "memory_gb": 80}, "A100 SXM 80GB"),
        # a second default H200 form: "NVIDIA H200" would mean both
        ({"name": "My H200", "model": "h200", "form": "pcie", "default_form": True}, "H200 SXM"),
        ({"name": "l4", "model": "l4x"}, "L4"),  # names are unique, whatever the case
    ],
)
def test_an_entry_overlapping_the_built_in_table_is_refused(kwargs: dict[str, Any], existing: str) -> None:
    figures: dict[str, Any] = {"flops": {"bf16": 1e15}, "bandwidth": 1e12, "source": "mine"}
    with pytest.raises(ValueError, match=f"built-in entry {existing!r}"):
        cb_callback.register_device_peaks(**kwargs, **figures)
    assert registry.registered_specs() == ()


def _entry(device_name: str) -> str | None:
    spec = gpu_spec(device_name)
    return None if spec is None else spec.name


def test_an_entry_the_table_tells_apart_is_accepted() -> None:
    spec = cb_callback.register_device_peaks(
        "H200 PCIe",
        model="h200",
        form="pcie",
        flops={"bf16": 7e14},
        bandwidth=4.8e12,
        source="mine",
    )
    assert gpu_spec("NVIDIA H200 PCIe") is spec
    # the built-in entries still resolve as before
    assert _entry("NVIDIA H200") == "H200 SXM"
    assert _entry("NVIDIA H200 NVL") == "H200 NVL"
    another_a100 = cb_callback.register_device_peaks(
        "A100 SXM 64GB",
        model="a100",
        form="sxm",
        memory_gb=64,
        flops={"bf16": 312e12},
        bandwidth=1.6e12,
        source="mine",
    )
    assert gpu_spec("NVIDIA A100-SXM4-64GB") is another_a100
    assert _entry("NVIDIA A100-SXM4-80GB") == "A100 SXM 80GB"


# --- invalid values -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"flops": {"bf16": 0.0}}, r"flops\['bf16'\]=0.0 must be a positive finite"),
        ({"flops": {"bf16": -1e12}}, "must be a positive finite"),
        ({"flops": {"bf16": math.nan}}, "must be a positive finite"),
        ({"flops": {"bf16": math.inf}}, "must be a positive finite"),
        ({"flops": {"bf16": True}}, "must be a positive finite"),
        ({"flops": {"bf16": "1e15"}}, "must be a positive finite"),
        ({"flops": {"int8": 1e15}}, r"unknown peak keys \['int8'\]"),
        ({"flops": {}}, "at least one peak key"),
        ({"bandwidth": 0.0}, "bandwidth=0.0 must be a positive finite"),
        ({"bandwidth": math.nan}, "bandwidth=nan must be a positive finite"),
        ({"bandwidth": math.inf}, "must be a positive finite"),
        ({"model": "GH200 480GB"}, "must be one model word"),
        ({"model": "80gb"}, "must be one model word"),
        ({"model": "nvidia"}, "must be one model word"),
        ({"model": "pcie"}, "must be one model word"),
        ({"form": "hgx"}, "form='hgx' must be None or one of"),
        ({"memory_gb": 0}, "memory_gb=0 must be None or a positive int"),
        ({"memory_gb": 80.0}, "must be None or a positive int"),
        ({"source": " "}, "source= must say where"),
        ({"verified": "yes"}, "verified= must be True or False"),
    ],
)
def test_invalid_values_are_refused(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cb_callback.register_device_peaks("GH200 96GB", **{**GH200, **change})
    assert registry.registered_specs() == ()


def test_an_empty_name_is_refused() -> None:
    with pytest.raises(ValueError, match="name must be a non-empty string"):
        cb_callback.register_device_peaks("", **GH200)


# --- unverified built-in entries --------------------------------------------------------


def test_the_table_marks_the_entries_not_checked_against_a_datasheet() -> None:
    assert {spec.name for spec in GPU_SPECS if not spec.verified} == {"B200", "A10", "V100 PCIe"}


def test_an_unverified_built_in_entry_says_so_in_the_metadata(
    cuda_name: Callable[[str], None],
) -> None:
    cuda_name("NVIDIA A10")
    peaks = resolve_peaks("cuda", "bf16")
    assert (peaks.flops, peaks.flops_source) == (125e12, "datasheet")  # the table's figure
    metadata = peaks.to_metadata()
    assert metadata["verified"] is False
    assert metadata["reference"].count("(unverified: not checked against its source)") == 2


def test_a_verified_built_in_entry_says_so_too(cuda_name: Callable[[str], None]) -> None:
    cuda_name("NVIDIA H100 80GB HBM3")
    peaks = resolve_peaks("cuda", "bf16", peak_bandwidth=1e12)  # the FLOP/s from the table
    assert peaks.to_metadata()["verified"] is True
    assert "unverified" not in peaks.reference


def test_measured_peaks_carry_no_verified_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_calibration, "_best_seconds", lambda fn, min_repeats, budget_s: (1e-3, 1e-2))
    peaks = resolve_peaks(torch.device("cpu"), "fp32")
    assert peaks.flops_source == "measured"
    assert "verified" not in peaks.to_metadata()
