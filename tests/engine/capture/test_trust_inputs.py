"""Numbers a user can trust: each replay on its own copy of the call, per-module modes,
no_grad/inference_mode callers, and capture hooks that never break the real step."""

from __future__ import annotations

import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import cb_callback._engine.capture.inputs as inputs_mod
from cb_callback import BenchmarkConfig, Capture, profile_components
from cb_callback._engine.capture.inputs import ComponentInputs, copy_call
from cb_callback._engine.replay.isolate import Replay
from cb_callback._engine.run.profile import profile_captured
from cb_callback._whatif.snapshot import load_snapshot, save_snapshot
from tests.conftest import FAST

PEAKS: dict[str, Any] = dict(peak_flops=1e12, peak_bandwidth=1e11)

# --- a KV cache passed down the tree ---------------------------------------------------

B, T, D = 2, 32, 64
KV_FLOPS = 2 * B * T * D * D  # the kv Linear: 524,288
BMM_FLOPS = 2 * B * T * T * D  # x @ k^T, and p @ k: 262,144 each
ATTN_FWD = KV_FLOPS + 2 * BMM_FLOPS  # 1,048,576: one key block, as in the real step
# backward w.r.t. the kv weight (x does not require grad): dW 524,288; x @ k^T: dk 262,144;
# p @ k: dp and dk 2 * 262,144 -> 1,310,720
ATTN_BWD = KV_FLOPS + BMM_FLOPS + 2 * BMM_FLOPS


class Cache:
    """A KV cache: the forward appends its keys."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []


class Attn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.kv = nn.Linear(D, D)

    def forward(self, x: torch.Tensor, cache: Cache) -> torch.Tensor:
        cache.keys.append(self.kv(x))
        k = torch.cat(cache.keys, 1)
        return torch.softmax(x @ k.transpose(1, 2), -1) @ k


class CacheNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = Attn()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x, Cache())


@pytest.mark.parametrize("backward", [False, True])
def test_a_cache_object_is_copied_when_captured_and_for_every_replay(backward: bool) -> None:
    # descend="all": attn and kv are replayed whatever the in-situ times the default triage reads
    report = profile_components(CacheNet(), (torch.randn(B, T, D),), backward=backward, descend="all", **FAST, **PEAKS)
    root, attn, kv = report.row(""), report.row("attn"), report.row("attn.kv")
    assert [root.status, attn.status, kv.status] == ["ok", "ok", "ok"]  # attn was `estimated` with backward
    # Before: the cache kept by reference held the real step's key block, then every
    # replay's: attn counted 1,572,864 forward FLOPs (cat of 2+ blocks) instead of the root's.
    assert root.fwd_flops == attn.fwd_flops == ATTN_FWD == 1_048_576
    assert kv.fwd_flops == KV_FLOPS
    assert "unknown_leaves" not in attn.details
    if backward:
        assert root.bwd_flops == attn.bwd_flops == ATTN_BWD == 1_310_720


def test_the_captured_copy_is_the_call_as_entered_and_replays_leave_it_alone() -> None:
    net = CacheNet()
    with Capture(net) as cap:
        net(torch.randn(B, T, D))
    cache = cap.calls["attn"].args[1]
    assert isinstance(cache, Cache) and cache.keys == []  # the real forward appended to its own
    profile_captured(net, cap.calls, config=BenchmarkConfig(**FAST, **PEAKS))
    assert cap.calls["attn"].args[1] is cache and cache.keys == []  # no replay appended to it


class Holder:
    __slots__ = ("module", "t")

    def __init__(self, t: torch.Tensor, module: nn.Module) -> None:
        self.t = t
        self.module = module


def test_copy_keeps_shared_tensors_shared_and_modules_by_reference() -> None:
    t = torch.randn(3, requires_grad=True)
    lin = nn.Linear(3, 3)
    (a, nested), kw = copy_call((t, {"same": t, "held": Holder(t, lin)}), {"fn": torch.relu, "lin": lin})
    assert a is nested["same"] is nested["held"].t  # one tensor in the copy, as in the call
    assert a is not t and a.is_leaf and a.requires_grad and torch.equal(a, t.detach())
    assert nested["held"].module is lin and kw["lin"] is lin and kw["fn"] is torch.relu


def test_a_replay_copy_has_one_leaf_per_shared_input() -> None:
    t = torch.randn(2, 3, requires_grad=True)
    replay = Replay(nn.Identity(), ComponentInputs((t, [t]), {}), device=torch.device("cpu"))
    fresh = replay.fresh_inputs()
    assert len(fresh.leaves) == 1  # before: the tensor appearing twice gave two leaves
    assert fresh.args[0] is fresh.args[1][0] and fresh.args[0].grad_fn is not None  # a clone of the leaf
    assert replay.fresh_inputs().leaves[0] is not fresh.leaves[0]  # a new copy per replay


class Locked:
    """Holds a lock: ``copy.deepcopy`` cannot copy it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.scale = 2.0


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, handle: Any = None, *, cache: Any = None) -> torch.Tensor:
        return self.lin(x) * (handle or cache).scale


