"""TorchScript submodules (``torch.jit.script`` / ``torch.jit.trace``): they refuse hooks, so each is a leaf
whose row fails saying why, while the rest of the model is captured and replayed as usual.

FLOPs are exact: a ``Linear(k -> n)`` on ``m`` rows is ``2*m*k*n`` forward, and its backward is one GEMM
for the weight's gradient plus one for the input's when the input requires grad. The scripted module's work
runs inside its parent's replay, so the root's counts hold it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.nn.modules import module as module_module

from cb_callback import profile_components
from cb_callback._engine.capture.capture import Capture
from cb_callback._engine.capture.tree import SCRIPTED, SCRIPTED_ROOT, component_paths, scripted
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


@MAKERS
def test_capture_counts_a_script_module_as_failed_and_captures_the_rest(make: Callable[[nn.Module], nn.Module]) -> None:
    model = Net(make, times=2)
    x = torch.randn(ROWS, FEATURES)
    expected = model(x)
    hooks = len(module_module._global_forward_pre_hooks)
    with Capture(model) as cap:
        out = model(x)
    assert torch.equal(out, expected)  # the step itself is untouched
    assert len(module_module._global_forward_pre_hooks) == hooks  # the global hook came off
    assert set(cap.calls) == {"", "feat", "head"}
    feat = cap.calls["feat"]
    assert (feat.capture_error, feat.calls, feat.args) == (SCRIPTED, 2, ())  # 2: forward runs feat twice
    assert cap.calls["head"].capture_error is None and cap.calls["head"].calls == 1
    assert cap.calls[""].capture_error is None


def _profile(model: nn.Module, x: torch.Tensor) -> Report:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: the capture forward no longer raises
        warnings.filterwarnings("ignore", message=".*machine.*")  # a busy machine's load, not the model's
        return profile_components(model, (x,), descend="all", peak_flops=1e11, peak_bandwidth=1e10, **FAST)


@MAKERS
def test_profile_replays_the_rest_and_the_script_module_fails_saying_why(
    make: Callable[[nn.Module], nn.Module],
) -> None:
    report = _profile(Net(make), torch.randn(ROWS, FEATURES))
    assert [(r.path, r.status) for r in report.rows] == [("", "ok"), ("feat", "failed"), ("head", "ok")]
    feat, head, root = report.row("feat"), report.row("head"), report.row("")
    assert feat.error == SCRIPTED and feat.calls == 1
    assert "cannot be hooked" in SCRIPTED and "parent's own time" in SCRIPTED
    # head: Linear(8 -> 2) on 4 rows: 2*4*8*2 forward; backward: input's and weight's gradients, 2*4*8*2 each
    assert (head.fwd_flops, head.bwd_flops) == (2 * ROWS * FEATURES * OUT, 2 * 2 * ROWS * FEATURES * OUT)
    # the root holds feat's Linear(8 -> 8): 2*4*8*8 forward, backward only the weight's gradient (x needs none)
    assert root.fwd_flops == 2 * ROWS * FEATURES * FEATURES + 2 * ROWS * FEATURES * OUT
    assert root.bwd_flops == 2 * ROWS * FEATURES * FEATURES + 2 * 2 * ROWS * FEATURES * OUT


def test_a_scripted_root_is_one_failed_row_saying_what_to_do() -> None:
    model = torch.jit.script(nn.Sequential(nn.Linear(FEATURES, FEATURES), nn.ReLU()))
    report = _profile(model, torch.randn(ROWS, FEATURES))
    assert [(r.path, r.status, r.error) for r in report.rows] == [("", "failed", SCRIPTED_ROOT)]
    assert "profile the nn.Module before scripting or tracing it" in SCRIPTED_ROOT
