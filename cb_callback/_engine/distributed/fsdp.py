"""FSDP2 (``fully_shard``) models: which modules are units, replaying a unit's children, leaving FSDP's state.

Under FSDP2 a unit (an ``FSDPModule``) holds its parameters sharded (DTensors)
except between its pre-forward and post-forward (and again in its backward):
its hooks all-gather them before it runs and reduce-scatter the gradients after.

* A unit is replayed in lockstep on every rank (its hooks communicate), and its
  backward accumulates gradients (``torch.autograd.backward``) so that FSDP's
  post-backward hook reduce-scatters them, as in the real step.
* A child of a unit that is not a unit itself computes with the unit's
  parameters unsharded: it is replayed while its unit is unsharded (one
  all-gather on every rank, :func:`unsharded`), on plain tensors, its row its
  compute alone; the unit is resharded after.
* :func:`save_fsdp_state` (a state saver every :class:`~cb_callback._engine.replay.state.StateGuard`
  runs) puts FSDP's own state back: which units were sharded, their training
  states, the forward order it prefetches by, and the sharded gradients.

FSDP1 (``FullyShardedDataParallel``) is not supported: :func:`fsdp1_problem`
says so.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from cb_callback._engine.replay.state import register_state_saver

if TYPE_CHECKING:
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

__all__ = [
    "fsdp1_problem",
    "has_unit",
    "is_unit",
    "save_fsdp_state",
    "shard_bytes",
    "unit_of",
    "unsharded",
]


#: The package that defines FSDP2's ``FSDPModule`` and FSDP1's ``FullyShardedDataParallel``: a model
#: holds either only once it was imported, so the checks below look it up instead of importing it
#: (about a second, in every process that profiles).
_FSDP_PACKAGE = "torch.distributed.fsdp"


def _fsdp_class(name: str) -> type | None:
    cls = getattr(sys.modules.get(_FSDP_PACKAGE), name, None)
    return cls if isinstance(cls, type) else None


def _fsdp_module_type() -> type | None:
    """FSDP2's ``FSDPModule``; ``None`` where FSDP was never imported (then no unit exists)."""
    return _fsdp_class("FSDPModule")


def is_unit(module: nn.Module) -> bool:
    """Whether ``module`` is an FSDP2 unit (``fully_shard`` was applied to it)."""
    cls = _fsdp_module_type()
    return cls is not None and isinstance(module, cls)


def has_unit(module: nn.Module) -> bool:
    """Whether ``module`` or a descendant is an FSDP2 unit."""
    cls = _fsdp_module_type()
    return cls is not None and any(isinstance(m, cls) for m in module.modules())


def unit_of(path: str, units: set[str]) -> str | None:
    """The nearest unit strictly above ``path`` (``units``: the units' paths), else ``None``."""
    if path == "":
        return None
    parts = path.split(".")
    for i in range(len(parts) - 1, -1, -1):
        above = ".".join(parts[:i])
        if above in units:
            return above
    return None


def fsdp1_problem(root: nn.Module) -> str | None:
    """Why a model under FSDP1 (``FullyShardedDataParallel``) cannot be profiled, else ``None``."""
    FullyShardedDataParallel = _fsdp_class("FullyShardedDataParallel")
    if FullyShardedDataParallel is None:
        return None
    found = next((p for p, m in root.named_modules() if isinstance(m, FullyShardedDataParallel)), None)
    if found is None:
        return None
    return (
        f"{found or 'the model'} is wrapped in FSDP1 (FullyShardedDataParallel), which cb_callback does not "
        "replay: its flat parameters exist only inside its forward. Shard with FSDP2 instead "
        "(torch.distributed.fsdp.fully_shard; Lightning: ModelParallelStrategy), which cb_callback profiles "
        "unit by unit"
    )


def _groups(unit: nn.Module) -> list[FSDPParamGroup]:
    state = unit._get_fsdp_state()  # type: ignore[operator]
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:  # torch versions with one group per state
        group = getattr(state, "_fsdp_param_group", None)
        groups = [] if group is None else [group]
    return list(groups)


