"""How ``report_v1/report.json`` was made: run by cb_callback 379e0da (before ``schema_version``).

    git worktree add /tmp/prev 379e0da
    cd /tmp/prev && PYTHONPATH=/tmp/prev python <this file> OUT_DIR

then ``OUT_DIR/report.json`` copied as it was written (nothing trimmed). A tiny model
whose rows have every status: ``ok`` (the root, ``blocks.0``, ``blocks.1``),
``estimated`` (``blocks``, a ``ModuleList`` never called itself), ``failed`` (``flaky``,
which raises when replayed alone), ``not_run`` (``unused``) and ``skipped``
(``head``, excluded).
"""

import sys

import torch
from torch import nn

import cb_callback

_IN_STEP = [False]  # set by the model's own forward: ``Flaky`` replayed alone raises


class Flaky(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _IN_STEP[0]:
            raise RuntimeError("only inside Tiny's forward")
        return x * 2.0


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.flaky = Flaky()
        self.unused = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.relu(block(x))
        _IN_STEP[0] = True
        try:
            x = self.flaky(x)
        finally:
            _IN_STEP[0] = False
        return self.head(x)


if __name__ == "__main__":
    torch.manual_seed(0)
    cb_callback.profile_components(
        Tiny(),
        (torch.randn(2, 4),),
        output_dir=sys.argv[1],
        descend="all",
        exclude=["head"],
        min_run_time_s=0.005,
        min_repeats=3,
        rounds=2,
        insitu_passes=1,
        peak_flops=1e12,
        peak_bandwidth=1e11,
    )
