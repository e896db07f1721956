"""The harness floor, estimates above their parent, ``bound`` by construction, rows' own flags (issue 22, 4/6/8)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils import _pytree as pytree

from cb_callback import profile_components
from cb_callback._engine.clocks.floor import FloorModule
from cb_callback._engine.clocks.timing import Sample, SampleSet
from cb_callback._engine.derive.estimate import ROOF_NEAR
from cb_callback._engine.derive.quality import FLAGS
from cb_callback._engine.derive.rollup import derive_all
from cb_callback._hardware.calibration import CacheLevel
from cb_callback._hardware.peaks import Peaks
from cb_callback._report.model import ComponentRow
from cb_callback.plugins import LatencyMetric, MeasureContext
from tests.conftest import FAST

_NAN = float("nan")
RATES = ("tflops", "mfu", "gbps", "bw_util")


def _graph_inputs(ctx: MeasureContext) -> bool:
    """Whether any input of the replay carries a graph (then the identity has a backward)."""
    leaves = pytree.tree_leaves((ctx.replay.inputs.args, ctx.replay.inputs.kwargs))
    return any(isinstance(t, torch.Tensor) and t.requires_grad for t in leaves)


class FakeLatency(LatencyMetric):
    """The built-in latency (so the floor is measured and subtracted) on a fixed clock, ms per run.

    The identity: 0.0625 forward, 0.125 backward where its inputs carry a graph (else none: 0).
    A component: the floor of its layout plus ``extra[type]``. Binary fractions: exact arithmetic.
    """

    def __init__(self, extra: Mapping[str, tuple[float, float]]) -> None:
        self.extra = extra

    def sampler(self, ctx: MeasureContext) -> Callable[[], Sample]:
        fwd, bwd = 0.0625, 0.125 if _graph_inputs(ctx) else 0.0
        if not isinstance(ctx.module, FloorModule):
            more = self.extra[type(ctx.module).__name__]
            fwd, bwd = fwd + more[0], bwd + more[1]
        return lambda: Sample(fwd, bwd, fwd, bwd)


class TypeClock:
    """A user's timing plugin (no floor): ``times[type]`` = (fwd, bwd) ms per run."""

    name = "type_clock"

    def __init__(self, times: Mapping[str, tuple[float, float]]) -> None:
        self.times = times

    def sampler(self, ctx: MeasureContext) -> Callable[[], Sample]:
        fwd, bwd = self.times[type(ctx.module).__name__]
        return lambda: Sample(fwd, bwd, fwd, bwd)

    def budget_s(self, ctx: MeasureContext) -> float:
        return 0.0

    def values(self, samples: SampleSet, ctx: MeasureContext) -> Mapping[str, Any]:
        bwd = samples.median("bwd_ms") if ctx.config.backward else _NAN
        return {"fwd_ms": samples.median("fwd_ms"), "bwd_ms": bwd, "noise": samples.noise}


def _zero_time_rows(report: Any) -> list[str]:
    """Rows that show a 0 ms pass (a backward that ran) without the ``at_floor`` flag."""
    out = []
    for r in report.rows:
        if r.status not in ("ok", "estimated"):
            continue
        bwd_zero = r.bwd_ms == 0.0 and "no_backward" not in r.details
        if (r.fwd_ms == 0.0 or bwd_zero) and "at_floor" not in r.details["flags"]:
            out.append(r.path)
    return out


# --- the floor is the cheapest replay ---------------------------------------------------------------


def test_the_floor_module_is_an_identity_with_no_parameter() -> None:
    # Before: FloorModule(device) held a parameter and returned a view of it (always a backward),
    # which cost more than an nn.Identity: every small ReLU read 0.000 ms.
    ident = FloorModule()
    assert list(ident.parameters()) == []
    a, b = torch.randn(2, requires_grad=True), torch.randn(3)
    assert ident(a, b) == (a, b)
    out = ident(a, k=b)
    assert out[0] == (a,) and out[1] == {"k": b}


def test_no_backward_floor_where_no_input_carries_a_graph() -> None:
    # A Linear on data: the identity on those inputs has no backward, so nothing is taken off the
    # Linear's backward (before: the parameter view's backward was, > 0).
    report = profile_components(nn.Linear(8, 8), torch.randn(4, 8), descend="all", insitu_passes=0, **FAST)
    floor = report.row("").details["floor_ms"]
    assert floor["bwd"] == 0.0 and floor["bwd_iqr_ms"] == 0.0
    assert floor["fwd"] > 0.0
    assert report.row("").bwd_ms == floor["raw_bwd_ms"]  # raw − 0


