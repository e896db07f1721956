"""TorchScript submodules (``torch.jit.script`` / ``torch.jit.trace``): they refuse module hooks, so global
hooks capture their calls; each is a leaf replayed whole, with a note saying why nothing inside it is a row,
and the rest of the model is captured and replayed as usual.

FLOPs are exact: a ``Linear(k -> n)`` on ``m`` rows is ``2*m*k*n`` forward, and its backward is one GEMM
for the weight's gradient plus one for the input's when the input requires grad.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.nn.modules import module as module_module

from cb_callback import profile_components
from cb_callback._engine.capture import capture as capture_module
from cb_callback._engine.capture.capture import Capture
from cb_callback._engine.capture.tree import SCRIPTED, SCRIPTED_UNREAD, component_paths, scripted
from cb_callback._report.model import Report
from tests.conftest import FAST

ROWS, FEATURES, OUT = 4, 8, 2
#: torch 2.13 deprecates torch.jit.script / trace; models still ship with them
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")


def _script(m: nn.Module) -> nn.Module:
    return torch.jit.script(m)


def _trace(m: nn.Module) -> nn.Module:
    return torch.jit.trace(m, torch.randn(ROWS, FEATURES))


class Net(nn.Module):
    """``head(feat(x))`` where ``feat`` is ``Linear(8 -> 8) -> ReLU`` made a ScriptModule by ``make``;
    ``feat`` runs ``times`` times."""

    def __init__(self, make: Callable[[nn.Module], nn.Module], times: int = 1) -> None:
        super().__init__()
        self.feat = make(nn.Sequential(nn.Linear(FEATURES, FEATURES), nn.ReLU()))
        self.head = nn.Linear(FEATURES, OUT)
        self.times = times

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.times):
            x = self.feat(x)
        return self.head(x)


MAKERS = pytest.mark.parametrize("make", [_script, _trace], ids=["script", "trace"])


@MAKERS
def test_a_script_module_is_a_leaf_of_the_tree(make: Callable[[nn.Module], nn.Module]) -> None:
    model = Net(make)
    # named_modules() also gives feat.0 and feat.1 (RecursiveScriptModules no hook can see): no nodes
    assert [n for n, _ in model.named_modules()] == ["", "feat", "feat.0", "feat.1", "head"]
    assert list(component_paths(model)) == ["", "feat", "head"]
    assert scripted(model.feat) and not scripted(model.head)
    assert list(component_paths(make(nn.Sequential(nn.Linear(FEATURES, FEATURES))))) == [""]


class Scaled(nn.Module):
    """``x * scale``, ``scale`` a keyword argument (a global forward pre-hook is not given the call's)."""

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return x * scale


class WithKeywords(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scaled = torch.jit.script(Scaled())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scaled(x, scale=3.0)


@MAKERS
def test_capture_takes_a_script_modules_calls_with_global_hooks(make: Callable[[nn.Module], nn.Module]) -> None:
    model = Net(make, times=2)
    x = torch.randn(ROWS, FEATURES)
    expected = model(x)
    hooks = len(module_module._global_forward_pre_hooks), len(module_module._global_forward_hooks)
    with Capture(model) as cap:
        out = model(x)
    assert torch.equal(out, expected)  # the step itself is untouched
    assert (len(module_module._global_forward_pre_hooks), len(module_module._global_forward_hooks)) == hooks
    assert set(cap.calls) == {"", "feat", "head"}
    feat = cap.calls["feat"]
    # 2 calls: the first on x (no grad), the second on feat's output (requires grad): another kind of call
    assert (feat.capture_error, feat.calls, len(feat.variants)) == (None, 2, 1)
    assert torch.equal(feat.args[0], x) and not feat.args[0].requires_grad
    assert feat.variants[0].args[0].requires_grad
    assert cap.calls["head"].calls == 1 and cap.calls[""].calls == 1


def test_capture_reads_a_script_modules_keyword_arguments() -> None:
    model, x = WithKeywords(), torch.randn(ROWS, FEATURES)
    with Capture(model) as cap:
        model(x)
    assert cap.calls["scaled"].kwargs == {"scale": 3.0} and torch.equal(cap.calls["scaled"].args[0], x)


def test_a_call_whose_keywords_cannot_be_read_fails_its_row_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture_module, "_call_kwargs", lambda: None)  # another torch's Module.__call__
    report = _profile(Net(_script), torch.randn(ROWS, FEATURES))
    assert [(r.path, r.status) for r in report.rows] == [("", "ok"), ("feat", "failed"), ("head", "ok")]
    assert report.row("feat").error == SCRIPTED_UNREAD and report.row("feat").calls == 1


def _profile(model: nn.Module, x: torch.Tensor) -> Report:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = profile_components(model, (x,), descend="all", peak_flops=1e11, peak_bandwidth=1e10, **FAST)
    # the capture forward raised ("the capture forward raised RuntimeError: register_forward_pre_hook ...");
    # other warnings (a busy machine's) are not the model's
    assert not [str(w.message) for w in caught if "raised" in str(w.message) or "ScriptModule" in str(w.message)]
    return report


@MAKERS
def test_profile_replays_a_script_module_whole_and_says_why_nothing_inside_is_a_row(
    make: Callable[[nn.Module], nn.Module],
) -> None:
    report = _profile(Net(make), torch.randn(ROWS, FEATURES))
    assert [(r.path, r.status) for r in report.rows] == [("", "ok"), ("feat", "ok"), ("head", "ok")]
    feat, head, root = report.row("feat"), report.row("head"), report.row("")
    assert feat.note == SCRIPTED and feat.calls == 1 and (head.note, root.note) == (None, None)
    assert "refuses module hooks" in SCRIPTED and "profile the nn.Module before scripting" in SCRIPTED
    # feat: Linear(8 -> 8) on 4 rows: 2*4*8*8 forward; backward only the weight's gradient (x needs none)
    assert (feat.fwd_flops, feat.bwd_flops) == (2 * ROWS * FEATURES * FEATURES, 2 * ROWS * FEATURES * FEATURES)
    # head: Linear(8 -> 2): 2*4*8*2 forward; backward: the input's and the weight's gradients, 2*4*8*2 each
    assert (head.fwd_flops, head.bwd_flops) == (2 * ROWS * FEATURES * OUT, 2 * 2 * ROWS * FEATURES * OUT)
    assert (root.fwd_flops, root.bwd_flops) == (feat.fwd_flops + head.fwd_flops, feat.bwd_flops + head.bwd_flops)
    assert math.isnan(feat.insitu_ms) and math.isfinite(head.insitu_ms)  # no module hook: no in-situ time


def test_a_scripted_root_is_replayed_whole() -> None:
    model = torch.jit.script(nn.Sequential(nn.Linear(FEATURES, FEATURES), nn.ReLU()))
    report = _profile(model, torch.randn(ROWS, FEATURES))
    assert [(r.path, r.status, r.note) for r in report.rows] == [("", "ok", SCRIPTED)]
    # Linear(8 -> 8) on 4 rows: 2*4*8*8 forward, the weight's gradient 2*4*8*8 backward (x needs none)
    assert (report.row("").fwd_flops, report.row("").bwd_flops) == (2 * ROWS * FEATURES * FEATURES,) * 2


class _Pause(nn.Module):
    """30 ms of sleep, then ``Linear(OUT, OUT)``: most of the step, so that no leaf of "0" reaches a fifth of
    it (a top hotspot, replayed) even when a busy machine preempts its in-situ pass for a few ms."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(OUT, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.03)
        return self.lin(x)


def test_a_script_module_left_in_situ_claims_no_census_counts() -> None:
    # descend_share=1: the root is replayed, "0" (share < 1: "1" holds most of the time) is left in situ and
    # nothing below it is descended into: its rows take the census's counts, which cannot see inside a
    # ScriptModule
    model = nn.Sequential(Net(_script), _Pause())
    report = profile_components(
        model, (torch.randn(ROWS, FEATURES),), descend_share=1.0, peak_flops=1e11, peak_bandwidth=1e10, **FAST
    )
    rows = {r.path: r for r in report.rows}
    assert [rows[p].status for p in ("", "0", "0.feat", "0.head")] == ["ok", "skipped", "skipped", "skipped"]
    # "0" as the census counted it: Linear(8 -> 8) and Linear(8 -> 2) on 4 rows, 2*4*8*8 + 2*4*8*2 forward
    assert rows["0"].fwd_flops == 2 * ROWS * FEATURES * FEATURES + 2 * ROWS * FEATURES * OUT
    assert rows["0.head"].fwd_flops == 2 * ROWS * FEATURES * OUT
    # feat's own work is no hook's: unknown (NaN), not 0 FLOPs
    assert math.isnan(rows["0.feat"].fwd_flops) and math.isnan(rows["0.feat"].bytes)
