"""``FusedBackward``: let the isolated backward reach TBEs hidden outside the module tree."""

from __future__ import annotations

from torch import nn

import cb_callback

from ._copy import copy_paths
from ._hidden import direct_hidden, tbe_classes

__all__ = ["FusedBackward"]

PLACEHOLDER_PREFIX = "_cb_fused_tbe_"


def _owners_of_hidden_tbes(model: nn.Module) -> list[tuple[str, list[nn.Module]]]:
    """``(path, hidden TBEs)`` of each module that keeps TBEs outside the module tree."""
    out = []
    for path, mod in model.named_modules():
        direct = [m for m in direct_hidden(mod) if isinstance(m, tbe_classes())]
        if direct:
            out.append((path, direct))
    return out


class FusedBackward(cb_callback.Preprocessor):
    """Let the isolated backward reach fused TBEs kept outside the module tree.

    The replay's backward is ``torch.autograd.grad`` w.r.t. the component's
    parameters. torchrec's ``FusedEmbeddingBagCollection`` (and the lookups of
    a sharded EBC) keep their fbgemm TBE in a plain list and expose only *views*
    of its weights, which are not in the autograd graph: the TBE's backward —
    the gradient scatter and the fused optimizer update — is pruned and
    ``bwd_ms`` covers none of it. ``prepare_model`` returns a copy (sharing all
    weights, paths unchanged) in which each such module also lists its TBEs'
    ``placeholder_autograd_tensor`` (an empty parameter the TBE's autograd
    function takes) as a parameter, so the backward runs the TBE's backward. A
    hidden *dense* TBE (``DenseTableBatchedEmbeddingBagsCodegen``, used by
    data-parallel sharding) has no placeholder: its weights are listed instead.

    Notes:
        The fused optimizer then updates the weights on every backward replay;
        the engine's ``StateGuard`` and the state saver of this integration put
        weights, optimizer state and step counters back when profiling ends.
        ``params_mb`` is unchanged for fused TBEs (the placeholder has no
        elements); a dense TBE's listed weights count in it. Only
        needed until the engine lets integrations add grad targets.
    """

    name = "fused_backward"

    def prepare_model(self, model: nn.Module, ctx: cb_callback.PrepareContext) -> nn.Module:
        owners = _owners_of_hidden_tbes(model)
        if not owners:
            return model
        new_model = copy_paths(model, [path for path, _ in owners])
        modules = dict(new_model.named_modules())
        exposed = []
        for path, tbes in owners:
            owner = modules[path]
            for i, tbe in enumerate(tbes):
                placeholder = getattr(tbe, "placeholder_autograd_tensor", None)
                # A fused TBE takes an empty placeholder into its autograd function; a
                # dense (unfused) TBE differentiates its weights directly.
                targets = (
                    {"placeholder": placeholder}
                    if isinstance(placeholder, nn.Parameter)
                    else {n.replace(".", "_"): p for n, p in tbe.named_parameters() if p.requires_grad}
                )
                for name, param in targets.items():
                    owner._parameters[f"{PLACEHOLDER_PREFIX}{i}_{name}"] = param
                if targets:
                    exposed.append(path)
        ctx.metadata["fused_backward"] = {"modules": sorted(set(exposed))}
        return new_model
