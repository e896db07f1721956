"""Plugin contracts, entry points, batch replication and capture hygiene."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from cb_callback import Capture, Report, profile_components
from cb_callback._engine.run.plugins import load_entry_point_plugins, validate_plugin
from cb_callback.plugins import (
    ComponentInputs,
    MeasureContext,
    PrepareContext,
    Preprocessor,
    replicate_batch,
    slice_batch,
)
from cb_callback.reporters import ReportContext
from tests.conftest import FAST


class CountParams:
    name = "count_params"

    def measure(self, ctx: MeasureContext) -> Mapping[str, Any]:
        # "calls" is a column; "n_params" is not and lands in details
        return {"n_params": sum(p.numel() for p in ctx.module.parameters()), "seen_fwd": "fwd_ms" in ctx.values}


class Broken:
    name = "broken"

    def measure(self, ctx: MeasureContext) -> Mapping[str, Any]:
        raise RuntimeError("plugin bug")


class Collect:
    name = "collect"

    def __init__(self) -> None:
        self.reports: list[Report] = []

    def write(self, report: Report, ctx: ReportContext) -> list[Path]:
        self.reports.append(report)
        return []


class Double(Preprocessor):
    name = "double"

    def process_inputs(self, inputs: ComponentInputs, ctx: PrepareContext) -> ComponentInputs:
        return ComponentInputs(
            tuple(a * 2 for a in inputs.args), inputs.kwargs, inputs.calls, inputs.training, inputs.order
        )


def test_user_metric_reporter_and_preprocessor() -> None:
    collect = Collect()
    report = profile_components(
        nn.Linear(3, 2),
        (torch.randn(4, 3),),
        metrics=[CountParams()],
        reporters=[collect],
        preprocessors=[Double()],
        **FAST,
    )
    row = report.row("")
    assert row.details["n_params"] == 3 * 2 + 2
    assert row.details["seen_fwd"] is True  # built-ins run first
    assert collect.reports == [report]


def test_a_failing_user_metric_is_recorded_not_fatal() -> None:
    with pytest.warns(RuntimeWarning, match="metric plugin 'broken' raised"):
        report = profile_components(nn.Linear(3, 2), (torch.randn(4, 3),), metrics=[Broken()], **FAST)
    row = report.row("")
    assert row.status == "ok"
    assert row.details["metric_errors"] == {"broken": "RuntimeError: plugin bug"}


def test_validation_names_the_plugin_and_hook() -> None:
    with pytest.raises(TypeError, match=r"metric plugin 'collect' has no callable measure\(\) hook"):
        validate_plugin(Collect(), "metric")
    with pytest.raises(TypeError, match="is a class; pass an instance"):
        validate_plugin(CountParams, "metric")


def test_entry_points_are_loaded_by_kind_and_bad_ones_skipped() -> None:
    class EP:
        def __init__(self, name: str, obj: Any) -> None:
            self.name, self.value, self._obj = name, f"pkg:{name}", obj

        def load(self) -> Any:
            if isinstance(self._obj, Exception):
                raise self._obj
            return self._obj

    eps = [EP("count", CountParams), EP("collect", Collect()), EP("bad", ImportError("no pkg")), EP("odd", 3)]
    with pytest.warns(RuntimeWarning, match="skipping plugin entry point") as rec:
        found = load_entry_point_plugins(lambda: eps)
    assert [type(p).__name__ for p in found["metric"]] == ["CountParams"]
    assert [type(p).__name__ for p in found["reporter"]] == ["Collect"]
    assert len(rec) == 2


def test_replicate_and_slice_by_tiling() -> None:
    x = torch.arange(6.0).reshape(3, 2)
    other = torch.zeros(5)  # leading dim is not the batch: untouched
    ((rx, ro),) = [replicate_batch((x, other), 3, 7)]
    assert torch.equal(rx, torch.cat([x, x, x[:1]]))
    assert ro is other
    (sx, so) = slice_batch((x, other), 3, 2)
    assert torch.equal(sx, x[:2]) and so is other


def test_capture_removes_hooks_when_the_forward_raises() -> None:
    class Boom(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("in the step")

    model = nn.Sequential(nn.Linear(2, 2), Boom())
    cap = Capture(model)
    with pytest.raises(ValueError), cap:
        model(torch.randn(1, 2))
    assert not cap.active
    assert all(not m._forward_pre_hooks for m in model.modules())
    assert set(cap.calls) == {"", "0", "1"}


def test_capture_keeps_requires_grad_and_counts_calls() -> None:
    lin = nn.Linear(2, 2)
    model = nn.Sequential(lin, nn.ReLU())
    x = torch.randn(4, 2, requires_grad=True)
    with Capture(model, keep_samples=2) as cap:
        model(x)
        model(x)
    assert cap.calls["0"].calls == 2
    assert cap.batch_size == 4 and cap.stored_batch_size == 2
    root_x = cap.calls[""].args[0]
    assert root_x.requires_grad and root_x.is_leaf and root_x.shape == (2, 2)
    relu_in = cap.calls["1"].args[0]
    assert relu_in.requires_grad and relu_in.is_leaf  # lin's output required grad; copy is detached


def test_profile_components_warns_when_the_capture_forward_raises() -> None:
    class Half(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.lin(x)
            raise RuntimeError("after lin")

    with pytest.warns(RuntimeWarning, match="the capture forward raised"):
        report = profile_components(Half(), (torch.randn(3, 2),), **FAST)
    assert report.row("lin").status == "ok"
    assert report.row("").status == "estimated"
    assert report.metadata["capture_error"] == "RuntimeError: after lin"


def test_embedding_bag_with_offsets_is_replicated_by_bag() -> None:
    class Rec(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bag = nn.EmbeddingBag(10, 4, mode="sum")
            self.dense = nn.Linear(2, 4)

        def forward(self, x: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
            return self.dense(x) + self.bag(ids, offsets)

    model = Rec()
    bag = model.bag
    values = torch.tensor([1, 2, 3, 4, 5, 6])
    offsets = torch.tensor([0, 2, 3])  # bags [1, 2], [3], [4, 5, 6]
    x = torch.randn(3, 2)  # the batch: 3 samples
    report = profile_components(model, (x, values, offsets), batch_size=7, **FAST)
    row = report.row("bag")
    assert row.status == "ok"
    # 7 bags tiled from 3: bag j = bag j % 3 -> lengths 2,1,3,2,1,3,2 = 14 ids looked up.
    # _embedding_bag: ids (14 int64) + offsets (7 int64) + rows read (14 x 4 fp32)
    # + outputs: pooled [7,4] fp32, offset2bag (empty in sum mode), bag_size and max_indices (7 int64)
    assert row.details["fwd_bytes"] == 14 * 8 + 7 * 8 + 14 * 4 * 4 + (7 * 4 * 4 + 0 + 7 * 8 + 7 * 8)
    from cb_callback._engine.replay.preprocessors import _replicate_bags

    rep = _replicate_bags(ComponentInputs((values, offsets), {}), 3, 7)
    assert rep is not None
    assert rep.args[0].tolist() == [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2]
    assert rep.args[1].tolist() == [0, 2, 3, 6, 8, 9, 12]
    out = bag(*rep.args)
    ref = bag(values, offsets)
    assert torch.equal(out, ref[torch.arange(7) % 3])


def test_builtin_observing_metrics_also_measure_on_their_own() -> None:
    from cb_callback import BenchmarkConfig
    from cb_callback.plugins import FlopsMetric, MemoryMetric, Replay, TrafficMetric

    lin = nn.Linear(4, 3, bias=False)
    inputs = ComponentInputs((torch.randn(2, 4),), {})
    replay = Replay(lin, inputs, device=torch.device("cpu"))
    ctx = MeasureContext("", lin, replay, BenchmarkConfig(**FAST), torch.device("cpu"))
    flops = FlopsMetric().measure(ctx)
    assert (flops["fwd_flops"], flops["bwd_flops"]) == (2 * 2 * 4 * 3, 2 * 3 * 2 * 4)
    # mm(x[2,4], W^T[4,3]) -> [2,3]; backward dW = mm(dY^T[3,2], x[2,4])
    assert TrafficMetric().measure(ctx)["bytes"] == 4 * (8 + 12 + 6) + 4 * (6 + 8 + 12)
    assert MemoryMetric().measure(ctx)["activation_mb"] == 0.0
