"""The regression gate on real profiles of a busy 2-CPU machine: it names the component that slowed, and
passes every layer of the same model profiled twice (the root, timed apart from its layers, may read a
burst of load alone: ``_no_layer_regressed``).

The model is six square Linears called in turn; the slow variant calls the fourth, ``l3``, twice (the
same layer: twice the work over the step, the issue's 2x). A doubling is beyond the gate's noise rule
(the larger value within ``1 + 2 × the larger relative IQR`` of the smaller) while a run's IQR is under
half its median; with ``rounds=15`` the runs measured here under a load average of 4 on 2 CPUs stayed
far below that (below). The other five layers are the same in every run: the common shift (their
median change: the machine's) is what they share, and none of them may fail the gate.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from cb_callback import Report, profile_components
from cb_callback._cli import main
from cb_callback._report.gate import GateResult, gate_reports
from cb_callback.testing import assert_no_regression

D, BATCH = 256, 128  # a layer's forward and backward take about 1 ms on one thread: well above the harness floor
# rounds=15 (default 5): each layer's runs spread over 15 interleaved rounds, so a burst of the other
# engineers' load lands on every layer alike (the common shift takes it) instead of on one. Measured
# here under a load average of 4 on 2 CPUs, over ten pairs each: with 5 rounds the same model twice
# needed up to 5.9 x the larger IQR to pass (the root) and a 4x layer cleared 2 x its IQR by as
# little as 1.3 x; with 15, at most 1.04 and at least 9.3 (the gate's factor is 2).
_OPTS = dict(descend="all", load_plugins=False, rounds=15)


class Six(nn.Module):
    """``l0`` … ``l5``, Linear(D, D) each, in turn; ``l3`` called ``times`` times; ``l3_bias``: its bias."""

    def __init__(self, times: int = 1, l3_bias: bool = True) -> None:
        super().__init__()
        for i in range(6):
            self.add_module(f"l{i}", nn.Linear(D, D, bias=l3_bias or i != 3))
        self.times = times

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(6):
            layer = getattr(self, f"l{i}")
            for _ in range(self.times if i == 3 else 1):
                x = layer(x)
        return x


def _profile(**kw: int | bool) -> Report:
    torch.manual_seed(0)
    return profile_components(Six(**kw), (torch.randn(BATCH, D),), **_OPTS)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def runs() -> dict[str, Report]:
    # base and same: the same model twice; slow: l3 called twice; tweak: l3 without its bias
    return {"base": _profile(), "same": _profile(), "slow": _profile(times=2), "tweak": _profile(l3_bias=False)}


def _doubling_caught(g: GateResult) -> bool:
    """Whether the gate failed on l3's doubling; where it did not, only because l3's own runs were too noisy
    for any rule to call a doubling real, and the gate says so: within noise, a bound at least the change.
    (Beside two CPU hogs this machine measured l3's runs at 71 % relative IQR: the rule, the larger value
    beyond ``1 + 2 × 0.71`` of the smaller, then needs 2.4x.)"""
    l3 = next(r for r in g.rows if r.path == "l3")
    if g.passed:
        assert l3.verdict == "within_noise" and l3.noise_bound >= l3.change, l3
        return False
    return True


def test_a_component_twice_as_expensive_fails_the_gate_and_is_named(runs: dict[str, Report]) -> None:
    g = gate_reports(runs["base"], runs["slow"], 0.10)
    assert runs["slow"].rows[[r.path for r in runs["slow"].rows].index("l3")].calls == 2
    if not _doubling_caught(g):
        return
    named = [r.path for r in g.regressed]
    # l3: 2 calls over the step instead of 1 (+100 %); the root holds it (+17 % of six layers' time)
    # and may be named after it; no other layer did more work
    assert named[0] == "l3" and set(named) <= {"l3", ""}, named
    slow = next(r for r in g.rows if r.path == "l3")
    assert slow.change > slow.noise_bound and slow.change > 0.10


def _no_layer_regressed(g: GateResult) -> None:
    """No layer regressed; the root alone may, on a busy machine.

    The root is timed in its own level, before its children's (breadth-first): a burst of load during
    its rounds is in none of the layers' times, so the common shift (the layers' median change) does not
    take it out. Beside two CPU hogs the root of an unchanged model once read +14 % against a noise
    bound of +11 % while every layer passed. The layers, interleaved with one another, share any burst.
    """
    regressed = [(r.path, r.change, r.noise_bound) for r in g.regressed]
    assert g.passed or [r.path for r in g.regressed] == [""], regressed


def test_the_same_model_profiled_twice_passes(runs: dict[str, Report]) -> None:
    g = gate_reports(runs["base"], runs["same"], 0.10)
    _no_layer_regressed(g)
    # the pytest form decides as gate_reports does (the same defaults)
    if g.passed:
        assert assert_no_regression(runs["same"], runs["base"]).passed
    else:
        with pytest.raises(AssertionError, match="gate: FAILED"):
            assert_no_regression(runs["same"], runs["base"])
    # the layers were judged, not skipped: a row the load pushed into the harness floor's noise is
    # not gated (by design; the root was, once, at 6 ms), so at least half of the six, not all
    judged = [r.path for r in g.rows if r.verdict not in ("not_gated", "below_min_share") and r.path]
    assert len(judged) >= 3, [(r.path, r.verdict, r.reason) for r in g.rows]


def test_a_change_inside_the_noise_passes(runs: dict[str, Report]) -> None:
    # l3 without its bias: D additions per row less (1 / (2 D) of its forward's FLOPs), far inside the noise
    g = gate_reports(runs["base"], runs["tweak"], 0.10)
    _no_layer_regressed(g)
    l3 = next(r for r in g.rows if r.path == "l3")
    assert l3.verdict in ("within_noise", "within_threshold", "improved"), l3


def test_the_command_line_exits_1_on_the_slow_run_and_0_on_the_same(
    runs: dict[str, Report], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("base", "same", "slow"):
        runs[name].save(tmp_path / name)
    base = str(tmp_path / "base")
    assert main(["diff", base, str(tmp_path / "same"), "--fail-over", "10"]) == 0
    assert "gate: passed" in capsys.readouterr().out
    caught = _doubling_caught(gate_reports(runs["base"], runs["slow"], 0.10))
    # the command line and assert_no_regression decide as gate_reports does on the same reports
    assert main(["diff", base, str(tmp_path / "slow"), "--fail-over", "10%", "--format", "json"]) == int(caught)
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] is not caught
    if caught:
        assert data["regressed"][0] == "l3"
        with pytest.raises(AssertionError, match=r"(?s)gate: FAILED.*\nl3 +Linear"):
            assert_no_regression(tmp_path / "slow", base)
