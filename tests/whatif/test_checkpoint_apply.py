"""``plan.apply`` / ``wrap_modules``: copies, pickles, keywords, undo, and the guards against a repeated forward."""

from __future__ import annotations

import copy
import inspect
import io
from typing import Any

import pytest
import torch
from torch import nn

from cb_callback import CheckpointPlan
from cb_callback._whatif.checkpoint_wrap import CheckpointedForward, wrap_modules


class Counted(nn.Linear):
    """A Linear that counts its forwards (class-wide): 2 per step when checkpointed, the recompute included."""

    calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        type(self).calls += 1
        return super().forward(x)


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.Sequential(Counted(8, 8), nn.GELU(), nn.Dropout(0.25)), nn.Linear(8, 1))


def _step(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor | None]]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    loss = model(x).sum()
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def _equal(a: dict[str, torch.Tensor | None], b: dict[str, torch.Tensor | None]) -> bool:
    assert a.keys() == b.keys()
    return all(
        x is not None and y is not None and torch.equal(x, y) for x, y in zip(a.values(), b.values(), strict=True)
    )


def _plan(paths: tuple[str, ...]) -> CheckpointPlan:
    return CheckpointPlan(paths, 0, 0, 0.0, [], {}, {})


def test_a_deepcopy_of_a_wrapped_model_runs_its_own_weights_and_keeps_its_own_wrapping() -> None:
    model, x = _model(), torch.randn(4, 8)
    reference = copy.deepcopy(model)
    handle = _plan(("1",)).apply(model)
    ema = copy.deepcopy(model)
    forward = ema[1].__dict__["forward"]
    assert isinstance(forward, CheckpointedForward) and forward.module is ema[1]
    Counted.calls = 0
    loss, grads = _step(ema, x)
    assert Counted.calls == 2  # the copy is checkpointed: its block ran again in the backward
    loss_ref, grads_ref = _step(reference, x)
    assert torch.equal(loss, loss_ref) and _equal(grads, grads_ref)
    assert all(p.grad is None for p in model.parameters())  # nothing landed on the original
    with torch.no_grad():
        ema[1][0].weight.zero_()
        ema[1][0].bias.zero_()
    assert torch.equal(ema[1](x), torch.zeros(4, 8))  # the copy's own (zeroed) weights
    handle.remove()
    assert "forward" not in model[1].__dict__
    assert isinstance(ema[1].__dict__["forward"], CheckpointedForward)  # the original's handle left the copy alone


def test_torch_save_and_load_of_a_wrapped_model_round_trip_with_equal_loss_and_gradients() -> None:
    model, x = _model(), torch.randn(4, 8)
    reference = copy.deepcopy(model)
    with _plan(("1",)).apply(model):
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        loss, grads = _step(model, x)
    forward = loaded[1].__dict__["forward"]
    assert isinstance(forward, CheckpointedForward) and forward.module is loaded[1] and forward.path == "1"
    Counted.calls = 0
    loss_loaded, grads_loaded = _step(loaded, x)
    assert Counted.calls == 2
    loss_ref, grads_ref = _step(reference, x)
    assert torch.equal(loss, loss_ref) and torch.equal(loss_loaded, loss_ref)
    assert _equal(grads, grads_ref) and _equal(grads_loaded, grads_ref)


