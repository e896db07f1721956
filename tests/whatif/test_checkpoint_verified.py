"""The checkpointing plan verified by real training steps, before and after: a GPT and a DLRM-like model.

Each model is profiled (``descend="all"``), planned, wrapped with :meth:`CheckpointPlan.apply`, and one
real training step (forward, loss, backward) is measured both ways on the same model object:

- the peak: the torch profiler's CPU allocation events of the step, the peak of ``total_allocated``
  above the level before the first event (the memory metric's own rule, ``_peak_of_cpu_events``); the
  gradients are set to None before the profiler starts, so every event of the step is its own;
- the time: ``ROUNDS`` interleaved rounds (unwrapped, then wrapped: the plan applied and removed each
  round), the median of the per-round differences. The noise the prediction is held to (with 25 % of
  the prediction on top) is their IQR, plus the chosen rows' ``fwd_iqr_ms``, plus the drift of the
  machine's speed between the profile and the steps (the plain step's median against the root's
  ``total_ms``, times the prediction).

Both run on one thread (``torch.set_num_threads(1)``): on a shared 2-CPU machine an op split over two
threads waits for the slower one whenever another process runs, which swings a step by 2-5x; one thread
is slowed only by its own share of the CPU.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile

from cb_callback import CheckpointPlan, Report, plan_checkpointing, profile_components
from cb_callback._metrics.memory import _allocation_events, _peak_of_cpu_events
from tests._zoo_models import GPT

pytestmark = pytest.mark.slow  # a profile and 20 timed steps per model: 10-30 s each on a shared 2-CPU VM

MIB = 1024 * 1024
ROUNDS = 9
PEAKS: dict[str, Any] = dict(peak_flops=1e12, peak_bandwidth=1e11)
#: Medians of a few timed runs per row: the recompute is priced by fwd_ms.
TIMED: dict[str, Any] = dict(warmup=1, min_repeats=5, max_repeats=9, min_run_time_s=0.0, load_plugins=False)

Step = Callable[[nn.Module], torch.Tensor]


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class ResMLP(nn.Module):
    """``x + fc2(relu(fc1(x)))``: what it holds for the backward is its hidden ``relu`` output, nothing it returns."""

    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.relu(self.fc1(x)))


class DLRMLike(nn.Module):
    """Sum-pooled embedding bags, a dense arch of residual MLP blocks, concatenation, an over arch."""

    def __init__(self, tables: int = 4, rows: int = 1000, dim: int = 64, dense: int = 128, hidden: int = 512) -> None:
        super().__init__()
        self.tables = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))
        self.dense_in = nn.Linear(dense, dense)
        self.dense_arch = nn.Sequential(*(ResMLP(dense, hidden) for _ in range(4)))
        self.dense_out = nn.Linear(dense, dim)
        self.over = nn.Sequential(nn.Linear(dim * (tables + 1), 256), nn.ReLU(), nn.Linear(256, 1))

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        x = self.dense_out(self.dense_arch(self.dense_in(dense)))
        pooled = [t(ids[i]) for i, t in enumerate(self.tables)]
        return self.over(torch.cat([x, *pooled], dim=1)).squeeze(1)


def _peak_bytes(model: nn.Module, step: Step) -> int:
    model.zero_grad(set_to_none=True)
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with prof:
        step(model)
    return _peak_of_cpu_events(_allocation_events(prof, torch.device("cpu")))


def _timed(model: nn.Module, step: Step) -> float:
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    step(model)
    return (time.perf_counter() - start) * 1e3


def _added_ms(model: nn.Module, plan: CheckpointPlan, step: Step) -> tuple[float, float, float]:
    """``(median added ms, IQR of the per-round differences, median plain step ms)`` over ``ROUNDS`` rounds."""
    _timed(model, step)  # warm-up
    diffs, plains = [], []
    for _ in range(ROUNDS):
        plains.append(_timed(model, step))
        with plan.apply(model):
            wrapped = _timed(model, step)
        diffs.append(wrapped - plains[-1])
    q = statistics.quantiles(diffs, n=4)
    return statistics.median(diffs), q[2] - q[0], statistics.median(plains)


def _same_step(model: nn.Module, plan: CheckpointPlan, step: Step) -> None:
    """The wrapped model's loss and gradients are the unwrapped one's, bit for bit."""
    reference = copy.deepcopy(model)
    with plan.apply(model):
        model.zero_grad(set_to_none=True)
        loss = step(model)
    reference.zero_grad(set_to_none=True)
    loss_ref = step(reference)
    assert torch.equal(loss, loss_ref)
    grads = {n: p.grad for n, p in model.named_parameters()}
    for name, p in reference.named_parameters():
        assert p.grad is not None and torch.equal(grads[name], p.grad), name


def _verify(model: nn.Module, report: Report, plan: CheckpointPlan, step: Step) -> dict[str, float]:
    """Measure the plan on real steps and hold it to its prediction; returns the numbers (for the docs)."""
    assert plan.reached and plan.modules
    _same_step(model, plan, step)
    before = statistics.median(_peak_bytes(model, step) for _ in range(3))
    with plan.apply(model):
        after = statistics.median(_peak_bytes(model, step) for _ in range(3))
    saved = before - after
    assert abs(saved - plan.peak_saved_bytes) <= 0.25 * plan.peak_saved_bytes, (
        saved / MIB,
        plan.peak_saved_bytes / MIB,
    )
    added, spread, plain = _added_ms(model, plan, step)
    own = sum((report.row(p).details.get("fwd_iqr_ms") or 0.0) for p in plan.modules)
    # the machine's speed between the profile and these steps (other jobs come and go): the plain step against
    # the root's own fwd + bwd in the report, the same work timed on the report's clock
    drift = abs(plain / report.row("").total_ms - 1.0) * plan.extra_ms
    noise = spread + own + drift
    assert abs(added - plan.extra_ms) <= noise + 0.25 * plan.extra_ms, (added, plan.extra_ms, noise)
    return {"peak_before_mib": round(before / MIB, 2), "peak_after_mib": round(after / MIB, 2),
            "added_ms": round(added, 1), "noise_ms": round(noise, 1), "drift_ms": round(drift, 1)}  # fmt: skip


def test_a_gpt_plan_saves_the_predicted_peak_at_the_predicted_time() -> None:
    torch.manual_seed(0)
    model = GPT(vocab=96, block_size=128, d=128, n_layer=4)
    idx = torch.randint(0, 96, (8, 129), generator=torch.Generator().manual_seed(1))
    args = (idx[:, :-1].contiguous(), idx[:, 1:].contiguous())
    report = profile_components(model, args, descend="all", **TIMED, **PEAKS)
    blocks = [f"blocks.{i}" for i in range(4)]
    # every block's activations: only the four blocks reach it (a block holds 7.59 MiB, its attention, MLP and
    # norms 6.10 together: the residual adds' and the mask's share is the block's own)
    need = sum(round(report.row(b).activation_mb * MIB) for b in blocks)
    plan = plan_checkpointing(report, save_bytes=need)
    assert set(blocks) <= set(plan.modules)  # and at most a few KiB more (a LayerNorm) if a frontier was thinned
    assert all(plan.candidates[p].saved_bytes < MIB for p in set(plan.modules) - set(blocks))
    assert plan.refused["blocks"].startswith("never called itself")

    def step(m: nn.Module) -> torch.Tensor:
        _, loss = m(*args)  # the attention mask is a keyword argument of each block: it passes through the checkpoint
        loss.backward()
        return loss.detach()

    print(
        plan.table().split("  refused")[0], _verify(model, report, plan, step)
    )  # the numbers docs/whatif.md shows (pytest -s)


def test_a_dlrm_plan_fits_a_budget_with_the_predicted_peak_and_time() -> None:
    torch.manual_seed(0)
    model = DLRMLike()
    gen = torch.Generator().manual_seed(1)
    # 2048 samples: activations (4 MiB per block) well above the 3 MiB of gradients the backward allocates
    args = (torch.randn(2048, 128, generator=gen), torch.randint(0, 1000, (4, 2048, 8), generator=gen))
    report = profile_components(model, args, descend="all", **TIMED, **PEAKS)
    root_peak = round(report.row("").peak_mem_mb * MIB)
    # 10 MiB off the peak: three of the four residual blocks (4 MiB each; which three, the times decide), not the
    # ReLU of the over arch (refused), not the whole dense arch (its position would keep its own peak: nothing off)
    plan = plan_checkpointing(report, memory_budget_bytes=root_peak - 10 * MIB)
    blocks = [p for p in plan.modules if p.startswith("dense_arch.")]
    assert len(blocks) >= 3 and set(plan.modules) - set(blocks) <= {f"tables.{i}" for i in range(4)}
    assert "a leaf without parameters" in plan.refused["over.1"]
    assert plan.predicted_peak_bytes is not None and plan.predicted_peak_bytes <= plan.memory_budget_bytes

    def step(m: nn.Module) -> torch.Tensor:
        loss = m(*args).square().mean()
        loss.backward()
        return loss.detach()

    print(plan.table().split("  refused")[0], _verify(model, report, plan, step))
