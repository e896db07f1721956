"""``DistributedModelParallel``: unwrapped to the model's paths on one rank, refused on several."""

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

import cb_callback.integrations.torchrec._sharded as sharded
from cb_callback import BenchmarkConfig, PrepareContext, profile_components
from cb_callback.integrations.torchrec import (
    ShardedModelCheck,
    hidden_tbe_grad_targets,
    tbe_modules,
    unwrap_model,
)
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
    report = profile_components(dmp, (torch.randn(2, 4), kjt), preprocessors=[ShardedModelCheck()], **FAST, **PEAKS)
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


def test_several_ranks_are_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sharded, "sharded_modules", lambda model: ["sparse_arch.embedding_bag_collection"])
    monkeypatch.setattr(sharded, "_world_size", lambda: 4)
    ctx = PrepareContext(config=BenchmarkConfig(), device=torch.device("cpu"), metadata={})
    with pytest.raises(NotImplementedError, match="ReduceHashSize"):
        ShardedModelCheck().prepare_model(nn.Linear(2, 2), ctx)


def test_unwrap_leaves_plain_modules_alone() -> None:
    lin = nn.Linear(2, 2)
    assert unwrap_model(lin) is lin
