"""The model zoo of ``tests/test_zoo.py`` (issue 22): small, realistic models whose repeated structure,
grad modes and outputs make a copied or a replayed row easy to get wrong.

Every builder returns ``(model, args)`` with fixed weights and inputs (seeded here), so two profiles of
one model see the same step. Sizes are small: a profile takes about a second on a CPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

__all__ = ["BUILDERS", "expert_tokens"]

Built = tuple[nn.Module, tuple[Any, ...]]


# --- MoE with routing -------------------------------------------------------------------------------


class Expert(nn.Module):
    """A feed-forward expert ``d -> 2d -> d`` (GELU)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class MoEBlock(nn.Module):
    """Top-1 routing: each token goes to the expert of its largest gate, scaled by that gate.

    An expert routed no token is not called (its row is ``not_run`` in this block).
    """

    def __init__(self, d: int, n_experts: int) -> None:
        super().__init__()
        self.router = nn.Linear(d, n_experts)
        self.experts = nn.ModuleList([Expert(d) for _ in range(n_experts)])

    def forward(self, x: Tensor) -> Tensor:
        weight, choice = torch.softmax(self.router(x), dim=-1).max(dim=-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            idx = (choice == e).nonzero(as_tuple=True)[0]
            if idx.numel():
                out = out.index_add(0, idx, expert(x[idx]) * weight[idx, None])
        return x + out


class MoE(nn.Module):
    """A stem, two equal MoE blocks (one group: same class, shapes and input signature), a head."""

    def __init__(self, d: int = 32, n_experts: int = 3, n_blocks: int = 2) -> None:
        super().__init__()
        self.stem = nn.Linear(d, d)
        self.blocks = nn.ModuleList([MoEBlock(d, n_experts) for _ in range(n_blocks)])
        self.head = nn.Linear(d, 8)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def moe() -> Built:
    """96 tokens of width 32. The routers' biases make the blocks route unlike each other: block 0 never
    picks expert 2, block 1 never expert 0 (see :func:`expert_tokens`). Whichever block stands for the
    other, the other ran an expert it did not, and its experts saw other token counts."""
    torch.manual_seed(1)
    model = MoE()
    biases = ([0.0, 0.0, -1e3], [-1e3, 0.0, 0.0])
    with torch.no_grad():
        for block, bias in zip(model.blocks, biases, strict=True):
            assert isinstance(block, MoEBlock)
            block.router.bias.copy_(torch.tensor(bias))
    return model, (torch.randn(96, 32),)


def expert_tokens(model: nn.Module, args: tuple[Any, ...]) -> list[list[int]]:
    """Tokens each expert of each MoE block receives in one forward: ``[block][expert]`` (0: not called)."""
    blocks = [m for m in model.modules() if isinstance(m, MoEBlock)]
    counts = [[0] * len(b.experts) for b in blocks]
    handles = []
    for i, block in enumerate(blocks):
        for e, expert in enumerate(block.experts):

            def count(_m: nn.Module, inp: tuple[Any, ...], i: int = i, e: int = e) -> None:
                counts[i][e] += int(inp[0].shape[0])

            handles.append(expert.register_forward_pre_hook(count))
    try:
        with torch.no_grad():
            model(*args)
    finally:
        for h in handles:
            h.remove()
    return counts


# --- a stack with one checkpointed member --------------------------------------------------------------


class MLPBlock(nn.Module):
    """Pre-norm residual MLP; ``checkpointed`` runs the MLP under non-reentrant activation checkpointing."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.checkpointed = False

    def forward(self, x: Tensor) -> Tensor:
        h = self.norm(x)
        h = checkpoint(self.mlp, h, use_reentrant=False) if self.checkpointed else self.mlp(h)
        return x + h


class CheckpointStack(nn.Module):
    """A stem and three equal blocks; block 1 checkpoints its MLP (its backward recomputes the forward)."""

    def __init__(self, d: int = 64, n_blocks: int = 3, checkpointed: int = 1) -> None:
        super().__init__()
        self.stem = nn.Linear(d, d)
        blocks = [MLPBlock(d) for _ in range(n_blocks)]
        blocks[checkpointed].checkpointed = True
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(d, 8)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def checkpoint_stack() -> Built:
    """256 tokens of width 64: each MLP's forward (16.8 M FLOPs) outweighs the checkpoint wrapper's own cost,
    so the checkpointed block's in-situ forward is like the others' (in-situ times cannot tell it apart)."""
    torch.manual_seed(2)
    return CheckpointStack(), (torch.randn(256, 64),)


# --- sibling convs differing only in padding / dilation -------------------------------------------------

#: ``(padding, dilation)`` of the siblings; all are ``Conv2d(8, 8, 3)`` (one weight shape). On a 16×16
#: input the outputs are 16×16, 14×14 and 20×20 (``16 + 2p - d·2``): their FLOPs differ.
CONV_SHAPES = ((1, 1), (0, 1), (4, 2))


class ConvBlock(nn.Module):
    """A conv, a ReLU and a global mean: the configuration sits in the child, not in the block."""

    def __init__(self, padding: int, dilation: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=padding, dilation=dilation)
        self.act = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.conv(x)).mean(dim=(2, 3))


class ConvSiblings(nn.Module):
    """Bare sibling convs and sibling blocks, each set equal in class, weight shapes and input."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = nn.ModuleList([nn.Conv2d(8, 8, 3, padding=p, dilation=d) for p, d in CONV_SHAPES])
        self.blocks = nn.ModuleList([ConvBlock(p, d) for p, d in CONV_SHAPES])

    def forward(self, x: Tensor) -> Tensor:
        feats = [conv(x).mean(dim=(2, 3)) for conv in self.convs] + [block(x) for block in self.blocks]
        return torch.cat(feats, dim=1)


def conv_siblings() -> Built:
    torch.manual_seed(3)
    return ConvSiblings(), (torch.randn(4, 8, 16, 16),)


# --- blocks with a scalar argument ----------------------------------------------------------------------


class Looper(nn.Module):
    """``forward(x, n)``: ``n`` steps of ``tanh(lin(x))`` (its work is ``n`` times one step's)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x: Tensor, n: int) -> Tensor:
        for _ in range(n):
            x = torch.tanh(self.lin(x))
        return x


class ScalarArgs(nn.Module):
    """A stem and three equal loopers called with 4, 5 and 6 steps: their in-situ times are within 1.5× of
    each other, inside the triage's margin (a member is measured alone beyond 1.5×)."""

    STEPS = (4, 5, 6)

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.stem = nn.Linear(d, d)
        self.blocks = nn.ModuleList([Looper(d) for _ in self.STEPS])

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x)
        for block, n in zip(self.blocks, self.STEPS, strict=True):
            x = block(x, n)
        return x


