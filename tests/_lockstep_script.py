"""Two CPU ranks (gloo) profiling in lockstep: an FSDP2 model, a plan mismatch, a rank that raises.

Run by test_lockstep.py: the scenarios one after another on one process pair (those after which the
process group is no use, :data:`OWN_PAIR`, on a pair of their own); each rank writes ``rank_<r>.json``
into ``OUT/<scenario>/``.

Usage: ``PYTHONPATH=<repo> python tests/_lockstep_script.py SCENARIO[=TIMEOUT_S][,SCENARIO...] OUT``
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

FEATURES, HIDDEN, CLASSES, BATCH = 16, 32, 4, 8
#: The lockstep scenarios' options: no in-situ pass (the profile descends level by level, every call of a
#: module below counted as before it ran under several ranks); the triage scenarios (TRIAGE) turn it on.
OPTS: dict[str, Any] = dict(
    warmup=1, min_run_time_s=0.0, min_repeats=2, max_repeats=2, rounds=2, peak_flops=1e12, peak_bandwidth=1e11,
    load_plugins=False, insitu_passes=0,
)  # fmt: skip
#: The default in-situ pass (a warm-up and 3 passes) and triage.
TRIAGE: dict[str, Any] = {"insitu_passes": 3}


class Block(nn.Module):
    """A residual MLP block."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, FEATURES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


class Net(nn.Module):
    """Three blocks and a head (what the issue's FSDP2 case shards)."""

    def __init__(self, extra: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(3)])
        self.head = nn.Linear(FEATURES, CLASSES)
        if extra:  # a different model on one rank: the plan mismatch
            self.extra = nn.Linear(CLASSES, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def sharded(extra: bool = False) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = Net(extra)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def batch(rank: int) -> torch.Tensor:
    return torch.randn(BATCH, FEATURES, generator=torch.Generator().manual_seed(rank))


def rows(report: Any) -> dict[str, dict[str, Any]]:
    def num(v: float) -> float | None:
        return v if isinstance(v, float) and math.isfinite(v) else None

    return {
        r.path: {
            "status": r.status, "error": r.error, "note": r.note, "fwd_flops": num(r.fwd_flops),
            "bwd_flops": num(r.bwd_flops), "comm_bytes": num(r.comm_bytes), "comm_ms": num(r.comm_ms),
            "params_mb": num(r.params_mb), "ranks": r.details.get("ranks"), "comm": r.details.get("comm"),
            "repeats": r.details.get("fwd_repeats"), "settled": (r.details.get("timing") or {}).get("settled"),
            "lockstep": r.details.get("lockstep"), "as": r.details.get("as"),
            "insitu_ms": num(r.insitu_ms), "insitu_bwd_ms": num((r.details.get("insitu") or {}).get("bwd_ms")),
        }
        for r in report.rows
    }  # fmt: skip


def fsdp(rank: int, out: Path, ranks: str) -> dict[str, Any]:
    """One real step, a profile on every rank, one more step; the same without the profile."""
    from cb_callback import profile_components

    def twin(profile: bool) -> tuple[list[torch.Tensor], list[torch.Tensor | None], Any]:
        model = sharded()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = batch(rank)
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
        t0 = time.perf_counter()
        report = profile_components(model, x, ranks=ranks, **OPTS) if profile else None
        seconds.append(time.perf_counter() - t0)
        loss = model(x).sum()
        loss.backward()
        grads = [None if p.grad is None else p.grad.to_local().clone() for p in model.parameters()]
        opt.step()
        return [p.to_local().clone() for p in model.parameters()], grads, report

    seconds: list[float] = []
    a, ga, report = twin(True)
    b, gb, _ = twin(False)
    same = all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    same_grads = all(x is not None and y is not None and torch.equal(x, y) for x, y in zip(ga, gb, strict=True))
    return {
        "identical": same, "identical_grads": same_grads, "rows": rows(report), "seconds": seconds[0],
        "meta_ranks": report.metadata.get("ranks"),
    }  # fmt: skip


def mismatch(rank: int, out: Path) -> dict[str, Any]:
    """Rank 1 profiles a model with one more module: a clear error on both ranks, nothing replayed."""
    from cb_callback import profile_components

    torch.manual_seed(0)
    layers = [nn.Linear(FEATURES, FEATURES), Center(), nn.ReLU(), nn.Linear(FEATURES, CLASSES)]
    if rank == 1:
        layers.append(nn.ReLU())
    model = nn.Sequential(*layers)
    before = [p.detach().clone() for p in model.parameters()]
    t0 = time.perf_counter()
    try:
        profile_components(model, batch(rank), **OPTS)
    except ValueError as e:
        seconds = time.perf_counter() - t0
        return {"error": str(e), "seconds": seconds, "center_calls": model[1].count, "untouched": _same(model, before)}
    return {"error": None}


def _same(model: nn.Module, before: list[torch.Tensor]) -> bool:
    """Every parameter equal to its copy taken before the profile, bit for bit, and no gradient left."""
    params = list(model.parameters())
    return all(torch.equal(p, b) and p.grad is None for p, b in zip(params, before, strict=True))


class _Calls:
    n = 0


class Center(nn.Module):
    """x minus the mean over every rank's batch (an all-reduce in its forward); on rank 1 its sixth call
    raises before the all-reduce (a timed run: the others must not wait for it forever)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = _Calls()  # an object of its own: profiling puts a module's own attributes back

    @property
    def count(self) -> int:
        """The forwards run so far: the capture's and every replay's."""
        return self.calls.n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.n += 1
        if dist.get_rank() == 1 and self.count == 6:
            raise RuntimeError("rank 1 gives up")
        total = x.detach().sum(0, keepdim=True)
        dist.all_reduce(total)
        return x - total / (BATCH * dist.get_world_size())


def raises(rank: int, out: Path) -> dict[str, Any]:
    from cb_callback import profile_components

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, FEATURES), Center(), nn.ReLU(), nn.Linear(FEATURES, CLASSES))
    before = [p.detach().clone() for p in model.parameters()]
    t0 = time.perf_counter()
    report = profile_components(model, batch(rank), **OPTS)
    seconds = time.perf_counter() - t0
    return {"rows": rows(report), "seconds": seconds, "center_calls": model[1].count, "untouched": _same(model, before)}


class SlowCenter(nn.Module):
    """150 ms (a sleep), then x minus the mean over every rank's batch (an all-reduce): a long component
    replayed in lockstep."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.15)
        total = x.detach().sum(0, keepdim=True)
        dist.all_reduce(total)
        return x - total / (BATCH * dist.get_world_size())


def settle(rank: int, out: Path) -> dict[str, Any]:
    """A long component in lockstep: its runs agree on both ranks after two, so both stop there."""
    from cb_callback import profile_components

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, FEATURES), SlowCenter(), nn.Linear(FEATURES, CLASSES))
    opts = {**OPTS, "min_run_time_s": 0.05, "min_repeats": 5, "max_repeats": 50, "rounds": 5}
    report = profile_components(model, batch(rank), **opts)
    return {"rows": rows(report)}


