"""The public measurement contract: instruments, pass contexts, artifacts, reserved keys."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import cb_callback._metrics.flops as flops_module
from cb_callback import BenchmarkConfig, profile_components
from cb_callback._engine.capture.inputs import ComponentInputs
from cb_callback._engine.capture.storage import unique_storage_bytes
from cb_callback._engine.run.plugins import validate_plugin
from cb_callback.plugins import (
    ArtifactMetric,
    Instrument,
    InstrumentingMetric,
    LatencyMetric,
    MeasureContext,
    MetricPlugin,
    PassContext,
    Phase,
    Replay,
    storage_key,
    unobserved,
)
from tests.conftest import FAST

# --- an observing plugin written against the contract ---------------------------------


class _Recording:
    """Records every phase it is entered around, with what the context carried."""

    def __init__(self, log: list[tuple[str, str, Any]]) -> None:
        self.log = log

    @contextlib.contextmanager
    def observe(self, ctx: PassContext) -> Iterator[None]:
        self.log.append(("enter", ctx.phase, ctx))
        yield
        self.log.append(("exit", ctx.phase, ctx.result))

    def values(self) -> Mapping[str, Any]:
        return {"phases_seen": sum(1 for event, _, _ in self.log if event == "enter")}


class PhaseLog:
    name = "phase_log"

    def __init__(self) -> None:
        self.logs: dict[str, list[tuple[str, str, Any]]] = {}

    def instrument(self, ctx: MeasureContext) -> Instrument:
        return _Recording(self.logs.setdefault(ctx.path, []))


def test_an_observing_plugin_sees_the_phases_in_order_with_the_pass_inputs() -> None:
    lin = nn.Linear(4, 2)
    x = torch.arange(12.0).reshape(3, 4).requires_grad_(True)
    plugin = PhaseLog()
    assert isinstance(plugin, InstrumentingMetric) and not isinstance(plugin, MetricPlugin)  # by type
    report = profile_components(lin, (x,), metrics=[plugin], **FAST)
    log = plugin.logs[""]
    # PASS is entered first and left last; FORWARD then BACKWARD nested inside it
    assert [(event, phase) for event, phase, _ in log] == [
        ("enter", Phase.PASS), ("enter", Phase.FORWARD), ("exit", Phase.FORWARD),
        ("enter", Phase.BACKWARD), ("exit", Phase.BACKWARD), ("exit", Phase.PASS),
    ]  # fmt: skip
    contexts = [c for event, _, c in log if event == "enter"]
    inputs = contexts[0].inputs
    assert all(c.inputs is inputs for c in contexts)  # one copy of the inputs for the whole pass
    assert all(c.path == "" and c.module is lin and c.backward for c in contexts)
    # x required grad: the pass differentiates against a new leaf, the argument is its clone
    (leaf,) = inputs.leaves
    assert torch.equal(leaf, x) and leaf is not x and torch.equal(inputs.args[0], x)
    # inside the pass there is no result yet; PASS's exit reads it
    assert [r for event, _, r in log if event == "exit"][:2] == [None, None]
    result = log[-1][2]
    assert result.backward_ran and not result.mutates_inputs
    assert result.output is None  # freed before the backward, as the timed runs do
    assert report.row("").details["phases_seen"] == 3


def test_a_forward_only_pass_has_no_backward_phase_and_keeps_the_output() -> None:
    lin = nn.Linear(4, 2)
    x = torch.arange(12.0).reshape(3, 4)
    plugin = PhaseLog()
    report = profile_components(lin, (x,), metrics=[plugin], backward=False, **FAST)
    log = plugin.logs[""]
    assert [(event, phase) for event, phase, _ in log] == [
        ("enter", Phase.PASS), ("enter", Phase.FORWARD), ("exit", Phase.FORWARD), ("exit", Phase.PASS),
    ]  # fmt: skip
    result = log[-1][2]
    assert not result.backward_ran and not log[0][2].backward
    assert torch.equal(result.output, lin(x))  # the same forward on the same inputs
    # one place says "not measured": bwd_flops is NaN with backward=False (0 would mean "none")
    assert math.isnan(report.row("").bwd_flops) and report.row("").fwd_flops == 2 * 3 * 4 * 2


class _Legacy:
    """An instrument written against 0.1's contract: ``observe(phase: str)``."""

    def __init__(self, phases: list[str]) -> None:
        self.phases = phases

    @contextlib.contextmanager
    def observe(self, phase: str) -> Iterator[None]:
        self.phases.append(phase)
        yield

    def values(self) -> Mapping[str, Any]:
        return {"legacy_phases": list(self.phases)}


