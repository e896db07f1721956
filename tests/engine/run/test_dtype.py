"""The dtype whose peak MFU divides by: the option, else the autocast the replays run under, else the weights'.

docs/options.md: ``dtype=None`` is "autocast's, else the parameters'". Before, autocast was not read: a
Linear profiled under ``torch.autocast("cpu", dtype=torch.bfloat16)`` ran its replays in bf16 and was
judged against the fp32 peak (an MFU of 2.97, 297 %, on this machine).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from cb_callback import BenchmarkConfig
from cb_callback._engine.run.preparation import infer_dtype

CPU = torch.device("cpu")


def test_the_option_comes_first_then_autocast_then_the_parameters() -> None:
    model = nn.Linear(2, 2)
    plain = BenchmarkConfig()
    assert infer_dtype(model, CPU, plain) == "fp32"
    assert infer_dtype(nn.Linear(2, 2).double(), CPU, plain) == "fp64"
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the caller's, around profile_components
        assert infer_dtype(model, CPU, plain) == "bf16"
        assert infer_dtype(model, CPU, BenchmarkConfig(dtype="fp32")) == "fp32"  # the option wins
        # Autocast casts float32 alone: a float64 model under it computes in float64 (a reviewer's case:
        # judged by the bf16 peak, its MFU read 8x low).
        assert infer_dtype(nn.Linear(2, 2).double(), CPU, plain) == "fp64"

    # The step's precision, entered around each replay (a "bf16-mixed" snapshot, the callback's fork child).
    def mixed() -> contextlib.AbstractContextManager[object]:
        return torch.autocast("cpu", dtype=torch.bfloat16)

    assert infer_dtype(model, CPU, plain, mixed) == "bf16"
    assert infer_dtype(model, CPU, plain, contextlib.nullcontext) == "fp32"
    assert not torch.is_autocast_enabled("cpu")  # read inside the context, which is left again


def test_a_profile_under_autocast_is_judged_by_its_peak() -> None:
    from cb_callback import profile_components
    from tests.conftest import FAST

    with torch.autocast("cpu", dtype=torch.bfloat16):
        report = profile_components(nn.Linear(8, 8), (torch.randn(4, 8),), **FAST)
    assert report.metadata["dtype"] == "bf16"