def _is_sharded(unit: nn.Module) -> bool:
    return all(g.is_sharded for g in _groups(unit))


@contextlib.contextmanager
def unsharded(unit: nn.Module) -> Iterator[None]:
    """The unit's parameters all-gathered (a collective: every rank enters it together), then resharded
    if they were sharded before."""
    was_sharded = _is_sharded(unit)
    unit.unshard()  # type: ignore[operator]
    try:
        yield
    finally:
        if was_sharded:
            unit.reshard()  # type: ignore[operator]


def shard_bytes(module: nn.Module) -> tuple[int, int]:
    """``(local, full)`` bytes of ``module``'s parameters: what this rank holds, and unsharded."""
    local = full = 0
    for p in module.parameters():
        to_local = getattr(p, "to_local", None)
        shard = to_local() if callable(to_local) else p
        local += shard.numel() * shard.element_size()
        full += p.numel() * p.element_size()
    return local, full


def save_fsdp_state(root: nn.Module) -> Callable[[], None]:
    """Save what replaying FSDP2 units changes; return the function that puts it back.

    Saved per unit: whether its parameters are sharded (a replayed forward
    without its backward leaves a root unit unsharded), its and its parameter
    groups' training states, the forward order FSDP prefetches by in the
    backward, the forward-root bookkeeping, and each sharded parameter's
    ``.grad`` (the object and its values: the replays' backwards reduce-scatter
    into it).
    """
    cls = _fsdp_module_type()
    units = [m for m in root.modules() if cls is not None and isinstance(m, cls)]
    if not units:
        return lambda: None
    saved: list[
        tuple[nn.Module, TrainingState, bool, FSDPState, list[tuple[FSDPParamGroup, TrainingState, list[int]]]]
    ] = []
    grads: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]] = []
    for unit in units:
        state = unit._get_fsdp_state()  # type: ignore[operator]
        groups = [(g, g._training_state, list(g._post_forward_indices)) for g in _groups(unit)]
        ctx = state._state_ctx
        saved.append((unit, state._training_state, _is_sharded(unit), state, groups))
        for group in _groups(unit):
            for fp in group.fsdp_params:
                p = fp.sharded_param
                g = p.grad
                grads.append((p, g, None if g is None else g.detach().clone()))
        del ctx
    ctx_state = [
        (s._state_ctx, s._state_ctx.iter_forward_root, s._state_ctx.post_backward_final_callback_queued)
        for _, _, _, s, _ in saved
    ]
    # post_forward_order exists once FSDP's lazy init ran (the first forward)
    orders = [
        (s._comm_ctx, list(s._comm_ctx.post_forward_order))
        for _, _, _, s, _ in saved
        if hasattr(s._comm_ctx, "post_forward_order")
    ]

    def restore() -> None:
        for unit, training_state, sharded, state, groups in saved:
            # the states first: a group left in FORWARD (a forward that raised part way) does not reshard
            # a unit that keeps its parameters after forward (the root), and would stay unsharded
            state._training_state = training_state
            for group, group_state, indices in groups:
                group._training_state = group_state
                group._post_forward_indices[:] = indices
            if sharded and not _is_sharded(unit):
                unit.reshard()  # type: ignore[operator]
        for ctx, forward_root, queued in ctx_state:
            ctx.iter_forward_root, ctx.post_backward_final_callback_queued = forward_root, queued
        for comm_ctx, order in orders:
            comm_ctx.post_forward_order[:] = order
        with torch.no_grad():
            for p, g, copy in grads:
                if p.grad is not g:
                    p.grad = g
                if g is not None and copy is not None:
                    g.copy_(copy)

    return restore


def _sharded_params(root: nn.Module) -> list[torch.Tensor]:
    """The sharded parameters of every unit under ``root`` (their gradients :func:`save_fsdp_state` restores)."""
    cls = _fsdp_module_type()
    if cls is None:
        return []
    return [fp.sharded_param for m in root.modules() if isinstance(m, cls) for g in _groups(m) for fp in g.fsdp_params]


register_state_saver(save_fsdp_state, owns=_sharded_params)
