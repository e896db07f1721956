"""torchrec rows: shared tables on all their calls, hash-size reduction said and at real size, sharded compute
measured (not derived by subtraction), and ``batch_size=`` replication of variable-batch inputs refused alike."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

pytest.importorskip("torchrec")

from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

import cb_callback.integrations.torchrec  # noqa: F401  (rules, metrics)
from cb_callback import ComponentRow, Report, profile_components
from cb_callback._engine.derive.parts import derive_parts
from cb_callback._report.distributed import distributed_lines
from cb_callback.integrations.torchrec import ReduceHashSize
from tests.conftest import FAST
from tests.integrations.test_torchrec_sharded import one_rank  # noqa: F401  (the 1-rank gloo process group fixture)

PEAKS: dict[str, Any] = dict(peak_flops=1e12, peak_bandwidth=1e11)
F32, I64 = 4, 8


def _bag_call_bytes(n: int, b: int, d: int) -> int:
    """One ``EmbeddingBag(sum, include_last_offset)`` call of ``n`` ids in ``b`` bags, dim ``d``, fp32, forward and
    backward, as the traffic rules count it (the rows touched, not the table):

    forward ``_embedding_bag``: ids n*8 + offsets (b+1)*8 + n rows read n*d*4 + output b*d*4 + bag_size and
    max_indices 2*b*8 (offset2bag is empty in sum mode); backward ``_embedding_bag_backward``: ids n*8 + offsets
    (b+1)*8 + bag_size, max_indices 2*b*8 + per id one grad row read and one gradient row read and written 3*n*d*4.
    """
    fwd = n * I64 + (b + 1) * I64 + n * d * F32 + b * d * F32 + 2 * b * I64
    bwd = n * I64 + (b + 1) * I64 + 2 * b * I64 + 3 * n * d * F32
    return fwd + bwd


# --- shared tables: measured on all of their calls --------------------------------------------------------------


def test_a_table_shared_by_a_1_id_and_a_50_id_feature_is_measured_on_both_calls() -> None:
    b, d, rows = 2, 8, 100
    ebc = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name="t", embedding_dim=d, num_embeddings=rows, feature_names=["one", "fifty"])]
    )
    values = torch.arange(b * 51) % rows
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["one", "fifty"], values=values, lengths=torch.tensor([1] * b + [50] * b)
    )
    report = profile_components(ebc, (kjt,), descend="all", **FAST, **PEAKS)
    t = report.row("embedding_bags.t")
    assert t.status == "ok" and t.calls == 2
    # both calls (2 ids in 2 bags; 100 ids in 2 bags) and the sum of their two dense [100, 8] gradients
    # (autograd adds them: 2 read + 1 written, 3 * 100 * 8 * 4) -- the first call alone is 464 bytes, 20x less
    step = _bag_call_bytes(2, b, d) + _bag_call_bytes(100, b, d) + 3 * rows * d * F32
    assert _bag_call_bytes(2, b, d) == 464 and step == 24_640
    assert t.bytes * t.calls == step  # a row is per call: its bytes over the step are the two calls'
    assert t.note is not None and "2 calls" in t.note  # the row says how it was measured


def test_an_embedding_collection_table_whose_first_feature_is_empty_reads_its_other_features_bytes() -> None:
    d, rows = 4, 10
    ec = EmbeddingCollection(
        tables=[EmbeddingConfig(name="t", embedding_dim=d, num_embeddings=rows, feature_names=["empty", "five"])]
    )
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["empty", "five"], values=torch.tensor([1, 2, 3, 4, 5]), lengths=torch.tensor([0, 0, 3, 2])
    )
    report = profile_components(ec, (kjt,), descend="all", **FAST, **PEAKS)
    t = report.row("embeddings.t")
    assert t.status == "ok" and t.calls == 2
    n = 5
    # the empty call moves nothing; the 5-id call: embedding (ids 5*8 + rows read and output written 2*5*4*4),
    # embedding_dense_backward (ids 5*8 + 3 grad rows per id 3*5*4*4); the two dense [10, 4] gradients summed
    # (3 * 10 * 4 * 4)
    step = (n * I64 + 2 * n * d * F32) + (n * I64 + 3 * n * d * F32) + 3 * rows * d * F32
    assert step == 960
    assert t.bytes * t.calls == step and t.bytes > 0  # not 0: the empty first call is not the only one measured


# --- hash-size reduction: said on the row, bytes at the real size, collapses flagged --------------------------


def _shared_reduced(values: torch.Tensor, lengths: torch.Tensor) -> Any:
    ebc = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name="t", embedding_dim=64, num_embeddings=100_000, feature_names=["a", "b"])]
    )
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["a", "b"], values=values, lengths=lengths)
    return profile_components(ebc, (kjt,), descend="all", preprocessors=[ReduceHashSize(1000)], **FAST, **PEAKS)


def test_a_reduced_row_says_so_and_keeps_the_real_tables_dense_gradient_sum() -> None:
    # 1 id per bag for "a", 50 for "b" (2 bags each), ids spread below 1000: the remap keeps them distinct
    values = torch.cat([torch.tensor([3, 7]), torch.arange(100) * 7 % 1000])
    report = _shared_reduced(values, torch.tensor([1, 1, 50, 50]))
    root, t = report.row(""), report.row("embedding_bags.t")
    for row in (root, t):
        assert "hash_reduced" in row.details["own_flags"] and "hash_collapsed" not in row.details["own_flags"]
        info = row.details["hash_size"]
        assert info["tables"]["embedding_bags.t"]["original_rows"] == 100_000
        assert info["tables"]["embedding_bags.t"]["reduced_rows"] == 1000
        assert "bytes" in info["from_real"] and {"fwd_ms", "params_mb", "bw_ceiling"} <= set(info["from_reduced"])
        assert "not scaled" in info["times"]
        # the sum of the two calls' dense gradients at the real size: 3 * 100_000 * 64 * 4 = 76.8 MB
        # (at the reduced size it would be 3 * 1000 * 64 * 4 = 768 kB)
        assert info["table_sized_bytes"] == {"reduced": 3 * 1000 * 64 * F32, "real": 3 * 100_000 * 64 * F32}
    distinct = len(set(values.tolist()))  # 101: 3 and the multiples of 7 below 700 (7 among them)
    assert root.details["hash_size"]["tables"]["embedding_bags.t"]["distinct"] == distinct
    assert root.details["hash_size"]["tables"]["embedding_bags.t"]["distinct_after_remap"] == distinct
    # the table's bytes over the step: both calls as on the real table (rows touched) plus that real-size sum
    step = _bag_call_bytes(2, 2, 64) + _bag_call_bytes(100, 2, 64) + 3 * 100_000 * 64 * F32
    assert t.bytes * t.calls == step
    assert t.params_mb == 1000 * 64 * F32 / 2**20  # from the reduced table, as the row says
    assert "hash_reduced" in t.details["flags"] and "hash_reduced" in root.details["flags"]  # the row's flags
    text = report.summary()  # and the summary: real and reduced rows, which columns come from which
    assert "hash-size reduction (max_rows=1000): 1 table(s) profiled shrunk, 2 row(s) flagged hash_reduced" in text
    assert "  embedding_bags.t: 100,000 real rows, 1,000 profiled" in text
    assert "bytes and FLOPs the real tables'" in text


def test_a_remap_that_collapses_distinct_ids_is_flagged_with_the_counts() -> None:
    # strided ids 0, 1000, 2000, ... all fall on row 0 under id % 1000
    values = torch.arange(102) * 1000
    report = _shared_reduced(values, torch.tensor([1, 1, 50, 50]))
    root = report.row("")
    assert "hash_collapsed" in root.details["own_flags"]
    entry = root.details["hash_size"]["tables"]["embedding_bags.t"]
    assert (entry["distinct"], entry["distinct_after_remap"]) == (102, 1)
    # the table's own row was captured after the remap: it names the row whose pass saw the collapse
    t = report.row("embedding_bags.t")
    assert "hash_collapsed" in t.details["own_flags"]
    assert t.details["hash_size"]["tables"]["embedding_bags.t"]["collapsed_in"]["row"] == ""
    # without a reduction no row carries either flag
    plain = profile_components(
        EmbeddingBagCollection(
            tables=[EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=10, feature_names=["a"])]
        ),
        (KeyedJaggedTensor.from_lengths_sync(keys=["a"], values=torch.tensor([1, 2]), lengths=torch.tensor([1, 1])),),
        descend="all",
        **FAST,
        **PEAKS,
    )
    assert all("hash_size" not in r.details and "own_flags" not in r.details for r in plain)


# --- sharded compute vs comms: measured, a negative derivation flagged -------------------------------------------


def _sharded_row(bwd_ms: float, bwd_comm_ms: float, parts: list[dict[str, Any]]) -> ComponentRow:
    row = ComponentRow(
        path="ebc", module_type="ShardedEmbeddingBagCollection", depth=1, parent="", status="ok", calls=1,
        fwd_ms=1.0, bwd_ms=bwd_ms, total_ms=1.0 + bwd_ms, comm_bytes=1024.0,
    )  # fmt: skip
    row.details["comm"] = [
        {"op": "c10d.alltoall_base_", "phase": "forward", "count": 1, "bytes": 512, "ms": 0.4},
        {"op": "c10d.alltoall_base_", "phase": "backward", "count": 1, "bytes": 512, "ms": bwd_comm_ms},
    ]
    row.details["parts"] = parts
    row.details["planned"] = {"fwd_compute_ms": 0.1, "fwd_comms_ms": 0.1, "bwd_compute_ms": 0.2, "bwd_comms_ms": 0.1}
    return row


def test_backward_compute_is_the_lookups_backward_timed_alone() -> None:
    # the comms' passes (0.9 ms) were slower than the row's backward (0.5 ms): the old split read max(0.5 - 0.9, 0)
    row = _sharded_row(0.5, 0.9, [{"name": "lookup:table_wise", "fwd_ms": 0.3, "bwd_ms": 0.2}])
    derive_parts(row, 1e10)
    planned = row.details["planned"]
    assert planned["measured"]["bwd_compute_ms"] == 0.2 and planned["measured"]["fwd_compute_ms"] == 0.3
    assert planned["measured_how"] == {"fwd_compute_ms": "measured", "bwd_compute_ms": "measured"}
    assert "derived_negative" not in planned and "own_flags" not in row.details


def test_a_derived_compute_below_zero_is_flagged_never_a_silent_zero() -> None:
    row = _sharded_row(0.5, 0.9, [{"name": "lookup:table_wise", "fwd_ms": 0.3}])  # its backward was not timed
    derive_parts(row, 1e10)
    planned = row.details["planned"]
    assert planned["measured"]["bwd_compute_ms"] is None  # no value, not 0.0
    assert planned["measured_how"]["bwd_compute_ms"] == "derived"
    assert planned["derived_negative"] == {"bwd_compute_ms": pytest.approx(0.5 - 0.9)}
    assert planned["ratio"]["bwd_compute_ms"] is None
    assert row.details["own_flags"] == ["derived_negative"]
    derive_parts(row, 1e10)  # derived twice (several batches): flagged once
    assert row.details["own_flags"] == ["derived_negative"]
    # the summary's measured-vs-planned line says it, instead of a 0
    lines = distributed_lines(Report([row], {}))
    assert "bwd compute <0 (derived -0.4) vs 0.2;" in "\n".join(lines)
    assert "fwd compute 0.3 vs 0.1" in "\n".join(lines)  # the lookup's forward, measured alone


def _one_rank_lookup(plan_fn: Any) -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    """A 1-rank DMP of one table planned by ``plan_fn``; its first lookup (inside DDP for data-parallel) and the
    inputs it was called with after the input dist."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan
    from torchrec.distributed.types import ShardingPlan
    from torchrec.optim import RowWiseAdagrad
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    from cb_callback.integrations.torchrec._stages import _inner

    class Sparse(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            config = EmbeddingBagConfig(name="t0", embedding_dim=8, num_embeddings=100, feature_names=["f0"])
            self.ebc = EmbeddingBagCollection(tables=[config], device=torch.device("meta"))

        def forward(self, kjt: KeyedJaggedTensor) -> Any:
            return self.ebc(kjt)

    model = Sparse()
    apply_optimizer_in_backward(RowWiseAdagrad, model.ebc.parameters(), {"lr": 0.1})
    module_plan = construct_module_sharding_plan(
        model.ebc, {"t0": plan_fn()}, local_size=1, world_size=1, device_type="cpu"
    )
    dmp = DistributedModelParallel(
        model, device=torch.device("cpu"), plan=ShardingPlan({"ebc": module_plan}),
        sharders=[EmbeddingBagCollectionSharder()],
    )  # fmt: skip
    lookup = vars(dmp.module.ebc)["_lookups"][0]
    seen: list[Any] = []
    handle = lookup.register_forward_pre_hook(lambda m, a, k: seen.append((a, k)), with_kwargs=True)
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["f0"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 2]))
    dmp(kjt)
    handle.remove()
    return _inner(lookup), *seen[0]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.usefixtures("one_rank")
