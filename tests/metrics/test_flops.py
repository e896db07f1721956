"""Exact FLOPs per component, with the arithmetic in comments."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from cb_callback import profile_components
from tests.conftest import FAST


class Bmm(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, b)


class Attention(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v)


def test_linear_flops_input_requires_grad() -> None:
    x = torch.randn(8, 64, requires_grad=True)
    row = profile_components(nn.Linear(64, 32), (x,), **FAST).row("")
    assert row.fwd_flops == 2 * 8 * 64 * 32  # addmm: 2*M*K*N = 32768
    # dX = dY @ W (2*8*32*64) and dW = dY^T @ X (2*32*8*64)
    assert row.bwd_flops == 2 * (2 * 8 * 32 * 64)


def test_linear_flops_input_without_grad() -> None:
    row = profile_components(nn.Linear(64, 32), (torch.randn(8, 64),), **FAST).row("")
    assert row.fwd_flops == 2 * 8 * 64 * 32
    assert row.bwd_flops == 2 * 32 * 8 * 64  # only dW: the input needs no gradient


def test_conv2d_flops() -> None:
    x = torch.randn(2, 3, 16, 16, requires_grad=True)
    row = profile_components(nn.Conv2d(3, 8, 3, padding=1), (x,), **FAST).row("")
    # 2 * B * Cout * Hout * Wout * Cin * kh * kw = 2*2*8*16*16*3*9
    assert row.fwd_flops == 221_184
    assert row.bwd_flops == 2 * 221_184  # grad input + grad weight, one conv each


def test_bmm_flops() -> None:
    a = torch.randn(4, 8, 16, requires_grad=True)
    b = torch.randn(4, 16, 32, requires_grad=True)
    row = profile_components(Bmm(), (a, b), **FAST).row("")
    assert row.fwd_flops == 2 * 4 * 8 * 16 * 32  # 32768
    assert row.bwd_flops == 2 * (2 * 4 * 8 * 16 * 32)  # dA and dB, one bmm each


def test_cpu_sdpa_flops_are_counted() -> None:
    B, H, L, E = 2, 4, 16, 8
    q, k, v = (torch.randn(B, H, L, E, requires_grad=True) for _ in range(3))
    report = profile_components(Attention(), (q, k, v), **FAST)
    row = report.row("")
    # QK^T and PV: two bmms of 2*B*H*L*L*E each -> 4*B*H*L*L*E
    assert row.fwd_flops == 4 * B * H * L * L * E  # 65536
    # Flash backward recomputes S = QK^T, then dP = dO V^T, dV = P^T dO, dQ = dS K,
    # dK = dS^T Q: five bmms of 2*B*H*L*L*E -> 10*B*H*L*L*E (torch's CUDA formula too)
    assert row.bwd_flops == 10 * B * H * L * L * E  # 163840
    assert "aten._scaled_dot_product_flash_attention_for_cpu" not in row.details["uncounted_ops"]


def test_cpu_sdpa_formula_matches_the_math_decomposition() -> None:
    q, k, v = (torch.randn(1, 2, 12, 8, requires_grad=True) for _ in range(3))
    with sdpa_kernel(SDPBackend.MATH):
        counter = FlopCounterMode(display=False)
        with counter:
            F.scaled_dot_product_attention(q, k, v)
    flash = profile_components(Attention(), (q, k, v), **FAST).row("").fwd_flops
    assert flash == counter.get_total_flops() == 4 * 1 * 2 * 12 * 12 * 8


def test_uncounted_ops_are_listed() -> None:
    row = profile_components(nn.GELU(), (torch.randn(4, 4, requires_grad=True),), **FAST).row("")
    assert row.fwd_flops == 0
    assert row.details["uncounted_ops"] == ["aten.gelu", "aten.gelu_backward"]
