"""Overhead of ComponentBenchmark on training: idle steps, the capture step, the pause.

Run: ``python benchmarks/overhead.py [--pairs 3] [--steps 40] [--models mlp gpt] [--json out.json]``
(about 1-2 minutes on 2 CPU cores). Prints what it measured; the targets live in
docs/benchmarks.md.

For each example model (``examples/lightning_mlp.py``'s MLP, ``examples/gpt.py``'s
GPT), runs of the same seeded fit alternate without and with
``ComponentBenchmark(capture_step=C)`` (default settings, ``mode="pause"``):

- idle-step ratio: median loop iteration (one ``on_train_batch_start`` to the
  next) over the steps other than 0, 1, C and C + 1, with the callback / without
  it, per pair of runs (the median of the pairs is printed, with each pair: on a
  shared machine, load from other processes moves these by several percent);
- idle hooks: the time the callback's two hooks take on an idle step, timed
  between a callback placed before it and one placed after it (minus the same
  span without it), and the step-time ratio it implies: insensitive to load;
- capture-step ratio: the captured step's batch (``on_train_batch_start`` before
  the capture hooks go in, to ``on_train_batch_end`` before profiling) / the
  median of the 5 steps before it, in the same run;
- pause: seconds the callback's ``on_train_batch_end`` spends profiling at step C.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from _examples import load_example
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader

from cb_callback import ComponentBenchmark

_example = load_example


def mlp_setup() -> tuple[pl.LightningModule, DataLoader]:
    ex = _example("lightning_mlp")
    return ex.MLPClassifier(), DataLoader(ex.synthetic(8192), batch_size=256, shuffle=True)


def gpt_setup() -> tuple[pl.LightningModule, DataLoader]:
    ex = _example("gpt")
    cfg = ex.GPTConfig()
    corpus = ex.CharCorpus(cfg.block_size)
    cfg.vocab_size = corpus.vocab_size
    return ex.GPTModule(cfg), DataLoader(corpus, batch_size=16, shuffle=True)


MODELS = {"mlp": mlp_setup, "gpt": gpt_setup}


class First(Callback):
    """Placed first: batch start before the capture hooks, batch end before profiling."""

    def __init__(self) -> None:
        self.step: list[int] = []
        self.start: list[float] = []
        self.end: list[float] = []

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.step.append(trainer.global_step)
        self.start.append(time.perf_counter())

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, *args: Any) -> None:
        self.end.append(time.perf_counter())


class Last(Callback):
    """Placed last: batch start after the capture hooks went in, batch end after profiling."""

    def __init__(self) -> None:
        self.start: list[float] = []
        self.end: list[float] = []

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.start.append(time.perf_counter())

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, *args: Any) -> None:
        self.end.append(time.perf_counter())


def one_run(model_name: str, steps: int, capture_step: int | None, root: Path) -> dict[str, Any]:
    pl.seed_everything(0, verbose=False)
    model, loader = MODELS[model_name]()
    first, last = First(), Last()
    callbacks: list[Callback] = [first]
    bench = None
    if capture_step is not None:
        bench = ComponentBenchmark(capture_step=capture_step, output_dir=str(root / "report"))
        callbacks.append(bench)
    callbacks.append(last)
    trainer = pl.Trainer(
        max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(root), callbacks=callbacks,
    )  # fmt: skip
    trainer.fit(model, loader)
    n = len(first.start)
    iteration = {first.step[i]: first.start[i + 1] - first.start[i] for i in range(n - 1)}
    batch = {first.step[i]: first.end[i] - first.start[i] for i in range(n)}
    pause = {first.step[i]: last.end[i] - first.end[i] for i in range(n)}
    # time spent between First's and Last's hooks: the benchmark's two hooks (and the timers')
    hooks = {first.step[i]: (last.start[i] - first.start[i]) + (last.end[i] - first.end[i]) for i in range(n)}
    return {
        "iteration": iteration,
        "batch": batch,
        "pause": pause,
        "hooks": hooks,
        "components": None if bench is None or bench.report is None else len(bench.report.rows),
        "trainer": trainer,
        "module": model,
    }


def hook_methods_s(trainer: pl.Trainer, module: Any, capture_step: int, calls: int = 20000) -> dict[str, float]:
    """Seconds per idle step of the callback's own two batch hooks, called directly in a loop."""
    out = {}
    for state, step in (("before_capture", capture_step + 10**6), ("after_capture", capture_step)):
        bench = ComponentBenchmark(capture_step=step)
        bench._active = True
        bench._done = state == "after_capture"
        t0 = time.perf_counter()
        for i in range(calls):
            bench.on_train_batch_start(trainer, module, None, i)
            bench.on_train_batch_end(trainer, module, None, None, i)
        out[state] = (time.perf_counter() - t0) / calls
    return out


