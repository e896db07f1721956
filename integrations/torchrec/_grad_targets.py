"""Grad targets: let the isolated backward reach TBEs hidden outside the module tree."""

from __future__ import annotations

from torch import nn

import cb_callback
import cb_callback.plugins

from ._hidden import hidden_modules, tbe_classes

__all__ = ["hidden_tbe_grad_targets", "register_hidden_tbe_grad_targets"]


def hidden_tbe_grad_targets(module: nn.Module) -> list[nn.Parameter]:
    """What the isolated backward of ``module`` must also differentiate against.

    The replay's backward is ``torch.autograd.grad`` w.r.t. the component's
    parameters. torchrec's ``FusedEmbeddingBagCollection`` (and the lookups of
    a sharded EBC) keep their fbgemm TBE in a plain list and expose only *views*
    of its weights, which are not in the autograd graph: without more targets the
    TBE's backward — the gradient scatter and the fused optimizer update — is
    pruned and ``bwd_ms`` covers none of it.

    Returns, for each TBE hidden in plain attributes of ``module`` or of any
    module of its subtree (so a parent, up to the root, differentiates against
    them too), its ``placeholder_autograd_tensor`` (an empty parameter the fused
    TBE's autograd function takes), or — for a dense TBE
    (``DenseTableBatchedEmbeddingBagsCodegen``, used by data-parallel sharding),
    which has none — its weights. TBEs registered in the tree need nothing: their
    parameters are the module's. The engine drops duplicates by identity.
    """
    classes = tbe_classes()
    if not classes:
        return []
    out: list[nn.Parameter] = []
    for tbe in hidden_modules(module):
        if not isinstance(tbe, classes):
            continue
        placeholder = getattr(tbe, "placeholder_autograd_tensor", None)
        if isinstance(placeholder, nn.Parameter):
            out.append(placeholder)
        else:
            out.extend(p for p in tbe.parameters() if p.requires_grad)
    return out


def register_hidden_tbe_grad_targets() -> None:
    """Register :func:`hidden_tbe_grad_targets` with the engine (idempotent)."""
    global _registered
    if _registered:
        return
    cb_callback.plugins.register_grad_targets(hidden_tbe_grad_targets)
    _registered = True


_registered = False