def test_a_pass_at_the_floor_is_flagged_and_no_rate_is_derived_from_it() -> None:
    # Fixed clock: the identity runs 0.0625 ms forward (and 0.125 ms backward where its inputs carry a
    # graph); the Linear 1 + 2 ms above it, the ReLU exactly at it. Constant runs: every IQR is 0.
    clock = FakeLatency({"Sequential": (1.5, 3.0), "Linear": (1.0, 2.0), "ReLU": (0.0, 0.0)})
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    report = profile_components(
        model, torch.randn(4, 8), metrics=[clock], descend="all", insitu_passes=0, peak_flops=1e12,
        peak_bandwidth=1e11, **FAST,
    )  # fmt: skip
    lin, relu = report.row("0"), report.row("1")
    # The Linear's inputs carry no graph: floor (0.0625, 0); (1.0625 − 0.0625, 2 − 0).
    assert (lin.fwd_ms, lin.bwd_ms) == (1.0, 2.0)
    assert lin.details["floor_ms"]["at_floor"] == [] and "at_floor" not in lin.details["flags"]
    assert math.isfinite(lin.mfu) and lin.bound is not None  # rates from a time above the floor
    # The ReLU's input carries the Linear's graph: floor (0.0625, 0.125), raw the same; net 0 ≤ 0 + 0.
    assert relu.details["floor_ms"] == {
        "fwd": 0.0625, "bwd": 0.125, "raw_fwd_ms": 0.0625, "raw_bwd_ms": 0.125, "fwd_iqr_ms": 0.0,
        "bwd_iqr_ms": 0.0, "at_floor": ["fwd", "bwd"],
    }  # fmt: skip
    assert (relu.fwd_ms, relu.bwd_ms, relu.total_ms) == (0.0, 0.0, 0.0)
    assert "at_floor" in relu.details["flags"]
    assert all(math.isnan(getattr(relu, k)) for k in RATES) and relu.bound is None
    assert relu.intensity == 0.0  # 0 FLOPs ÷ its bytes: no time in it, kept, and so is the roof it binds
    assert relu.details["roofline"]["roof"] == "memory" and math.isnan(relu.details["roofline"]["roof_util"])
    quality = report.metadata["quality"]
    assert quality["at_floor"] == ["1"] and quality["flags"]["at_floor"] == 1
    assert any("at_floor: 1" in a for a in quality["advice"])
    assert _zero_time_rows(report) == []


def test_tiny_relus_do_not_read_zero_without_the_flag() -> None:
    # Real clocks (any timing): before, the floor (a parameter view's forward and backward) cost more
    # than a small ReLU's whole replay, so every ReLU read exactly 0.000 ms, with no flag saying why.
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(3):
        layers += [nn.Linear(32, 32), nn.ReLU(), nn.Identity()]
    report = profile_components(
        nn.Sequential(*layers), torch.randn(16, 32), descend="all", insitu_passes=0, min_run_time_s=0.005,
        load_plugins=False,
    )  # fmt: skip
    assert _zero_time_rows(report) == []
    for row in report.rows:
        if row.status != "ok":
            continue
        at = "at_floor" in row.details["flags"]
        assert at == bool(row.details["floor_ms"]["at_floor"]), row.path
        if at:  # within the floor's noise: no rate from that time
            assert all(math.isnan(getattr(row, k)) for k in RATES) and row.bound is None, row.path
    relus = [r for r in report.rows if r.module_type == "ReLU"]
    assert len(relus) == 3
    assert all(r.fwd_ms > 0.0 or "at_floor" in r.details["flags"] for r in relus)


