"""StateGuard restores the plain Python attributes a forward changes (counters, lists, dicts, tensors held there).

Profiling replays a model's modules many times; a forward that advances ``self.t`` or appends
to ``self.seen`` must leave them as the training step left them, or training changes.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from cb_callback import ComponentBenchmark, profile_components
from cb_callback.plugins import StateGuard
from tests._callback_models import MLPModule, run_fit
from tests.conftest import FAST

# Every forward of the models below appends here: a module-level global, which the guard does
# not restore (documented), so the tests can count the forwards profiling ran.
FORWARDS: list[str] = []


class Counter(nn.Module):
    """A warm-up counter (``self.t += 1`` in training) that changes the computation, and other plain values."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.t = 0
        self.scale = 1.0
        self.phase = "warm"
        self.shape_seen: tuple[int, ...] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        FORWARDS.append("counter")
        if self.training:
            self.t += 1
            self.scale = min(1.0, self.t / 10)
            self.phase = "warm" if self.t < 10 else "done"
            self.shape_seen = tuple(x.shape)
        return self.fc(x) * self.scale


class Appender(nn.Module):
    """Appends to a list, fills a dict cache and a nested list, adds an attribute and deletes another."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.seen: list[int] = [8]
        self.cache: dict[str, Any] = {"a": 1}
        self.history: dict[str, list[int]] = {"batch": [8]}
        self.tags = {"x"}
        self.flag = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        FORWARDS.append("appender")
        self.seen.append(x.shape[0])
        self.cache[f"call{len(self.seen)}"] = x.shape
        self.history["batch"].append(x.shape[0])
        self.tags.add(f"y{len(self.seen)}")
        self.added_in_forward = len(self.seen)
        if hasattr(self, "flag"):
            del self.flag
        return self.fc(x)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.counter = Counter()
        self.appender = Appender()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.appender(self.counter(x))


def test_a_counter_and_plain_values_are_restored_exactly_after_profile_components() -> None:
    model = Net()
    model(torch.randn(8, 4))  # the real step: t = 1
    c = model.counter
    before = (c.t, c.scale, c.phase, c.shape_seen)
    assert before == (1, 0.1, "warm", (8, 4))
    FORWARDS.clear()

    report = profile_components(model, (torch.randn(8, 4),), descend="all", **FAST)

    assert all(r.status == "ok" for r in report)
    assert [r.path for r in report] == ["", "counter", "appender", "counter.fc", "appender.fc"]
    # the capture forward and the replays of "" and "counter" ran Counter.forward (each advancing t) ...
    assert FORWARDS.count("counter") >= 3
    # ... and every value is the one the real step left, of the same type
    assert (c.t, c.scale, c.phase, c.shape_seen) == before
    assert type(c.t) is int and type(c.scale) is float


def test_a_list_appending_module_gets_its_containers_back_in_the_same_objects() -> None:
    model = Net()
    a = model.appender
    seen, cache, history, batches, tags = a.seen, a.cache, a.history, a.history["batch"], a.tags
    FORWARDS.clear()

    profile_components(model, (torch.randn(8, 4),), descend="all", **FAST)

    assert FORWARDS.count("appender") >= 3  # capture, replays of "" and "appender"
    # the same objects (references held elsewhere see the restored items), with the items of entry
    assert a.seen is seen and seen == [8]
    assert a.cache is cache and cache == {"a": 1}
    assert a.history is history and history["batch"] is batches and batches == [8]
    assert a.tags is tags and tags == {"x"}
    assert not hasattr(a, "added_in_forward")  # added while profiling: removed
    assert a.flag is True  # deleted while profiling: put back


def test_attributes_rebound_added_and_deleted_inside_the_guard_come_back() -> None:
    m = nn.Linear(2, 2)
    m.order = collections.OrderedDict(a=1, b=2)
    m.queue = collections.deque([1, 2])
    m.raw = bytearray(b"ab")
    m.pair = ([1], 2)  # a tuple is immutable, the list it holds is not
    m.obj = object()
    obj, pair = m.obj, m.pair
    with StateGuard(m):
        m.order.move_to_end("a")
        m.order["c"] = 3
        m.queue.appendleft(0)
        m.raw += b"c"
        m.pair[0].append(9)
        m.obj = object()
        m.in_features = 7
        m.new = 1
        del m.out_features
    assert list(m.order.items()) == [("a", 1), ("b", 2)]  # the order too
    assert list(m.queue) == [1, 2] and m.raw == bytearray(b"ab")
    assert m.pair is pair and pair[0] == [1]
    assert m.obj is obj  # any object: its reference
    assert (m.in_features, m.out_features) == (2, 2) and not hasattr(m, "new")


def test_torch_own_tables_are_left_alone() -> None:
    """Hooks and submodules registered inside the guard stay: only the module's own attributes are restored."""
    m = nn.Sequential(nn.Linear(2, 2))
    with StateGuard(m):
        handle = m.register_forward_hook(lambda mod, args, out: None)
    assert len(m._forward_hooks) == 1
    handle.remove()