class _Root:
    calls = 0
    raised = False

    def __init__(self) -> None:
        self.modes: list[int] = []  # per forward of RaiseInRoot: how many dispatch modes were active


class _RaiseInBackward(torch.autograd.Function):
    """Identity whose backward raises (on rank 1, once: ``root.raised``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, root: _Root) -> torch.Tensor:
        ctx.root = root
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        if not ctx.root.raised:
            ctx.root.raised = True
            raise RuntimeError("rank 1 runs out of memory in the backward")
        return grad, None


class RaiseInRoot(nn.Module):
    """Identity; on rank 1 it raises once, in the root's ``at``-th forward (or in its backward): 1 the real
    step's, 2 ``profile_components``' own capture, 3 the first lockstep pass, 4 the first timed run, 5 the
    second, 6-8 the communication timing passes (with 2 timed runs in 2 slices). An out-of-memory on one
    rank looks like this."""

    def __init__(
        self, root: _Root, at: int = 4, backward: bool = False, die: bool = False, sleep_s: float = 0.0
    ) -> None:
        super().__init__()
        self.root, self.at, self.backward, self.die = root, at, backward, die
        self.sleep_s = sleep_s  # every forward, on every rank (the triage scenarios' hotspot)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        self.root.modes.append(len(_get_current_dispatch_mode_stack()))  # (on an object: profiling keeps it)
        if dist.get_rank() == 1 and self.root.calls == self.at and not self.root.raised and self.backward:
            return _RaiseInBackward.apply(x, self.root)
        if dist.get_rank() == 1 and self.root.calls == self.at and not self.root.raised and self.die:
            os._exit(3)  # the process is killed (an OOM killer, a lost node): no exception, no goodbye
        if dist.get_rank() == 1 and self.root.calls == self.at and not self.root.raised:
            self.root.raised = True
            raise RuntimeError("rank 1 runs out of memory")
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return x * 1.0


def fsdp_raise(
    rank: int,
    out: Path,
    at: int = 4,
    backward: bool = False,
    die: bool = False,
    sleep_s: float = 0.0,
    identical: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """FSDP2 blocks and a plain module after the head that raises on rank 1 in the root's ``at``-th forward
    (2: its first lockstep pass; 4: its second timed run), or in that forward's backward."""
    from torch.distributed.fsdp import fully_shard

    from cb_callback import profile_components

    torch.manual_seed(0)
    counter = _Root()
    model = Net()
    model.after = RaiseInRoot(counter, at, backward, die, sleep_s)
    inner = model.forward
    model.forward = lambda x: model.after(inner(x))  # type: ignore[method-assign]
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)

    def count(module: nn.Module, args: Any) -> None:
        counter.calls += 1

    model.register_forward_pre_hook(count)
    x = batch(rank)
    model(x).sum().backward()
    for p in model.parameters():
        p.grad = None
    before = [p.to_local().clone() for p in model.parameters()]
    t0 = time.perf_counter()
    report = profile_components(model, x, lockstep_timeout_s=30, **{**OPTS, **options})
    seconds = time.perf_counter() - t0
    untouched = all(
        torch.equal(p.to_local(), b) and p.grad is None for p, b in zip(model.parameters(), before, strict=True)
    )
    result = {
        "rows": rows(report), "seconds": seconds, "raised": counter.raised, "untouched": untouched,
        "lost": (report.metadata.get("ranks") or {}).get("lost"), "insitu": report.metadata.get("insitu"),
        "triage": report.metadata.get("triage"), "cost": report.metadata.get("cost"), "modes": counter.modes,
    }  # fmt: skip
    if identical:  # one training step after the profile, against the same step of an unprofiled twin
        result["identical"] = _step_after(model, x) == _twin_step(rank, x, sleep_s)
    return result


