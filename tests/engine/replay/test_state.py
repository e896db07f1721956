"""Profiling changes nothing observable: weights, buffers, grads, flags, RNG streams."""

from __future__ import annotations

import random
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from cb_callback import profile_components
from cb_callback.plugins import StateGuard, register_state_saver
from tests.conftest import FAST


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.bn = nn.BatchNorm1d(6)
        self.drop = nn.Dropout(0.5)
        self.head = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(self.bn(self.lin(x))))


class FusedUpdate(nn.Module):
    """Updates its own weight inside backward, as a fused optimizer (fbgemm TBE) does."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 4))
        self.steps = 0  # an optimizer step counter kept as a python attribute

        def sgd_in_backward(grad: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                self.weight.sub_(0.1 * grad)
            self.steps += 1
            return grad

        self.weight.register_hook(sgd_in_backward)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.weight.mul_(1.0)  # a forward that writes its weight in place
        return x @ self.weight


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_weights_buffers_grads_flags_and_rngs_are_restored() -> None:
    model = Net()
    model.train()
    model.head.eval()  # a mixed train/eval tree must come back as it was
    model(torch.randn(8, 6)).sum().backward()  # leave real .grad values
    before = _snapshot(model)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    flags = {n: m.training for n, m in model.named_modules()}
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    x = torch.randn(8, 6)
    rng = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())

    # descend="all": every row replayed whatever the load makes of the triage (the test is of the state)
    report = profile_components(model, (x,), descend="all", **FAST)  # Dropout draws from the torch RNG

    assert all(r.status == "ok" for r in report)
    after = model.state_dict()
    assert before.keys() == after.keys()
    for k in before:  # includes bn.running_mean/var and num_batches_tracked
        assert torch.equal(before[k], after[k]), k
    for n, p in model.named_parameters():
        assert p.grad is not None and torch.equal(p.grad, grads[n]), n
    assert {n: m.training for n, m in model.named_modules()} == flags
    assert torch.equal(torch.get_rng_state(), rng[0])
    assert random.getstate() == rng[1]
    assert np.array_equal(np.random.get_state()[1], rng[2])


def test_replay_uses_the_captured_training_flag() -> None:
    model = Net().eval()
    report = profile_components(model, (torch.randn(8, 6),), **FAST)
    assert report.row("bn").status == "ok"
    assert not any(m.training for m in model.modules())


def test_grad_none_stays_none() -> None:
    model = Net()
    profile_components(model, (torch.randn(8, 6),), **FAST)
    assert all(p.grad is None for p in model.parameters())


def test_weights_updated_inside_backward_are_restored() -> None:
    model = FusedUpdate()
    before = model.weight.detach().clone()
    restored: list[int] = []

    def save_steps(root: nn.Module):  # type: ignore[no-untyped-def]
        saved = {m: m.steps for m in root.modules() if isinstance(m, FusedUpdate)}

        def restore() -> None:
            for m, s in saved.items():
                m.steps = s
            restored.append(1)

        return restore

    register_state_saver(save_steps)
    try:
        report = profile_components(model, (torch.randn(3, 4, requires_grad=True),), **FAST)
    finally:
        from cb_callback._engine.replay import state as _state

        _state._SAVERS.remove(save_steps)
    assert report.row("").status == "ok"
    assert torch.equal(model.weight, before)
    assert model.steps == 0 and restored


def test_guard_restores_after_an_exception() -> None:
    model = Net()
    before = _snapshot(model)
    try:
        with StateGuard(model):
            model(torch.randn(8, 6))  # BatchNorm statistics move
            raise KeyError("x")
    except KeyError:
        pass
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])


def test_registered_grad_targets_reach_hidden_tensors() -> None:
    from cb_callback._engine.replay import isolate as _isolate
    from cb_callback.plugins import register_grad_targets

    class Hidden(nn.Module):
        """Uses a tensor that is not one of its parameters (kept in a plain list)."""

        def __init__(self) -> None:
            super().__init__()
            self.hidden = [torch.randn(4, 4, requires_grad=True)]

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ self.hidden[0]

    def targets(module: nn.Module) -> list[torch.Tensor]:
        return list(module.hidden) if isinstance(module, Hidden) else []

    x = torch.randn(2, 4)
    no_target = profile_components(Hidden(), (x,), **FAST).row("").details["no_backward"]
    assert no_target == "no input or parameter of the component requires grad"
    register_grad_targets(targets)
    try:
        row = profile_components(Hidden(), (x,), **FAST).row("")
    finally:
        _isolate._GRAD_TARGETS.remove(targets)
    assert row.bwd_flops == 2 * 4 * 2 * 4  # d(hidden) = x^T @ dY: one [4,2]x[2,4] matmul


# --- what the guard copies, and where (issue 8: memory at the capture step) ---------------


def test_the_guard_copies_only_the_buffers_when_nothing_writes_weights() -> None:
    model = Net()
    model(torch.randn(8, 6)).sum().backward()  # .grad set, as after a training step
    with StateGuard(model) as guard:
        # BatchNorm1d(6): running_mean, running_var (6 fp32 each) + num_batches_tracked (1 int64).
        # Not copied: the weights (lin 6*6+6, head 6*2+2 = 56 fp32) nor their 56 grads.
        assert guard.copied_bytes() == {"cpu": 6 * 4 + 6 * 4 + 8}


def test_weights_with_a_gradient_hook_are_copied_to_host_with_their_grad() -> None:
    model = FusedUpdate()
    model(torch.randn(2, 4)).sum().backward()  # the hook updates the weight; .grad is set
    with StateGuard(model) as guard:
        # the hooked 4x4 fp32 weight and its 4x4 grad, in host memory; no buffers
        assert guard.copied_bytes() == {"cpu": 2 * 4 * 4 * 4}


def test_a_max_norm_embedding_renormalised_by_the_forward_is_restored() -> None:
    emb = nn.Embedding(10, 4, max_norm=0.5)
    before = emb.weight.detach().clone()
    assert float(before.norm(dim=1).max()) > 0.5  # N(0, 1) rows of dim 4: the forward will rescale some
    with StateGuard(emb) as guard:
        assert guard.copied_bytes() == {"cpu": 10 * 4 * 4}  # the weight is known to be written
        emb(torch.tensor([0, 1, 2, 3]))
        assert not torch.equal(emb.weight, before)
    assert torch.equal(emb.weight, before)


def test_a_replaced_grad_comes_back_as_the_same_tensor() -> None:
    model = Net()
    model(torch.randn(8, 6)).sum().backward()
    grad = model.lin.weight.grad
    values = grad.clone()
    with StateGuard(model):
        model.lin.weight.grad = torch.zeros_like(grad)
        model.head.weight.grad = None
    assert model.lin.weight.grad is grad and torch.equal(grad, values)
    assert model.head.weight.grad is not None


def test_a_write_the_guard_holds_no_copy_of_is_reported_by_name() -> None:
    """Version counters are how the guard sees writes: a bump without a copy is named, not hidden."""
    model = Net()
    warning = r"1 parameter\(s\).*\(lin\.bias\).*register_state_saver"
    with pytest.warns(RuntimeWarning, match=warning), StateGuard(model), torch.no_grad():
        model.lin.bias.add_(1.0)  # an unhooked parameter written in place: version 0 -> 1


def test_a_write_without_a_version_bump_is_out_of_scope() -> None:
    """Documented limit: ``.data`` writes to an unhooked parameter are invisible to the guard."""
    model = Net()
    before = model.lin.bias.detach().clone()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and it says nothing
        with StateGuard(model):
            model.lin.bias.data.add_(1.0)  # ``.data`` has its own version counter
    assert torch.equal(model.lin.bias, before + 1.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_only_the_buffers_are_copied_on_the_device() -> None:
    model = FusedUpdate().cuda()
    model.bn = nn.BatchNorm1d(4).cuda()  # 2 x 4 fp32 + 1 int64 of buffers
    before = model.weight.detach().clone()
    with StateGuard(model) as guard:
        # the hooked weight (4x4 fp32, no grad yet) is copied to host memory
        assert guard.copied_bytes() == {"cuda:0": 2 * 4 * 4 + 8, "cpu": 4 * 4 * 4}
        model(torch.randn(3, 4, device="cuda", requires_grad=True)).sum().backward()
        assert not torch.equal(model.weight, before)
    assert torch.equal(model.weight, before)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_a_scripted_batchnorms_running_stats_are_restored() -> None:
    # a TorchScript module's _buffers is an OrderedDictWrapper (no .get): the restore raised, and the
    # replays' updates of the running stats stayed in the user's model
    bn = torch.jit.script(nn.BatchNorm1d(6))
    before = {k: v.clone() for k, v in bn.state_dict().items()}
    with StateGuard(bn):
        bn(torch.randn(8, 6) * 3 + 1)
        assert not torch.equal(bn.running_mean, before["running_mean"])
    after = bn.state_dict()
    assert list(after) == list(before)  # running_mean, running_var, num_batches_tracked (and the affine pair)
    assert all(torch.equal(after[k], before[k]) for k in before)