def test_a_tensor_held_in_a_plain_attribute_and_written_in_place_is_restored() -> None:
    class Steps(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.count = torch.zeros(())  # not a buffer: a plain attribute
            self.last: torch.Tensor | None = None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.count += 1  # in place: the same tensor, version bumped
            self.last = x  # rebound
            return self.fc(x) * (1 + self.count)

    m = Steps()
    count, last = m.count, m.last
    profile_components(m, (torch.randn(8, 4),), descend="all", **FAST)
    assert m.count is count and float(count) == 0.0 and m.last is last
    with StateGuard(m) as guard:
        assert guard.copied_bytes() == {"cpu": 4}  # the 0-d fp32 count (the weights are not copied)


def test_a_large_tensor_attribute_written_in_place_is_named() -> None:
    m = nn.Linear(2, 2)
    m.table = torch.zeros(512, 1024)  # 2 MiB fp32: over the 1 MiB the guard copies
    warning = r"1 tensor\(s\) held in plain module attributes.*\(table\)"
    with pytest.warns(RuntimeWarning, match=warning), StateGuard(m) as guard:
        assert guard.copied_bytes() == {}
        m.table.add_(1.0)
    assert float(m.table[0, 0]) == 1.0  # documented: kept the changed value


# --- Lightning: training with the callback equals training without it --------------------


class WarmupModule(MLPModule):
    """An MLP whose head's input is scaled by a warm-up counter advanced in every training forward."""

    def __init__(self) -> None:
        super().__init__(validate=False)
        self.t = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.t += 1
        return self.head(self.encoder(x) * min(1.0, self.t / 10))


def test_lightning_training_with_a_counter_is_bit_identical_with_the_callback(tmp_path: Path) -> None:
    base_trainer, base, base_losses = run_fit(tmp_path / "base", model_cls=WarmupModule, max_steps=4)
    cb = ComponentBenchmark(capture_step=1, mode="pause", peak_flops=1e11, peak_bandwidth=1e10, **FAST)
    trainer, model, losses = run_fit(tmp_path / "cb", [cb], model_cls=WarmupModule, max_steps=4)

    assert cb.report is not None and cb.report.row("").status == "ok"  # it profiled (replaying forward)
    assert base.t == model.t == 4  # one training forward per step
    assert len(losses.losses) == len(base_losses.losses) == 4
    for i, (a, b) in enumerate(zip(base_losses.losses, losses.losses, strict=True)):
        assert torch.equal(a, b), f"loss of step {i} differs: {a.item()!r} != {b.item()!r}"
    sa, sb = base.state_dict(), model.state_dict()
    assert list(sa) == list(sb)
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key
    oa, ob = base_trainer.optimizers[0].state_dict()["state"], trainer.optimizers[0].state_dict()["state"]
    assert oa.keys() == ob.keys()
    for idx in oa:  # Adam's step, exp_avg, exp_avg_sq
        for name, value in oa[idx].items():
            assert torch.equal(value, ob[idx][name]), (idx, name)
