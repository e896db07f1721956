"""FLOPs of the isolated forward and backward, counted by ``FlopCounterMode``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import (
    FlopCounterMode,
    flop_registry,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

from cb_callback._engine.isolate import PassContext, Phase
from cb_callback._engine.plugins import MeasureContext
from cb_callback._metrics._observing import ObservingMetric

__all__ = ["FlopsMetric", "register_flop_rule"]

aten = torch.ops.aten

#: FLOP formulas of cb_callback's own counting, by op packet; never added to torch's
#: global ``flop_registry``, so a user's own ``FlopCounterMode`` is unchanged.
_RULES: dict[Any, Callable[..., int]] = {}

# Ops that move or describe data but compute nothing worth a FLOP formula; they
# are not listed as "uncounted".
_NO_COMPUTE = {
    "aten.detach",
    "aten.view",
    "aten._unsafe_view",
    "aten.t",
    "aten.transpose",
    "aten.permute",
    "aten.expand",
    "aten.reshape",
    "aten.squeeze",
    "aten.unsqueeze",
    "aten.clone",
    "aten.copy_",
    "aten._to_copy",
    "aten.slice",
    "aten.select",
    "aten.split",
    "aten.split_with_sizes",
    "aten.cat",
    "aten.stack",
    "aten.empty",
    "aten.empty_like",
    "aten.zeros",
    "aten.zeros_like",
    "aten.ones_like",
    "aten.full",
    "aten.fill_",
    "aten.zero_",
    "aten.new_empty",
    "aten.new_zeros",
    "aten.new_empty_strided",
    "aten.empty_strided",
    "aten.alias",
    "aten.lift_fresh",
    "aten.as_strided",
    "aten.unbind",
    "aten.chunk",
    "aten._reshape_alias",
    "aten.contiguous",
    "aten.index",
    "aten.index_select",
    "aten.gather",
    "aten.embedding",
    "aten.masked_fill",
    "aten.where",
    "aten.arange",
    "aten.scalar_tensor",
    "aten._local_scalar_dense",
    "aten.flatten",
    "aten.unflatten",
    "aten.repeat",
    "aten.constant_pad_nd",
    "aten.resize_",
    "aten.set_",
    "aten.nonzero",
    "aten.eq",
    "aten.ne",
    "aten.lt",
    "aten.gt",
    "aten.le",
    "aten.ge",
    "aten.native_dropout",
    "aten.bernoulli_",
    "aten.randn",
    "aten.rand",
    "aten.ones",
    "aten.new_ones",
    "aten.new_full",
    "aten.full_like",
    "aten.view_as",
    "aten.slice_backward",
    "aten.select_backward",
    "aten.detach_",
    "aten.copy",
    "aten.lift_fresh_copy",
    "aten.narrow",
}


def register_flop_rule(op: Any, formula: Callable[..., int]) -> None:
    """Give ``op`` (an ``OpOverloadPacket``, e.g. ``torch.ops.fbgemm.foo``) a FLOP formula.

    ``formula`` has the signature of a ``torch.utils.flop_counter.register_flop_formula``
    formula: it is called with the *shapes* of the op's arguments (tensors
    replaced by their shapes) and ``out_shape=``, and returns the FLOPs. It
    applies only inside cb_callback's counting (``FlopCounterMode(custom_mapping=...)``),
    never to torch's global registry, and there it wins over a formula torch has.

    Raises:
        ValueError: if ``op`` is not an ``OpOverloadPacket`` or already has a rule.
    """
    if not isinstance(op, torch._ops.OpOverloadPacket):
        raise ValueError(f"register_flop_rule(op={op!r}): expected an OpOverloadPacket such as torch.ops.aten.mm")
    if op in _RULES:
        raise ValueError(f"a FLOP rule for {op} is already registered")
    _RULES[op] = formula


def _cpu_sdpa_forward(
    query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, out_shape: Any = None, **kwargs: Any
) -> int:
    return int(sdpa_flop_count(query_shape, key_shape, value_shape))


def _cpu_sdpa_backward(
    grad_out_shape: Any,
    query_shape: Any,
    key_shape: Any,
    value_shape: Any,
    *args: Any,
    out_shape: Any = None,
    **kwargs: Any,
) -> int:
    return int(sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape))


def _register_cpu_sdpa() -> None:
    """FLOP rules for CPU flash attention, which torch 2.13 counts as 0.

    Same arithmetic as torch's CUDA flash-attention formulas (``sdpa_flop_count``:
    ``4 * B * H * Lq * Lk * E`` forward, 2.5x that for backward when ``E == Ev``),
    so CPU and GPU reports agree. A causal mask is not discounted (as in torch).
    Added only where torch has no formula of its own.
    """
    for op, formula in (
        (aten._scaled_dot_product_flash_attention_for_cpu, _cpu_sdpa_forward),
        (aten._scaled_dot_product_flash_attention_for_cpu_backward, _cpu_sdpa_backward),
    ):
        if op not in flop_registry:
            register_flop_rule(op, formula)


_register_cpu_sdpa()


class _OpRecorder(TorchDispatchMode):
    """Records the name of every aten op that runs."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[Any] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
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
        counter = FlopCounterMode(display=False, custom_mapping=dict(_RULES))
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
