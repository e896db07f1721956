"""FLOP rules of cb_callback's own counting: formulas by op, and the ops that compute nothing.

The census (:mod:`cb_callback._engine.counting.census`) and the FLOP metric
(``cb_callback._metrics.flops``) count with the same rules: ``FlopCounterMode``
with :func:`custom_mapping`, torch's global registry left unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch._ops import OpOverloadPacket
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

from cb_callback._types import OpValue

__all__ = ["NO_COMPUTE", "RULES", "custom_mapping", "register_flop_rule"]

aten = torch.ops.aten

#: FLOP formulas of cb_callback's own counting, by op packet; never added to torch's
#: global ``flop_registry``, so a user's own ``FlopCounterMode`` is unchanged.
RULES: dict[OpOverloadPacket, Callable[..., int]] = {}

#: Ops that move or describe data but compute nothing worth a FLOP formula; they
#: are not listed as "uncounted".
NO_COMPUTE = {
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


def register_flop_rule(op: object, formula: Callable[..., int]) -> None:
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
    if op in RULES:
        raise ValueError(f"a FLOP rule for {op} is already registered")
    RULES[op] = formula


def _cpu_sdpa_forward(
    query_shape: torch.Size,
    key_shape: torch.Size,
    value_shape: torch.Size,
    *args: OpValue,
    out_shape: OpValue = None,
    **kwargs: OpValue,
) -> int:
    return int(sdpa_flop_count(query_shape, key_shape, value_shape))


def _cpu_sdpa_backward(
    grad_out_shape: torch.Size,
    query_shape: torch.Size,
    key_shape: torch.Size,
    value_shape: torch.Size,
    *args: OpValue,
    out_shape: OpValue = None,
    **kwargs: OpValue,
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


def custom_mapping() -> dict[OpOverloadPacket, Callable[..., int]]:
    """The rules as ``FlopCounterMode(custom_mapping=...)`` takes them (read when called)."""
    return dict(RULES)