class LegacyPlugin:
    name = "legacy"

    def instrument(self, ctx: MeasureContext) -> Any:
        return _Legacy([])


def test_an_instrument_of_the_old_contract_gets_phase_names_and_one_warning() -> None:
    with pytest.warns(DeprecationWarning, match=r"observe\(phase: str\) is the 0.1 instrument contract") as rec:
        report = profile_components(
            nn.Sequential(nn.Linear(4, 4)), (torch.randn(2, 4),), metrics=[LegacyPlugin()], **FAST
        )
    assert len([w for w in rec if issubclass(w.category, DeprecationWarning)]) == 1  # two components, one class
    assert report.row("").details["legacy_phases"] == ["pass", "forward", "backward"]
    assert report.row("0").details["legacy_phases"] == ["pass", "forward", "backward"]


# --- artifact plugins ------------------------------------------------------------------


class _WritePhases:
    def __init__(self, ctx: MeasureContext) -> None:
        self.ctx = ctx
        self.phases: list[str] = []

    @contextlib.contextmanager
    def observe(self, ctx: PassContext) -> Iterator[None]:
        self.phases.append(ctx.phase.value)
        yield

    def values(self) -> Mapping[str, Any]:
        out = self.ctx.artifact_path("phases.txt")
        out.write_text(",".join(self.phases))
        return {"phases": "phases.txt"}


class PhasesArtifact:
    name = "phases_artifact"

    def __init__(self) -> None:
        self.seen_fwd_ms: dict[str, float] = {}

    def artifacts(self, ctx: MeasureContext) -> Instrument:
        self.seen_fwd_ms[ctx.path] = ctx.values["fwd_ms"]
        return _WritePhases(ctx)


def test_an_artifact_plugin_writes_into_its_directory_and_the_row_links_the_file(tmp_path: Path) -> None:
    plugin = PhasesArtifact()
    assert isinstance(plugin, ArtifactMetric) and validate_plugin(plugin, "metric") is plugin
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    # descend="all": every row replayed (hence its artifact written) whatever the in-situ times the triage reads
    report = profile_components(
        model, (torch.randn(2, 4),), metrics=[plugin], output_dir=str(tmp_path), descend="all", **FAST
    )
    # one directory per component: <output_dir>/artifacts/<path or "root">/
    for path, folder in (("", "root"), ("0", "0"), ("1", "1")):
        row = report.row(path)
        assert row.details["artifacts"] == {"phases": f"artifacts/{folder}/phases.txt"}  # relative to the report
        # its own forward + backward: the shared pass and the timed runs are not in it
        assert (tmp_path / row.details["artifacts"]["phases"]).read_text() == "pass,forward,backward"
        # it ran after the component's timed runs: their median was known
        assert plugin.seen_fwd_ms[path] == row.fwd_ms


def test_without_an_output_dir_no_artifact_plugin_runs(tmp_path: Path) -> None:
    plugin = PhasesArtifact()
    report = profile_components(nn.Linear(4, 2), (torch.randn(2, 4),), metrics=[plugin], **FAST)
    assert plugin.seen_fwd_ms == {} and "artifacts" not in report.row("").details


class Silent:
    """An artifact plugin that writes nothing."""

    name = "silent"

    def artifacts(self, ctx: MeasureContext) -> Instrument:
        class Nothing:
            def observe(self, ctx: PassContext) -> contextlib.AbstractContextManager[None]:
                return contextlib.nullcontext()

            def values(self) -> Mapping[str, Any]:
                return {}

        return Nothing()