def scalar_args() -> Built:
    torch.manual_seed(4)
    return ScalarArgs(), (torch.randn(64, 64),)


# --- self-conditioning ----------------------------------------------------------------------------------


class Denoiser(nn.Module):
    """Predicts the clean sample from the noisy one and a previous prediction."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.inp = nn.Linear(2 * d, 4 * d)
        self.act = nn.SiLU()
        self.out = nn.Linear(4 * d, d)

    def forward(self, x_t: Tensor, prev: Tensor) -> Tensor:
        return self.out(self.act(self.inp(torch.cat([x_t, prev], dim=-1))))


class SelfConditioning(nn.Module):
    """The diffusion self-conditioning step: a first prediction under ``no_grad``, then the denoiser again
    with grad on it. The root's backward is all the second call's (and the embedding's)."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.embed = nn.Linear(d, d)
        self.denoiser = Denoiser(d)

    def forward(self, x_t: Tensor) -> Tensor:
        h = self.embed(x_t)
        with torch.no_grad():
            prev = self.denoiser(h, torch.zeros_like(h))
        return self.denoiser(h, prev)


def self_conditioning() -> Built:
    torch.manual_seed(5)
    return SelfConditioning(), (torch.randn(64, 32),)


# --- a logged probe -------------------------------------------------------------------------------------


class Probed(nn.Module):
    """A body, a head, and a probe whose value is only logged (``.item()``): no loss reaches the probe."""

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d, 2 * d), nn.ReLU(), nn.Linear(2 * d, d))
        self.probe = nn.Linear(d, 1)
        self.head = nn.Linear(d, 10)
        self.logged = math.nan

    def forward(self, x: Tensor) -> Tensor:
        h = self.body(x)
        self.logged = float(self.probe(h).mean().item())
        return self.head(h)


def probe() -> Built:
    torch.manual_seed(6)
    return Probed(), (torch.randn(64, 64),)


# --- torchrec DLRM with a shared table ------------------------------------------------------------------

#: Ids per sample of each feature: ``f_one`` and ``f_many`` both look up table ``t_shared``.
DLRM_BAGS = {"f_one": 1, "f_many": 50, "f_own": 2}