def test_an_estimate_of_at_floor_children_is_at_the_floor() -> None:
    class Box(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.acts = nn.ModuleList([nn.ReLU(), nn.ReLU()])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.acts[1](self.acts[0](x))

    clock = FakeLatency({"Box": (1.0, 1.0), "ReLU": (0.0, 0.0)})
    report = profile_components(
        Box(), torch.randn(4, 8, requires_grad=True), metrics=[clock], descend="all", insitu_passes=0, **FAST
    )
    acts = report.row("acts")
    assert acts.status == "estimated" and acts.total_ms == 0.0  # 2 × (0 + 0)
    assert acts.details["floor_ms"] == {"at_floor": ["children"], "children": ["acts.0", "acts.1"]}
    assert "at_floor" in acts.details["flags"] and acts.bound is None
    assert _zero_time_rows(report) == []


# --- estimates above their parent --------------------------------------------------------------------


class Looped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(8)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_an_estimated_modulelist_above_its_parent_is_flagged_with_why() -> None:
    # The root 1 + 2 = 3 ms; each of 8 Linears 0.25 + 0.5 ms: the ModuleList's estimate 8 × 0.75 = 6 ms,
    # 2.0 × its parent (constant runs: the parent's noise is 0, the limit 1.1 × 3 ms). Before: no flag.
    clock = TypeClock({"Looped": (1.0, 2.0), "Linear": (0.25, 0.5)})
    report = profile_components(Looped(), torch.randn(2, 4), metrics=[clock], descend="all", insitu_passes=0, **FAST)
    layers = report.row("layers")
    assert (layers.status, layers.total_ms, report.row("").total_ms) == ("estimated", 6.0, 3.0)
    assert layers.details["flags"] == ["above_parent"]
    assert layers.details["above_parent"]["parent"] == "" and layers.details["above_parent"]["ratio"] == 2.0
    assert "per-replay cost" in layers.details["above_parent"]["why"]
    quality = report.metadata["quality"]
    assert quality["above_parent"] == [{"path": "layers", "parent": "", "ratio": 2.0}]
    assert quality["flags"]["above_parent"] == 1
    assert any("above_parent: layers 2.00× root" in a and "per-replay cost" in a for a in quality["advice"])


def test_an_estimate_equal_to_its_parent_is_not_flagged() -> None:
    # 8 × (0.125 + 0.25) = 3 ms = the root's: ratio 1.0, within the margin.
    clock = TypeClock({"Looped": (1.0, 2.0), "Linear": (0.125, 0.25)})
    report = profile_components(Looped(), torch.randn(2, 4), metrics=[clock], descend="all", insitu_passes=0, **FAST)
    assert report.row("layers").total_ms == 3.0
    assert report.row("layers").details["flags"] == [] and report.metadata["quality"]["above_parent"] == []


# --- bound by construction ---------------------------------------------------------------------------


def test_bound_is_compute_for_a_big_gemm_and_latency_for_a_tiny_op() -> None:
    # Peaks passed (no calibration): 1e12 FLOP/s and 1e11 B/s, the ridge 10 FLOP/byte. Forward only.
    clock = TypeClock({"Sequential": (0.2, _NAN), "Linear": (0.1, _NAN), "ReLU": (0.1, _NAN)})
    model = nn.Sequential(nn.Linear(256, 256, bias=False), nn.ReLU())
    report = profile_components(
        model, torch.randn(256, 256), metrics=[clock], descend="all", insitu_passes=0, backward=False,
        peak_flops=1e12, peak_bandwidth=1e11, **FAST,
    )  # fmt: skip
    gemm, relu, root = report.row("0"), report.row("1"), report.row("")
    assert gemm.fwd_flops == 2 * 256**3  # 2·M·N·K
    # 2·256³ FLOPs in 0.1 ms = 3.36e11 FLOP/s: 0.336 of the peak, above ROOF_NEAR; intensity ≥ the ridge.
    assert gemm.intensity >= 10.0 and gemm.mfu == pytest.approx(2 * 256**3 / 1e-4 / 1e12)
    assert gemm.bound == "compute" and gemm.details["roofline"]["roof"] == "compute"
    assert gemm.details["roofline"]["ridge"] == 10.0
    assert gemm.details["roofline"]["roof_util"] == pytest.approx(gemm.mfu)
    # The ReLU: 0 FLOPs, the memory roof binds; its bytes in 0.1 ms are ~5 % of 1e11 B/s: neither roof
    # is near. Before: "memory" (its intensity is below the ridge, however far from the roof it ran).
    assert relu.fwd_flops == 0 and relu.details["roofline"]["roof"] == "memory"
    assert relu.details["roofline"]["roof_util"] == pytest.approx(relu.bytes / 1e-4 / 1e11)
    assert relu.details["roofline"]["roof_util"] < ROOF_NEAR and relu.bound == "latency"
    # The root: (2·256³) FLOPs over both ops' bytes, above the ridge, in 0.2 ms: MFU 0.168 < 0.25.
    assert root.details["roofline"]["roof"] == "compute" and root.mfu < ROOF_NEAR and root.bound == "latency"


def _row(path: str, working_set: float) -> ComponentRow:
    # 5e8 FLOPs over 1e7 bytes (intensity 50) in 1 ms: 5e11 FLOP/s and 1e10 B/s.
    return ComponentRow(
        path=path, module_type="Linear", depth=1, parent="", status="ok", calls=1, fwd_ms=1.0, bwd_ms=0.0,
        fwd_flops=5e8, bwd_flops=0.0, bytes=1e7, details={"working_set_bytes": working_set},
    )  # fmt: skip


def test_the_ridge_uses_the_rows_own_bandwidth_ceiling() -> None:
    # Peak 1e12 FLOP/s; L2 (1 MiB) copies at 1e11 B/s, DRAM at 1e10: ridges 10 (L2) and 100 (DRAM).
    peaks = Peaks(
        device_name="cpu", dtype="fp32", flops=1e12, bandwidth=1e10, flops_source="user",
        bandwidth_source="measured", reference="test",
        levels=(CacheLevel("L2", 1 << 20, 1e11), CacheLevel("DRAM", None, 1e10)),
    )  # fmt: skip
    in_l2, in_dram = _row("a", 1e5), _row("b", 1e8)
    derive_all([in_l2, in_dram], peaks)
    # In L2: intensity 50 ≥ the L2 ridge 10, the compute roof binds at 5e11 / 1e12 = 0.5 of it. Before,
    # the ridge was always DRAM's (100) and the row read "memory".
    assert in_l2.details["roofline"] == {
        "bound": "compute", "roof": "compute", "roof_util": 0.5, "ridge": 10.0, "bandwidth_gbps": 100.0,
        "ceiling": "L2",
    }  # fmt: skip
    assert in_l2.bound == "compute"
    # Larger than L2: DRAM's ridge 100, the memory roof binds at 1e10 / 1e10 = 1.0 of it.
    assert in_dram.details["roofline"]["ridge"] == 100.0 and in_dram.details["roofline"]["roof_util"] == 1.0
    assert in_dram.bound == "memory"
    assert in_l2.bw_util == in_dram.bw_util == 1.0  # bw_util stays ÷ the device's bandwidth


def test_bound_needs_peaks_and_a_row_at_the_floor_has_none() -> None:
    row = _row("a", 1e5)
    derive_all([row], Peaks("cpu", "fp32", None, 1e10, "unknown", "user", "test"))
    assert row.bound is None and "roofline" not in row.details and row.intensity == 50.0
    floored = _row("b", 1e5)
    floored.details["floor_ms"] = {"at_floor": ["fwd"]}
    derive_all([floored], Peaks("cpu", "fp32", 1e12, 1e10, "user", "user", "test"))
    assert floored.total_ms == 1.0 and floored.bound is None
    assert all(math.isnan(getattr(floored, k)) for k in RATES)
    # Which roof its intensity puts it under needs no time: 50 FLOP/byte below the ridge 1e12 / 1e10 = 100.
    assert floored.details["roofline"]["roof"] == "memory" and math.isnan(floored.details["roofline"]["roof_util"])


# --- a row's own flags -------------------------------------------------------------------------------


class Tagger:
    """A metric plugin that flags rows through ``details["own_flags"]``."""

    name = "tagger"

    def __init__(self, tags: Mapping[str, list[str]]) -> None:
        self.tags = tags

    def measure(self, ctx: MeasureContext) -> Mapping[str, Any]:
        tags = self.tags.get(type(ctx.module).__name__)
        return {"own_flags": tags} if tags else {}


def test_the_pre_registered_own_flags_are_flags() -> None:
    assert {"at_floor", "above_parent", "hash_reduced", "hash_collapsed", "derived_negative"} <= set(FLAGS)


def test_own_flags_are_merged_counted_and_advised() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    report = profile_components(
        model, torch.randn(2, 4), metrics=[Tagger({"Linear": ["hash_reduced", "derived_negative"]})],
        descend="all", insitu_passes=0, **FAST,
    )  # fmt: skip
    flags = report.row("0").details["flags"]
    assert "hash_reduced" in flags and "derived_negative" in flags
    assert not {"hash_reduced", "derived_negative"} & set(report.row("1").details["flags"])
    counts = report.metadata["quality"]["flags"]
    assert (counts["hash_reduced"], counts["derived_negative"], counts["hash_collapsed"]) == (1, 1, 0)
    advice = report.metadata["quality"]["advice"]
    assert any("(hash_reduced: 0)" in a for a in advice) and any("(derived_negative: 0)" in a for a in advice)


def test_an_unknown_own_flag_is_dropped_with_a_warning() -> None:
    with pytest.warns(RuntimeWarning, match=r"own_flags.*\['bogus'\]"):
        report = profile_components(
            nn.Linear(4, 4), torch.randn(2, 4), metrics=[Tagger({"Linear": ["bogus"]})], descend="all",
            insitu_passes=0, **FAST,
        )  # fmt: skip
    assert "bogus" not in report.row("").details["flags"]