class LockedNet(nn.Module):
    def __init__(self, as_kwarg: bool) -> None:
        super().__init__()
        self.block = Scaled()
        self.as_kwarg = as_kwarg

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x, cache=Locked()) if self.as_kwarg else self.block(x, Locked())


@pytest.mark.parametrize(("as_kwarg", "where"), [(False, "args[1]"), (True, "kwargs['cache']")])
def test_an_object_that_cannot_be_copied_fails_its_row_naming_the_argument(as_kwarg: bool, where: str) -> None:
    report = profile_components(LockedNet(as_kwarg), (torch.randn(4, 8),), **FAST, **PEAKS)
    block = report.row("block")
    # Failed, then estimated from its child like any failed parent; the details survive.
    assert block.status == "estimated"
    assert block.error.startswith(
        f"could not copy {where} (Locked) of the captured call: TypeError: cannot pickle '_thread.lock' object"
    )
    assert block.details["unknown_leaves"] == [f"{where}: Locked"]
    assert block.fwd_flops == report.row("block.lin").fwd_flops == 2 * 4 * 8 * 8  # the child's: 512
    assert report.row("").status == "ok"


def test_snapshots_round_trip_copied_objects(tmp_path: Path) -> None:
    net = CacheNet()
    with Capture(net) as cap:
        net(torch.randn(B, T, D))
    save_snapshot(tmp_path, net, cap.calls)
    snap = load_snapshot(tmp_path)
    cache = snap.calls["attn"].args[1]
    assert type(cache) is Cache and cache.keys == []  # before: the real step's key block was in it
    assert snap.calls["attn"].modes == {"": True, "kv": True}
    assert snap.profile(**FAST, **PEAKS).row("attn").fwd_flops == ATTN_FWD


# --- per-module training flags ------------------------------------------------------------


class Frozen(nn.Module):
    """A train-mode parent with frozen ``eval()`` children (one never called)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.bn = nn.BatchNorm1d(6)
        self.drop = nn.Dropout(0.5)
        self.unused = nn.Dropout(0.5)
        self.bn.eval()
        self.drop.eval()
        self.unused.eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.bn(self.lin(x)))


def test_a_frozen_eval_child_stays_in_eval_during_its_parents_replay() -> None:
    model = Frozen()
    seen: list[tuple[bool, bool, int]] = []

    def spy(m: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> None:
        # Dropout in eval is the identity; BatchNorm in eval uses (and does not count) running stats.
        seen.append((m.training, torch.equal(out, args[0]), int(model.bn.num_batches_tracked)))

    handle = model.drop.register_forward_hook(spy)
    try:
        report = profile_components(model, (torch.randn(4, 6),), backward=False, **FAST, **PEAKS)
    finally:
        handle.remove()
    assert report.row("").status == "ok"
    # The capture forward, then the root's replays (instrumented + timed) and drop's own:
    # before, the root's replays ran `train(True)` on the subtree (dropout on, stats counted).
    assert len(seen) >= 3 and set(seen) == {(False, True, 0)}
    assert (model.training, model.bn.training, model.drop.training, model.unused.training) == (
        True, False, False, False,
    )  # fmt: skip


def test_capture_records_every_subtree_modules_flag() -> None:
    model = Frozen()
    with Capture(model) as cap:
        model(torch.randn(4, 6))
    assert cap.calls[""].modes == {"": True, "lin": True, "bn": False, "drop": False, "unused": False}
    assert cap.calls["bn"].modes == {"": False}
    assert "unused" not in cap.calls  # never called: its flag comes from the capture's start


# --- no_grad / inference_mode callers -----------------------------------------------------


class GradSpy(nn.Module):
    """Logs each forward's grad and inference modes into a list it does not own: profiling puts the
    module's own attributes back (a list attribute would be emptied again), not what they point at."""

    def __init__(self, log: list[tuple[bool, bool]]) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.log = log.append

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.log((torch.is_grad_enabled(), torch.is_inference_mode_enabled()))
        return self.lin(x)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_no_grad_and_inference_mode_callers_get_a_forward_only_profile(mode: str) -> None:
    modes: list[tuple[bool, bool]] = []
    model = GradSpy(modes)
    context = torch.no_grad() if mode == "no_grad" else torch.inference_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with context:
            x = torch.randn(3, 8)  # an inference tensor under inference_mode
            report = profile_components(model, (x,), **FAST, **PEAKS)
    ours = [w for w in caught if str(w.message).startswith("cb_callback:")]
    assert len(ours) == 1 and f"torch.{mode}()" in str(ours[0].message)
    assert report.metadata["grad_mode"] == (
        f"profile_components was called under torch.{mode}(): profiled the forward only (backward=False), "
        "replayed without grad; for backward numbers call it outside no_grad/inference_mode"
    )
    for path in ("", "lin"):
        row = report.row(path)
        assert row.status == "ok", row.error  # before, under inference_mode: every row failed
        assert row.fwd_flops == 2 * 3 * 8 * 4  # 192
        assert row.bwd_flops != row.bwd_flops  # NaN: no backward profiled
    # The capture forward ran in the caller's mode; every replay without grad, outside inference mode.
    assert modes[0] == (False, mode == "inference_mode")
    assert set(modes[1:]) == {(False, False)}