def dlrm_shared_table() -> Built:
    """torchrec's DLRM; table ``t_shared`` (1000 rows) serves a 1-id and a 50-id feature, ``t_own`` one
    2-id feature. 16 samples, 4 dense features. Needs torchrec (the test skips without it)."""
    from torchrec.models.dlrm import DLRM
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    import cb_callback.integrations.torchrec  # noqa: F401  (registers the KJT batch and traffic rules)

    torch.manual_seed(7)
    d, batch = 8, 16
    tables = [
        EmbeddingBagConfig(name="t_shared", embedding_dim=d, num_embeddings=1_000, feature_names=["f_one", "f_many"]),
        EmbeddingBagConfig(name="t_own", embedding_dim=d, num_embeddings=100, feature_names=["f_own"]),
    ]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
    model = DLRM(
        embedding_bag_collection=ebc, dense_in_features=4, dense_arch_layer_sizes=[16, d], over_arch_layer_sizes=[16, 1]
    )
    gen = torch.Generator().manual_seed(7)
    rows = {"f_one": 1_000, "f_many": 1_000, "f_own": 100}
    lengths = torch.cat([torch.full((batch,), n) for n in DLRM_BAGS.values()])
    values = torch.cat([torch.randint(0, rows[f], (n * batch,), generator=gen) for f, n in DLRM_BAGS.items()])
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=list(DLRM_BAGS), values=values, lengths=lengths)
    return model, (torch.randn(batch, 4, generator=gen), kjt)


# --- a GPT ----------------------------------------------------------------------------------------------


class CausalSelfAttention(nn.Module):
    """Grouped-query attention: 4 query heads share 2 key/value heads (``repeat_interleave``), SDPA with the
    causal mask the model passes."""

    def __init__(self, d: int, n_head: int, n_kv_head: int) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, d // n_head
        self.q = nn.Linear(d, d, bias=False)
        self.kv = nn.Linear(d, 2 * n_kv_head * self.head_dim, bias=False)
        self.proj = nn.Linear(d, d, bias=False)

    def forward(self, x: Tensor, attn_mask: Tensor) -> Tensor:
        b, t, c = x.shape
        q = self.q(x).view(b, t, self.n_head, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, t, 2, self.n_kv_head, self.head_dim).unbind(dim=2)
        rep = self.n_head // self.n_kv_head
        k, v = (z.transpose(1, 2).repeat_interleave(rep, dim=1) for z in (k, v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class GPTBlock(nn.Module):
    """Pre-norm block: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``."""

    def __init__(self, d: int, n_head: int, n_kv_head: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, n_head, n_kv_head)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: Tensor, attn_mask: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x), attn_mask=attn_mask)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Token and position embeddings, two blocks, final norm and an LM head tied to the token embedding;
    ``forward(idx, targets)`` returns ``(logits, loss)`` as training scripts write it."""

    causal: Tensor

    def __init__(self, vocab: int = 64, block_size: int = 32, d: int = 64, n_layer: int = 2) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d)
        self.pos_emb = nn.Embedding(block_size, d)
        self.blocks = nn.ModuleList([GPTBlock(d, n_head=4, n_kv_head=2) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # weight tying
        self.register_buffer("causal", torch.ones(block_size, block_size, dtype=torch.bool).tril(), persistent=False)

    def forward(self, idx: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        t = idx.shape[1]
        mask = self.causal[:t, :t]
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x, attn_mask=mask)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def gpt() -> Built:
    torch.manual_seed(8)
    gen = torch.Generator().manual_seed(8)
    idx = torch.randint(0, 64, (4, 33), generator=gen)
    return GPT(), (idx[:, :-1].contiguous(), idx[:, 1:].contiguous())


# --- a CNN with BatchNorm (train mode) ------------------------------------------------------------------


class ResBlock(nn.Module):
    """conv-BN-ReLU-conv-BN plus the skip, then the same ReLU module again (called twice per block)."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.act = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        return self.act(x + self.bn2(self.conv2(self.act(self.bn1(self.conv1(x))))))


class BNNet(nn.Module):
    """A conv-BN-ReLU stem, two equal residual blocks, global pooling and a classifier."""

    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        self.blocks = nn.Sequential(*[ResBlock(c) for _ in range(2)])
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c, 10)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.pool(self.blocks(self.stem(x))).flatten(1))


def bn_cnn() -> Built:
    torch.manual_seed(9)
    return BNNet().train(), (torch.randn(8, 3, 16, 16),)


#: The zoo, by case id.
BUILDERS: dict[str, Callable[[], Built]] = {
    "moe": moe,
    "checkpoint": checkpoint_stack,
    "conv_attrs": conv_siblings,
    "scalar_arg": scalar_args,
    "self_cond": self_conditioning,
    "probe": probe,
    "dlrm_shared": dlrm_shared_table,
    "gpt": gpt,
    "bn_cnn": bn_cnn,
}
