"""Exact bytes moved, activation and peak memory of small components."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from cb_callback import profile_components
from cb_callback.plugins import register_traffic_rule
from tests.conftest import FAST

F32 = 4
I64 = 8


def test_linear_bytes_are_inputs_plus_outputs_per_op() -> None:
    row = profile_components(nn.Linear(64, 32), (torch.randn(8, 64),), **FAST).row("")
    # forward addmm(bias[32], x[8,64], W^T[64,32]) -> y[8,32]; W.t() is a view (0 bytes)
    fwd = F32 * (32 + 8 * 64 + 64 * 32 + 8 * 32)
    # backward, x needs no grad: dW = mm(dY^T[32,8], x[8,64]) -> [32,64]; db = sum(dY[8,32]) -> [32]
    bwd = F32 * (32 * 8 + 8 * 64 + 32 * 64) + F32 * (8 * 32 + 32)
    assert row.details["fwd_bytes"] == fwd == 11_392
    assert row.details["bwd_bytes"] == bwd == 12_416
    assert row.bytes == fwd + bwd
    assert row.intensity == pytest.approx((2 * 8 * 64 * 32 * 2) / (fwd + bwd))
    if "at_floor" in row.details.get("flags", []):  # a time isolation cannot tell from nothing: no rate
        assert math.isnan(row.gbps)
    else:
        assert row.gbps == pytest.approx((fwd + bwd) / (row.total_ms / 1e3) / 1e9)


def test_embedding_counts_rows_touched_not_the_table() -> None:
    table_rows, dim = 2_000_000, 4  # a 32 MB table
    ids = torch.randint(0, table_rows, (4, 5))
    row = profile_components(nn.Embedding(table_rows, dim), (ids,), **FAST).row("")
    out = 4 * 5 * dim * F32  # 20 rows gathered
    index = 4 * 5 * I64
    assert row.details["fwd_bytes"] == index + 2 * out  # read index, read rows, write output
    # embedding_dense_backward: read index and grad rows, read+write one gradient row each
    # (the zero fill of the table-sized gradient happens inside the kernel: not counted)
    assert row.details["bwd_bytes"] == index + 3 * out
    assert row.bytes == 1_920  # vs a 32 MB table
    # 0 FLOPs: the memory roof binds; bound is "memory" only near it, else "latency" (issue 22)
    assert row.details["roofline"]["roof"] == "memory" and row.bound != "compute"


def test_views_move_nothing() -> None:
    row = profile_components(nn.Flatten(), (torch.randn(8, 4, 4, requires_grad=True),), **FAST).row("")
    assert row.bytes == 0


def test_activation_memory_excludes_inputs_and_parameters() -> None:
    x = torch.randn(8, 64, requires_grad=True)
    relu = profile_components(nn.ReLU(), (x,), **FAST).row("")
    assert relu.activation_mb == 8 * 64 * F32 / 2**20  # relu saves its output
    lin = profile_components(nn.Linear(64, 32), (x,), **FAST).row("")
    assert lin.activation_mb == 0.0  # it saves only its input and weight


def test_cpu_peak_memory_is_the_allocator_peak() -> None:
    row = profile_components(nn.Linear(64, 32), (torch.randn(8, 64),), **FAST).row("")
    # alive together at the end of backward: y[8,32], dY[8,32], dW[32,64], db[32]
    assert row.peak_mem_mb * 2**20 == F32 * (8 * 32 + 8 * 32 + 32 * 64 + 32)
    assert row.details["peak_mem_source"] == "cpu_profiler_allocations"


def test_register_traffic_rule_rejects_duplicates() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_traffic_rule(torch.ops.aten.embedding, lambda a, k, o: 0)
