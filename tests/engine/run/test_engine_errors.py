"""The engine's own answers to bad input and to a spent budget: clear, and true."""

from __future__ import annotations

import re
import time

import pytest
import torch
from torch import nn

from cb_callback import profile_components
from tests.conftest import FAST


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_on_a_machine_without_it_is_a_value_error_naming_the_fix() -> None:
    # before: torch's AssertionError ("Torch not compiled with CUDA enabled") from module.to
    with pytest.raises(
        ValueError, match=r"device='cuda': CUDA is not available: torch .* is built without CUDA .*; use device='cpu'"
    ):
        profile_components(nn.Linear(2, 2), torch.randn(1, 2), device="cuda")


def test_the_budget_note_says_what_was_spent_and_what_was_committed() -> None:
    model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(4)])
    t0 = time.perf_counter()
    report = profile_components(model, torch.randn(4, 16), max_total_time_s=0.001, **{**FAST, "min_run_time_s": 0.05})
    wall = time.perf_counter() - t0
    skipped = [r for r in report.rows if r.status == "skipped"]
    assert [r.path for r in skipped] == ["0", "1", "2", "3"]  # the root is always measured
    note = skipped[0].note or ""
    m = re.fullmatch(
        r"max_total_time_s=0.001 reached: (\d+\.\d\d) s spent profiling so far and (\d+\.\d\d) s more committed "
        r"to the timed runs of the 1 component started before it \(at least their timing budget each\)",
        note,
    )
    assert m is not None, note
    # what it says was spent happened inside this call (before: spent + committed, read as "elapsed",
    # could exceed the whole process's run time)
    assert float(m.group(1)) <= wall
    # the root's timing budget: min_run_time_s per pass, forward and backward: 2 x 0.05 s at least
    assert float(m.group(2)) >= 0.10