class Outside:
    """An artifact plugin that names a file outside its directory."""

    name = "outside"

    def __init__(self, where: Path) -> None:
        self.where = where

    def artifacts(self, ctx: MeasureContext) -> Instrument:
        where = self.where

        class Elsewhere:
            def observe(self, ctx: PassContext) -> contextlib.AbstractContextManager[None]:
                return contextlib.nullcontext()

            def values(self) -> Mapping[str, Any]:
                where.write_text("x")
                return {"stray": where}

        return Elsewhere()


def test_the_artifact_directory_is_made_only_for_a_file_and_strays_are_errors(tmp_path: Path) -> None:
    out = tmp_path / "report"
    stray = tmp_path / "stray.txt"
    with pytest.warns(RuntimeWarning, match="metric plugin 'outside' raised"):
        report = profile_components(
            nn.Linear(4, 2), (torch.randn(2, 4),), metrics=[Silent(), Outside(stray)], output_dir=str(out), **FAST
        )
    assert not (out / "artifacts").exists()  # nothing asked for a file in it
    row = report.row("")
    assert row.status == "ok" and "artifacts" not in row.details  # the measurements stand
    assert row.details["metric_errors"]["outside"].startswith(
        f"ValueError: artifact plugin 'outside' returned 'stray': {str(stray)!r}; expected {{kind: a file it wrote"
    )


# --- keys a plugin may not return ------------------------------------------------------


class Overreach:
    """Returns a structural column next to a legitimate details key."""

    def __init__(self, name: str, key: str) -> None:
        self.name, self.key = name, key

    def measure(self, ctx: MeasureContext) -> Mapping[str, Any]:
        return {self.key: "x", "fine": 1}


def test_a_plugin_returning_status_or_path_is_rejected_by_name() -> None:
    plugins = [Overreach("sets_status", "status"), Overreach("sets_path", "path")]
    with pytest.warns(RuntimeWarning, match=r"metric plugin 'sets_(status|path)' raised"):
        report = profile_components(nn.Linear(4, 2), (torch.randn(2, 4),), metrics=plugins, **FAST)
    row = report.row("")
    assert row.status == "ok" and row.path == ""  # nothing was overwritten
    assert "fine" not in row.details  # a rejected plugin contributes nothing
    errors = row.details["metric_errors"]
    assert errors["sets_status"].startswith(
        "ValueError: metric plugin 'sets_status' returned 'status', which the engine owns"
    )
    assert errors["sets_path"].startswith(
        "ValueError: metric plugin 'sets_path' returned 'path', which the engine owns"
    )


class Returns:
    """Returns ``values`` as they are."""

    def __init__(self, name: str, values: dict[str, Any]) -> None:
        self.name, self.values = name, values

    def measure(self, ctx: MeasureContext) -> Mapping[str, Any]:
        return self.values


def test_a_one_element_tensor_or_numpy_scalar_becomes_a_number_and_the_report_loads_again(tmp_path: Path) -> None:
    import numpy as np

    from cb_callback import Report

    # What tensor arithmetic gives: a 0-d tensor in a column, a numpy scalar in a column and in details.
    values = {"activation_mb": torch.tensor(2.5), "bytes": np.int64(64), "ratio": np.float32(0.5)}
    out = tmp_path / "out"
    report = profile_components(nn.Linear(4, 2), (torch.randn(2, 4),), metrics=[Returns("tensors", values)],
                                output_dir=str(out), **FAST)  # fmt: skip
    row = report.row("")
    assert (row.activation_mb, row.bytes, row.details["ratio"]) == (2.5, 64, 0.5)
    assert type(row.activation_mb) is float and type(row.bytes) is int and type(row.details["ratio"]) is float
    assert "metric_errors" not in row.details
    loaded = Report.load(out).row("")  # before: "tensor(2.5000)" in report.json, refused on load
    assert (loaded.activation_mb, loaded.bytes) == (2.5, 64)


