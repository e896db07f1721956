"""Issue 7, numbers a user can trust: include keeps ancestors, any dtype keeps its report,
the time budget excludes calibration, FLOP rules stay ours, CUDA peaks are not reset,
and snapshots of classes in the training script replay."""

from __future__ import annotations

import json
import math
import os
import select
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

import cb_callback._engine.run.profile as engine_module
import cb_callback._metrics.memory as memory_module
from cb_callback import Report, profile_components
from cb_callback._engine.capture.tree import filter_reasons
from cb_callback._engine.counting import flop_rules
from cb_callback._engine.run.config import resolve_dtype
from cb_callback._hardware import calibration as _calibration
from cb_callback._hardware import peaks as hw
from cb_callback.plugins import PassContext, Phase, ReplayInputs, register_flop_rule
from tests.conftest import FAST

PEAKS: dict[str, Any] = dict(peak_flops=1e11, peak_bandwidth=1e10)
OPTS: dict[str, Any] = {**FAST, **PEAKS}
_MIB = 2**20


@pytest.fixture(autouse=True)
def _fresh_peak_caches() -> Iterator[None]:
    hw._clear_caches()
    yield
    hw._clear_caches()


def _nested() -> nn.Module:
    # paths in report order: "", "0", "1", "0.0", "0.1"
    return nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), nn.Linear(4, 2))


def _ours(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if str(w.message).startswith("cb_callback:")]


# --- 1. include profiles the ancestors of what it matches ------------------------------


def test_include_profiles_the_ancestors_that_lead_to_matches() -> None:
    # descend="all": what include selects is replayed whatever the in-situ times (beside two CPU hogs the
    # default triage left "0.1" in situ)
    report = profile_components(_nested(), (torch.randn(2, 4),), include=["0.*"], descend="all", **OPTS)
    assert [r.path for r in report] == ["", "0", "1", "0.0", "0.1"]
    # "0.0" and "0.1" match; "0" and the root lead to them; "1" neither
    assert [r.status for r in report] == ["ok", "ok", "skipped", "ok", "ok"]
    assert report.row("1").note == "not matched by include=['0.*']"
    assert report.row("0").fwd_flops == 2 * 2 * 4 * 4  # measured whole: its Linear(4 -> 4) on 2 rows


def test_exclude_wins_over_include_and_its_matches_keep_no_ancestors() -> None:
    paths = ["", "0", "1", "0.0", "0.1"]
    assert filter_reasons(paths, ["0.*"], ["0.1"]) == {
        "0.1": "matched exclude pattern '0.1'",
        "1": "not matched by include=['0.*']",
    }
    # an excluded ancestor stays skipped; the root still leads to "0.0" and "0.1"
    assert filter_reasons(paths, ["0.*"], ["0"]) == {
        "0": "matched exclude pattern '0'",
        "1": "not matched by include=['0.*']",
    }
    # the only match is excluded: nothing is kept, not even the root
    only = filter_reasons(paths, ["0.1"], ["0.1"])
    assert sorted(only) == sorted(paths)
    assert only["0.1"] == "matched exclude pattern '0.1'"
    assert only[""] == "not matched by include=['0.1']"


def test_an_include_pattern_matching_nothing_warns_once_with_real_paths() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = profile_components(
            _nested(), (torch.randn(2, 4),), include=["encoder.*", "0.0"], descend="all", **OPTS
        )
    messages = [m for m in _ours(caught) if "include pattern" in m]
    assert messages == [
        "cb_callback: include pattern(s) ['encoder.*'] match no component, so they profile "
        "nothing; component paths look like ['0', '1', '0.0', '0.1'] (fnmatch globs on the "
        "dotted path, the root is '')"
    ]
    assert [r.status for r in report] == ["ok", "ok", "skipped", "ok", "skipped"]


# --- 2. a dtype without a peak keeps its report ----------------------------------------


class _FakeClock:
    """Stands in for ``_best_seconds``: every timed call takes 1 ms."""

    def __call__(self, fn: object, min_repeats: int, budget_s: float) -> tuple[float, float]:
        return 1e-3, 1e-3 * (min_repeats + 1)


