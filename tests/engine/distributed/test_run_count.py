"""Counting a run's collectives without a dispatch mode (process groups' sequence numbers), on a 1-rank gloo
group in this process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from cb_callback._engine.distributed.comm import CommCounter, RunCount, issued_collectives


@pytest.fixture
def group(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _run(n: int) -> None:
    t = torch.ones(4)
    for _ in range(n):
        dist.all_reduce(t)


def test_a_run_is_counted_by_sequence_numbers_with_no_dispatch_mode_on_its_ops(group: None) -> None:
    before = issued_collectives()
    assert before is not None
    _run(3)
    assert issued_collectives() == before + 3  # every all-reduce counted on the default group
    # the reference run's record: 4 all-reduces (as a keep counter writes them down)
    reference = CommCounter(keep=True)
    with reference:
        _run(4)
    assert len(reference.kept) == 4
    modes: list[int] = []
    count = RunCount()
    with count:
        modes.append(len(_get_current_dispatch_mode_stack()))
        _run(1)  # a run that raised after its first all-reduce
    assert modes == [0]  # nothing between the run's ops and the dispatcher
    assert count.rest(reference.kept) == reference.kept[1:]  # the 3 the others still wait for
