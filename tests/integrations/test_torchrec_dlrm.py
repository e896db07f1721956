"""torchrec's DLRM (the ``make demo`` model) profiled end to end on CPU."""

from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

pytest.importorskip("torchrec")

from torchrec.models.dlrm import DLRM_DCN
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from cb_callback import Report, profile_components
from tests.conftest import FAST, load_example

PEAKS: dict[str, Any] = dict(peak_flops=1e12, peak_bandwidth=1e11)
B = 32
D = 8
F = 26  # sparse features
ROWS = (1_000, 100, 50)


@pytest.fixture(scope="module")
def ex() -> ModuleType:
    return load_example("dlrm")


@pytest.fixture(scope="module")
def report(ex: ModuleType) -> Report:
    cfg = ex.DLRMConfig(table_rows=ROWS, embedding_dim=D, dense_arch=(16, D), over_arch=(16, 1))
    model = ex.build_dlrm(cfg)
    dense, kjt, _ = ex.synthetic_batch(B, cfg, seed=1)
    torch.manual_seed(0)
    return profile_components(model, (dense, kjt), descend="all", **FAST, **PEAKS)  # every row


def test_synthetic_batch_is_criteo_shaped(ex: ModuleType) -> None:
    cfg = ex.DLRMConfig(table_rows=ROWS)
    dense, kjt, labels = ex.synthetic_batch(B, cfg, seed=3)
    assert dense.shape == (B, 13) and labels.shape == (B,)
    assert isinstance(kjt, KeyedJaggedTensor) and len(kjt.keys()) == F and kjt.stride() == B
    lengths = kjt.lengths().view(F, B)
    assert int(lengths.min()) >= 1 and int(lengths.max()) <= cfg.max_bag  # multi-hot bags
    for f, jt in enumerate(kjt.to_dict().values()):
        assert int(jt.values().min()) >= 0 and int(jt.values().max()) < cfg.rows()[f]
    again = ex.synthetic_batch(B, cfg, seed=3)
    assert torch.equal(again[1].values(), kjt.values())  # deterministic


def test_every_row_is_ok_or_an_estimated_container(report: Report) -> None:
    bad = {r.path: (r.status, r.error) for r in report if r.status not in ("ok", "estimated")}
    assert not bad
    estimated = [r.path for r in report if r.status == "estimated"]
    assert estimated == ["sparse_arch.embedding_bag_collection.embedding_bags"]  # a ModuleDict, never called


def test_embedding_rows_are_memory_bound(report: Report) -> None:
    tables = [r for r in report if r.module_type == "EmbeddingBag"]
    assert len(tables) == F
    for row in [*tables, report.row("sparse_arch"), report.row("sparse_arch.embedding_bag_collection")]:
        # 0 FLOPs: under the memory roof ("memory" or, far from it, "latency": issue 22)
        assert row.bytes > 0 and row.fwd_flops == 0 and row.details["roofline"]["roof"] == "memory", row.path
        if "at_floor" in row.details.get("flags", []):
            # a time isolation cannot tell from a replay doing nothing derives no rate (issue 22);
            # a busy machine's floor noise can swallow a 4-row table's lookup
            assert math.isnan(row.gbps) and math.isnan(row.bw_util), row.path
        else:
            assert row.gbps > 0 and row.bw_util > 0, row.path


