"""A replay puts each module in the mode its call ran in, and assigns only the flags that differ.

The forward's timed region holds this (``_metrics/latency.py`` times ``Replay.forward``) while the harness
floor's identity has one module: assigning every flag of a subtree (``Module.__setattr__``, about 1 µs
each) read a third of a 30-block MLP's forward into its ``fwd_ms``. Counted here, not timed.
"""

from __future__ import annotations

import torch
from torch import nn

from cb_callback._engine.capture.inputs import ComponentInputs
from cb_callback._engine.replay.isolate import Replay

CPU = torch.device("cpu")


class Counted(nn.Module):
    """A Linear that counts the ``training`` assignments made to it and the ``train()`` calls."""

    def __init__(self, *children: nn.Module) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.parts = nn.ModuleList(children)
        self.__dict__["assigned"] = 0
        self.__dict__["trains"] = 0

    def __setattr__(self, name: str, value: object) -> None:
        if name == "training":
            self.__dict__["assigned"] += 1
        super().__setattr__(name, value)

    def train(self, mode: bool = True) -> Counted:
        self.__dict__["trains"] += 1
        return super().train(mode)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.lin(x)
        for part in self.parts:
            x = part(x)
        return x


def _assigned(*modules: Counted) -> list[int]:
    return [m.assigned for m in modules]


def test_only_the_flags_that_differ_are_assigned_and_each_module_replays_in_its_mode() -> None:
    a, b = Counted(), Counted()
    root = Counted(a, b)
    # The step ran the root and a in training, b in eval (a frozen part): the modes the capture records.
    inputs = ComponentInputs(
        (torch.randn(2, 3),), {}, training=True, modes={"": True, "parts.0": True, "parts.1": False}
    )
    replay = Replay(root, inputs, device=CPU)
    before = _assigned(root, a, b)  # nn.Module.__init__ set each flag once
    replay.forward()
    # Everything is in training now: b alone differs, and is assigned once.
    assert [n - m for n, m in zip(_assigned(root, a, b), before, strict=True)] == [0, 0, 1]
    assert (root.training, a.training, b.training) == (True, True, False)
    settled = _assigned(root, a, b)
    for _ in range(3):
        replay.forward()
    assert _assigned(root, a, b) == settled  # nothing differs: no assignment in the timed forwards
    a.eval()  # the user's forward (or a hook) left a in eval: the next replay puts it back, that flag alone
    moved = _assigned(root, a, b)
    replay.forward()
    assert [n - m for n, m in zip(_assigned(root, a, b), moved, strict=True)] == [0, 1, 0]
    assert a.training and not b.training


def test_a_capture_without_per_module_modes_calls_train_only_when_a_module_is_in_another_mode() -> None:
    a = Counted()
    root = Counted(a)
    inputs = ComponentInputs((torch.randn(2, 3),), {}, training=False)  # no modes: a capture before them
    replay = Replay(root, inputs, device=CPU)
    replay.forward()
    assert root.trains == 1 and not root.training and not a.training  # train(False), the user's override run
    for _ in range(3):
        replay.forward()
    assert root.trains == 1  # every module in eval already: no call
    a.train()
    replay.forward()
    assert root.trains == 2 and not a.training
