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
from cb_callback import BenchmarkConfig, Capture, Comparison, compare_components
from cb_callback._cli import main
from cb_callback._whatif.compare import DEFAULT_TOLERANCES
from cb_callback._whatif.snapshot import save_snapshot
from cb_callback.plugins import ComponentInputs
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
    for name, value in [("rtol", math.inf), ("atol", -1.0), ("rtol", math.nan), ("atol", "1e-3"), ("rtol", True)]:
        with pytest.raises(ValueError) as e:  # rtol=inf called any candidate equivalent
            compare_components(model[0], ElementwiseGemv(D), capture.calls["0"], **{name: value}, **OPTS)
        assert str(e.value) == f"{name}={value!r} is invalid: expected a finite number >= 0 (or None: by dtype)"
    with pytest.raises(TypeError, match=r"^config=\{'seed': 1\}: expected a BenchmarkConfig, got dict; pass "):
        compare_components(model[0], ElementwiseGemv(D), capture.calls["0"], config={"seed": 1})  # type: ignore[arg-type]


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


# --- issue 14 §1: one closeness rule (torch.isclose's, equal_nan=True), integers exact, numbers too ---


class _Log(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


class _LogNoNegInf(nn.Module):
    """The log with -inf replaced by 0 (a candidate that "fixes" log(0))."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x).nan_to_num(neginf=0.0)


def test_equal_infinities_are_equivalent_and_an_infinity_replaced_by_a_number_is_not() -> None:
    x = torch.tensor([[0.0, 1.0, 2.0]], requires_grad=True)
    # log([0, 1, 2]) = [-inf, 0, 0.693]: -inf - (-inf) is NaN, but equal infinities are equal (isclose).
    # The gradient 1/x is inf at 0 (times the seeded output gradient, the same for both): equal too.
    same = compare_components(_Log(), _Log(), ((x,), {}), **OPTS)
    assert same.equivalent
    assert [(t.name, t.max_abs, t.max_rel, t.ok) for t in same.tensors] == [
        ("output[0]", 0.0, 0.0, True), ("grad[input 0]", 0.0, 0.0, True)]  # fmt: skip
    # 0 against -inf: not close whatever the tolerance (the bound atol + rtol*|-inf| must not admit it),
    # and the error is inf, not the largest float. nan_to_num's gradient is 0 where the input was -inf.
    fixed = compare_components(_Log(), _LogNoNegInf(), ((x,), {}), rtol=1e-3, atol=1e-3, **OPTS)
    assert not fixed.equivalent
    out, grad = fixed.tensor("output[0]"), fixed.tensor("grad[input 0]")
    assert (out.ok, out.max_abs, out.max_rel) == (False, math.inf, math.inf)
    assert (grad.ok, grad.max_abs, grad.max_rel) == (False, math.inf, math.inf)


def test_nan_against_nan_is_equal_and_nan_against_a_number_is_not() -> None:
    from cb_callback._whatif.tolerances import compare_tensors

    nan, inf = math.nan, math.inf
    ref = torch.tensor([nan, inf, -inf, 1.0])
    # NaN with NaN and each infinity with itself: equal (diff 0), even at zero tolerance.
    assert compare_tensors(ref, ref.clone(), 0.0, 0.0).close
    assert (compare_tensors(ref, ref.clone(), 0.0, 0.0).max_abs, compare_tensors(ref, ref.clone(), 0.0, 0.0).max_rel) \
        == (0.0, 0.0)  # fmt: skip
    for i, value in [(0, 1.0), (1, -inf), (2, inf), (3, nan), (3, inf)]:  # one element changed each time
        cand = ref.clone()
        cand[i] = value
        got = compare_tensors(ref, cand, 1e9, 1e9)  # no tolerance admits a non-finite difference
        assert (got.close, got.max_abs, got.max_rel) == (False, inf, inf), (i, value)


def test_int64_outputs_near_2_to_60_that_differ_by_one_are_not_equivalent() -> None:
    class Hash(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 1

    class HashOffByOne(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1

    x = torch.tensor([2**60, 2**60 + 2], dtype=torch.int64)
    c = compare_components(Hash(), HashOffByOne(), ((x,), {}), **OPTS)
    out = c.tensor("output[0]")
    # 2**60 + 1 vs 2**60 and 2**60 + 3 vs 2**60 + 2: float64's spacing at 2**60 is 2**8, so all four read
    # 2**60 there. Integers compare exactly, default tolerance 0 -> not equivalent; max |diff| = 1,
    # max_rel = 1 / 2**60 (float64 of 2**60 + 2 is 2**60 too).
    assert not c.equivalent and not out.ok and (out.rtol, out.atol) == (0.0, 0.0)
    assert out.max_abs == 1.0 and out.max_rel == 2.0**-60


def test_integer_differences_are_exact_even_at_the_ends_of_int64() -> None:
    from cb_callback._whatif.tolerances import compare_tensors

    lo, hi = -(2**63), 2**63 - 1
    got = compare_tensors(torch.tensor([lo, 5]), torch.tensor([hi, 5]), 0.0, 0.0)
    # hi - lo = 2**64 - 1: wraps to -1 in int64; taken as max - min and read back as unsigned.
    # float(2**64 - 1) rounds to 2**64; relative to |lo| = 2**63: (2**64 - 1) / 2**63 -> 2.0 in float64.
    assert (got.close, got.max_abs, got.max_rel) == (False, 2.0**64, 2.0)
    # An atol of 2**64 admits it (the bound is compared in float64: 2**64 <= 2**64).
    assert compare_tensors(torch.tensor([lo]), torch.tensor([hi]), 0.0, 2.0**64).close
    # bools: True vs False differ by 1, relative to |False| = 0: inf.
    b = compare_tensors(torch.tensor([False, True]), torch.tensor([True, True]), 0.0, 0.0)
    assert (b.close, b.max_abs, b.max_rel) == (False, 1.0, math.inf)


class _WithSum(nn.Module):
    """``(y, y.sum().item())``: the sum accumulated in the tensor's fp32."""

    def forward(self, x: torch.Tensor) -> Any:
        y = x * 2
        return y, y.sum().item()


class _WithSumFp64(nn.Module):
    """The same, the sum accumulated in fp64."""

    def forward(self, x: torch.Tensor) -> Any:
        y = x * 2
        return y, y.double().sum().item()


def test_a_python_float_output_leaf_is_compared_within_the_tolerances() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(16, generator=gen)  # 16 values in [0, 1): y = 2x in [0, 2), positive
    y = x * 2
    s32, exact = y.sum().item(), math.fsum(y.tolist())  # fsum: the exact sum of the fp32 values, rounded once
    assert s32 != exact  # the fp32 accumulation rounded: the two leaves differ
    # fp32 sum of n = 16 positive values: |error| <= (n - 1) * 2**-24 * sum = 15 * 2**-24 * sum < 8.95e-7 * sum,
    # within fp32's default bound atol + rtol * sum = 1e-5 + 1.3e-6 * sum; within 1e-3 + 1e-3 * sum a fortiori.
    assert abs(s32 - exact) <= 15 * 2**-24 * exact
    for tol in ({}, {"rtol": 1e-3, "atol": 1e-3}):
        c = compare_components(_WithSum(), _WithSumFp64(), ((x,), {}), backward=False, **tol, **OPTS)
        leaf = c.tensor("output[1]")
        assert c.equivalent and leaf.ok, tol
        assert (leaf.rtol, leaf.atol) == ((1.3e-6, 1e-5) if not tol else (1e-3, 1e-3))
        assert (leaf.shape_ref, leaf.dtype_ref, leaf.dtype_cand) == ((), "float", "float")
        assert leaf.max_abs == pytest.approx(abs(s32 - exact), abs=1e-15)  # fp64 sum vs fsum: <= 1 ulp apart
        assert leaf.max_rel == pytest.approx(abs(s32 - exact) / abs(s32), rel=1e-6)
    # At zero tolerance the rounding is a difference.
    assert not compare_components(_WithSum(), _WithSumFp64(), ((x,), {}), backward=False, rtol=0.0, atol=0.0,
                                  **OPTS).equivalent  # fmt: skip


def test_python_int_and_bool_leaves_are_exact_and_their_type_must_agree() -> None:
    class Returns(nn.Module):
        def __init__(self, value: Any) -> None:
            super().__init__()
            self.value = value

        def forward(self, x: torch.Tensor) -> Any:
            return x * 1, self.value

    x = torch.ones(2)
    big = compare_components(Returns(2**60), Returns(2**60 + 1), ((x,), {}), backward=False, **OPTS)
    leaf = big.tensor("output[1]")
    # ints: exact (tolerance 0), never through float64; 2**60 + 1 - 2**60 = 1.
    assert not big.equivalent and (leaf.max_abs, leaf.rtol, leaf.atol, leaf.mismatch) == (1.0, 0.0, 0.0, None)
    huge = compare_components(Returns(2**80), Returns(2**80), ((x,), {}), backward=False, **OPTS)
    assert huge.equivalent  # beyond int64: compared as Python ints
    kind = compare_components(Returns(3), Returns(3.0), ((x,), {}), backward=False, **OPTS)
    leaf = kind.tensor("output[1]")
    assert not kind.equivalent and leaf.max_abs == 0.0
    assert leaf.mismatch == "type differs: reference int, candidate float (values compared)"
    flag = compare_components(Returns(True), Returns(False), ((x,), {}), backward=False, **OPTS)
    assert not flag.equivalent and flag.tensor("output[1]").max_abs == 1.0  # True - False = 1
    t = compare_components(Returns(1.0), Returns(torch.tensor(1.0)), ((x,), {}), backward=False, **OPTS)
    assert t.tensor("output[1]").mismatch == "type differs: reference a float, candidate a float32 tensor"