def test_a_float64_model_is_profiled_against_a_measured_fp64_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_calibration, "_best_seconds", _FakeClock())
    model = nn.Linear(4, 2).double()
    report = profile_components(model, (torch.randn(3, 4, dtype=torch.float64),), **FAST)
    assert report.metadata["dtype"] == "fp64"
    peaks = report.metadata["peaks"]
    # 1 ms per GEMM: all sizes fit the budget and the largest wins, as for fp32
    assert peaks["flops"] == 2 * 2048**3 / 1e-3
    assert peaks["flops_source"] == "measured"
    assert "torch.float64" in peaks["reference"]
    # read + write of the DRAM copy: 128 MiB, or 4x the last-level cache where that is larger (a 300 MiB L3
    # makes it the 1 GiB cap): the machine's own size, not a constant
    copy_bytes = _calibration._dram_copy_bytes()
    assert copy_bytes >= 128 * _MIB
    assert peaks["bandwidth"] == 2 * copy_bytes / 1e-3
    row = report.row("")
    assert row.status == "ok"
    assert row.fwd_flops == 2 * 3 * 4 * 2  # 48
    flops_per_s = (row.fwd_flops + row.bwd_flops) / (row.total_ms / 1e3)
    assert row.mfu == pytest.approx(flops_per_s / (2 * 2048**3 / 1e-3), rel=1e-9)