def _step_after(model: nn.Module, x: torch.Tensor) -> list[list[float]]:
    """One SGD step of ``model`` on ``x``: its local shards after it (as lists, to compare exactly)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(x).sum().backward()
    opt.step()
    return [p.to_local().flatten().tolist() for p in model.parameters()]


def _twin_step(rank: int, x: torch.Tensor, sleep_s: float) -> list[list[float]]:
    """The same model built and stepped as :func:`fsdp_raise` builds it, never profiled: the real step,
    then the step :func:`_step_after` takes."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = Net()
    model.after = RaiseInRoot(_Root(), at=-1, sleep_s=sleep_s)
    inner = model.forward
    model.forward = lambda y: model.after(inner(y))  # type: ignore[method-assign]
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    model(x).sum().backward()
    for p in model.parameters():
        p.grad = None
    return _step_after(model, x)


def ddp_raise(rank: int, out: Path, at: int, backward: bool, mid: bool = False) -> dict[str, Any]:
    """``DistributedDataParallel`` around ``Net`` and a ``RaiseInRoot`` after its head (raising on rank 1 in
    the root's ``at``-th forward, or its backward): DDP's reducer all-reduces the gradients from C++ in the
    backward, on the default group. With ``mid``, the ``RaiseInRoot`` sits after the first block and the
    buckets are one parameter each: its backward raises after the later blocks' buckets were all-reduced
    (the reducer part way through an iteration). One SGD step after the profile against an unprofiled
    twin's."""
    from cb_callback import profile_components

    def build(raise_at: int) -> tuple[nn.Module, _Root, torch.optim.Optimizer]:
        torch.manual_seed(0)
        counter = _Root()
        inner = Net()
        inner.after = RaiseInRoot(counter, raise_at, backward)
        forward = inner.forward

        def after_first(x: torch.Tensor) -> torch.Tensor:
            x = inner.after(inner.blocks[0](x))
            for block in inner.blocks[1:]:
                x = block(x)
            return inner.head(x)

        if mid:
            inner.forward = after_first  # type: ignore[method-assign]
        else:
            inner.forward = lambda x: inner.after(forward(x))  # type: ignore[method-assign]
        model = nn.parallel.DistributedDataParallel(inner, bucket_cap_mb=1e-6 if mid else 25)

        def count(module: nn.Module, args: Any) -> None:
            counter.calls += 1

        model.register_forward_pre_hook(count)
        return model, counter, torch.optim.SGD(model.parameters(), lr=0.1)

    def train(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()

    x = batch(rank)
    model, counter, opt = build(at)
    train(model, opt, x)
    before = [p.detach().clone() for p in model.parameters()]
    t0 = time.perf_counter()
    report = profile_components(model, x, lockstep_timeout_s=30, **{**OPTS, **TRIAGE})
    seconds = time.perf_counter() - t0
    untouched = all(torch.equal(p, b) and p.grad is None for p, b in zip(model.parameters(), before, strict=True))
    train(model, opt, x)
    twin, _, twin_opt = build(-1)
    train(twin, twin_opt, x)
    train(twin, twin_opt, x)
    identical = all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters(), strict=True))
    return {
        "rows": rows(report), "seconds": seconds, "raised": counter.raised, "untouched": untouched,
        "identical": identical, "insitu": report.metadata.get("insitu"), "triage": report.metadata.get("triage"),
    }  # fmt: skip


