"""What every phase of one run reads: the run's measurer, its tree, its captured batches, its ranks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from cb_callback._engine.capture.inputs import ComponentInputs
from cb_callback._engine.capture.tree import Node
from cb_callback._engine.distributed.coordinator import Coordinator
from cb_callback._engine.run.component import ComponentRun
from cb_callback._engine.run.config import BenchmarkConfig

__all__ = ["RunContext"]


@dataclass(frozen=True)
class RunContext:
    """The parts of one run that the triage, the schedule and the lockstep phase all read.

    Built once per run (:func:`cb_callback._engine.run.profile._run_context`), after the
    tree and before the in-situ pass; none of its fields is replaced during the
    run (the objects themselves keep their own state: ``run`` counts its costs,
    ``coord`` notes a lost rank). What one phase decides (the in-situ times, the
    triage's plan, the schedule's rows) is that phase's own, not the context's.

    Attributes:
        run: how each component is replayed and measured (its model, options,
            device and plugins; :class:`ComponentRun`).
        nodes: the component tree, breadth-first from the root (``""``).
        modules: each component's module, by path.
        batches: each captured batch's calls, by path (one mapping per batch, in
            capture order; one for a single batch).
        coord: the coordinator of several ranks (``None``: one process).
    """

    run: ComponentRun
    nodes: Sequence[Node]
    modules: Mapping[str, nn.Module]
    batches: Sequence[Mapping[str, ComponentInputs]]
    coord: Coordinator | None = None

    @property
    def cfg(self) -> BenchmarkConfig:
        """The run's options (the run's own, :attr:`ComponentRun.cfg`)."""
        return self.run.cfg

    @property
    def device(self) -> torch.device:
        """The device every replay runs on (:attr:`ComponentRun.device`)."""
        return self.run.device

    @property
    def calls(self) -> Mapping[str, ComponentInputs]:
        """Every component's captured call: the single batch's, or with several batches each component's
        call from the first batch it ran in (:func:`cb_callback._engine.replay.batches.merged_calls`;
        :attr:`ComponentRun.calls`)."""
        return self.run.calls
