"""What publishing one capture costs: the report files and TensorBoard, as the callback writes them.

Run: ``python benchmarks/publish.py [--report DIR] [--repeats 5] [--json out.json]`` (under a minute on
2 CPU cores). Prints what it measured; the figures live in docs/benchmarks.md.

The callback, after profiling a capture, writes the files (``FileReporter``: report.json,
components.csv, report.html, three icicle PNGs, roofline.png) and then logs the same report to
TensorBoard (``TensorBoardReporter``: scalars, two texts, the four images). Training waits for both
in ``mode="pause"``. This times each, on a copy of the report whose metadata differs per repeat
(so nothing drawn for one repeat is reused by the next), into a fresh directory; the median of
``--repeats`` is printed, and each repeat.

Without ``--report``, the report is a real profile of ``examples/gpt.py``'s GPT with 6 blocks (fixed peaks, one
timing round: its numbers do not matter here, only its rows).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from _examples import load_example

from cb_callback import Report, profile_components
from cb_callback._report.context import ReportContext
from cb_callback._report.files import FileReporter
from cb_callback._report.tensorboard import TensorBoardReporter


def _gpt_report() -> Report:
    gpt = load_example("gpt")
    torch.manual_seed(0)
    cfg = gpt.GPTConfig(n_layer=6)  # 6 blocks: 70 rows
    model = gpt.GPT(cfg)
    idx = torch.randint(0, cfg.vocab_size, (4, cfg.block_size))
    return profile_components(
        model, (idx,), reporters=[],
        warmup=0, min_run_time_s=0.0, min_repeats=1, max_repeats=1, rounds=1,
        peak_flops=1e12, peak_bandwidth=1e11,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", help="a report directory (default: profile examples/gpt.py's GPT)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    report = Report.load(args.report) if args.report else _gpt_report()
    files_s, tb_s = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            each = copy.deepcopy(report)
            each.metadata["benchmark_repeat"] = i
            out = Path(tmp) / str(i)
            t0 = time.perf_counter()
            FileReporter().write(each, ReportContext(output_dir=out))
            t1 = time.perf_counter()
            TensorBoardReporter().write(each, ReportContext(output_dir=out / "tb", step=i))
            t2 = time.perf_counter()
            files_s.append(t1 - t0)
            tb_s.append(t2 - t1)
    result = {
        "rows": len(report.rows),
        "files_s": statistics.median(files_s),
        "tensorboard_s": statistics.median(tb_s),
        "files_each_s": files_s,
        "tensorboard_each_s": tb_s,
    }
    print(
        f"{result['rows']} rows: files {result['files_s']:.3f} s, TensorBoard after them "
        f"{result['tensorboard_s']:.3f} s (medians of {args.repeats}; each: files "
        + ", ".join(f"{s:.3f}" for s in files_s)
        + "; TensorBoard "
        + ", ".join(f"{s:.3f}" for s in tb_s)
        + ")"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
