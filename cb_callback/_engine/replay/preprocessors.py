"""The built-in preprocessors: inputs to the replay device, and the batch replicated to a size."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn
from torch.utils import _pytree as pytree

from cb_callback._engine.capture.inputs import _BATCH_RULES, ComponentInputs, _has_rule, replicate_batch, to_device
from cb_callback._engine.run.config import BenchmarkConfig
from cb_callback._engine.run.plugins import PrepareContext, Preprocessor

__all__ = ["ReplicateBatch", "ToDevice", "builtin_preprocessors"]


class ReplicateBatch(Preprocessor):
    """Tile captured inputs along dim 0 to ``batch_size`` samples (built-in).

    Leaves whose leading dimension is the captured batch size are tiled
    (``[x0..xk, x0..xk, …]``), which keeps the captured samples' distribution;
    types with a registered batch rule (a ``KeyedJaggedTensor``) use it.
    """

    name = "replicate_batch"

    def __init__(self, batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError(f"ReplicateBatch(batch_size={batch_size!r}): expected an integer >= 1")
        self.batch_size = batch_size
        #: The components refused this run (their inputs cannot be replicated), and why.
        self._refused: dict[str, str] = {}

    def process_inputs(self, inputs: ComponentInputs, ctx: PrepareContext) -> ComponentInputs:
        if ctx.batch_size is None or ctx.batch_size == self.batch_size:
            return inputs
        self._refuse_unsized(inputs, ctx)
        if isinstance(ctx.module, nn.EmbeddingBag):
            bags = _replicate_bags(inputs, ctx.batch_size, self.batch_size)
            if bags is not None:
                return bags
        args, kwargs = replicate_batch((inputs.args, inputs.kwargs), ctx.batch_size, self.batch_size)
        return dataclasses.replace(inputs, args=tuple(args), kwargs=dict(kwargs))

    def _refuse_unsized(self, inputs: ComponentInputs, ctx: PrepareContext) -> None:
        """Raise (the row fails with the reason) for a component that holds an input with a batch rule but no
        single batch size (a variable-batch ``KeyedJaggedTensor``), and for every component under one.

        Such an input cannot be tiled; replicating the rest of the component's inputs, or its children's,
        would measure a parent at the captured batch and its children at ``batch_size`` (an estimated
        container then reads several times its parent). Parents are preprocessed before their children
        (the replays go breadth-first from the root).
        """
        path = ctx.path or ""
        above = next((p for p in self._refused if p == "" or path == p or path.startswith(p + ".")), None)
        if above is None:
            where = unsized_batch_leaf((inputs.args, inputs.kwargs))
            if where is None:
                return
            self._refused[path] = f"its input {where} has no single batch size to replicate (a batch size per key: VBE)"
            above = path
        if above == path:
            why = self._refused[path]
        else:
            why = f"it is under {above or '(root)'}, which is refused ({self._refused[above]})"
        raise ValueError(
            f"ReplicateBatch(batch_size={self.batch_size}) refuses this component: {why}; a component and its "
            "children are replicated alike or not at all (profile without batch_size=)"
        )


def unsized_batch_leaf(tree: object) -> str | None:
    """The first leaf of ``tree`` whose type has a batch rule that gives it no batch size (its type name), if any.

    A variable-batch ``KeyedJaggedTensor`` (VBE: a batch size per key) is one: the torchrec integration's
    rule returns ``None`` for it.
    """
    for x in pytree.tree_leaves(tree, is_leaf=_has_rule):
        if _has_rule(x) and _BATCH_RULES[type(x)].size(x) is None:
            return type(x).__qualname__
    return None


def _replicate_bags(inputs: ComponentInputs, batch: int, n: int) -> ComponentInputs | None:
    """Tile the bags of a 1-D ``EmbeddingBag(input, offsets)`` call: bag ``j`` of the
    result is bag ``j % batch`` of the capture (with its per-sample weights).

    ``None`` when the call is not that form (2-D input: the generic rule applies).
    """
    names = ("input", "offsets", "per_sample_weights")
    given = dict(zip(names, inputs.args, strict=False)) | {k: v for k, v in inputs.kwargs.items() if k in names}
    values, offsets = given.get("input"), given.get("offsets")
    if not isinstance(values, torch.Tensor) or values.dim() != 1 or not isinstance(offsets, torch.Tensor):
        return None
    include_last = offsets.numel() == batch + 1
    if offsets.numel() not in (batch, batch + 1):
        return None
    starts = offsets[:batch]
    ends = torch.cat([offsets[1:batch], offsets.new_tensor([values.numel()])]) if not include_last else offsets[1:]
    src = torch.arange(n) % batch
    pieces = [torch.arange(int(starts[b]), int(ends[b])) for b in src.tolist()]
    index = torch.cat(pieces) if pieces else torch.empty(0, dtype=torch.long)
    lengths = (ends - starts)[src]
    new_offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    new_offsets = new_offsets if include_last else new_offsets[:-1]
    out = {"input": values[index.to(values.device)], "offsets": new_offsets.to(offsets.device)}
    psw = given.get("per_sample_weights")
    if isinstance(psw, torch.Tensor):
        out["per_sample_weights"] = psw.detach()[index.to(psw.device)].requires_grad_(psw.requires_grad)
    args = list(inputs.args)
    kwargs = dict(inputs.kwargs)
    for i, name in enumerate(names):
        if name not in out:
            continue
        if i < len(args):
            args[i] = out[name]
        elif name in kwargs:
            kwargs[name] = out[name]
    return dataclasses.replace(inputs, args=tuple(args), kwargs=kwargs)


class ToDevice(Preprocessor):
    """Move the captured inputs to the replay device (built-in, always first)."""

    name = "to_device"

    def process_inputs(self, inputs: ComponentInputs, ctx: PrepareContext) -> ComponentInputs:
        args, kwargs = to_device((inputs.args, inputs.kwargs), ctx.device)
        return dataclasses.replace(inputs, args=tuple(args), kwargs=dict(kwargs))


def builtin_preprocessors(cfg: BenchmarkConfig) -> list[Preprocessor]:
    """The built-ins a run applies before the user's: :class:`ToDevice`, then
    :class:`ReplicateBatch` when ``cfg.batch_size`` is set."""
    out: list[Preprocessor] = [ToDevice()]
    if cfg.batch_size is not None:
        out.append(ReplicateBatch(cfg.batch_size))
    return out
