"""Profiling changes nothing observable: weights, buffers, grads, flags, RNG streams."""

from __future__ import annotations

import random

import numpy as np
import torch
from torch import nn

from cb_callback import StateGuard, profile_components, register_state_saver
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

    report = profile_components(model, (x,), **FAST)  # Dropout draws from the torch RNG

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
        from cb_callback import _state

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
    from cb_callback import _isolate, register_grad_targets

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
