"""Embedding cost model: rows touched, not tables; lookups read as memory-bound."""

from __future__ import annotations

import itertools
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
    assert row.status == "ok" and row.details["roofline"]["roof"] == "memory"  # bound: memory or latency
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
        assert row.status == "ok" and row.bytes > 0 and row.details["roofline"]["roof"] == "memory", path
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


def test_tbe_backward_counts_a_row_shared_by_two_features_once() -> None:
    # features 0 and 1 share one table (same weights offset, D = 4); 2 samples each:
    # feature 0 bags [1], [2, 2]; feature 1 bags [2], [3] -> distinct rows {1, 2, 3}
    named = {
        "host_weights": torch.zeros(10 * 4),
        "grad_output": torch.zeros(2, 8),
        "indices": torch.tensor([1, 2, 2, 2, 3]),
        "offsets": torch.tensor([0, 1, 3, 4, 5]),
        "weights_offsets": torch.tensor([0, 0]),
        "D_offsets": torch.tensor([0, 4, 8], dtype=torch.int32),
    }
    small = 2 * 8 * F32 + 5 * I64 + 5 * I64 + 2 * I64 + 3 * 4  # every argument but the table
    assert cbt.tbe_backward_bytes(named, None) == small + 2 * (3 * 4) * F32  # read + write of 3 rows of dim 4
    assert cbt.tbe_forward_bytes(named, None) == small + 5 * 4 * F32  # 5 ids, each a row of dim 4


def test_tbe_rules_follow_a_variable_batch() -> None:
    # VBE: feature 0 (dim 4) has 1 sample, bag [5, 6]; feature 1 (dim 8, its own table) 2: [6], [7]
    named = {
        "host_weights": torch.zeros(100 * 4 + 100 * 8),
        "indices": torch.tensor([5, 6, 6, 7], dtype=torch.int32),
        "offsets": torch.tensor([0, 2, 3, 4], dtype=torch.int32),
        "B_offsets": torch.tensor([0, 1, 3], dtype=torch.int32),
        "weights_offsets": torch.tensor([0, 100 * 4]),
        "D_offsets": torch.tensor([0, 4, 12], dtype=torch.int32),
    }
    small = 4 * 4 + 4 * 4 + 3 * 4 + 2 * I64 + 3 * 4  # int32 indices, offsets, B_offsets; weights_offsets; D_offsets
    # distinct rows: feature 0 ids {5, 6} (dim 4), feature 1 ids {6, 7} (dim 8): 2 * 4 + 2 * 8 = 24 elements
    assert cbt.tbe_backward_bytes(named, None) == small + 2 * 24 * F32
    assert cbt.tbe_forward_bytes(named, None) == small + 24 * F32  # 2 ids of dim 4 + 2 of dim 8


def _rows_by_dict(named: dict[str, Any]) -> tuple[int, int]:
    """The per-id loop the vectorised rule replaced: the oracle."""
    offsets = named["offsets"].tolist()
    d_off = named["D_offsets"].tolist()
    dims = [b - a for a, b in itertools.pairwise(d_off)]
    batch = (len(offsets) - 1) // len(dims)
    bounds = [offsets[f * batch] for f in range(len(dims) + 1)]
    indices, starts = named["indices"].tolist(), named["weights_offsets"].tolist()
    rows: dict[int, int] = {}
    for f, d in enumerate(dims):
        for i in indices[bounds[f] : bounds[f + 1]]:
            rows[starts[f] + i * d] = d
    return len(rows), sum(rows.values())


def test_tbe_backward_bytes_match_the_per_id_loop_on_random_batches() -> None:
    from cb_callback.integrations.torchrec._traffic import _unique_rows

    gen = torch.Generator().manual_seed(0)
    for _ in range(30):
        features, batch = int(torch.randint(1, 6, (1,), generator=gen)), int(torch.randint(1, 9, (1,), generator=gen))
        dims = torch.randint(1, 4, (features,), generator=gen) * 4
        rows = torch.randint(1, 20, (features,), generator=gen)
        starts = torch.cat([torch.zeros(1, dtype=torch.long), (rows * dims).cumsum(0)[:-1]])
        if features > 1:  # features 0 and 1 share a table
            dims[1], starts[1], rows[1] = dims[0], starts[0], rows[0]
        lengths = torch.randint(0, 4, (features * batch,), generator=gen)
        ids = [torch.randint(0, int(rows[k // batch]), (int(n),), generator=gen) for k, n in enumerate(lengths)]
        named: dict[str, Any] = {
            "indices": torch.cat(ids),
            "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
            "weights_offsets": starts,
            "D_offsets": torch.cat([torch.zeros(1, dtype=torch.long), dims.cumsum(0)]).int(),
        }
        assert _unique_rows(named) == _rows_by_dict(named)