class Routed(nn.Module):
    """Two experts of one shape, each given a slice of the batch: on rank 0 both get 4 rows, on rank 1 the
    first gets 2 and the second 6 (what a router does with another rank's tokens)."""

    def __init__(self) -> None:
        super().__init__()
        self.experts = nn.ModuleList([nn.Linear(FEATURES, FEATURES) for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = 4 if dist.get_rank() == 0 else 2
        return torch.cat([self.experts[0](x[:k]), self.experts[1](x[k:])])


def routed(rank: int, out: Path) -> dict[str, Any]:
    """A router's two experts, alike on rank 0 and called on other rows on rank 1 (no collective: every
    replay rank-local, the in-situ pass and the triage on both ranks); descend_share=0."""
    from cb_callback import profile_components

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, FEATURES), Routed(), nn.Linear(FEATURES, CLASSES))
    report = profile_components(model, batch(rank), **{**OPTS, **TRIAGE, "descend_share": 0.0})
    result = {"rows": rows(report), "triage": report.metadata.get("triage")}
    result["not_copy"] = {r.path: r.details.get("not_copy") for r in report.rows if r.details.get("not_copy")}
    return result


def unsharded_flops(out: Path) -> None:
    """The same model, not sharded, on one process: the FLOPs the sharded profile must equal. Every row
    replayed (descend_share=0): the sharded profile replays every unit's children in lockstep, and a block's
    share of the step, a timing, may read under descend_share=0.05 on a busy machine (its children then not
    replayed: no FLOPs to compare with)."""
    from cb_callback import profile_components

    torch.manual_seed(0)
    t0 = time.perf_counter()
    report = profile_components(Net(), batch(0), **{**OPTS, "descend_share": 0.0})
    result = {"rows": rows(report), "seconds": time.perf_counter() - t0}
    (out / "unsharded.json").write_text(json.dumps(result))


