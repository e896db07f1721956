"""``compare_components`` and ``cb compare`` (issue 10 §2): numeric equivalence of a re-authored component."""

from __future__ import annotations

import math
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import cb_callback
from cb_callback import BenchmarkConfig, Capture, Comparison, ComponentInputs, compare_components
from cb_callback._cli import main
from cb_callback._compare import DEFAULT_TOLERANCES
from cb_callback._snapshot import save_snapshot
from tests.conftest import FAST

PEAKS: dict[str, Any] = dict(peak_flops=1e11, peak_bandwidth=1e10)
OPTS: dict[str, Any] = dict(FAST, **PEAKS)
D = 16


class ElementwiseGemv(nn.Module):
    """``Linear(d, 1)`` re-authored as a broadcast multiply and a sum (the paper's GEMV case)."""

    def __init__(self, d: int, bias: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1, d))
        self.bias = nn.Parameter(torch.zeros(1)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = (x * self.weight).sum(-1, keepdim=True)
        return y + self.bias if self.bias is not None else y


class MatmulNoTranspose(nn.Module):
    """A square ``Linear(d, d)`` re-authored as ``x @ w + b``: forgets that Linear computes ``x @ w.T``."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(d, d))
        self.bias = nn.Parameter(torch.zeros(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight + self.bias


class _HalfGradScale(torch.autograd.Function):
    """Identity forward; the backward returns half the gradient (a wrong backward)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * 0.5


class WrongBackwardLinear(nn.Linear):
    """The reference's forward exactly, but the gradient flowing into the input is halved."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(_HalfGradScale.apply(x))


def _x(n: int = 8, d: int = D) -> torch.Tensor:
    return torch.randn(n, d, requires_grad=True)


def test_public_surface() -> None:
    assert {"compare_components", "Comparison"} <= set(cb_callback.__all__)
    # The defaults are torch.testing.assert_close's (asked for fp32, fp16, bf16).
    assert DEFAULT_TOLERANCES[torch.float32] == (1.3e-6, 1e-5)
    assert DEFAULT_TOLERANCES[torch.float16] == (1e-3, 1e-5)
    assert DEFAULT_TOLERANCES[torch.bfloat16] == (1.6e-2, 1e-5)


def test_gemv_reauthored_elementwise_is_equivalent_outputs_and_grads() -> None:
    ref = nn.Linear(D, 1)
    x = _x()
    c = compare_components(ref, ElementwiseGemv(D), ((x,), {}), **OPTS)
    assert isinstance(c, Comparison)
    assert c.equivalent, c.summary()
    assert [t.name for t in c.tensors] == ["output[0]", "grad[input 0]", "grad[weight]", "grad[bias]"]
    assert c.state_loaded == ["weight", "bias"] and c.state_missing == [] and c.state_unused == []
    assert c.not_compared == {}
    out = c.tensor("output[0]")
    assert (out.shape_ref, out.shape_cand, out.rtol, out.atol) == ((8, 1), (8, 1), 1.3e-6, 1e-5)
    # The error is the float32 rounding of two summation orders, measured exactly:
    cand = ElementwiseGemv(D)
    cand.load_state_dict(ref.state_dict())
    with torch.no_grad():
        expected = (cand(x).double() - ref(x).double()).abs().max().item()
    assert out.max_abs == expected
    # The grads are compared (w.r.t. the input and both parameters), each one named.
    df = c.to_dataframe()
    assert list(df.columns[:8]) == ["name", "shape_ref", "shape_cand", "max_abs", "max_rel", "rtol", "atol", "ok"]
    assert df["ok"].tolist() == [True] * 4
    assert df.set_index("name").loc["grad[weight]", "shape_ref"] == (1, D)
    # The engine measured both, side by side: the GEMV counts 2 * 8 * 16 FLOPs, the elementwise form 0
    # (FlopCounterMode counts matmuls, not multiplies and sums).
    ref_row, cand_row = c.rows
    assert (ref_row.path, cand_row.path) == ("reference", "candidate")
    assert (ref_row.status, cand_row.status) == ("ok", "ok")
    assert ref_row.fwd_flops == 2 * 8 * D * 1
    assert cand_row.fwd_flops == 0
    assert math.isfinite(ref_row.bwd_ms) and math.isfinite(cand_row.bwd_ms)
    text = str(c)
    assert text.splitlines()[0] == "equivalent: all 4 compared tensors are allclose"
    assert "metric" in text and "fwd_flops" in text and "bw_util" in text and "bound" in text


def test_the_callers_candidate_and_the_reference_are_left_unchanged() -> None:
    ref, cand = nn.Linear(D, 1), ElementwiseGemv(D)
    before = {k: v.clone() for k, v in ref.state_dict().items()}
    compare_components(ref, cand, ((_x(),), {}), **OPTS)
    assert all(torch.equal(v, before[k]) for k, v in ref.state_dict().items())
    assert torch.count_nonzero(cand.weight) == 0  # the state was loaded into a copy
    assert ref.weight.grad is None


def test_transposed_weight_is_not_equivalent_and_the_output_is_named() -> None:
    ref = nn.Linear(D, D)
    x = _x()
    c = compare_components(ref, MatmulNoTranspose(D), ((x,), {}), **OPTS)
    assert not c.equivalent
    out = c.tensor("output[0]")
    assert not out.ok and out.mismatch is None
    with torch.no_grad():
        y_ref = ref(x)
        y_cand = x @ ref.weight + ref.bias  # what the candidate computes with the loaded weight
    assert out.max_abs == (y_cand.double() - y_ref.double()).abs().max().item()
    assert {t.name for t in c.failing} == {"output[0]", "grad[input 0]", "grad[weight]"}
    assert c.tensor("grad[bias]").ok  # the bias's gradient is the sum of the output gradient in both
    lines = c.summary().splitlines()
    assert lines[0] == "NOT equivalent: 3 of 4 compared tensors differ"
    # The failing tensors first (lines 4-6, under the header), then the one that is ok.
    assert [line.split()[-1] for line in lines[4:8]] == ["FAIL", "FAIL", "FAIL", "ok"]
    assert lines[7].startswith("grad[bias]")


def test_dropped_bias_is_not_equivalent_and_the_missing_parameter_is_listed() -> None:
    ref = nn.Linear(D, 1)
    x = _x()
    c = compare_components(ref, ElementwiseGemv(D, bias=False), ((x,), {}), **OPTS)
    assert not c.equivalent
    assert c.state_loaded == ["weight"] and c.state_unused == ["bias"]
    assert c.not_compared == {"bias": "only in the reference"}
    out = c.tensor("output[0]")
    assert not out.ok
    # Dropping the bias shifts every output by it; rounding of the two sums is far below |bias|.
    assert out.max_abs == pytest.approx(abs(ref.bias.item()), abs=1e-5)
    assert c.tensor("grad[weight]").ok  # the weight's gradient does not depend on the bias
    assert [t.name for t in c.failing] == ["output[0]"]


def test_a_wrong_backward_is_caught_on_the_input_gradient() -> None:
    torch.manual_seed(0)
    ref = nn.Linear(D, D)
    cand = WrongBackwardLinear(D, D)
    c = compare_components(ref, cand, ((_x(),), {}), **OPTS)
    assert c.tensor("output[0]").ok and c.tensor("output[0]").max_abs == 0.0  # the same forward, bit for bit
    assert c.tensor("grad[weight]").ok and c.tensor("grad[bias]").ok
    bad = c.tensor("grad[input 0]")
    assert not bad.ok
    assert bad.max_rel == 0.5  # |g/2 - g| / |g|, exact in floating point
    assert not c.equivalent
    assert [t.name for t in c.failing] == ["grad[input 0]"]
    # Forward only, the same pair passes: what a check of outputs alone would have said.
    fwd = compare_components(ref, cand, ((_x(),), {}), backward=False, **OPTS)
    assert fwd.equivalent and [t.name for t in fwd.tensors] == ["output[0]"]
    assert math.isnan(fwd.rows[0].bwd_ms)


def test_shape_and_dtype_mismatches_are_named() -> None:
    class Wide(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(2, D))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ self.weight.T

    class Double(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x).double()

    x = _x()
    c = compare_components(nn.Linear(D, 1, bias=False), Wide(), ((x,), {}), **OPTS)
    assert c.tensor("output[0]").mismatch == "shape differs: reference (8, 1), candidate (8, 2)"
    assert c.state_missing == ["weight"] and c.state_unused == ["weight"]  # same name, other shape: not loaded
    assert c.tensor("grad[weight]").mismatch == "shape differs: reference (1, 16), candidate (2, 16)"
    assert not c.equivalent
    d = compare_components(nn.Linear(D, 1), Double(D, 1), ((x,), {}), **OPTS)
    out = d.tensor("output[0]")
    assert out.mismatch is not None and out.mismatch.startswith("dtype differs: reference float32, candidate float64")
    assert out.max_abs == 0.0 and not out.ok and not d.equivalent


def test_same_seed_makes_dropout_match_and_load_state_is_used() -> None:
    class Drop(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(D, D)
            self.drop = nn.Dropout(0.5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.drop(self.lin(x))

    class Renamed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(D, D)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return nn.functional.dropout(self.proj(x), 0.5, training=self.training)

    seen: list[tuple[str, str]] = []

    def load(reference: nn.Module, candidate: nn.Module) -> None:
        seen.append((type(reference).__name__, type(candidate).__name__))
        candidate.get_submodule("proj").load_state_dict(reference.get_submodule("lin").state_dict())

    ref = Drop().train()
    c = compare_components(ref, Renamed(), ((_x(),), {}), load_state=load, **OPTS)
    assert seen == [("Drop", "Renamed")]
    assert c.tensor("output[0]").max_abs == 0.0  # the same dropout mask: the same seed before each forward
    assert c.tensor("grad[input 0]").ok
    # Parameters are matched by name: the renamed ones are listed, not compared.
    assert c.not_compared == {
        "lin.weight": "only in the reference", "lin.bias": "only in the reference",
        "proj.weight": "only in the candidate", "proj.bias": "only in the candidate",
    }  # fmt: skip
    assert c.equivalent and c.notes == ["state loaded by load_state"]


def test_captured_component_inputs_and_bad_inputs() -> None:
    model = nn.Sequential(nn.Linear(D, 1))
    with Capture(model) as capture:
        model(torch.randn(4, D))
    c = compare_components(model[0], ElementwiseGemv(D), capture.calls["0"], config=BenchmarkConfig(**OPTS))
    # A captured input that did not require grad: only the parameters' gradients.
    assert [t.name for t in c.tensors] == ["output[0]", "grad[weight]", "grad[bias]"]
    assert c.equivalent
    with pytest.raises(ValueError, match="expected a ComponentInputs"):
        compare_components(model[0], ElementwiseGemv(D), torch.randn(4, D), **OPTS)  # type: ignore[arg-type]
    broken = ComponentInputs(args=(), kwargs={}, capture_error="could not copy args[0]")
    with pytest.raises(ValueError, match="could not copy args"):
        compare_components(model[0], ElementwiseGemv(D), broken, **OPTS)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(D, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(x))


_FACTORIES = """
import torch
from torch import nn


class Gemv(nn.Module):
    def __init__(self, d, bias=True):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1, d))
        self.bias = nn.Parameter(torch.zeros(1)) if bias else None

    def forward(self, x):
        y = (x * self.weight).sum(-1, keepdim=True)
        return y if self.bias is None else y + self.bias


