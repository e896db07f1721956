"""torchrec's jagged types: captured (deep copies), moved, sliced and replicated per key."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

pytest.importorskip("torchrec")

from torchrec.datasets.utils import Batch
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor, KeyedTensor

import cb_callback
from cb_callback import profile_components
from cb_callback._engine.capture.inputs import clone_tree, leading_batch_size, to_device
from cb_callback.integrations.torchrec import register, take_kjt
from cb_callback.plugins import replicate_batch, slice_batch
from tests.conftest import FAST

PEAKS: dict[str, Any] = dict(peak_flops=1e12, peak_bandwidth=1e11)


def _kjt(weights: bool = False) -> KeyedJaggedTensor:
    #            sample 0   sample 1   sample 2
    # key "a":   [1]        [2, 3]     []
    # key "b":   [4]        [5, 6, 7]  [8]
    values = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8])
    return KeyedJaggedTensor.from_lengths_sync(
        keys=["a", "b"],
        values=values,
        lengths=torch.tensor([1, 2, 0, 1, 3, 1]),
        weights=values.float() / 10 if weights else None,
    )


def _bags(kjt: KeyedJaggedTensor) -> dict[str, list[list[int]]]:
    return {k: [v.tolist() for v in jt.to_dense()] for k, jt in kjt.to_dict().items()}


def test_register_is_idempotent() -> None:
    register()
    register()  # a second call must not raise "already registered"


def test_kjt_clone_is_a_deep_copy_with_the_same_content() -> None:
    kjt = _kjt(weights=True)
    copy = clone_tree(kjt)
    assert type(copy) is KeyedJaggedTensor
    assert copy.keys() == kjt.keys() and copy.stride() == 3
    assert torch.equal(copy.values(), kjt.values()) and torch.equal(copy.lengths(), kjt.lengths())
    assert torch.equal(copy.weights(), kjt.weights())
    assert copy.values().data_ptr() != kjt.values().data_ptr()  # not aliased
    moved = to_device(copy, torch.device("cpu"))
    assert _bags(moved) == _bags(kjt)
    assert leading_batch_size(((kjt,), {})) == 3


def test_kt_and_jt_round_trip_keep_requires_grad() -> None:
    values = torch.randn(3, 5, requires_grad=True)
    kt = KeyedTensor(keys=["x", "y"], length_per_key=[2, 3], values=values)
    kt_copy = clone_tree(kt)
    assert kt_copy.keys() == ["x", "y"] and kt_copy.length_per_key() == [2, 3]
    assert kt_copy.values().requires_grad and kt_copy.values().is_leaf
    assert torch.equal(kt_copy.values(), values.detach())
    jt = JaggedTensor(values=torch.randn(4, 2, requires_grad=True), lengths=torch.tensor([1, 0, 3]))
    jt_copy = clone_tree(jt)
    assert jt_copy.values().requires_grad and torch.equal(jt_copy.lengths(), jt.lengths())


def test_kjt_slicing_keeps_the_first_samples_of_every_key() -> None:
    kjt = _kjt(weights=True)
    first2 = slice_batch(kjt, 3, 2)
    assert first2.stride() == 2
    assert _bags(first2) == {"a": [[1], [2, 3]], "b": [[4], [5, 6, 7]]}
    # weights follow their ids: values 1,2,3 | 4,5,6,7 -> weights / 10
    assert torch.allclose(first2.weights(), torch.tensor([1, 2, 3, 4, 5, 6, 7]) / 10)


def test_kjt_replication_tiles_per_key_not_the_flat_tensors() -> None:
    kjt = _kjt()
    tiled = replicate_batch(kjt, 3, 5)
    assert tiled.stride() == 5
    # per key: samples 0, 1, 2, 0, 1
    assert _bags(tiled) == {"a": [[1], [2, 3], [], [1], [2, 3]], "b": [[4], [5, 6, 7], [8], [4], [5, 6, 7]]}
    # The pitfall: lengths are key-major, so tiling the flat tensors gives other bags
    # ("a" gets key b's first sample as its fourth one).
    naive = KeyedJaggedTensor.from_lengths_sync(
        keys=["a", "b"], values=kjt.values().repeat(2), lengths=kjt.lengths().repeat(2)
    )
    assert _bags(naive)["a"] != [[1], [2, 3], [], [1], [2, 3], []]


def test_replicated_kjt_gives_the_original_rows_output_tiled() -> None:
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(name="ta", embedding_dim=4, num_embeddings=10, feature_names=["a"]),
            EmbeddingBagConfig(
                name="tb", embedding_dim=3, num_embeddings=10, feature_names=["b"], pooling=PoolingType.MEAN
            ),
        ]
    )
    kjt = _kjt(weights=False)
    out = ebc(kjt).values()
    tiled_out = ebc(take_kjt(kjt, 7)).values()
    # row j of the replicated batch is row j % 3 of the original, bit for bit
    assert torch.equal(tiled_out, out[torch.arange(7) % 3])
    assert torch.equal(ebc(take_kjt(kjt, 2)).values(), out[:2])


def test_variable_batch_kjt_is_left_alone() -> None:
    vbe = KeyedJaggedTensor(
        keys=["a", "b"], values=torch.arange(4), lengths=torch.tensor([1, 2, 1, 0, 0]),
        stride_per_key_per_rank=[[2], [3]],
    )  # fmt: skip
    assert replicate_batch(vbe, 3, 6) is vbe  # no single batch size: not replicated


class _KTHead(nn.Module):
    """Consumes a KeyedTensor (what an EBC outputs) through a Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(5, 2)

    def forward(self, kt: KeyedTensor) -> torch.Tensor:
        return self.lin(kt.values())


