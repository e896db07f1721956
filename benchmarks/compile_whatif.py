"""Does the compile what-if predict what compiling the model does? And what does it cost?

Run: ``python benchmarks/compile_whatif.py [--backend inductor] [--compile-top 8] [--rounds 7] [--json out.json]``.

Models (CPU-sized; ``--device cuda`` runs the same on a GPU):

- ``gpt``: the GPT example (``examples/gpt.py``: 2 blocks, 64 wide, batch 16 × 64 tokens).
- ``pointwise``: an MLP whose blocks are a ``Linear(512, 512)`` followed by a chain of
  eight elementwise ops (``x * sigmoid(x)`` style gates, scale, shift, tanh): the
  memory-bound glue inductor fuses, batch 256.

For each model:

1. ``profile_components(model, x, compile=True, compile_top=K)`` — the what-if: per
   compiled component ``total_ms`` (eager), ``compiled_ms``, the speedup, compile
   seconds, graph breaks; for the root its "children compiled separately" time.
2. The reference: the whole model's forward + backward (``sum()`` of the output as
   the loss, the gradient of every parameter) eager and ``torch.compile(model)``,
   timed in ``--rounds`` alternating rounds of 20 runs each after 3 warm-up runs,
   medians. That is the speedup a user would get from compiling the model; the
   what-if's root row (the model compiled alone on its captured input, its backward
   against the engine's seeded output gradient) should agree with it within the
   machine's noise.
3. The what-if's cost: the wall seconds of ``profile_components`` with and without
   ``compile=True``.

Prints what it measured; the figures recorded are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch._dynamo
from _examples import load_example
from torch import nn

from cb_callback import profile_components


class Gate(nn.Module):
    """``Linear`` then eight elementwise ops (memory-bound glue that fuses into one kernel)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        g = h * torch.sigmoid(h)
        g = g * 0.5 + 0.25
        return x + torch.tanh(g) * torch.sigmoid(h - 1.0)


def _pointwise(device: str) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(*[Gate(512) for _ in range(4)]).to(device)
    return model, torch.randn(256, 512, device=device)


def _gpt(device: str) -> tuple[nn.Module, torch.Tensor]:
    mod = load_example("gpt")
    model = mod.build_gpt(mod.GPTConfig()).to(device)
    idx = torch.randint(0, 96, (16, 64), generator=torch.Generator().manual_seed(0)).to(device)
    return model, idx


def _step_ms(fn: Callable[[], Any], device: str) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def reference(model: nn.Module, x: torch.Tensor, backend: str, rounds: int, device: str) -> dict[str, float]:
    """Eager vs ``torch.compile(model)``: forward + backward of ``output.sum()``, medians of alternating rounds."""
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)

    def run(m: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], None]:
        def once() -> None:
            model.zero_grad(set_to_none=True)
            m(x).float().sum().backward()

        return once

    eager_run, compiled_run = run(model), run(compiled)
    t0 = time.perf_counter()
    compiled_run()
    compile_s = time.perf_counter() - t0
    for _ in range(3):
        eager_run()
        compiled_run()
    eager_ms: list[float] = []
    compiled_ms: list[float] = []
    for r in range(rounds):
        order = [(eager_run, eager_ms), (compiled_run, compiled_ms)]
        for fn, out in order if r % 2 == 0 else order[::-1]:
            out += [_step_ms(fn, device) for _ in range(20)]
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    e, c = statistics.median(eager_ms), statistics.median(compiled_ms)
    return {"eager_ms": e, "compiled_ms": c, "speedup": e / c, "compile_s": compile_s}


def what_if(model: nn.Module, x: torch.Tensor, args: argparse.Namespace) -> dict[str, Any]:
    opts = dict(min_run_time_s=args.min_run_time_s, rounds=args.rounds, load_plugins=False, device=args.device)
    t0 = time.perf_counter()
    plain = profile_components(model, (x,), **opts)
    plain_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    report = profile_components(
        model, (x,), compile=True, compile_top=args.compile_top, compile_options={"backend": args.backend}, **opts
    )
    compiled_s = time.perf_counter() - t0
    rows = []
    for r in report:
        info = r.details.get("compile")
        if not isinstance(info, dict):
            continue
        rows.append({
            "path": r.path or "root", "type": r.module_type, "total_ms": r.total_ms, "compiled_ms": r.compiled_ms,
            "speedup": r.compile_speedup, "eager_same_rounds_ms": info.get("eager_ms_same_rounds"),
            "compile_s": info.get("compile_s"), "graph_breaks": info.get("graph_breaks"),
            "children_separately_ms": info.get("children_separately_ms"), "error": info.get("error"),
            "outputs_close": info.get("outputs_close"),
        })  # fmt: skip
    return {
        "profile_s": plain_s, "profile_with_compile_s": compiled_s, "rows": rows,
        "root_plain_total_ms": plain.row("").total_ms,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="inductor")
    p.add_argument("--compile-top", type=int, default=8)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--min-run-time-s", type=float, default=0.1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--models", default="pointwise,gpt")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}, backend {args.backend}")
    out: dict[str, Any] = {}
    for name in args.models.split(","):
        model, x = {"pointwise": _pointwise, "gpt": _gpt}[name](args.device)
        found = what_if(model, x, args)
        ref = reference(model, x, args.backend, args.rounds, args.device)
        found["reference"] = ref
        out[name] = found
        print(
            f"\n== {name}: profile {found['profile_s']:.1f} s; "
            f"with compile=True {found['profile_with_compile_s']:.1f} s"
        )
        print(
            f"{'component':<22}{'eager ms':>10}{'compiled':>10}{'speedup':>9}{'same-rnd':>10}{'compile s':>10}"
            f"{'breaks':>7}{'children sep.':>15}"
        )
        for r in found["rows"]:
            sep = r["children_separately_ms"]
            print(
                f"{r['path']:<22}{r['total_ms']:>10.3f}{r['compiled_ms']:>10.3f}{r['speedup']:>9.2f}"
                f"{(r['eager_same_rounds_ms'] or float('nan')):>10.3f}{(r['compile_s'] or float('nan')):>10.1f}"
                f"{(r['graph_breaks'] if r['graph_breaks'] is not None else '-')!s:>7}"
                f"{(f'{sep:.3f}' if sep is not None else '-'):>15}" + (f"  error: {r['error']}" if r["error"] else "")
            )
        root = next(r for r in found["rows"] if r["path"] == "root")
        print(
            f"reference (whole model, torch.compile, {args.rounds} rounds): eager {ref['eager_ms']:.3f} ms, "
            f"compiled {ref['compiled_ms']:.3f} ms, speedup {ref['speedup']:.2f} (compile {ref['compile_s']:.1f} s); "
            f"what-if root speedup {root['speedup']:.2f} (same rounds: "
            f"{root['eager_same_rounds_ms'] / root['compiled_ms']:.2f})"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