def test_a_column_that_is_no_number_is_rejected_by_name() -> None:
    plugins = [Returns("texts", {"fwd_ms": "fast"}), Returns("vectors", {"bytes": torch.ones(3)})]
    with pytest.warns(RuntimeWarning, match=r"metric plugin '(texts|vectors)' raised"):
        report = profile_components(nn.Linear(4, 2), (torch.randn(2, 4),), metrics=plugins, **FAST)
    errors = report.row("").details["metric_errors"]
    assert errors["texts"] == (
        "ValueError: metric plugin 'texts' returned fwd_ms='fast' (str): a column takes a number (int or "
        "float; a one-element tensor or numpy scalar is converted)"
    )
    assert errors["vectors"].startswith("ValueError: metric plugin 'vectors' returned bytes=tensor([1., 1., 1.])")
    assert report.row("").status == "ok"  # the row's own measurements stand


@pytest.mark.parametrize("source", ["its own pass", "the census"])
def test_a_builtin_returning_a_structural_key_fails_the_row(monkeypatch: pytest.MonkeyPatch, source: str) -> None:
    """The same check on a built-in's values whether they come from the row's own instrumented pass
    (``descend="all"``) or from the step's census (the default; ``from_census``)."""
    if source == "its own pass":
        real = flops_module._FlopsInstrument.values
        monkeypatch.setattr(flops_module._FlopsInstrument, "values", lambda self: {**real(self), "share": 1.0})
    else:
        census = flops_module.FlopsMetric.from_census
        monkeypatch.setattr(flops_module.FlopsMetric, "from_census", lambda self, c: {**census(self, c), "share": 1.0})
    model = nn.Sequential(nn.Linear(4, 2), nn.ReLU())
    descend = "all" if source == "its own pass" else "hotspots"
    report = profile_components(model, (torch.randn(2, 4),), descend=descend, **FAST)
    row = report.row("")
    assert row.status == "failed"
    assert row.error is not None and row.error.startswith(
        "flops metric raised ValueError: metric plugin 'flops' returned 'share', which the engine owns"
    )


# --- helpers of the contract -----------------------------------------------------------


class HiddenWork(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with unobserved():  # bookkeeping that is not the component's work
            torch.mm(x, self.w.detach())
        return torch.mm(x, self.w)


def test_ops_under_unobserved_are_not_counted() -> None:
    row = profile_components(HiddenWork(), (torch.randn(3, 4),), **FAST).row("")
    assert row.fwd_flops == 2 * 3 * 4 * 5  # one (3x4)@(4x5) matmul, not two: 120


def test_storage_key_and_unique_bytes_count_each_storage_once() -> None:
    t = torch.zeros(4, 8)  # 32 float32: 128 bytes
    other = torch.zeros(3)  # 12 bytes
    assert storage_key(t[1:]) == storage_key(t) != storage_key(other)
    assert storage_key(torch.empty(0)) is None and storage_key(torch.empty(2, device="meta")) is None
    assert unique_storage_bytes([t, t[1:], t.t(), other]) == 128 + 12
    # a meta tensor has no storage to share: its own elements, once per tensor
    meta = torch.empty(5, device="meta")
    assert unique_storage_bytes([meta, meta, torch.empty(5, device="meta")]) == 2 * 5 * 4


class AddsToInput(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.add_(1.0)


@pytest.mark.parametrize(("module", "reuse"), [(nn.Linear(4, 4), True), (AddsToInput(), False)])
def test_latency_measure_on_its_own_learns_whether_inputs_can_be_reused(module: nn.Module, reuse: bool) -> None:
    x = torch.randn(2, 4)
    replay = Replay(module, ComponentInputs((x,), {}), device=torch.device("cpu"))
    cfg = BenchmarkConfig(warmup=2, min_run_time_s=0.0, min_repeats=3, max_repeats=3, rounds=3, load_plugins=False)
    forwards: list[int] = []
    handle = module.register_forward_pre_hook(lambda m, a: forwards.append(1))
    try:
        values = LatencyMetric().measure(MeasureContext("", module, replay, cfg, torch.device("cpu")))
    finally:
        handle.remove()
    # its first warm-up run is an observed pass, which tells whether the inputs change
    assert replay.reuse_inputs is reuse
    # 3 samples over 3 rounds, one a round (a slice of one run has no untimed run before it)
    assert values["fwd_repeats"] == 3
    # the observed pass + (warmup - 1 = 1) more warm-up run + the 3 samples
    assert len(forwards) == 1 + 1 + 3
