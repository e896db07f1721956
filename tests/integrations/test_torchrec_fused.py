"""Fused optimizers: the fused backward is measured; weights, optimizer state and step counters stay as they were."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import torch
from torch import nn

pytest.importorskip("torchrec")

from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
)
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

import cb_callback.integrations.torchrec as cbt
from cb_callback import profile_components
from cb_callback.integrations.torchrec import hidden_tbe_grad_targets, register, tbe_modules
from cb_callback.plugins import MeasureContext, register_grad_targets
from tests.conftest import FAST
from tests.integrations.test_torchrec_embedding import _TABLES, F32, _nbytes, _RecordOp

PEAKS: dict[str, Any] = dict(peak_flops=1e12, peak_bandwidth=1e11)
IDS = torch.tensor([1, 2, 2, 7, 7, 9, 9, 11])
OFFSETS = torch.tensor([0, 1, 3, 4, 8])


def _snapshot(tbe: Any) -> dict[str, Any]:
    """Every tensor the fused optimizer touches, and the Python step counters."""
    tensors = [*tbe.named_parameters(), *tbe.named_buffers()]  # weights, momentum, ``iter`` …
    state: dict[str, Any] = {k: v.detach().clone() for k, v in tensors}
    state["iter_cpu"] = tbe.iter_cpu.clone()
    state["step"] = tbe.step
    return state


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    diff = []
    for k, v in a.items():
        w = b[k]
        same = torch.equal(v, w) if isinstance(v, torch.Tensor) else v == w
        if not same:
            diff.append(k)
    return diff


class _WeightsChanged:
    """A metric plugin that sees, after the instrumented replays, whether the fused update ran."""

    name = "weights_changed"

    def __init__(self, tbe: Any, before: torch.Tensor) -> None:
        self.tbe, self.before = tbe, before

    def measure(self, ctx: MeasureContext) -> Mapping[str, Any]:
        return {"weights_changed": not torch.equal(self.tbe.weights_host, self.before)}


def _trained_tbe() -> SplitTableBatchedEmbeddingBagsCodegen:
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=[
            (20, 4, EmbeddingLocation.HOST, ComputeDevice.CPU),
            (30, 8, EmbeddingLocation.HOST, ComputeDevice.CPU),
        ],
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        learning_rate=0.1,
    )
    tbe(IDS, OFFSETS).sum().backward()  # one real step: momentum, iter and step are non-zero
    return tbe


def test_fused_tbe_weights_and_optimizer_state_are_unchanged_after_profiling() -> None:
    tbe = _trained_tbe()
    before = _snapshot(tbe)
    assert before["step"] == 1 and int(before["iter"]) == 1 and float(before["momentum1_host"].abs().sum()) > 0
    spy = _WeightsChanged(tbe, before["weights_host"])
    row = profile_components(tbe, (IDS, OFFSETS), metrics=[spy], **FAST, **PEAKS).row("")
    assert row.status == "ok" and row.details["roofline"]["roof"] == "memory"  # bound: memory or latency
    assert row.details["weights_changed"] is True  # the replayed backward did apply the fused update …
    assert _same(before, _snapshot(tbe)) == []  # … and everything is back


def _fused_ebc() -> FusedEmbeddingBagCollection:
    return FusedEmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(name="t0", embedding_dim=4, num_embeddings=10, feature_names=["a"]),
            EmbeddingBagConfig(name="t1", embedding_dim=8, num_embeddings=20, feature_names=["b", "c"]),
        ],
        optimizer_type=torch.optim.Adagrad, optimizer_kwargs={"lr": 0.1}, device=torch.device("cpu"),
    )  # fmt: skip


class _Head(nn.Module):
    """A parent of the FusedEBC: its isolated backward must reach the hidden TBE too."""

    def __init__(self, ebc: FusedEmbeddingBagCollection) -> None:
        super().__init__()
        self.ebc = ebc

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        return self.ebc(kjt).values().sum(dim=1)


def test_fused_ebc_backward_is_measured_by_default_and_its_state_restored() -> None:
    ebc = _fused_ebc()
    # 3 features x 2 samples: a (t0, dim 4): [1], [2, 3]; b, c (both t1, dim 8): [4], [5] | [6, 7], [8]
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["a", "b", "c"], values=torch.tensor([1, 2, 3, 4, 5, 6, 7, 8]), lengths=torch.tensor([1, 2, 1, 1, 2, 1])
    )
    rec = _RecordOp("backward_codegen")
    with rec:
        ebc(kjt).values().sum().backward()  # one real step: the fused Adagrad update ran
    named, bwd_out = rec.calls[0]
    (tbe,) = tbe_modules(ebc)  # hidden in a plain list, not a registered submodule
    model = _Head(ebc)
    for mod in (ebc, model):  # the owner and its parent; once each, however deep
        (target,) = hidden_tbe_grad_targets(mod)
        assert target is tbe.placeholder_autograd_tensor
    # distinct rows: t0 ids {1, 2, 3} (dim 4), t1 ids {4, 5, 6, 7, 8} (dim 8)
    dims = 3 * 4 + 5 * 8
    skip = (*_TABLES, "momentum1_host", "momentum1_dev", "momentum1_uvm")
    expected = (
        _nbytes(named, skip=skip)  # grad_output, indices, offsets, metadata, lr
        + 2 * dims * F32  # read + write of each updated weight row
        + 2 * dims * F32  # read + write of each row's Adagrad momentum (element-wise: D fp32)
    )
    assert bwd_out is None and cbt.tbe_backward_bytes(named, bwd_out) == expected
    before = _snapshot(tbe)
    names = [n for n, _ in model.named_parameters()]
    spy = _WeightsChanged(tbe, before["weights_host"])
    report = profile_components(model, (kjt,), metrics=[spy], **FAST, **PEAKS)  # no preprocessor needed
    bwd_op = "fbgemm.split_embedding_backward_codegen_adagrad_unweighted_pt2_wrapper"  # torch.optim.Adagrad
    for path in ("", "ebc"):
        row = report.row(path)
        assert row.status == "ok" and row.details["weights_changed"] is True, path
        # the fused backward (gradient scatter + Adagrad update) is in the measured backward, exactly
        assert row.details["top_bytes_ops"][bwd_op] == expected, path
        assert row.details["bwd_bytes"] >= expected and row.bwd_ms > 0, path
    assert _same(before, _snapshot(tbe)) == []
    assert [n for n, _ in model.named_parameters()] == names  # the user's module is not changed


def test_grad_targets_are_registered_once() -> None:
    register()  # a second registration is a no-op …
    with pytest.raises(ValueError, match="already registered"):  # … of a function the engine already has
        register_grad_targets(hidden_tbe_grad_targets)
    assert hidden_tbe_grad_targets(nn.Linear(2, 2)) == []  # no hidden TBE: nothing added
    tbe = _trained_tbe()  # a registered TBE: its placeholder already is a parameter of the component
    assert hidden_tbe_grad_targets(tbe) == []


def test_fused_ebc_with_sgd_restores_its_step_counter() -> None:
    ebc = FusedEmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name="t0", embedding_dim=4, num_embeddings=10, feature_names=["a"])],
        optimizer_type=torch.optim.SGD, optimizer_kwargs={"lr": 0.1}, device=torch.device("cpu"),
    )  # fmt: skip
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["a"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 2]))
    (tbe,) = tbe_modules(ebc)
    before = _snapshot(tbe)
    profile_components(ebc, (kjt,), **FAST, **PEAKS)
    assert _same(before, _snapshot(tbe)) == []
