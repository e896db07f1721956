"""Embedding cost model: rows touched, not tables; lookups read as memory-bound."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("torchrec")

from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
)
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

import cb_callback.integrations.torchrec as cbt
from cb_callback import profile_components
from tests.conftest import FAST

PEAKS: dict[str, Any] = dict(peak_flops=1e12, peak_bandwidth=1e11)
F32, I64 = 4, 8
_TABLES = ("host_weights", "dev_weights", "uvm_weights", "lxu_cache_weights")


class _RecordOp(TorchDispatchMode):
    """Records the arguments (by schema name) and output of the ops whose name contains ``key``."""

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key
        self.calls: list[tuple[dict[str, Any], Any]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.key in str(func):
            names = [a.name for a in func._schema.arguments]
            named = dict(zip(names, args, strict=False)) | dict(kwargs or {})
            self.calls.append((named, out))
        return out


def _nbytes(named: dict[str, Any], skip: tuple[str, ...] = ()) -> int:
    return sum(v.numel() * v.element_size() for k, v in named.items() if isinstance(v, torch.Tensor) and k not in skip)


def _tbe(rows: int = 100_000) -> SplitTableBatchedEmbeddingBagsCodegen:
    return SplitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=[
            (rows, 4, EmbeddingLocation.HOST, ComputeDevice.CPU),
            (rows, 8, EmbeddingLocation.HOST, ComputeDevice.CPU),
        ],
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        learning_rate=0.1,
    )


# 2 features x 2 samples; feature 0 (dim 4): bags [1], [2, 2]; feature 1 (dim 8): [7], [7, 9, 9, 11]
IDS = torch.tensor([1, 2, 2, 7, 7, 9, 9, 11])
OFFSETS = torch.tensor([0, 1, 3, 4, 8])


def test_tbe_forward_charges_the_rows_gathered_not_the_tables() -> None:
    tbe = _tbe()
    row = profile_components(tbe, (IDS, OFFSETS), **FAST, **PEAKS).row("")
    assert row.status == "ok" and row.bound == "memory"
    fwd_op = "fbgemm.split_embedding_codegen_forward_unweighted_pt2_wrapper"
    rec = _RecordOp("split_embedding_codegen_forward")
    with rec:
        tbe(IDS, OFFSETS)
    named, out = rec.calls[0]
    # rows gathered: 3 ids of dim 4 + 5 ids of dim 8 = 52 fp32 elements
    gathered = (3 * 4 + 5 * 8) * F32
    expected = _nbytes(named, skip=_TABLES) + gathered + out.numel() * F32
    assert row.details["top_bytes_ops"][fwd_op] == expected
    # the tables (100k x 4 + 100k x 8 fp32 = 4.8 MB) are not charged
    assert expected < 2_000 < 100_000 * 12 * F32


def test_tbe_backward_charges_each_distinct_row_and_its_optimizer_state() -> None:
    tbe = _tbe()
    bwd_op = "fbgemm.split_embedding_backward_codegen_rowwise_adagrad_unweighted_pt2_wrapper"
    rec = _RecordOp("backward_codegen")
    with rec:
        out = tbe(IDS, OFFSETS)
        torch.autograd.grad([out], [tbe.placeholder_autograd_tensor], [torch.ones_like(out)], allow_unused=True)
    named, bwd_out = rec.calls[0]
    skip = (*_TABLES, "momentum1_host", "momentum1_dev", "momentum1_uvm")
    # distinct rows: feature 0 ids {1, 2} (dim 4), feature 1 ids {7, 9, 11} (dim 8)
    rows, dims = 2 + 3, 2 * 4 + 3 * 8
    expected = (
        _nbytes(named, skip=skip)  # grad_output, indices, offsets, metadata, lr
        + 2 * dims * F32  # read + write of each updated weight row
        + 2 * rows * F32  # read + write of each row's Adagrad momentum (row-wise: 1 fp32)
    )
    assert bwd_out is None  # the fused backward returns no gradient: it applied it
    assert cbt.tbe_backward_bytes(named, bwd_out) == expected
    row = profile_components(_tbe(), (IDS, OFFSETS), **FAST, **PEAKS).row("")
    assert row.details["top_bytes_ops"][bwd_op] == expected


def _ebc() -> EmbeddingBagCollection:
    return EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(name="t0", embedding_dim=8, num_embeddings=50_000, feature_names=["a"]),
            EmbeddingBagConfig(name="t1", embedding_dim=8, num_embeddings=1_000, feature_names=["b"]),
        ]
    )


def test_ebc_rows_are_memory_bound_with_exact_gather_bytes() -> None:
    batch = 4
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["a", "b"], values=torch.tensor([3, 10, 11, 12, 40_000, 5, 6, 7, 8]),
        lengths=torch.tensor([1, 2, 0, 2, 1, 1, 1, 1]),
    )  # fmt: skip
    report = profile_components(_ebc(), (kjt,), **FAST, **PEAKS)
    for path in ("", "embedding_bags.t0", "embedding_bags.t1"):
        row = report.row(path)
        assert row.status == "ok" and row.bytes > 0 and row.bound == "memory", path
        assert row.fwd_flops == 0  # lookups and pooling carry no FLOP formula
    t0 = report.row("embedding_bags.t0")
    n, dim = 5, 8  # ids of feature "a": 3 | 10 11 | - | 12 40000
    # _embedding_bag (sum, CPU): read ids + offsets[B+1] + one row per id; write the
    # pooled [B, D] output, bag_size[B] and max_indices[B] (offset2bag is empty for sum).
    assert t0.details["fwd_bytes"] == n * I64 + (batch + 1) * I64 + n * dim * F32 + batch * dim * F32 + 2 * batch * I64
    # backward: at least the gradient scatter (each id reads its bag's grad row and
    # updates one table-gradient row: 3 row transfers) — never the 50k-row table's read
    assert t0.details["bwd_bytes"] >= n * I64 + 3 * n * dim * F32
    assert report.row("").bytes >= t0.bytes + report.row("embedding_bags.t1").bytes


def test_traffic_rules_cover_the_cpu_tbe_ops() -> None:
    names = cbt.register_tbe_traffic_rules()
    assert "split_embedding_codegen_forward_unweighted_pt2_wrapper" in names
    assert "split_embedding_codegen_forward_weighted_pt2_wrapper" in names
    assert "split_embedding_backward_codegen_sgd_unweighted_pt2_wrapper" in names
    assert "split_embedding_backward_codegen_rowwise_adagrad_unweighted_pt2_wrapper" in names
    assert cbt.register_tbe_traffic_rules() == names  # idempotent