# --- capture hooks never raise into the real step ----------------------------------------


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x.squeeze(0))


class Stack(nn.Module):
    """Only ``block``'s input is 3-D: (1, 3, 6)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin1 = nn.Linear(8, 6)
        self.block = Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.lin1(x).unsqueeze(0))


@pytest.mark.parametrize(
    "error", [torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB"), RuntimeError("boom")]
)
def test_a_clone_that_raises_marks_the_component_and_the_step_goes_on(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    model = Stack()
    x = torch.randn(3, 8)
    expected = model(x)
    real_copy = inputs_mod._copy_tensor

    def copy_tensor(t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 3:
            raise error
        return real_copy(t)

    monkeypatch.setattr(inputs_mod, "_copy_tensor", copy_tensor)
    with Capture(model) as cap:
        out = model(x)  # before: the error came out of the forward
    assert torch.equal(out, expected)
    text = f"could not copy args[0] (Tensor) of the captured call: {type(error).__name__}: {error}"
    assert cap.calls["block"].capture_error == text
    assert cap.calls["block"].unknown_leaves == []  # the tensor is copyable, memory was short
    monkeypatch.setattr(inputs_mod, "_copy_tensor", real_copy)
    report = profile_captured(model, cap.calls, config=BenchmarkConfig(**FAST, **PEAKS))
    block = report.row("block")
    assert block.status == "estimated" and block.error.startswith(text)
    assert block.fwd_flops == 2 * 3 * 6 * 5  # block.lin's: 180
    assert report.row("").status == "ok" and report.row("block.lin").status == "ok"


class NoCopies:
    scale = 3.0

    def __deepcopy__(self, memo: dict[int, Any]) -> NoCopies:
        raise RuntimeError("no copies of me")


def test_an_object_whose_deepcopy_raises_never_breaks_the_forward() -> None:
    model = LockedNet(as_kwarg=False)
    x = torch.randn(2, 8)
    handle = NoCopies()
    expected = model.block(x, handle)
    with Capture(model.block) as cap:
        out = model.block(x, handle)
    assert torch.equal(out, expected)  # 2 * 8 -> 8, times 3.0
    assert cap.calls[""].capture_error == (
        "could not copy args[1] (NoCopies) of the captured call: RuntimeError: no copies of me; "
        "each replay needs its own copy of the call (give NoCopies a working __deepcopy__)"
    )
    assert cap.calls[""].unknown_leaves == ["args[1]: NoCopies"]
    assert not cap.active


class _FrozenEncoderNet(nn.Module):
    """An encoder the real step runs under ``no_grad`` (frozen), then a trained head."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(8, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            h = self.encoder(x)
        return self.head(h)


def test_a_component_the_step_ran_under_no_grad_has_no_backward() -> None:
    report = profile_components(
        _FrozenEncoderNet(),
        (torch.randn(4, 8),),
        min_run_time_s=0.0,
        min_repeats=2,
        max_repeats=2,
        rounds=1,
        descend="all",  # both rows replayed whatever the in-situ times (a busy machine's triage left one in situ)
    )
    enc, head = report.row("encoder"), report.row("head")
    assert enc.status == "ok" and enc.bwd_ms == 0.0 and enc.bwd_flops == 0.0
    assert enc.details["no_backward"] == "replayed without grad, as the real step ran it (no_grad)"
    # the head's backward: grad of W (2*4*8*2 = 128) only, its input does not require grad
    assert head.bwd_flops == 128.0
    assert head.fwd_flops == 128.0  # 2 * 4 * 8 * 2
