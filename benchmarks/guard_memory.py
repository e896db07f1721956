"""Memory the state guard takes at the capture step: its copies by device, and the peak RSS.

Run: ``python benchmarks/guard_memory.py [--models dlrm mlp] [--json out.json]``
(about a minute on 2 CPU cores). Each model is measured in a fresh process, after
one training step (forward, backward, optimizer step: ``.grad`` is set, as at
the Lightning callback's ``on_train_batch_end``):

- ``copies``: bytes the guard's ``__enter__`` allocates, by device, counted by a
  dispatch mode (the outputs of ``clone``, ``_to_copy``, ``empty*`` ops), so it
  reads the same for any version of the guard;
- ``guard_rss_mib``: resident memory after entering the guard minus before;
- ``profile_peak_mib``: the peak resident memory during one
  ``profile_components`` call (guard, capture, replays; the kernel's peak
  counter ``VmHWM`` is reset just before it) minus the resident memory before.

Models: examples/dlrm.py's DLRM (26 tables, 834,400 rows x 16 fp32, batch 512,
Adagrad) and an MLP whose parameters dominate (8 x Linear(2048, 2048) with ReLU,
batch 8, SGD). To measure an older version of the package, put its checkout
first on ``PYTHONPATH``; the output names the ``cb_callback`` it imported.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from _examples import load_example
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

_MIB = 1024.0 * 1024.0
_ALLOCATING = ("clone", "_to_copy", "empty_like", "empty", "empty_strided", "new_empty", "new_empty_strided")
SETTINGS: dict[str, Any] = dict(
    warmup=0, min_run_time_s=0.0, min_repeats=1, max_repeats=1, rounds=1, load_plugins=False,
    peak_flops=1e12, peak_bandwidth=1e11,  # no CPU calibration: its matrices would be in the peak
)  # fmt: skip


class _CopiedBytes(TorchDispatchMode):
    """Bytes of the tensors that allocating ops return, by device."""

    def __init__(self) -> None:
        super().__init__()
        self.by_device: dict[str, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in _ALLOCATING and isinstance(out, torch.Tensor):
            key = str(out.device)
            self.by_device[key] = self.by_device.get(key, 0) + out.numel() * out.element_size()
        return out


def _status_kib(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    match = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    return int(match.group(1)) if match else 0


def _reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # Linux >= 4.0: VmHWM := VmRSS
    except OSError:
        return False
    return True


_example = load_example


def _dlrm() -> tuple[nn.Module, tuple[Any, ...], torch.optim.Optimizer]:
    ex = _example("dlrm")
    model = ex.build_dlrm(ex.DLRMConfig())
    dense, kjt, _ = ex.synthetic_batch(512, seed=0)
    return model, (dense, kjt), torch.optim.Adagrad(model.parameters(), lr=0.05)


def _mlp() -> tuple[nn.Module, tuple[Any, ...], torch.optim.Optimizer]:
    layers: list[nn.Module] = []
    for _ in range(8):
        layers += [nn.Linear(2048, 2048), nn.ReLU()]
    model = nn.Sequential(*layers)
    return model, (torch.randn(8, 2048),), torch.optim.SGD(model.parameters(), lr=0.01)


MODELS = {"dlrm": _dlrm, "mlp": _mlp}


def measure(name: str) -> dict[str, Any]:
    """One model's figures, in this process (call it in a fresh one)."""
    import cb_callback

    torch.manual_seed(0)
    model, args, opt = MODELS[name]()
    opt.zero_grad(set_to_none=True)
    model(*args).float().square().mean().backward()
    opt.step()  # .grad stays set, as after a Lightning training step
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    rss0 = _status_kib("VmRSS")
    counter = _CopiedBytes()
    guard = cb_callback.plugins.StateGuard(model)
    with counter:
        guard.__enter__()
    rss1 = _status_kib("VmRSS")
    guard.__exit__(None, None, None)
    del guard
    before = _status_kib("VmRSS")
    reset = _reset_peak_rss()
    cb_callback.profile_components(model, args, **SETTINGS)
    peak = _status_kib("VmHWM")
    return {
        "model": name,
        "cb_callback": str(Path(cb_callback.__file__).parent),
        "params_bytes": params,
        "grads_bytes": grads,
        "buffers_bytes": buffers,
        "copies": counter.by_device,
        "guard_rss_mib": (rss1 - rss0) / 1024.0,
        "profile_peak_mib": (peak - before) / 1024.0 if reset else None,
    }


def main(argv: list[str] | None = None) -> None:
    """Measure each model in a child process and print one line of JSON per model."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["dlrm", "mlp"])
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--child", choices=sorted(MODELS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child)))
        return
    results = []
    for name in args.models:
        run = subprocess.run([sys.executable, __file__, "--child", name], check=True, capture_output=True, text=True)
        result = json.loads(run.stdout.strip().splitlines()[-1])
        results.append(result)
        copies = ", ".join(f"{d}: {b:,} B" for d, b in sorted(result["copies"].items())) or "none"
        print(
            f"{name}: params {result['params_bytes'] / _MIB:.2f} MiB, grads {result['grads_bytes'] / _MIB:.2f} MiB, "
            f"buffers {result['buffers_bytes']:,} B | guard copies {copies} | "
            f"guard RSS +{result['guard_rss_mib']:.1f} MiB | profile_components peak RSS "
            f"+{result['profile_peak_mib']:.1f} MiB  ({result['cb_callback']})"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
