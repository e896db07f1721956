"""Cost of the torchrec TBE traffic rules: the rule alone, and a FusedEBC profile where it runs.

Run: ``python benchmarks/tbe_traffic.py [--batch 4096] [--repeats 5]`` (about
half a minute on 2 CPU cores). The demo (``examples/dlrm.py``) uses an unfused
``EmbeddingBagCollection``, whose lookups are aten ops the rules never see;
these figures are for fused tables (``FusedEmbeddingBagCollection``, fbgemm
TBEs), where they run once per instrumented pass of every component that holds
one:

- ``rule_ms``: median wall time of ``tbe_forward_bytes`` + ``tbe_backward_bytes``
  on one DLRM-shaped call (26 features, ``--batch`` samples, 1-4 ids per bag,
  ids uniform over 100,000 rows of dim 16);
- ``profile_s``: ``metadata["timing"]["wall_s"]`` of ``profile_components`` on
  a FusedEBC of those 26 tables (Adagrad) under a module that sums its output.

To measure an older version of the package, put its checkout first on
``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from torch import nn

F, ROWS, D = 26, 100_000, 16


def _named(batch: int, gen: torch.Generator) -> dict[str, Any]:
    lengths = torch.randint(1, 5, (F * batch,), generator=gen)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    return {
        "host_weights": torch.zeros(1),  # only its element size is read
        "grad_output": torch.zeros(batch, F * D),
        "indices": torch.randint(0, ROWS, (int(offsets[-1]),), generator=gen),
        "offsets": offsets,
        "weights_offsets": torch.arange(F) * ROWS * D,
        "D_offsets": torch.arange(F + 1, dtype=torch.int32) * D,
        "momentum1_host": torch.zeros(F * ROWS),
    }


class _Sum(nn.Module):
    def __init__(self, ebc: nn.Module) -> None:
        super().__init__()
        self.ebc = ebc

    def forward(self, kjt: Any) -> torch.Tensor:
        return self.ebc(kjt).values().sum(dim=1)


def main(argv: list[str] | None = None) -> None:
    """Print the rule's median time and the FusedEBC profile's wall time."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    import cb_callback
    import cb_callback.integrations.torchrec as cbt

    gen = torch.Generator().manual_seed(0)
    named = _named(args.batch, gen)
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        cbt.tbe_forward_bytes(named, None)
        cbt.tbe_backward_bytes(named, None)
        times.append(time.perf_counter() - t0)
    ids = named["indices"].numel()
    print(f"rule_ms: {statistics.median(times) * 1e3:.1f} (median of {args.repeats}; {ids} ids)")

    tables = [
        EmbeddingBagConfig(name=f"t{f}", embedding_dim=D, num_embeddings=ROWS, feature_names=[f"f{f}"])
        for f in range(F)
    ]
    ebc = FusedEmbeddingBagCollection(
        tables=tables, optimizer_type=torch.optim.Adagrad, optimizer_kwargs={"lr": 0.1}, device=torch.device("cpu")
    )
    lengths = named["offsets"].diff()
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f{f}" for f in range(F)], values=named["indices"], lengths=lengths
    )
    report = cb_callback.profile_components(
        _Sum(ebc), (kjt,), warmup=1, min_run_time_s=0.0, min_repeats=3, max_repeats=3, rounds=1,
        peak_flops=1e12, peak_bandwidth=1e11, load_plugins=False,
    )  # fmt: skip
    print(f"profile_s: {report.metadata['timing']['wall_s']:.2f} ({cb_callback.__file__})")


if __name__ == "__main__":
    main()
