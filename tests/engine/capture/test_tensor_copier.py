"""The one tensor copier of every copy of a call: what a copy of a grad-requiring tensor is held as."""

from __future__ import annotations

from typing import Literal

import pytest
import torch

from cb_callback._engine.capture.inputs import copy_call, tensor_copier


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    leaf = torch.ones(2, requires_grad=True)
    upstream = leaf * 2  # a non-leaf that requires grad
    plain = torch.arange(3)
    return leaf, upstream, plain


@pytest.mark.parametrize(
    ("leaf", "as_leaf"),
    # (leaf input, non-leaf input): whether each copy is a leaf
    [("always", (True, True)), ("as_given", (True, False)), ("never", (False, False))],
)
def test_a_grad_copy_is_a_leaf_as_the_rule_says_and_its_leaf_is_recorded(
    leaf: Literal["always", "as_given", "never"], as_leaf: tuple[bool, bool]
) -> None:
    a, b, c = _inputs()
    leaves: list[torch.Tensor] = []
    copy = tensor_copier(leaf=leaf, leaves=leaves)
    ca, cb, cc = copy(a), copy(b), copy(c)
    assert (ca.is_leaf, cb.is_leaf) == as_leaf
    assert ca.requires_grad and cb.requires_grad and not cc.requires_grad
    assert torch.equal(ca, a) and torch.equal(cb, b) and torch.equal(cc, c)
    assert all(t is not s for t, s in ((ca, a), (cb, b), (cc, c)))
    assert len(leaves) == 2 and all(t.is_leaf and t.requires_grad for t in leaves)  # a's and b's, in order
    (ca.sum() + cb.sum()).backward()
    assert [t.grad.tolist() for t in leaves if t.grad is not None] == [[1.0, 1.0], [1.0, 1.0]]
    assert a.grad is None  # the original is untouched


def test_kept_tensors_are_the_same_object_in_the_copy() -> None:
    weight = torch.nn.Parameter(torch.ones(2))
    x = torch.zeros(2)
    (w, y), kw = copy_call((weight, x), {"by": {"w": weight}}, tensor_copier(leaf="as_given", keep=[weight]))
    assert w is weight and kw["by"]["w"] is weight and y is not x
