"""A nested tensor among the inputs: its batch is its component count, and profiling goes on.

``leading_batch_size`` read ``shape[0]``, which a strided nested tensor refuses ("NestedTensorImpl doesn't
support sizes"): ``profile_components`` raised out of the capture instead of reporting; the byte count keyed
tensors by their strides, and the root's pass raised the same.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from cb_callback import profile_components
from cb_callback._engine.capture.inputs import leading_batch_size
from tests.conftest import FAST


def _nested(*lengths: int, layout: torch.layout = torch.strided) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "the PyTorch API of nested tensors is in prototype stage"
        return torch.nested.nested_tensor([torch.randn(n, 8) for n in lengths], layout=layout)


class PerSequence(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(8, 4)

    def forward(self, nt: torch.Tensor) -> torch.Tensor:
        return torch.nested.as_nested_tensor([self.l(t) for t in nt.unbind()])  # keeps the graph


def test_the_batch_of_a_nested_tensor_is_its_component_count() -> None:
    assert leading_batch_size((_nested(2, 3, 5),)) == 3
    assert leading_batch_size({"x": _nested(2, 3, layout=torch.jagged)}) == 2


def test_a_model_taking_a_nested_tensor_is_profiled_without_raising() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        report = profile_components(PerSequence(), (_nested(2, 3),), descend="all", **FAST)
    lin = report.row("l")
    # The Linear runs once per sequence (2 calls) on dense tensors: measured like any Linear.
    assert lin.status == "ok" and lin.calls == 2
    root = report.row("")
    assert root.status == "ok", root.error  # its bytes counted too (a nested tensor has no strides)
    # Its bytes, by op, those derivable by hand: each addmm reads its (n, 8) input, the (4, 8) weight and the
    # bias (4) and writes (n, 4): 4 · [(16 + 32 + 4 + 8) + (24 + 32 + 4 + 12)] = 528 B for n = 2 and 3;
    # packing the two (n, 4) outputs into the nested result reads and writes 2·4 + 3·4 = 20 floats: 160 B.
    ops = root.details["top_bytes_ops"]
    assert (ops["aten.addmm"], ops["aten._nested_tensor_from_tensor_list"]) == (528, 160)
    # Its backward runs (a nested output's gradient: ones like it): the weight's gradient per sequence,
    # 2 · n · 8 · 4 for n = 2 and 3 = 128 + 192 = 320 FLOPs, as the child's two calls.
    assert root.bwd_flops == lin.bwd_flops * lin.calls == 320.0 and root.bwd_ms > 0.0