def measure(model_name: str, pairs: int, steps: int, capture_step: int, root: Path) -> dict[str, Any]:
    skip = {0, 1, capture_step, capture_step + 1}  # warm-up steps, the capture step and the one after
    before = range(max(2, capture_step - 5), capture_step)  # the steps just before the capture step
    pair_ratios: list[float] = []
    idle_with: list[float] = []
    idle_without: list[float] = []
    hooks_with: list[float] = []
    hooks_without: list[float] = []
    capture_ratios: list[float] = []
    pauses: list[float] = []
    components = None
    for pair in range(pairs):
        medians = {}
        for with_cb in (False, True):
            run = one_run(model_name, steps, capture_step if with_cb else None, root / f"{pair}-{with_cb}")
            idle = [t for s, t in run["iteration"].items() if s not in skip]
            hooks = [t for s, t in run["hooks"].items() if s not in skip]
            medians[with_cb] = statistics.median(idle)
            (idle_with if with_cb else idle_without).extend(idle)
            (hooks_with if with_cb else hooks_without).extend(hooks)
            if with_cb:
                normal = statistics.median(run["batch"][s] for s in before)
                capture_ratios.append(run["batch"][capture_step] / normal)
                pauses.append(run["pause"][capture_step])
                components = run["components"]
        pair_ratios.append(medians[True] / medians[False])
    own_s = hook_methods_s(run["trainer"], run["module"], capture_step)
    step_s = statistics.median(idle_without)
    hook_s = max(statistics.median(hooks_with) - statistics.median(hooks_without), 0.0)
    return {
        "model": model_name,
        "components": components,
        "idle_step_ms_without": 1e3 * step_s,
        "idle_step_ms_with": 1e3 * statistics.median(idle_with),
        "idle_step_ratio": statistics.median(pair_ratios),
        "idle_step_ratios": pair_ratios,
        "idle_hook_us": 1e6 * hook_s,
        "idle_step_ratio_from_hooks": (step_s + hook_s) / step_s,
        "hook_methods_us": {k: 1e6 * v for k, v in own_s.items()},
        "capture_step_ratio": statistics.median(capture_ratios),
        "capture_step_ratios": capture_ratios,
        "pause_s": statistics.median(pauses),
        "pauses_s": pauses,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3, help="alternating without/with pairs per model")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--capture-step", type=int, default=10)
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["mlp", "gpt"])
    parser.add_argument("--out", type=Path, default=Path("cb_out/overhead"))
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.pairs} pairs of runs per model, "
          f"{args.steps} steps, capture_step={args.capture_step}")  # fmt: skip
    results = []
    for name in args.models:
        t0 = time.perf_counter()
        r = measure(name, args.pairs, args.steps, args.capture_step, args.out / name)
        results.append(r)
        print(
            f"{name} ({r['components']} components) [{time.perf_counter() - t0:.0f} s]\n"
            f"  idle step: {r['idle_step_ms_without']:.2f} ms without, {r['idle_step_ms_with']:.2f} ms with; "
            f"ratio (median of pairs) {r['idle_step_ratio']:.3f} "
            f"(pairs: {', '.join(f'{x:.3f}' for x in r['idle_step_ratios'])})\n"
            f"  idle hooks: {r['idle_hook_us']:.1f} us per step -> ratio {r['idle_step_ratio_from_hooks']:.5f} "
            f"(Lightning's dispatch to one more callback included; the callback's own methods: "
            f"{r['hook_methods_us']['before_capture']:.2f} us before the capture step, "
            f"{r['hook_methods_us']['after_capture']:.2f} us after)\n"
            f"  capture step / the 5 steps before: {r['capture_step_ratio']:.2f} "
            f"(runs: {', '.join(f'{x:.2f}' for x in r['capture_step_ratios'])})\n"
            f"  pause: {r['pause_s']:.2f} s (runs: {', '.join(f'{x:.2f}' for x in r['pauses_s'])})"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