@pytest.mark.parametrize("requires_grad", [True, False])
def test_keyed_tensor_that_required_grad_requires_grad_in_replay(requires_grad: bool) -> None:
    batch = 3
    kt = KeyedTensor(keys=["x", "y"], length_per_key=[2, 3], values=torch.randn(batch, 5, requires_grad=requires_grad))
    row = profile_components(_KTHead(), (kt,), **FAST, **PEAKS).row("")
    assert row.status == "ok"
    assert row.fwd_flops == 2 * batch * 5 * 2
    # backward: dW (2 * B * 5 * 2) always, dX (the same again) only if the KT required grad
    assert row.bwd_flops == (2 if requires_grad else 1) * 2 * batch * 5 * 2


def test_replicate_batch_option_replicates_kjt_inputs() -> None:
    ebc = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name="ta", embedding_dim=4, num_embeddings=10, feature_names=["a", "b"])]
    )
    seen: list[int] = []

    class Spy(cb_callback.plugins.Preprocessor):
        name = "spy"

        def process_inputs(
            self, inputs: cb_callback.plugins.ComponentInputs, ctx: cb_callback.plugins.PrepareContext
        ) -> cb_callback.plugins.ComponentInputs:
            if inputs.args and isinstance(inputs.args[0], KeyedJaggedTensor):
                seen.append(inputs.args[0].stride())
            return inputs

    report = profile_components(ebc, (_kjt(),), batch_size=6, preprocessors=[Spy()], **FAST, **PEAKS)
    assert report.row("").status == "ok"
    assert seen == [6]  # the spy runs after the built-in replication: the EBC replays 6 samples


def test_torchrec_batch_is_a_pytree_node() -> None:
    batch = Batch(dense_features=torch.randn(3, 2), sparse_features=_kjt(), labels=torch.ones(3))
    copy = clone_tree(batch)
    assert isinstance(copy, Batch) and _bags(copy.sparse_features) == _bags(batch.sparse_features)
    tiled = replicate_batch(batch, 3, 6)
    assert tiled.dense_features.shape == (6, 2) and tiled.sparse_features.stride() == 6