def run_scenario(rank: int, scenario: str, out: Path) -> dict[str, Any]:
    """One scenario on this rank (the default process group initialized): its result, to be written down."""
    if scenario in ("fsdp", "fsdp_zero"):
        return fsdp(rank, out, "zero" if scenario == "fsdp_zero" else "all")
    if scenario == "mismatch":
        return mismatch(rank, out)
    if scenario == "settle":
        return settle(rank, out)
    if scenario == "fsdp_raise":
        return fsdp_raise(rank, out)
    if scenario == "fsdp_raise_pass":
        return fsdp_raise(rank, out, at=3)
    if scenario == "fsdp_raise_bwd":
        return fsdp_raise(rank, out, backward=True)
    if scenario == "fsdp_raise_pass_bwd":
        return fsdp_raise(rank, out, at=3, backward=True)
    if scenario == "fsdp_raise_unwritable":  # the backward's reduce-scatters cannot be written down
        from cb_callback._engine.distributed import ledger

        encode = ledger._encode

        def no_reduce_op(leaf: Any) -> Any:
            if isinstance(leaf, torch.ScriptObject) and "ReduceOp" in str(leaf._type().qualified_name()):
                raise ledger._Unwritable("ReduceOp")
            return encode(leaf)

        ledger._encode = no_reduce_op  # type: ignore[assignment]
        try:
            return fsdp_raise(rank, out, at=3)
        finally:
            ledger._encode = encode  # type: ignore[assignment]
    if scenario == "fsdp_raise_comm":
        return fsdp_raise(rank, out, at=6)
    if scenario == "fsdp_die":  # rank 1's process ends in the root's first timed run
        return fsdp_raise(rank, out, die=True)
    if scenario == "fsdp_raise_slice":  # one slice of 4 timed runs after an untimed one: the 2nd raises
        return fsdp_raise(rank, out, at=6, min_repeats=4, max_repeats=4, rounds=1)
    if scenario == "fsdp_triage":  # the in-situ pass and the triage on both ranks; `after` sleeps 0.2 s
        return fsdp_raise(rank, out, at=-1, sleep_s=0.2, identical=True, **TRIAGE)
    if scenario == "fsdp_insitu_raise":  # the root's 3rd forward: the in-situ pass's warm-up
        return fsdp_raise(rank, out, at=3, **TRIAGE)
    if scenario == "fsdp_insitu_raise_bwd":  # the 3rd's backward: the in-situ pass's warm-up's
        return fsdp_raise(rank, out, at=3, backward=True, **TRIAGE)
    if scenario == "fsdp_insitu_raise_timed":  # the 5th: the in-situ pass's second timed pass
        return fsdp_raise(rank, out, at=5, identical=True, **TRIAGE)
    if scenario == "fsdp_insitu_raise_timed_bwd":  # the 4th's backward: the first timed pass's
        return fsdp_raise(rank, out, at=4, backward=True, identical=True, **TRIAGE)
    if scenario == "ddp_insitu_raise_mid_bwd":  # DDP: the 4th's backward, after some buckets' all-reduce
        return ddp_raise(rank, out, at=4, backward=True, mid=True)
    if scenario == "routed":
        return routed(rank, out)
    if scenario == "ddp_insitu_raise_timed_bwd":  # DDP: the 4th forward's backward (the first timed pass)
        return ddp_raise(rank, out, at=4, backward=True)
    if scenario == "fsdp_census_raise":  # the 7th: the census (after the warm-up and 3 passes)
        return fsdp_raise(rank, out, at=7, **TRIAGE)
    if scenario == "fsdp_insitu_die":  # rank 1's process ends in the in-situ pass's first timed pass
        return fsdp_raise(rank, out, at=4, die=True, **TRIAGE)
    if scenario == "raise":
        return raises(rank, out)
    raise ValueError(f"no scenario {scenario!r}")


#: Scenarios that need a process pair of their own: rank 1's process ends (``os._exit``) part way, or rank 1
#: ends its part while rank 0 is left in a collective that only rank 1's process group closing ends (the
#: default process group is no use for another scenario after either).
OWN_PAIR = ("fsdp_die", "fsdp_insitu_die", "fsdp_raise_unwritable")
#: The state of torch's default generator in a fresh process (``torch.initial_seed()`` before any seeding):
#: every scenario of a batch starts from it, as if it ran alone.
FRESH_SEED = 67280421310721
#: How long a rank that finished a scenario of a batch waits for the other to finish it too (the parent ends
#: both first when the scenario runs past its own timeout).
AGREE_S = 900


