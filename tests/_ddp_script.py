"""A two-process CPU DDP fit with two ComponentBenchmark instances (run by test_callback_ddp.py).

The two ranks are forked from this process as ``torchrun`` starts them (``tests/_ranks.py``: this process's imports
are theirs, none imports them again), each a Trainer with ``strategy="ddp"``. Each rank writes ``rank_<r>.json``
with what it saw into ``OUT``.

Usage: ``PYTHONPATH=<repo> python tests/_ddp_script.py OUT``
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

#: What the ranks import (the callback, the report's writers), imported before the fork.
PRELOAD = (
    "lightning.pytorch", "torch.utils.tensorboard", "torch.distributed.algorithms.ddp_comm_hooks", "pandas", "plotly",
    "cb_callback._lightning.callback", "tests._callback_models",
)  # fmt: skip


def fit(out: Path) -> None:
    """One rank's fit (``LOCAL_RANK`` set)."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.loggers import TensorBoardLogger

    from cb_callback import ComponentBenchmark
    from tests._callback_models import LossRecorder, MLPModule
    from tests.conftest import FAST

    # the in-situ pass and the triage run on every rank; descend_share=0: every row replayed
    opts: dict[str, Any] = {**FAST, "peak_flops": 1e11, "peak_bandwidth": 1e10, "descend_share": 0.0}
    zero = ComponentBenchmark(capture_step=1, ranks="zero", output_dir=str(out / "zero"), **opts)
    every = ComponentBenchmark(capture_step=2, ranks="all", output_dir=str(out / "all"), **opts)
    # two captures (a series) in the same run: rank 0 profiles each, the other rank waits at each barrier
    series = ComponentBenchmark(
        capture_steps=[1, 3], ranks="zero", output_dir=str(out / "series"), log_to_tensorboard=False, **opts
    )

    class Clock(Callback):
        """When each rank left the batch end of every step (after the profile's barrier)."""

        def __init__(self) -> None:
            self.left: dict[int, float] = {}

        def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
            self.left[trainer.global_step] = time.time()

    clock, recorder = Clock(), LossRecorder()
    pl.seed_everything(0, verbose=False)
    trainer = pl.Trainer(
        strategy="ddp", devices=2, accelerator="cpu", max_steps=4, default_root_dir=str(out),
        logger=TensorBoardLogger(str(out), name="tb", version=0), callbacks=[recorder, zero, every, series, clock],
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        limit_val_batches=0, log_every_n_steps=1,
    )  # fmt: skip
    trainer.fit(MLPModule(validate=False))
    rank = trainer.global_rank
    result = {
        "rank": rank,
        "global_step": trainer.global_step,
        "zero_report": zero.report is not None,
        "all_report": every.report is not None,
        "series_reports": sorted(series.reports),
        "zero_output_dir": str(zero.output_dir),
        "all_output_dir": str(every.output_dir),
        "max_total_time_s": None if zero.report is None else zero.report.metadata["config"]["max_total_time_s"],
        "left": clock.left,
        "losses": [float(x) for x in recorder.losses],
    }
    (out / f"rank_{rank}.json").write_text(json.dumps(result))


def main(out: Path) -> int:
    """Both ranks' fits, after :data:`PRELOAD` (imported once, not in each rank; not ``tests.conftest``, which gives
    each process a cache folder of its own)."""
    from tests._ranks import fork_ranks

    for name in PRELOAD:
        importlib.import_module(name)

    return fork_ranks(lambda: fit(out))


if __name__ == "__main__":
    from tests._figures import blank_here

    blank_here()  # test_callback_ddp reads the images' tags, not their pixels
    sys.exit(main(Path(sys.argv[1])))