class Keywords(nn.Module):
    """A module whose own keywords are named like ``torch.utils.checkpoint.checkpoint``'s."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(
        self,
        x: torch.Tensor,
        debug: bool = False,
        use_reentrant: Any = None,
        preserve_rng_state: float = 1.0,
        context_fn: Any = None,
        determinism_check: str = "default",
        early_stop: float = 1.0,
    ) -> torch.Tensor:
        y = self.lin(x) * preserve_rng_state * early_stop
        y = y * 100.0 if debug else y
        if use_reentrant is not None or context_fn is not None or determinism_check != "default":
            y = y + 1.0
        return y


@pytest.mark.parametrize(
    "kwargs",
    [
        {"debug": True},
        {"use_reentrant": True},
        {"preserve_rng_state": 3.0},
        {"context_fn": "mine"},
        {"determinism_check": "none"},
        {"early_stop": 0.5},
    ],
)
def test_a_modules_keywords_named_like_checkpoints_reach_the_module(kwargs: dict[str, Any]) -> None:
    torch.manual_seed(0)
    model, x = nn.ModuleDict({"m": Keywords()}), torch.randn(2, 4)
    reference = copy.deepcopy(model)
    y_ref = reference["m"](x, **kwargs)
    y_ref.sum().backward()
    with wrap_modules(model, ["m"]):
        y = model["m"](x, **kwargs)
        y.sum().backward()
        assert "determinism_check" in inspect.signature(model["m"].forward).parameters  # seen through the wrapper
    assert torch.equal(y, y_ref)
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert _equal(grads, {n: p.grad for n, p in reference.named_parameters()})


def test_remove_puts_back_a_forward_the_user_had_patched_on_the_instance() -> None:
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1)), torch.randn(2, 4)
    original = model[0].forward

    def patched(inp: torch.Tensor) -> torch.Tensor:  # the user's own shim (LoRA, quantization ...)
        return original(inp) * 10

    model[0].forward = patched  # type: ignore[method-assign]
    y_before = model(x)
    handle = wrap_modules(model, ["0"])
    assert torch.equal(model(x), y_before)  # the wrapper runs the patch, not the class's forward
    handle.remove()
    assert model[0].__dict__["forward"] is patched
    assert torch.equal(model(x), y_before)
    handle.remove()  # idempotent
    assert model[0].__dict__["forward"] is patched


class Seen(nn.Module):
    """Counts the samples it saw in a buffer: in place (``seen += n``) or by reassigning it."""

    def __init__(self, in_place: bool) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.in_place = in_place
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.in_place:
            self.seen += x.shape[0]
        else:
            self.seen = self.seen + x.shape[0]
        return self.lin(x)


@pytest.mark.parametrize("in_place", [True, False])
def test_a_forward_that_writes_a_buffer_raises_at_the_forward_before_any_recompute(in_place: bool) -> None:
    model, x = nn.Sequential(Seen(in_place), nn.Linear(8, 1)), torch.randn(4, 8)
    with wrap_modules(model, ["0"]):
        with pytest.raises(RuntimeError, match=r"checkpoint of '0': its forward wrote the buffer 'seen' \(Seen\)"):
            model(x)
        assert float(model[0].seen) == 4.0  # written once, as unwrapped (not 8: no recompute ran)
        with torch.no_grad():  # nothing is recomputed without gradients: no error
            model(x)
    assert float(model[0].seen) == 8.0


class MyBN(nn.BatchNorm1d):
    """A BatchNorm under another name (a user's or a library's subclass)."""


@pytest.mark.parametrize(
    "norm", [lambda: MyBN(8), lambda: nn.InstanceNorm1d(8, track_running_stats=True)], ids=["bn_subclass", "instnorm"]
)
def test_a_norm_turned_to_training_mode_after_apply_raises_instead_of_updating_twice(norm: Any) -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.Linear(8, 8), norm()), nn.Linear(8, 1))
    x = torch.randn(4, 8) if isinstance(model[1][1], MyBN) else torch.randn(4, 8, 8)
    name = type(model[1][1]).__name__
    with pytest.raises(ValueError, match=rf"'1\.1' is a {name} in training mode"):  # refused by isinstance
        wrap_modules(model, ["1"])
    model.eval()
    with wrap_modules(model, ["1"]):
        model.train()
        with pytest.raises(RuntimeError, match=rf"checkpoint of '1': its forward wrote the buffer '1\.\w+' \({name}\)"):
            model(x)
    assert int(model[1][1].num_batches_tracked) == (1 if name == "MyBN" else 0)  # updated once, not twice
    model[1][1].eval()
    reference = copy.deepcopy(model)
    with wrap_modules(model, ["1"]):
        loss, grads = _step(model, x)
    loss_ref, grads_ref = _step(reference, x)
    assert torch.equal(loss, loss_ref) and _equal(grads, grads_ref)


def test_a_forward_that_modifies_its_input_in_place_raises_at_the_forward_naming_the_module() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.ReLU(inplace=True), nn.Linear(8, 8)), nn.Linear(8, 1))
    x = torch.randn(4, 8)
    reference = copy.deepcopy(model)
    with wrap_modules(model, ["1"]):
        with pytest.raises(RuntimeError, match=r"checkpoint of '1': its forward modified its input tensor #0 in place"):
            model(x)
        with torch.no_grad():
            assert torch.equal(model(x), reference(x))
    loss, grads = _step(model, x)  # unwrapped again: the step runs
    loss_ref, grads_ref = _step(reference, x)
    assert torch.equal(loss, loss_ref) and _equal(grads, grads_ref)


def test_the_same_module_under_two_paths_is_refused_and_nothing_is_wrapped() -> None:
    block = nn.Linear(4, 4)
    model = nn.Module()
    model.a = block
    model.b = block
    with pytest.raises(ValueError, match="cannot checkpoint 'b': it is the same module as 'a'"):
        wrap_modules(model, ["a", "b"])
    assert "forward" not in block.__dict__


def test_a_forward_already_under_the_bare_checkpointed_forward_is_refused() -> None:
    from cb_callback._whatif.checkpoint_wrap import checkpointed_forward

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    model[0].forward = checkpointed_forward(model[0].forward)  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="cannot checkpoint '0': '0' is already wrapped"):
        wrap_modules(model, ["0"])