def test_a_dtype_without_any_peak_leaves_mfu_empty_with_one_warning() -> None:
    x = torch.randn(3, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = profile_components(nn.Linear(4, 2), (x,), dtype=torch.int8, peak_bandwidth=1e10, **FAST)
        profile_components(nn.Linear(4, 2), (x,), dtype=torch.int8, peak_bandwidth=1e10, **FAST)
    assert [m for m in _ours(caught) if "peak FLOP/s" in m] == [
        "cb_callback: no peak FLOP/s is known for torch.int8 (peaks exist for ('fp32', 'tf32', "
        "'bf16', 'fp16', 'fp8', 'fp64')), so MFU is left empty; pass peak_flops=<FLOP/s> to set it."
    ]
    assert first.metadata["dtype"] == "torch.int8"
    assert first.metadata["peaks"]["flops"] is None
    assert first.metadata["peaks"]["flops_source"] == "unknown"
    row = first.row("")
    assert row.status == "ok"
    assert math.isnan(row.mfu)
    assert row.bw_util == pytest.approx(row.bytes / (row.total_ms / 1e3) / 1e10, rel=1e-9)


def test_fp64_on_a_gpu_is_unknown_but_its_bandwidth_known(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hw, "_cuda_device_name", lambda device: "NVIDIA H100 80GB HBM3")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        peaks = hw.resolve_peaks("cuda", "fp64")
        hw.resolve_peaks("cuda", "fp64")
    assert _ours(caught) == [
        "cb_callback: the H100 SXM datasheet has no fp64 peak (the table records no FP64 rates), "
        "so MFU is left empty; pass peak_flops=<FLOP/s> to set it."
    ]
    assert (peaks.flops, peaks.flops_source) == (None, "unknown")
    assert (peaks.bandwidth, peaks.bandwidth_source) == (3.35e12, "datasheet")


def test_dtype_keys_and_the_typo_guard() -> None:
    assert resolve_dtype(torch.float64) == (torch.float64, "fp64")
    assert resolve_dtype("float64") == (torch.float64, "fp64")
    assert resolve_dtype("double") == (torch.float64, "fp64")
    assert resolve_dtype(torch.float8_e4m3fn) == (torch.float8_e4m3fn, "fp8")
    assert resolve_dtype(torch.int8) == (torch.int8, "torch.int8")
    for typo in ("float64", "int8", "torch.nothing"):
        with pytest.raises(ValueError, match="is not a peak key"):
            hw.resolve_peaks("cpu", typo, **PEAKS)


def test_lightning_64_true_keeps_its_report(tmp_path: Path) -> None:
    from cb_callback import ComponentBenchmark
    from cb_callback._engine.run.precision import peak_dtype as _precision_dtype
    from tests._callback_models import run_fit

    assert (_precision_dtype("64-true"), _precision_dtype("64")) == ("fp64", "fp64")
    # descend="all": every row replayed whatever the in-situ times say (a busy machine moves a leaf's
    # share under the triage's floor, and it would be kept in situ as "skipped"): the test is of fp64
    cb = ComponentBenchmark(capture_step=1, descend="all", **OPTS)
    run_fit(tmp_path, [cb], max_steps=2, logger=False, precision="64-true")
    assert cb.report is not None
    assert cb.report.metadata["dtype"] == "fp64"
    assert cb.report.metadata["precision"] == "64-true"
    assert {r.status for r in cb.report} == {"ok"}


# --- 3. the time budget starts after the calibration -----------------------------------


def test_the_calibration_is_outside_the_budget_and_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    real = engine_module.resolve_peaks

    def slow_calibration(*args: Any, **kwargs: Any) -> hw.Peaks:
        time.sleep(0.35)  # a calibration longer than the whole budget
        return real(*args, **kwargs)

    monkeypatch.setattr(engine_module, "resolve_peaks", slow_calibration)
    report = profile_components(_nested(), (torch.randn(2, 4),), max_total_time_s=0.3, **OPTS)
    assert report.row("").status == "ok"
    assert report.metadata["timing"]["calibration_s"] >= 0.35


def test_any_positive_budget_measures_the_root() -> None:
    report = profile_components(_nested(), (torch.randn(2, 4),), max_total_time_s=1e-9, **OPTS)
    assert [r.status for r in report] == ["ok", "skipped", "skipped", "skipped", "skipped"]
    assert (report.row("1").note or "").startswith("max_total_time_s=1e-09 reached: ")


# --- 4. our FLOP rules apply to our counting only ---------------------------------------

_USER_FLOPS_SCRIPT = """
import json
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode, flop_registry

B, H, L, E = 2, 4, 16, 8
q, k, v = (torch.randn(B, H, L, E, requires_grad=True) for _ in range(3))

def user_count():
    counter = FlopCounterMode(display=False)
    with counter:
        F.scaled_dot_product_attention(q, k, v)
    return counter.get_total_flops()

plain = user_count()
import cb_callback

class Attention(torch.nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)

after = user_count()
row = cb_callback.profile_components(
    Attention(), (q, k, v), warmup=0, min_run_time_s=0.0, min_repeats=1, max_repeats=1,
    load_plugins=False, peak_flops=1e11, peak_bandwidth=1e10,
).row("")
op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
print(json.dumps({"plain": plain, "after": after, "ours": row.fwd_flops, "global": op in flop_registry}))
"""


def test_importing_cb_callback_leaves_a_users_flop_counter_alone(tmp_path: Path) -> None:
    script = tmp_path / "user_flops.py"
    script.write_text(_USER_FLOPS_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["after"] == result["plain"]  # the user's count is torch's, before and after
    assert result["global"] is False  # nothing was added to torch's registry
    assert result["ours"] == 4 * 2 * 4 * 16 * 16 * 8  # 4*B*H*L*L*E = 65536 in our report


def test_register_flop_rule_counts_in_ours_only_and_rejects_duplicates(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.utils.flop_counter import flop_registry

    monkeypatch.setattr(flop_rules, "RULES", dict(flop_rules.RULES))
    gelu = torch.ops.aten.gelu

    def gelu_flops(x_shape: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        return 8 * math.prod(x_shape)

    register_flop_rule(gelu, gelu_flops)
    with pytest.raises(ValueError, match="already registered"):
        register_flop_rule(gelu, gelu_flops)
    with pytest.raises(ValueError, match="OpOverloadPacket"):
        register_flop_rule(torch.ops.aten.gelu.default, gelu_flops)
    row = profile_components(nn.GELU(), (torch.randn(4, 4, requires_grad=True),), **OPTS).row("")
    assert row.fwd_flops == 8 * 4 * 4  # 128: the rule's formula on the (4, 4) input
    assert row.details["uncounted_ops"] == ["aten.gelu_backward"]
    assert gelu not in flop_registry


# --- 5. CUDA peak statistics are left as they were ---------------------------------------


def _stats(current: int, peak: int, allocated: int) -> dict[str, int]:
    return {
        "allocated_bytes.all.current": current,
        "allocated_bytes.all.peak": peak,
        "allocated_bytes.all.allocated": allocated,
    }


def test_cuda_pass_peak_from_events_from_a_new_peak_or_unknown() -> None:
    before = _stats(current=10_000, peak=50_000, allocated=1_000_000)
    # events of the pass: +512, +1024, -512 (sizes), allocator totals after each
    events = [(1, 512, 10_512), (2, 1024, 11_536), (3, -512, 11_024)]
    complete = _stats(current=11_024, peak=50_000, allocated=1_000_000 + 512 + 1024)
    assert memory_module._cuda_pass_peak(before, complete, events) == (1536, None)  # 11_536 - 10_000
    # the events missed 2048 bytes, but the pass raised the process peak: that is its peak
    missed = _stats(current=11_024, peak=60_000, allocated=1_000_000 + 512 + 1024 + 2048)
    assert memory_module._cuda_pass_peak(before, missed, events) == (50_000, None)  # 60_000 - 10_000
    # missed events and an earlier, higher peak: unknown, and it says why
    below = _stats(current=11_024, peak=50_000, allocated=1_000_000 + 4096)
    peak, why = memory_module._cuda_pass_peak(before, below, events)
    assert peak is None
    assert why == (
        "the allocation events missed some allocations and the pass stayed below the process's "
        "earlier CUDA peak (torch.cuda.max_memory_allocated), which cb_callback never resets"
    )
    assert memory_module._cuda_pass_peak(before, below, None)[1].startswith("no allocation events were recorded")


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, stats: list[dict[str, int]]) -> None:
    def forbidden(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the process's CUDA peak statistics must not be reset")

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: stats.pop(0))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", forbidden)
    monkeypatch.setattr(torch.cuda, "reset_max_memory_allocated", forbidden)
    monkeypatch.setattr(memory_module, "_WARNED", set())


def _cuda_instrument() -> Any:
    ctx = SimpleNamespace(device=torch.device("cuda", 0), path="block", module=nn.Identity(), replay=None)
    return memory_module.MemoryMetric().instrument(ctx)  # type: ignore[arg-type]


def _cuda_pass() -> PassContext:
    return PassContext(Phase.PASS, "block", nn.Identity(), torch.device("cuda", 0), ReplayInputs((), {}))


def test_the_cuda_pass_never_resets_the_peak_statistics(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_cuda(monkeypatch, [_stats(0, 8 * _MIB, 100), _stats(0, 8 * _MIB, 100 + 2 * _MIB)])
    events = [(1, 2 * _MIB, 2 * _MIB), (2, -2 * _MIB, 0)]
    monkeypatch.setattr(memory_module, "_allocation_events", lambda prof, device: events)
    ins = _cuda_instrument()
    with ins.observe(_cuda_pass()):
        torch.ones(4)
    values = ins.values()
    assert values["peak_mem_mb"] == 2.0  # the 2 MiB block, below the process's 8 MiB peak
    assert values["peak_mem_source"] == "cuda_caching_allocator"
    assert "peak_mem_unknown" not in values


def test_an_unknown_cuda_peak_is_empty_and_warned_once(monkeypatch: pytest.MonkeyPatch) -> None:
    stats = [_stats(0, 8 * _MIB, 100), _stats(0, 8 * _MIB, 100 + _MIB)] * 2
    _fake_cuda(monkeypatch, stats)
    monkeypatch.setattr(memory_module, "_allocation_events", lambda prof, device: [])  # none seen
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            ins = _cuda_instrument()
            with ins.observe(_cuda_pass()):
                pass
    values = ins.values()
    assert "peak_mem_mb" not in values
    assert values["peak_mem_unknown"].startswith("the allocation events missed some allocations")
    assert len(_ours(caught)) == 1
    assert "the cuda peak memory of 'block'" in _ours(caught)[0]


def test_a_users_own_profiler_keeps_running_and_the_peak_says_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.profiler import ProfilerActivity, profile

    monkeypatch.setattr(memory_module, "_WARNED", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with profile(activities=[ProfilerActivity.CPU]) as user:
            row = profile_components(nn.Linear(4, 2), (torch.randn(3, 4),), **OPTS).row("")
            torch.mm(torch.randn(2, 2), torch.randn(2, 2))
    assert "aten::mm" in {e.key for e in user.key_averages()}  # the user's session kept recording
    assert math.isnan(row.peak_mem_mb)
    assert row.details["peak_mem_unknown"] == "another torch profiler is running (a second one would end it)"
    assert len([m for m in _ours(caught) if "peak memory" in m]) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_profile_leaves_max_memory_allocated_as_it_was() -> None:
    torch.cuda.reset_peak_memory_stats()
    big = torch.empty(64 * _MIB, dtype=torch.uint8, device="cuda")  # a 64 MiB training peak
    del big
    peak_before = torch.cuda.max_memory_allocated()
    model = nn.Linear(1024, 1024).cuda()
    report = profile_components(model, (torch.randn(512, 1024, device="cuda"),), **FAST)
    assert torch.cuda.max_memory_allocated() == peak_before
    row = report.row("")
    assert "peak_mem_unknown" not in row.details  # the allocation events accounted for the pass
    # alive at the end: y, dY (512x1024 fp32 each), dW (1024x1024), db (1024)
    assert row.peak_mem_mb * _MIB >= 4 * (2 * 512 * 1024 + 1024 * 1024 + 1024)


# --- 6. a snapshot of a class in the training script replays ------------------------------

_TRAIN_SCRIPT = """
import sys
from pathlib import Path

import torch
from torch import nn

from cb_callback import BenchmarkConfig, Capture
from cb_callback._whatif.snapshot import save_snapshot
from helpers import HIDDEN

LOG = Path(__file__).with_name("imports.log")
with LOG.open("a") as f:
    f.write(f"top {__name__}\\n")


class MLPClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, HIDDEN), nn.ReLU())
        self.head = nn.Linear(HIDDEN, 3)

    def forward(self, x):
        return self.head(self.body(x))


if __name__ == "__main__":
    with LOG.open("a") as f:
        f.write("main\\n")
    torch.manual_seed(0)
    model = MLPClassifier()
    with Capture(model) as capture:
        model(torch.randn(5, 4))
    # descend="all": every replay measures all five rows, whatever the in-situ times of a busy machine say
    config = BenchmarkConfig(
        warmup=0, min_run_time_s=0.0, min_repeats=1, max_repeats=1, load_plugins=False,
        peak_flops=1e11, peak_bandwidth=1e10, descend="all",
    )
    save_snapshot(
        sys.argv[1], model, capture.calls, config=config, captured_batch_size=5,
        metadata={"capture_step": 0, "capture_device": "cpu"},
    )
"""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in ``cwd``."""
    return subprocess.run([sys.executable, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300)


class _Cli:
    """``python -m cb_callback._cli ARGS`` runs, each a process forked from ``tests/_cli_forks.py`` (started at once,
    no ``PYTHONPATH`` either), which imported the CLI and what a replay imports once, not once a run."""

    def __init__(self, cwd: Path, logs: Path) -> None:
        self.logs, self.n = logs, 0
        logs.mkdir()
        script = Path(__file__).with_name("_cli_forks.py")
        self.proc = subprocess.Popen(
            [sys.executable, str(script)], cwd=cwd, env=_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )  # fmt: skip

    def _line(self) -> str:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 300)
        assert ready, "tests/_cli_forks.py: nothing in 300 s"
        return self.proc.stdout.readline()

    def run_together(self, commands: list[tuple[list[str], Path]]) -> list[subprocess.CompletedProcess[str]]:
        """Each ``python -m cb_callback._cli ARGS`` in its directory, all at once, waited for in order."""
        if self.n == 0:
            assert self._line() == "ready\n"
        assert self.proc.stdin is not None
        logs = []
        for args, cwd in commands:
            assert args[:2] == ["-m", "cb_callback._cli"], args
            self.n += 1
            logs.append((self.logs / f"{self.n}.out", self.logs / f"{self.n}.err"))
            self.proc.stdin.write(json.dumps([str(cwd), *map(str, logs[-1]), *args[2:]]) + "\n")
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        codes = json.loads(self._line())
        return [
            subprocess.CompletedProcess(args, code, out.read_text(), err.read_text())
            for (args, _), code, (out, err) in zip(commands, codes, logs, strict=True)
        ]

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _assert_replayed(out: Path) -> None:
    report = Report.load(out)
    assert [r.path for r in report.rows] == ["", "body", "head", "body.0", "body.1"]
    assert [r.status for r in report.rows] == ["ok"] * 5
    assert report.row("body.0").fwd_flops == 2 * 5 * 4 * 8  # Linear(4 -> HIDDEN=8) on 5 samples
    assert report.row("head").fwd_flops == 2 * 5 * 8 * 3  # Linear(8 -> 3)


def test_cb_replay_finds_a_model_class_defined_in_the_training_script(tmp_path: Path) -> None:
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "train.py").write_text(_TRAIN_SCRIPT)
    (project / "helpers.py").write_text("HIDDEN = 8\n")
    snap = tmp_path / "snap"
    cli = _Cli(elsewhere, tmp_path / "logs")  # (it imports while the training script runs)
    try:
        _replays(tmp_path, project, elsewhere, snap, cli)
    finally:
        cli.close()


def _replays(tmp_path: Path, project: Path, elsewhere: Path, snap: Path, cli: _Cli) -> None:
    saved = _run(["train.py", str(snap)], cwd=project)
    assert saved.returncode == 0, saved.stderr
    description = json.loads((snap / "snapshot.json").read_text())
    assert description["model_class"] == "__main__.MLPClassifier"
    assert description["script"] == str(project / "train.py")
    assert description["script_sys_path"] == str(project)

    # from another directory, with the script's directory not on the path: a real `python -m` process, cold (what
    # the CLI imports on its own); the two replays after the move are forks of the process that imported it once
    replayed = _run(
        ["-m", "cb_callback._cli", "replay", str(snap), "--device", "cpu", "--out", str(tmp_path / "a")], elsewhere
    )
    assert replayed.returncode == 0, replayed.stderr
    _assert_replayed(tmp_path / "a")
    # the script's top level ran as __mp_main__; its __main__ block did not run again
    assert (project / "imports.log").read_text() == "top __main__\nmain\ntop __mp_main__\n"

    moved = tmp_path / "moved"
    moved.mkdir()
    for name in ("train.py", "helpers.py"):
        shutil.move(str(project / name), str(moved / name))
    # the replays without and with --script, one after the other (forks import nothing: the first ends within a
    # second; at once, it would be one more process on the CPUs while the second times the components)
    (lost,) = cli.run_together(
        [(["-m", "cb_callback._cli", "replay", str(snap), "--device", "cpu", "--out", str(tmp_path / "b")], elsewhere)]
    )
    (found,) = cli.run_together([
        (["-m", "cb_callback._cli", "replay", str(snap), "--device", "cpu", "--out", str(tmp_path / "c"),
          "--script", str(moved / "train.py")], elsewhere),
    ])  # fmt: skip
    assert lost.returncode == 2  # could not replay (1: replayed, files not written)
    assert f"the script is not at {project / 'train.py'}: pass it with `cb replay --script PATH`" in lost.stderr
    assert found.returncode == 0, found.stderr
    _assert_replayed(tmp_path / "c")
    assert (moved / "imports.log").read_text() == "top __mp_main__\n"
