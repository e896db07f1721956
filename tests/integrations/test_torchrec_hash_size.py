"""``ReduceHashSize``: tables too large for the machine (or only on ``meta``) profile reduced."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

pytest.importorskip("torchrec")

from torchrec.models.dlrm import DLRM
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from cb_callback import BenchmarkConfig, profile_components
from cb_callback.integrations.torchrec import ReduceHashSize
from cb_callback.plugins import ComponentInputs, PrepareContext
from tests.conftest import FAST

PEAKS: dict[str, Any] = dict(peak_flops=1e12, peak_bandwidth=1e11)
F32, I64 = 4, 8
HUGE = 2**31  # rows: 2^31 x 16 fp32 = 128 GiB, only ever on "meta"
D = 16
MAX_ROWS = 1_000
BIG = "sparse_arch.embedding_bag_collection.embedding_bags.t_big"
SMALL = "sparse_arch.embedding_bag_collection.embedding_bags.t_small"


def _meta_dlrm() -> DLRM:
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(name="t_big", embedding_dim=D, num_embeddings=HUGE, feature_names=["big"]),
            EmbeddingBagConfig(name="t_small", embedding_dim=D, num_embeddings=50, feature_names=["small"]),
        ],
        device=torch.device("meta"),
    )
    return DLRM(
        embedding_bag_collection=ebc, dense_in_features=13, dense_arch_layer_sizes=[16, D],
        over_arch_layer_sizes=[8, 1], dense_device=torch.device("cpu"),
    )  # fmt: skip


def _inputs(batch: int = 4) -> tuple[torch.Tensor, KeyedJaggedTensor]:
    # one id per bag; "big" ids far beyond MAX_ROWS (up to 2^31 - 1), "small" ids < 50
    big = torch.tensor([7, 1_234_567, HUGE - 1, 999])[:batch]
    small = torch.tensor([0, 49, 3, 10])[:batch]
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["big", "small"], values=torch.cat([big, small]), lengths=torch.ones(2 * batch, dtype=torch.long)
    )
    return torch.randn(batch, 13), kjt


def _ctx(metadata: dict[str, object]) -> PrepareContext:
    return PrepareContext(config=BenchmarkConfig(), device=torch.device("cpu"), metadata=metadata)


def test_meta_model_with_a_2_pow_31_row_table_profiles_on_cpu() -> None:
    model = _meta_dlrm()
    dense, kjt = _inputs()
    report = profile_components(
        model, (dense, kjt), preprocessors=[ReduceHashSize(MAX_ROWS)], descend="all", **FAST, **PEAKS
    )
    assert {r.status for r in report} <= {"ok", "estimated"}, [
        (r.path, r.error) for r in report if r.status not in ("ok", "estimated")
    ]
    # the report reads as the original model: same paths
    assert [r.path for r in report if r.path] and {r.path for r in report} == {p for p, _ in model.named_modules()}
    tables = report.metadata["hash_size_reduction"]["tables"]
    assert tables[BIG]["original_rows"] == HUGE and tables[BIG]["reduced_rows"] == MAX_ROWS
    assert tables[BIG]["original_device"] == "meta" and tables[BIG]["remapped"] is True
    assert tables[SMALL]["original_rows"] == 50 and tables[SMALL]["reduced_rows"] == 50  # materialised as is
    assert tables[SMALL]["remapped"] is False
    big = report.row(BIG)
    assert big.params_mb == MAX_ROWS * D * F32 / 2**20
    assert big.details["roofline"]["roof"] == "memory"  # bound: memory or latency (issue 22)
    n = b = 4  # ids, bags
    # rows touched, as on the real table: ids + offsets[B+1] + n rows read; pooled output,
    # bag_size and max_indices written. The id remap is not counted (not in the real model).
    assert big.details["fwd_bytes"] == n * I64 + (b + 1) * I64 + n * D * F32 + b * D * F32 + 2 * b * I64
    # the user's model is untouched: still on meta, still 2^31 rows
    weight = model.sparse_arch.embedding_bag_collection.embedding_bags["t_big"].weight
    assert weight.device.type == "meta" and weight.shape == (HUGE, D)


def test_reduced_lookup_is_the_lookup_of_id_mod_max_rows() -> None:
    model = _meta_dlrm()
    meta: dict[str, object] = {}
    rng = torch.get_rng_state()
    pre = ReduceHashSize(MAX_ROWS)
    prepared = pre.prepare_model(model, _ctx(meta))
    assert torch.equal(torch.get_rng_state(), rng)  # materialising consumed no training RNG
    _, kjt = _inputs()
    ebc = prepared.sparse_arch.embedding_bag_collection
    out = ebc(kjt).to_dict()
    table = ebc.embedding_bags["t_big"].weight
    ids = kjt["big"].values()
    assert torch.equal(out["big"], table[ids % MAX_ROWS])  # one id per bag: the row itself
    # same dim and dtype, torchrec's init scheme kept: uniform in +-sqrt(1 / original rows)
    assert table.shape == (MAX_ROWS, D) and table.dtype == torch.float32
    assert float(table.detach().abs().max()) <= math.sqrt(1 / HUGE)
    # deterministic: a second preparation builds the same table
    again = ReduceHashSize(MAX_ROWS).prepare_model(model, _ctx({}))
    assert torch.equal(again.sparse_arch.embedding_bag_collection.embedding_bags["t_big"].weight, table)
    # the copy shares every other module and parameter with the original
    assert prepared is not model and prepared.dense_arch is model.dense_arch
    assert prepared.over_arch.model[1].weight is model.over_arch.model[1].weight
    # the remap hooks belong to the preprocessor and come off with remove()
    hooked = ebc.embedding_bags["t_big"]
    assert len(hooked._forward_pre_hooks) == 1
    pre.remove()
    assert len(hooked._forward_pre_hooks) == 0


def test_real_tables_within_the_limit_are_left_alone() -> None:
    ebc = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=100, feature_names=["f"])]
    )
    meta: dict[str, object] = {}
    assert ReduceHashSize(100).prepare_model(ebc, _ctx(meta)) is ebc
    assert meta["hash_size_reduction"] == {"max_rows": 100, "tables": {}, "not_reduced": []}


def test_embedding_collection_tables_are_reduced_too() -> None:
    ec = EmbeddingCollection(
        tables=[EmbeddingConfig(name="t", embedding_dim=4, num_embeddings=5_000, feature_names=["f"])]
    )
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["f"], values=torch.tensor([4_999, 3, 2_500]), lengths=torch.tensor([2, 1])
    )
    report = profile_components(ec, (kjt,), preprocessors=[ReduceHashSize(64)], **FAST, **PEAKS)
    assert report.row("").status == "ok" and report.row("embeddings.t").status == "ok"
    assert report.metadata["hash_size_reduction"]["tables"]["embeddings.t"]["reduced_rows"] == 64
    assert report.row("embeddings.t").params_mb == 64 * 4 * F32 / 2**20
    # the user's table keeps its 5000 rows
    assert ec.embeddings["t"].weight.shape == (5_000, 4)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_max_rows_is_validated(bad: object) -> None:
    with pytest.raises(ValueError, match="max_rows"):
        ReduceHashSize(bad)  # type: ignore[arg-type]


def test_a_preprocessor_whose_prepare_model_never_ran_says_so() -> None:
    inputs = ComponentInputs(args=(torch.tensor([1]),), kwargs={})
    pre = ReduceHashSize(10)
    with pytest.warns(RuntimeWarning, match="prepare_model was not called"):
        assert pre.process_inputs(inputs, _ctx({})) is inputs