def test_a_fused_lookups_backward_alone_runs_the_tbe_backward_every_run() -> None:
    from torch.utils._python_dispatch import TorchDispatchMode
    from torchrec.distributed.sharding_plan import table_wise

    from cb_callback.integrations.torchrec._stages import _backward_ms

    inner, args, kwargs = _one_rank_lookup(lambda: table_wise(rank=0))
    ran: list[str] = []

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, a: Any = (), k: Any = None) -> Any:
            if func.namespace == "fbgemm" and "backward" in func.overloadpacket.__name__:
                ran.append(func.overloadpacket.__name__)
            return func(*a, **(k or {}))

    with Ops():
        timed = _backward_ms(inner, args, kwargs, lambda: None)
    # the lookup's parameters are views of the TBE's weights, outside the graph: differentiated against them the
    # fused backward (gradient scatter + row-wise Adagrad update) would be pruned and 'bwd_ms' would time nothing.
    # Against the TBE's placeholder it runs once per timed run and once in the warm-up.
    assert len(ran) == timed["bwd_runs"] + 1 and set(ran) == {
        "split_embedding_backward_codegen_rowwise_adagrad_unweighted_pt2_wrapper"
    }
    assert timed["bwd_ms"] > 0


@pytest.mark.slow
def test_two_rank_dmp_backward_compute_is_measured_never_clamped(dmp_runs: dict[str, list[dict[str, Any]]]) -> None:
    from tests.integrations.test_torchrec_dmp import DETAILS, EBC

    # the 2-rank launch test_torchrec_dmp reads too (tests/integrations/conftest.py)
    for sharding in ("table_wise", "row_wise"):
        ranks = dmp_runs[sharding]
        for res in ranks:
            assert res["error"] is None, res.get("traceback")
            assert res["state_diff_after_profile"] == [] and res["state_diff_after_step"] == []  # training untouched
            details = res["rows"][EBC][DETAILS]
            parts = details["parts"]
            assert parts and all(p["bwd_ms"] > 0 and p["bwd_runs"] >= 5 for p in parts), (sharding, parts)
            planned = details["planned"]
            # the backward compute is the lookups' own backward, timed alone on this rank: their sum, not the
            # row's bwd_ms minus the collectives' times of other passes (which the ranks' skew can make negative)
            assert planned["measured"]["bwd_compute_ms"] == sum(p["bwd_ms"] for p in parts)
            assert planned["measured_how"] == {"fwd_compute_ms": "measured", "bwd_compute_ms": "measured"}
            assert "derived_negative" not in planned
            assert "derived_negative" not in (details.get("flags") or [])


