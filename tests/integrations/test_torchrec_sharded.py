"""``DistributedModelParallel`` on one rank: the model's paths, the planner estimate, the sharded-embedding metric."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

pytest.importorskip("torchrec")

from torchrec.models.dlrm import DLRM
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

import cb_callback
import cb_callback.integrations.torchrec._sharded as sharded
import cb_callback.plugins
from cb_callback import BenchmarkConfig, profile_components
from cb_callback.integrations.torchrec import (
    ShardedModelCheck,
    dmp_unwrapper,
    hidden_tbe_grad_targets,
    planned_perf,
    register_dmp_paths,
    tbe_modules,
    unwrap_model,
)
from cb_callback.plugins import PrepareContext
from tests.conftest import FAST

PEAKS: dict[str, Any] = dict(peak_flops=1e12, peak_bandwidth=1e11)


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[None]:
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed and no process group already set up")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _dlrm() -> DLRM:
    ebc = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name="t0", embedding_dim=8, num_embeddings=100, feature_names=["a"])],
        device=torch.device("meta"),
    )
    return DLRM(
        embedding_bag_collection=ebc, dense_in_features=4, dense_arch_layer_sizes=[8], over_arch_layer_sizes=[4, 1]
    )


@pytest.mark.filterwarnings("ignore")
def test_dmp_on_one_rank_profiles_under_the_unsharded_paths(one_rank: None) -> None:
    from torchrec.distributed.model_parallel import DistributedModelParallel

    model = _dlrm()
    # a sharded EBC keeps its tables in its lookups: its "embedding_bags" are never called
    paths = {p for p, _ in model.named_modules() if ".embedding_bags" not in p}
    dmp = DistributedModelParallel(model, device=torch.device("cpu"))
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["a"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 2]))
    report = profile_components(
        dmp, (torch.randn(2, 4), kjt), preprocessors=[ShardedModelCheck()], descend="all", **FAST, **PEAKS
    )
    got = {r.path for r in report}
    assert paths <= got and not any(p.startswith("_dmp_wrapped_module") for p in got)
    ebc = "sparse_arch.embedding_bag_collection"
    assert report.row(ebc).module_type == "ShardedEmbeddingBagCollection" and report.row(ebc).status == "ok"
    assert {r.status for r in report if r.path in paths} <= {"ok", "estimated"}
    assert report.metadata["torchrec_sharded"] == {"world_size": 1, "sharded_modules": [ebc]}
    # the data-parallel lookup is charged the rows it reads, not its table
    lookup = report.row(ebc).details["top_bytes_ops"]["fbgemm.dense_embedding_codegen_lookup_function"]
    assert lookup < 100 * 8 * 4
    # its dense TBE is hidden outside the module tree; its weights are grad targets, so the
    # parents' backward, with no preprocessor, computes its table-sized gradient (100 x 8 fp32)
    sharded_ebc = unwrap_model(dmp).get_submodule(ebc)
    (tbe,), (target,) = tbe_modules(sharded_ebc), hidden_tbe_grad_targets(sharded_ebc)
    assert target is tbe.weights
    assert report.row("sparse_arch").details["bwd_bytes"] >= 100 * 8 * 4


@pytest.mark.filterwarnings("ignore")
def test_the_sharded_embedding_metric_splits_the_row_and_puts_the_plan_beside_it(one_rank: None) -> None:
    from torchrec.distributed.model_parallel import DistributedModelParallel

    dmp = DistributedModelParallel(_dlrm(), device=torch.device("cpu"))
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["a"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 2]))
    # no extra argument; descend="all": the EBC is replayed whatever the in-situ times the default triage reads
    report = profile_components(dmp, (torch.randn(2, 4), kjt), descend="all", **FAST, **PEAKS)
    ebc = report.row("sparse_arch.embedding_bag_collection")
    # one sharding type on one rank (data-parallel): no collective in its forward, one local lookup
    assert ebc.details["torchrec"] == {"sharding_types": ["data_parallel"], "stages": []}
    (part,) = ebc.details["parts"]
    assert (part["name"], part["kind"], part["tables"], part["ids"]) == ("lookup:data_parallel", "lookup", ["t0"], 3)
    # the lookup's bytes are its TBE op's, charged by the same rule the row's byte count used
    assert part["bytes"] == ebc.details["top_bytes_ops"]["fbgemm.dense_embedding_codegen_lookup_function"]
    assert part["fwd_ms"] > 0 and part["runs"] >= 5
    # the engine derived the bandwidth: bytes over the lookup's own forward, against the peak given
    assert part["gbps"] == part["bytes"] / (part["fwd_ms"] / 1e3) / 1e9
    assert part["bw_util"] == part["bytes"] / (part["fwd_ms"] / 1e3) / PEAKS["peak_bandwidth"]
    # beside it, torchrec's estimate of this rank's shards at the captured batch (2 samples)
    planned = ebc.details["planned"]
    want = planned_perf(dmp, batch_size=2)["sparse_arch.embedding_bag_collection"]
    assert planned["source"] == "torchrec EmbeddingPerfEstimator" and planned["rank"] == 0
    for key in ("fwd_compute_ms", "fwd_comms_ms", "bwd_compute_ms", "bwd_comms_ms", "input_dist_comms_ms", "total_ms"):
        assert planned[key] == want["ranks"]["0"][key]
    assert planned["assumptions"] == want["assumptions"]
    # the measured split: the lookup alone is the forward compute; no collective ran, so no comms
    measured = planned["measured"]
    assert measured["fwd_compute_ms"] == part["fwd_ms"] and measured["fwd_comms_ms"] == 0.0
    # the backward compute too is the lookup's own, timed alone (not the row's bwd_ms minus its comms)
    assert part["bwd_ms"] > 0 and part["bwd_runs"] >= 5
    assert measured["bwd_compute_ms"] == part["bwd_ms"] and measured["total_ms"] == ebc.total_ms
    assert planned["measured_how"] == {"fwd_compute_ms": "measured", "bwd_compute_ms": "measured"}
    planned_total = want["ranks"]["0"]["total_ms"] + planned["input_dist_comms_ms"]  # its input all-to-all joins
    assert planned["ratio"]["total_ms"] == ebc.total_ms / planned_total
    # other rows get nothing from it
    assert all("planned" not in r.details and "parts" not in r.details for r in report if r is not ebc)


def test_several_ranks_are_not_refused_any_more(monkeypatch: pytest.MonkeyPatch) -> None:
    # the sharded modules are replayed in lockstep on every rank (tests/integrations/test_torchrec_dmp.py runs 2 ranks)
    monkeypatch.setattr(sharded, "sharded_modules", lambda model: ["sparse_arch.embedding_bag_collection"])
    monkeypatch.setattr(sharded, "_world_size", lambda: 4)
    ctx = PrepareContext(config=BenchmarkConfig(), device=torch.device("cpu"), metadata={})
    lin = nn.Linear(2, 2)
    assert ShardedModelCheck().prepare_model(lin, ctx) is lin
    ebc = "sparse_arch.embedding_bag_collection"
    assert ctx.metadata["torchrec_sharded"] == {"world_size": 4, "sharded_modules": [ebc]}


def test_unwrap_leaves_plain_modules_alone() -> None:
    lin = nn.Linear(2, 2)
    assert unwrap_model(lin) is lin


# --- paths without extra arguments (issue 16 §4) ------------------------------------------------------------------


def test_register_dmp_paths_hands_the_unwrapper_to_the_public_api(monkeypatch: pytest.MonkeyPatch) -> None:
    got: list[Any] = []
    monkeypatch.setattr(cb_callback.plugins, "register_module_unwrapper", got.append)
    monkeypatch.setattr(sharded, "_paths_registered", False)
    assert register_dmp_paths() is True and got == [dmp_unwrapper]
    assert register_dmp_paths() is True and got == [dmp_unwrapper]  # idempotent: registered once


@pytest.mark.filterwarnings("ignore")
def test_dmp_unwrapper_stands_a_dmp_for_the_model_it_wraps(one_rank: None) -> None:
    from torchrec.distributed.model_parallel import DistributedModelParallel

    model = _dlrm()
    dmp = DistributedModelParallel(model, device=torch.device("cpu"))
    assert dmp_unwrapper(dmp) is model  # DMP shards the model in place and wraps it in DDP: past both
    assert dmp_unwrapper(dmp._dmp_wrapped_module) is None and dmp_unwrapper(model) is None


@pytest.mark.filterwarnings("ignore")
def test_dmp_paths_are_the_unsharded_models_without_extra_arguments(one_rank: None) -> None:
    from torchrec.distributed.model_parallel import DistributedModelParallel

    model = _dlrm()
    paths = {p for p, _ in model.named_modules() if ".embedding_bags" not in p}
    dmp = DistributedModelParallel(model, device=torch.device("cpu"))
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["a"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 2]))
    report = profile_components(dmp, (torch.randn(2, 4), kjt), **FAST, **PEAKS)  # no preprocessor
    got = {r.path for r in report}
    assert paths <= got and not any(p.startswith("_dmp_wrapped_module") for p in got)


# --- planned_perf -------------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore")
def test_planned_perf_of_a_one_rank_dmp_keys_by_unsharded_path_with_the_planners_defaults(one_rank: None) -> None:
    from torchrec.distributed.model_parallel import DistributedModelParallel

    dmp = DistributedModelParallel(_dlrm(), device=torch.device("cpu"))
    (ps,) = dmp.plan.plan["sparse_arch.embedding_bag_collection"].values()
    assert (ps.sharding_type, ps.compute_kernel) == ("data_parallel", "dense")  # what torchrec plans on 1 CPU rank
    planned = planned_perf(dmp)
    assert list(planned) == ["sparse_arch.embedding_bag_collection"]
    entry = planned["sparse_arch.embedding_bag_collection"]
    assert entry["assumptions"]["batch_size"] == 512  # torchrec's planner default, as DMP's own planner used
    assert entry["assumptions"]["world_size"] == 1 and entry["assumptions"]["bwd_compute_multiplier"] == 2
    (shard,) = entry["tables"]["t0"]["shards"]
    assert (shard["rank"], shard["size"]) == (0, [100, 8])
    # one replica: its 100 x 8 x 4-byte gradient all-reduced at the cross-host bandwidth (x 1 local rank),
    # plus 9.22 optimizer passes at the dense kernel's half of the DDR bandwidth (torchrec's constants)
    grad = 100 * 8 * 4
    cross, ddr = 12.5 * 1024**3 / 1000, 51 * 1024**3 / 1000
    assert entry["bwd_comms_ms"] == pytest.approx(grad / cross + grad * 9.22 / (0.5 * ddr), rel=1e-12)
    assert entry["fwd_comms_ms"] == 0.0 and entry["ranks"].keys() == {"0"}
    # a DMP inside another module: keyed under that module's path
    holder = nn.Module()
    holder.net = dmp
    assert list(planned_perf(holder)) == ["net.sparse_arch.embedding_bag_collection"]
    with pytest.raises(ValueError, match="batch_size=0"):
        planned_perf(dmp, batch_size=0)
    # a plan entry the model lacks is that entry's one-line error, not an exception
    dmp.plan.plan["sparse_arch.gone"] = dmp.plan.plan["sparse_arch.embedding_bag_collection"]
    assert planned_perf(dmp)["sparse_arch.gone"]["error"] == "the plan names 'sparse_arch.gone', which the model lacks"


def test_planned_perf_names_the_missing_dmp() -> None:
    with pytest.raises(ValueError, match="no torchrec DistributedModelParallel in Linear's tree"):
        planned_perf(nn.Linear(2, 2))