def good():
    return Gemv({d})


def from_reference(reference):
    return Gemv(reference.in_features)


def no_bias():
    return Gemv({d}, bias=False)
"""


def test_cli_compare_exit_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = Net()
    with Capture(model) as capture:
        model(torch.randn(5, D))
    snap = save_snapshot(
        tmp_path / "snap", model, capture.calls, config=BenchmarkConfig(**OPTS), captured_batch_size=5,
        metadata={"capture_device": "cpu"},
    )  # fmt: skip
    (tmp_path / "cand_factories.py").write_text(textwrap.dedent(_FACTORIES.format(d=D)))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "cand_factories", raising=False)
    argv = ["compare", str(snap), "--path", "head", "--candidate"]
    assert main([*argv, "cand_factories:good"]) == 0
    out = capsys.readouterr().out
    assert "equivalent: all 3 compared tensors are allclose" in out
    assert "head (Linear) vs cand_factories:good (Gemv)" in out
    assert "compiled_ms      -          -" in out  # not compiled without --compile
    assert main([*argv, "cand_factories:good", "--compile", "--compile-backend", "eager"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("compiled_ms"))
    assert line.split()[1] != "-" and line.split()[2] != "-"  # both sides compiled and timed
    assert main([*argv, "cand_factories:from_reference"]) == 0  # factory(reference)
    capsys.readouterr()
    assert main([*argv, "cand_factories:no_bias"]) == 1
    out = capsys.readouterr().out
    assert "NOT equivalent: 1 of 2 compared tensors differ" in out
    assert "bias (only in the reference)" in out
    assert main([*argv, "cand_factories:nowhere"]) == 2
    assert "has no attribute 'nowhere'" in capsys.readouterr().err
    assert main(["compare", str(snap), "--path", "tail", "--candidate", "cand_factories:good"]) == 2
    assert "no captured call of 'tail'" in capsys.readouterr().err


def test_output_structure_and_dtype_aware_tolerances() -> None:
    class AsTuple(nn.Linear):
        def forward(self, x: torch.Tensor) -> Any:
            return (super().forward(x),)

    x = _x()
    c = compare_components(nn.Linear(D, 1), AsTuple(D, 1), ((x,), {}), **OPTS)
    out = c.tensor("output[0]")
    assert out.max_abs == 0.0 and out.mismatch == "the output structures differ (containers or keys)"
    assert not c.equivalent
    # bf16 tensors get assert_close's bf16 tolerances; explicit ones win.
    ref = nn.Linear(D, 1).to(torch.bfloat16)
    xb = x.detach().to(torch.bfloat16).requires_grad_(True)
    b = compare_components(ref, ElementwiseGemv(D).to(torch.bfloat16), ((xb,), {}), **OPTS)
    assert {(t.rtol, t.atol) for t in b.tensors} == {(1.6e-2, 1e-5)}
    e = compare_components(ref, ElementwiseGemv(D).to(torch.bfloat16), ((xb,), {}), rtol=0.0, atol=0.0, **OPTS)
    assert {(t.rtol, t.atol) for t in e.tensors} == {(0.0, 0.0)}