# --- batch_size= replication of variable-batch inputs ---------------------------------------------------------


class _DenseAndSparse(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dense = nn.Linear(4, 4)
        self.ebc = EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(name="t0", embedding_dim=4, num_embeddings=10, feature_names=["a"]),
                EmbeddingBagConfig(name="t1", embedding_dim=4, num_embeddings=10, feature_names=["b"]),
            ]
        )

    def forward(self, x: torch.Tensor, kjt: KeyedJaggedTensor) -> torch.Tensor:
        return self.dense(x).sum() + self.ebc(kjt).values().sum()


def test_replicating_a_variable_batch_input_refuses_the_component_and_its_children_alike() -> None:
    # VBE: "a" has 2 samples, "b" 3; the EBC's output has 3 (inverse indices)
    kjt = KeyedJaggedTensor(
        keys=["a", "b"], values=torch.tensor([1, 2, 3, 4, 5]), lengths=torch.ones(5, dtype=torch.long),
        stride_per_key_per_rank=[[2], [3]], inverse_indices=(["a", "b"], torch.tensor([[0, 1, 0], [0, 1, 2]])),
    )  # fmt: skip
    model = _DenseAndSparse()
    report = profile_components(model, (torch.randn(3, 4), kjt), batch_size=30, descend="all", **FAST, **PEAKS)
    root = report.row("")
    assert root.status == "failed" and "no single batch size to replicate" in str(root.error)
    # before: the root kept its captured batch while its tables were tiled to 30 bags (an estimate 10x its parent);
    # now every component under it is refused too, naming why
    for path in ("ebc", "dense", "ebc.embedding_bags.t0", "ebc.embedding_bags.t1"):
        row = report.row(path)
        assert row.status == "failed" and "it is under (root), which is refused" in str(row.error), path
    assert all(r.status != "ok" for r in report)
    # a fixed-batch KJT is still replicated as before
    fixed = KeyedJaggedTensor.from_lengths_sync(
        keys=["a", "b"], values=torch.arange(6) % 10, lengths=torch.ones(6, dtype=torch.long)
    )
    ok = profile_components(model, (torch.randn(3, 4), fixed), batch_size=30, descend="all", **FAST, **PEAKS)
    assert {r.status for r in ok} <= {"ok", "estimated"}
