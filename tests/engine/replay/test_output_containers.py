"""A component's output in a container pytree does not know still has its backward replayed.

The step's loss reads the tensors of whatever the model returns; the replay differentiates the output's
leaves (``flatten_output``). Containers pytree leaves whole (a ``dict``/``OrderedDict`` subclass such as a
hand-written ``ModelOutput``, a ``list`` subclass, a plain object holding tensors) had no leaves: the root
read ``bwd_ms`` 0 and its MFU from the forward alone, beside a child whose backward was measured.
"""

from __future__ import annotations

import collections
import dataclasses
import typing

import pytest
import torch
from torch import nn

from cb_callback import profile_components
from cb_callback._engine.replay.isolate import flatten_output
from tests.conftest import FAST


class ODSub(collections.OrderedDict):  # type: ignore[type-arg]
    pass


class DictSub(dict):  # type: ignore[type-arg]
    pass


class ListSub(list):  # type: ignore[type-arg]
    pass


class Plain:
    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits
        self.note = "kept as a leaf"


class Named(typing.NamedTuple):
    logits: torch.Tensor


@dataclasses.dataclass
class Data:
    logits: torch.Tensor


WRAPS: dict[str, typing.Callable[[torch.Tensor], object]] = {
    "tuple": lambda y: (y,),
    "NamedTuple": Named,
    "dataclass": Data,
    "OrderedDict subclass": lambda y: ODSub(logits=y),
    "dict subclass": lambda y: DictSub(logits=y),
    "list subclass": lambda y: ListSub([y]),
    "plain object": Plain,
}


class Wrapped(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.l = nn.Linear(8, 8)
        self.kind = kind

    def forward(self, x: torch.Tensor) -> object:
        return WRAPS[self.kind](self.l(x))


@pytest.mark.parametrize("kind", list(WRAPS))
def test_the_tensor_inside_any_container_is_a_leaf(kind: str) -> None:
    y = torch.randn(2, 3)
    leaves = [x for x in flatten_output(WRAPS[kind](y))[0] if isinstance(x, torch.Tensor)]
    assert len(leaves) == 1 and leaves[0] is y


def test_the_structure_names_what_was_opened_and_tells_containers_apart() -> None:
    y = torch.randn(2)
    a, b = flatten_output(DictSub(logits=y)), flatten_output(DictSub(loss=y))
    assert a[0] == b[0] == [y] and a[1] != b[1]  # other keys: another structure
    assert flatten_output(Plain(y))[0] == [y, "kept as a leaf"]  # its attributes, in order
    assert flatten_output(ListSub([y, 1]))[1] != flatten_output([y, 1])[1]  # the subclass is named


def test_a_container_inside_itself_stays_one_leaf() -> None:
    cyc = Plain(torch.randn(2))
    cyc.me = cyc  # type: ignore[attr-defined]
    leaves = flatten_output(cyc)[0]
    # Its own attributes opened once: the tensor, the note, then itself again, kept whole.
    assert len(leaves) == 3 and leaves[2] is cyc
    module = nn.Linear(2, 2)
    assert flatten_output(Plain(module.weight).__dict__ | {"m": module})[0][-1] is module  # a module is a leaf


@pytest.mark.parametrize("kind", list(WRAPS))
def test_the_roots_backward_is_replayed_whatever_holds_its_output(kind: str) -> None:
    torch.manual_seed(0)
    report = profile_components(Wrapped(kind), (torch.randn(4, 8),), descend="all", **FAST)
    root, lin = report.row(""), report.row("l")
    # Linear(8, 8) on a (4, 8) input that needs no grad: the backward is the weight's gradient alone,
    # 2 · 4 · 8 · 8 = 512 FLOPs, in the root as in the child.
    assert lin.bwd_flops == 512.0
    assert root.bwd_flops == 512.0 and root.bwd_ms > 0.0, (root.bwd_flops, root.details.get("no_backward"))
    assert "no_backward" not in root.details


@dataclasses.dataclass
class Node2:
    """Two fields pointing at one next level: 2^depth paths to the tensor at the bottom."""

    a: object
    b: object


def test_a_container_met_twice_is_opened_once_so_shared_structure_stays_small() -> None:
    y = torch.randn(2)
    out: object = (y,)
    for _ in range(18):
        out = Node2(out, out)
    # Opened along every path, depth 18 gave 2^18 = 262 144 leaves and took seconds per call. Each level is
    # now opened once, at its first path: levels 18 to 2 each keep their second field (the level below, met
    # again) whole, 17 leaves; level 1's two fields are the bottom tuple, a pytree container flattened at
    # each: its tensor twice. 17 + 2 = 19.
    leaves = flatten_output(out)[0]
    assert [x is y for x in leaves if isinstance(x, torch.Tensor)] == [True, True] and len(leaves) == 19


def test_objects_without_tensors_and_unreadable_ones_stay_leaves() -> None:
    import logging

    class WithLogger:
        def __init__(self, y: torch.Tensor) -> None:
            self.logits = y
            self.log = logging.getLogger("torch")  # its attributes hold no tensor: not opened

    class Unreadable(dict):  # type: ignore[type-arg]
        def __getitem__(self, key: object) -> object:
            raise RuntimeError("no item for you")

    y = torch.randn(2)
    leaves = flatten_output(WithLogger(y))[0]
    assert len(leaves) == 2 and leaves[0] is y and isinstance(leaves[1], logging.Logger)
    broken = Unreadable(logits=y)
    assert flatten_output(broken)[0] == [broken]  # its keys are listed, its items raise: kept whole