def _worker(rank: int, scenarios: list[str], out: Path, store: Path) -> None:
    """Every scenario in turn on one process pair (one default process group), each into ``out/<scenario>``.

    After each scenario of a batch the ranks agree through the store that both finished it: a rank that raised
    out of a scenario, or whose peer does not finish it, ends the batch (exit code 1: what came after would not
    be what it is alone)."""
    from datetime import timedelta

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    kv = dist.distributed_c10d._get_default_store()
    for i, scenario in enumerate(scenarios):
        here = out / scenario
        here.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(FRESH_SEED)
        try:
            result = run_scenario(rank, scenario, here)
        except Exception:
            result = {"crash": traceback.format_exc()}
        (here / f"rank_{rank}.json").write_text(json.dumps(result, default=str))
        if len(scenarios) == 1:
            break
        if "crash" in result:  # the other rank may be left in a collective: nothing later would be as alone
            print(f"rank {rank}: the batch ends at {scenario}, which raised on this rank", flush=True)
            os._exit(1)  # the parent ends the other rank too
        kv.set(f"batch/{i}/{rank}", "ok")
        try:
            kv.wait([f"batch/{i}/{1 - rank}"], timedelta(seconds=AGREE_S))
        except Exception as e:  # the other rank ended (the parent ends this one) or is still in this scenario
            print(f"rank {rank}: the batch ends at {scenario}: the other rank did not finish it ({e!r})", flush=True)
            os._exit(1)
    dist.destroy_process_group()


def _batch(scenarios: dict[str, float], out: Path) -> None:
    """``scenarios`` (name -> timeout in seconds) one after another on one process pair; a scenario that runs
    past its timeout ends the batch (both ranks killed, ``<scenario>/timeout.txt`` written)."""
    names = list(scenarios)
    procs = mp.start_processes(
        _worker, args=(names, out, out / "store"), nprocs=2, join=False, start_method="fork"
    )  # fmt: skip
    began = time.monotonic()
    done = 0
    while not procs.join(timeout=0.5):
        while done < len(names) and all((out / names[done] / f"rank_{r}.json").exists() for r in (0, 1)):
            done, began = done + 1, time.monotonic()
        if done < len(names) and time.monotonic() - began > scenarios[names[done]]:
            for p in procs.processes:
                p.kill()
            (out / names[done]).mkdir(parents=True, exist_ok=True)
            (out / names[done] / "timeout.txt").write_text(f"ran past its {scenarios[names[done]]:g} s")
            sys.exit(f"{names[done]} ran past its {scenarios[names[done]]:g} s: the batch was ended there")


def main(scenarios: dict[str, float], out: Path) -> None:
    """Run ``scenarios`` (name -> timeout in seconds), each writing into ``OUT/<scenario>/``.

    ``unsharded`` runs in a process of its own (no process group); a scenario of :data:`OWN_PAIR` alone on a
    process pair of its own; the others one after another on one process pair. Every process is forked from
    this one (it imported torch, the package and what the scenarios import lazily, and started no process group
    or thread): none imports them again."""
    # imported once, before the fork: FSDP2 (fully_shard; 3 s a process on a busy machine) and torch._dynamo
    # (the first FSDP2 forward imports it) would otherwise be imported in every rank of every pair
    import torch._dynamo
    import torch.distributed.fsdp  # noqa: F401

    import cb_callback  # noqa: F401

    out.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("fork")
    for scenario, timeout in scenarios.items():
        here = out / scenario
        if scenario == "unsharded":
            here.mkdir(exist_ok=True)
            alone = ctx.Process(target=unsharded_flops, args=(here,))
            alone.start()
            alone.join(timeout=timeout)
            if alone.exitcode is None:
                alone.kill()
        elif scenario in OWN_PAIR:
            here.mkdir(exist_ok=True)
            # rank 1's process may end: two processes of our own (mp.start_processes would end rank 0 with it)
            procs = [ctx.Process(target=_worker, args=(r, [scenario], out, here / "store")) for r in (0, 1)]
            for p in procs:
                p.start()
            deadline = time.monotonic() + timeout
            for p in procs:
                p.join(timeout=max(0.0, deadline - time.monotonic()))
            for p in procs:
                if p.exitcode is None:
                    p.kill()
            (here / "exitcodes.json").write_text(json.dumps([p.exitcode for p in procs]))
    pair = {s: t for s, t in scenarios.items() if s != "unsharded" and s not in OWN_PAIR}
    if pair:
        _batch(pair, out)


if __name__ == "__main__":
    # SCENARIO[=TIMEOUT_S][,SCENARIO[=TIMEOUT_S]...] OUT (a timeout of 240 s unless given)
    items = [item.partition("=") for item in sys.argv[1].split(",")]
    main({name: float(t or 240) for name, _, t in items}, Path(sys.argv[2]))
