"""FLOPs of the isolated forward and backward, counted by ``FlopCounterMode``."""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import (
    FlopCounterMode,
)

from cb_callback._engine.counting import flop_rules
from cb_callback._engine.counting.flop_rules import NO_COMPUTE as _NO_COMPUTE
from cb_callback._engine.counting.flop_rules import register_flop_rule
from cb_callback._engine.replay.isolate import PassContext, Phase
from cb_callback._engine.run.plugins import MeasureContext
from cb_callback._metrics._observing import ObservingMetric
from cb_callback._types import OpValue

if TYPE_CHECKING:
    from torch._ops import OpOverload

__all__ = ["FlopsMetric", "register_flop_rule"]


class _OpRecorder(TorchDispatchMode):
    """Records the name of every aten op that runs."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[Any] = set()

    def __torch_dispatch__(
        self,
        func: OpOverload,
        types: Collection[type],
        args: tuple[OpValue, ...] = (),
        kwargs: dict[str, OpValue] | None = None,
    ) -> OpValue:
        self.ops.add(func.overloadpacket)
        return func(*args, **(kwargs or {}))


def _uncounted(recorder: _OpRecorder, counter: FlopCounterMode) -> list[str]:
    return sorted(
        name for name in (str(op) for op in recorder.ops if op not in counter.flop_registry) if name not in _NO_COMPUTE
    )


class _FlopsInstrument:
    def __init__(self) -> None:
        self.flops: dict[Phase, int] = {}
        self.uncounted: set[str] = set()
        self.backward = True

    @contextlib.contextmanager
    def observe(self, ctx: PassContext) -> Iterator[None]:
        if ctx.phase is Phase.PASS:
            self.backward = ctx.backward
            yield
            return
        recorder = _OpRecorder()
        counter = FlopCounterMode(display=False, custom_mapping=flop_rules.custom_mapping())
        with counter, recorder:
            yield
        self.flops[ctx.phase] = int(counter.get_total_flops())
        self.uncounted.update(_uncounted(recorder, counter))

    def values(self) -> Mapping[str, Any]:
        # Not measured (backward=False): NaN; measured, but the component has no backward: 0.
        bwd = float(self.flops.get(Phase.BACKWARD, 0)) if self.backward else float("nan")
        return {
            "fwd_flops": float(self.flops.get(Phase.FORWARD, 0)),
            "bwd_flops": bwd,
            "uncounted_ops": sorted(self.uncounted),
        }


class FlopsMetric(ObservingMetric):
    """``fwd_flops`` and ``bwd_flops`` of one call; details ``uncounted_ops``.

    ``bwd_flops`` is NaN when the backward is not measured (``backward=False``)
    and 0 for a component without a backward.

    Notes:
        Counted per aten op by torch's ``FlopCounterMode`` (matmuls, convolutions,
        attention) plus the rules of :func:`register_flop_rule` (CPU flash
        attention here, and what integrations add), which apply to this counting
        only: torch's global registry is left as it is.
        Elementwise ops, norms and reductions have no formula: their FLOPs are
        not in the total (they are memory-bound; see ``bytes``), and they are
        listed in ``uncounted_ops``.
    """

    name = "flops"

    def instrument(self, ctx: MeasureContext) -> _FlopsInstrument:
        """An observer of the engine's shared instrumented pass."""
        return _FlopsInstrument()

    def from_census(self, counted: Mapping[str, Any]) -> Mapping[str, Any]:
        """The census counts with this metric's formulas: its values of the component, as counted in the step."""
        return {k: counted[k] for k in ("fwd_flops", "bwd_flops", "uncounted_ops")}