def test_dense_and_over_arch_linear_flops_are_exact(report: Report) -> None:
    over_in = D + F * (F - 1) // 2 + F  # 8 + 325 + 26 = 359
    linears = {
        # path: (in, out, does its input require grad?)
        "dense_arch.model._mlp.0._linear": (13, 16, False),  # the raw dense features
        "dense_arch.model._mlp.1._linear": (16, D, True),
        "over_arch.model.0._mlp.0._linear": (over_in, 16, True),
        "over_arch.model.1": (16, 1, True),
    }
    total_fwd = total_bwd = 0
    for path, (fin, fout, dx) in linears.items():
        row = report.row(path)
        fwd = 2 * B * fin * fout  # one multiply-add per (sample, in, out)
        assert row.fwd_flops == fwd, path
        # backward: dW always (the same GEMM size), dX when the input requires grad
        assert row.bwd_flops == (2 if dx else 1) * fwd, path
        total_fwd, total_bwd = total_fwd + fwd, total_bwd + (2 if dx else 1) * fwd
    # interaction: bmm of [B, F+1, D] by its transpose; backward differentiates both operands
    inter = 2 * B * (F + 1) * (F + 1) * D
    assert report.row("inter_arch").fwd_flops == inter
    assert report.row("inter_arch").bwd_flops == 2 * inter
    root = report.row("")
    assert root.fwd_flops == total_fwd + inter
    assert root.bwd_flops == total_bwd + 2 * inter


def test_replicated_batch_reaches_the_sparse_arch(ex: ModuleType) -> None:
    cfg = ex.DLRMConfig(table_rows=ROWS, embedding_dim=D, dense_arch=(16, D), over_arch=(16, 1))
    dense, kjt, _ = ex.synthetic_batch(B, cfg, seed=1)
    rep = profile_components(
        ex.build_dlrm(cfg), (dense, kjt), batch_size=2 * B, max_depth=2, descend_share=0.0, **FAST, **PEAKS
    )
    assert rep.row("dense_arch.model").fwd_flops == 2 * (2 * B) * (13 * 16 + 16 * D)
    assert rep.row("inter_arch").fwd_flops == 2 * (2 * B) * (F + 1) * (F + 1) * D
    assert rep.row("sparse_arch").status == "ok"


def test_dlrm_dcn_variant_profiles(ex: ModuleType) -> None:
    from torchrec.modules.crossnet import LowRankCrossNet

    cfg = ex.DLRMConfig(table_rows=ROWS, embedding_dim=D, dense_arch=(16, D), over_arch=(16, 1))
    base = ex.build_dlrm(cfg)
    ebc = base.sparse_arch.embedding_bag_collection
    in_features = (F + 1) * D
    model = DLRM_DCN(
        embedding_bag_collection=ebc, dense_in_features=13, dense_arch_layer_sizes=[16, D],
        over_arch_layer_sizes=[16, 1], dcn_num_layers=2, dcn_low_rank_dim=4,
    )  # fmt: skip
    assert isinstance(model.inter_arch.crossnet, LowRankCrossNet)
    dense, kjt, _ = ex.synthetic_batch(B, cfg, seed=2)
    rep = profile_components(model, (dense, kjt), max_depth=2, descend="all", **FAST, **PEAKS)
    assert {r.status for r in rep} <= {"ok", "estimated"}
    # per cross layer: x @ V (in -> rank 4) then @ W (4 -> in): 2 * B * in * 4 twice; 2 layers
    assert rep.row("inter_arch").fwd_flops == 2 * (2 * (2 * B * in_features * 4))


def test_demo_lightning_module_profiles_with_the_callback(ex: ModuleType, tmp_path: Path) -> None:
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

    from cb_callback import ComponentBenchmark

    cfg = ex.DLRMConfig(table_rows=ROWS, embedding_dim=D, dense_arch=(16, D), over_arch=(16, 1))
    loader = DataLoader(ex.SyntheticCriteo(3, B, cfg), batch_size=None, collate_fn=ex._as_is)
    bench = ComponentBenchmark(
        capture_step=1, output_dir=str(tmp_path), max_depth=3, log_to_tensorboard=False, **FAST, **PEAKS
    )
    trainer = pl.Trainer(
        max_steps=3, callbacks=[bench], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
    )  # fmt: skip
    trainer.fit(ex.DLRMModule(cfg), train_dataloaders=loader)
    assert bench.report is not None
    assert bench.report.row("model.sparse_arch").status == "ok"
    assert bench.report.row("model.over_arch").bwd_flops == 2 * 2 * B * ((D + F * (F - 1) // 2 + F) * 16 + 16)
    assert (tmp_path / "report.json").is_file()
