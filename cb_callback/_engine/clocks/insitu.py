"""Every component's in-situ time: the captured step's top components run whole, each module's
calls timed by hooks (``insitu_ms``, the forward) and, on CPU, each module's backward by the autograd
nodes it built (:mod:`cb_callback._engine.clocks.nodeclock`), before any isolated replay."""

from __future__ import annotations

import contextlib
import functools
import math
import statistics
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from cb_callback._engine.capture.inputs import ComponentInputs
from cb_callback._engine.capture.tree import component_paths, owner, scripted
from cb_callback._engine.clocks.clock import HookClock, HookCost
from cb_callback._engine.clocks.nodeclock import NodeClock
from cb_callback._engine.clocks.timing import record_timed
from cb_callback._engine.distributed.collectives import refuse_collectives
from cb_callback._engine.replay.isolate import Replay
from cb_callback._report.model import error_text
from cb_callback._types import UserValue

__all__ = ["InSitu", "InSituTimes", "hook_clock", "measure_hook_cost", "time_in_situ", "top_paths"]

_NAN = float("nan")


@dataclass
class InSitu:
    """One component's in-situ forward and backward.

    Attributes:
        fwd_ms: median over the passes of its forward time per call (ms), inside
            its parent's forward as the real step runs it.
        calls: its calls in one pass (one call of its top: the step's count is the capture's).
        spread: ``(max - min) ÷ median`` of the per-call time over the passes.
        bwd_ms: its backward per call in the step: a top component's whole
            backward; below a top, on CPU, the time of the autograd nodes its
            forward built (its share of the gradient sums left out: see
            :mod:`cb_callback._engine.clocks.nodeclock`); NaN on CUDA below a top, or
            without a backward.
    """

    fwd_ms: float
    calls: int
    spread: float
    bwd_ms: float = _NAN


@dataclass
class InSituTimes:
    """The in-situ pass of one captured batch.

    Attributes:
        times: by path.
        tops: the components run whole (the root, or the outermost called ones).
        passes: timed passes run (after one warm-up; the fewest over the tops).
        seconds: what the pass cost, warm-up included.
        timed_s: the timed passes' forwards and backwards (counted as timed work).
        errors: ``{top: error}`` for a top whose pass raised (its subtree has no times).
        hook_cost: what the clock's hooks added per call, left out of every time (:func:`measure_hook_cost`).
    """

    times: dict[str, InSitu] = field(default_factory=dict)
    tops: list[str] = field(default_factory=list)
    passes: int = 0
    seconds: float = 0.0
    timed_s: float = 0.0
    errors: dict[str, str] = field(default_factory=dict)
    hook_cost: HookCost = field(default_factory=HookCost)

    @property
    def backward_timed(self) -> bool:
        """Whether every module's backward was timed (:attr:`InSitu.bwd_ms` finite on every path): the
        triage's shares are then of the forward and backward (:meth:`cost_ms`), else of the forward."""
        return bool(self.times) and all(math.isfinite(x.bwd_ms) for x in self.times.values())

    def cost_ms(self, path: str) -> float:
        """``path``'s in-situ time per call that the triage's shares divide: forward + backward when
        :attr:`backward_timed`, else the forward (NaN: not timed)."""
        mine = self.times.get(path)
        if mine is None:
            return _NAN
        return mine.fwd_ms + mine.bwd_ms if self.backward_timed else mine.fwd_ms

    def step_ms(self, calls: Mapping[str, int]) -> float:
        """The step as the tops cost it: ``Σ cost_ms × calls`` over the tops (``calls``: the captured
        step's, by path): its forward and backward when :attr:`backward_timed`, else its forward."""
        return math.fsum(self.cost_ms(t) * max(calls.get(t, 1), 1) for t in self.tops if t in self.times)

    def to_metadata(self) -> dict[str, Any]:
        return {
            "tops": list(self.tops),
            "passes": self.passes,
            "seconds": self.seconds,
            "bwd_ms": {t: self.times[t].bwd_ms for t in self.tops if t in self.times},
            "shares_of": "forward and backward" if self.backward_timed else "forward",
            "errors": dict(self.errors),
            "hook_cost_us": {"own": self.hook_cost.own_s * 1e6, "nested": self.hook_cost.nested_s * 1e6},
        }


def top_paths(calls: Mapping[str, ComponentInputs], paths: Sequence[str]) -> list[str]:
    """The called components none of whose ancestors was called (the root, when the step called it)."""
    called = {p for p in paths if p in calls and calls[p].capture_error is None}
    out = []
    for p in paths:
        if p not in called:
            continue
        parts = p.split(".") if p else []
        ancestors = ["", *(".".join(parts[:i]) for i in range(1, len(parts)))] if p else []
        if not any(a in called for a in ancestors):
            out.append(p)
    return out


@contextlib.contextmanager
def hook_clock(
    root: nn.Module, clock: HookClock, only: set[str] | None = None, nodes: NodeClock | None = None
) -> Iterator[None]:
    """Forward hooks on every module of ``root``'s tree marking each call on ``clock`` (by node path).

    The hooks' own work is bracketed as a hook region, so a parent's time
    excludes its children's hooks. With ``nodes``, each call also claims the
    autograd nodes it built (in the hook region), for its backward to be timed.
    Hooks come off on exit, also when the forward raised.
    """
    places: dict[int, list[tuple[str, str | None]]] = {}
    modules: dict[int, nn.Module] = {}
    for path, at in component_paths(root).items():
        if (only is None or path in only) and not scripted(at.module):  # a ScriptModule refuses hooks
            places.setdefault(id(at.module), []).append((path, at.parent))
            modules[id(at.module)] = at.module
    running: list[str] = []

    def pre(mine: list[tuple[str, str | None]]) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[UserValue, ...], kwargs: dict[str, UserValue]) -> None:
            clock.hook_start()
            path = owner(mine, running)
            running.append(path)
            if nodes is not None:
                nodes.pre(path, args, kwargs)
            clock.hook_end()
            clock.open(path)

        return hook

    def post(module: nn.Module, args: tuple[UserValue, ...], output: UserValue) -> None:
        path = running.pop() if running else ""
        clock.close(path)
        if nodes is not None:
            clock.hook_start()
            nodes.post(path, output)
            clock.hook_end()

    handles = []
    try:
        for key, module in modules.items():
            # first of the module's pre-hooks (and, registered last, last of its forward hooks): a call's time
            # spans every hook of it, as its isolated replay runs them (an FSDP2 unit's all-gather, in its
            # pre-forward hook, and the gradients' reduce-scatter its pre-forward registers are the unit's)
            handles.append(module.register_forward_pre_hook(pre(places[key]), with_kwargs=True, prepend=True))
            handles.append(module.register_forward_hook(post, always_call=True))
        yield
    finally:
        for h in handles:
            h.remove()


#: ``nn.Identity`` children of the probe :func:`measure_hook_cost` times, and its timed passes of each kind.
_PROBE_CHILDREN = 32
_PROBE_PASSES = 15


class _HookProbe(nn.Module):
    """A parent that calls one identity :data:`_PROBE_CHILDREN` times (32 distinct identities read the same,
    2.2 µs a call against 2.15-2.25 µs, on a 2-vCPU VM)."""

    def __init__(self) -> None:
        super().__init__()
        self.part = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(_PROBE_CHILDREN):
            x = self.part(x)
        return x


def measure_hook_cost(device: torch.device, nodes: bool) -> HookCost:
    """What :func:`hook_clock`'s hooks add to the times they read on this machine, now (:class:`HookCost`).

    A probe parent calls an ``nn.Identity`` 32 times, hooked as the in-situ pass hooks them (``nodes``: each
    call also offers its outputs to a :class:`NodeClock`; an identity builds no node to claim), its passes
    alternating between every module hooked and the parent alone:

    - ``own_s``: the median call of the hooked child (it does nothing of its own);
    - ``nested_s``: the parent's median time with its child hooked less its median with it unhooked, per
      call.

    Medians of 15 passes of each (5-10 ms in all), each at least 0. Measured on a 2-vCPU VM: 0.7-0.8 µs and
    1.8-2.3 µs. Calls that build autograd nodes cost more to hook (their claims, outside what the hooks
    bracket: a probe of ``x + 1`` children read 2.6 µs), so there the correction falls short (a container of
    90 tiny modules read 1.2× its forward hooked alone, 1.8× raw: ``benchmarks/hook_cost.py``); a probe of
    such children took a detached loop of 2000 identity calls to half its forward, this one to within 2-7 %
    below it.

    On CUDA both are 0: the clock reads device events there, which the hooks' Python does not delay unless
    the forward waits on its launches (:class:`HookClock` says so).
    """
    if device.type == "cuda":
        return HookCost()
    probe = _HookProbe()
    own: list[float] = []
    every: list[float] = []
    alone: list[float] = []
    for _ in range(_PROBE_PASSES + 2):  # two untimed rounds first; the kinds alternate (the load drifts)
        spans = _probe_pass(probe, None, nodes)
        own.append(statistics.median(spans["part"]))
        every.append(spans[""][0])
        alone.append(_probe_pass(probe, {""}, nodes)[""][0])
    own, every, alone = own[2:], every[2:], alone[2:]
    nested = (statistics.median(every) - statistics.median(alone)) / _PROBE_CHILDREN
    return HookCost(max(statistics.median(own), 0.0), max(nested, 0.0))


def _probe_pass(probe: nn.Module, only: set[str] | None, nodes: bool) -> dict[str, list[float]]:
    """One forward of ``probe`` hooked on ``only`` (``None``: every module), grad on: its call times
    (:meth:`HookClock.durations`)."""
    x = torch.zeros(4)
    clock = HookClock()
    claims = NodeClock() if nodes else None
    try:
        with torch.enable_grad(), hook_clock(probe, clock, only, claims):
            probe(x)
    finally:
        if claims is not None:
            claims.close()
    return clock.durations()


class PassGuard(Protocol):
    """What :func:`time_in_situ` tells of each pass of a top (under several ranks:
    :class:`cb_callback._engine.selection.ranked_triage.PassGuard`)."""

    def begin(self, top: str) -> None:
        """A pass of ``top`` starts."""

    def failed(self) -> None:
        """This rank's pass raised (before :meth:`end`)."""

    def end(self, error: str | None) -> str | None:
        """The pass ended (``error``: this rank's, or ``None``); returns the error that stops the pass
        (``None``: go on)."""


def time_in_situ(
    tops: Sequence[str],
    replay_of: Callable[[str], Replay],
    root: nn.Module,
    device: torch.device,
    *,
    passes: int = 3,
    budget_s: float | None = None,
    backward: bool = True,
    only: set[str] | None = None,
    collectives: bool = False,
    warm_up: bool = True,
    guard: PassGuard | None = None,
    warmed: Collection[str] = (),
) -> InSituTimes:
    """Run each top component whole ``passes + 1`` times (the first a warm-up), every module's calls timed.

    Args:
        tops: the components to run whole (:func:`top_paths`).
        replay_of: the replay of a top (inputs as the isolated replays get them).
        root: the model (its tree names the paths).
        device: where it runs.
        passes: timed passes at most (their forward and backward count as timed
            work in :func:`cb_callback._engine.clocks.timing.timed_seconds`; the warm-up
            runs the forward and backward untimed: a first backward allocates
            the gradients, page faults and all, that later steps reuse).
        budget_s: a top's timed passes stop once they took this long, after
            the first (a model whose step takes seconds gets one pass, its
            ``spread`` then NaN); ``None``: always ``passes``.
        backward: also time each top's whole backward and, on CPU, each
            module's: the autograd nodes its forward built, each timed between
            the engine's hooks on it (:class:`cb_callback._engine.clocks.nodeclock.NodeClock`,
            which says what that cannot see: the gradient sums, a CUDA device).
        only: the paths to time (default: every node).
        collectives: let the passes communicate (several ranks, every rank
            running the same passes: :mod:`cb_callback._engine.selection.ranked_triage`);
            then the first top whose pass raises ends the pass (a rank that went
            on would issue collectives the others do not), else a collective
            raises (on one process it would wait forever).
        warm_up: run the untimed warm-up first (``False``: a warm-up ran
            already, under several ranks a pass of its own).
        warmed: the tops that need no warm-up of their own: a pass of theirs
            ran just before (the census, one forward and backward of each top
            on the same call: :mod:`cb_callback._engine.counting.census`).
        guard: told of each pass (:class:`PassGuard`): under several ranks,
            what lets a rank whose pass raised finish the others' collectives
            and every rank stop at the same pass.

    Notes:
        The pass copies nothing inside the forward: the inputs are fresh before
        it starts, the hooks only mark a clock, and their own time is left out
        (:class:`HookClock`), with what hooking a call costs beyond it, measured
        first (:func:`measure_hook_cost`: ``hook_cost``). The caller guards the model's state
        (:class:`cb_callback._engine.replay.state.StateGuard`). A top whose pass raises
        gets no times (``errors`` says why); the others keep theirs.
    """
    t_start = time.perf_counter()
    by_nodes = backward and device.type == "cpu"  # on CUDA a node's hooks see its launch, not its kernels
    out = InSituTimes(tops=list(tops), passes=passes, hook_cost=measure_hook_cost(device, by_nodes))
    tally = _Tally(out)
    run = functools.partial(
        _one_pass, root=root, clock=HookClock(device, cost=out.hook_cost), only=only, device=device,
        backward=backward, collectives=collectives,
    )  # fmt: skip
    for top in tops:
        first = 0 if warm_up and top not in warmed else 1
        _time_top(top, replay_of, run, tally, range(first, passes + 1), budget_s, guard, by_nodes)
        if collectives and top in out.errors:
            break
    out.passes = min(tally.done.values(), default=0)
    out.times = _medians(tally.per_pass, tally.bwd_s, tally.node_s, out.passes)
    out.seconds = time.perf_counter() - t_start
    return out


class _Pass(Protocol):
    """One pass of a top: :func:`_one_pass` with the run's clock and options."""

    def __call__(
        self, replay: Replay, *, nodes: NodeClock | None, warm_up: bool
    ) -> tuple[dict[str, list[float]], float | None]:
        """Each module's forward seconds per call, and the top's backward seconds (``None``: none)."""


@dataclass
class _Tally:
    """The timed passes of every top of one :func:`time_in_situ`, as they add up.

    Attributes:
        out: the result, whose ``timed_s`` and ``errors`` fill as the passes run.
        per_pass: per module, each pass's forward seconds (summed over its calls) and its calls.
        bwd_s: per top, each pass's whole backward seconds (less the node clock's hooks).
        node_s: per module, each pass's seconds of the autograd nodes it built, and its calls.
        done: per top, its last timed pass (1-based).
    """

    out: InSituTimes
    per_pass: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    bwd_s: dict[str, list[float]] = field(default_factory=dict)
    node_s: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    done: dict[str, int] = field(default_factory=dict)

    def add(
        self, top: str, i: int, spent: Mapping[str, list[float]], seconds: float | None, nodes: NodeClock | None
    ) -> float:
        """Timed pass ``i`` of ``top``: ``spent`` (each module's forward seconds per call), the backward's
        ``seconds`` and the node clock's; returns the pass's measured seconds (its forward and backward),
        which count as timed work (:func:`record_timed`)."""
        if seconds is not None and nodes is not None:
            seconds = max(seconds - nodes.hooks_s, 0.0)  # the top's whole backward, less the hooks'
            for path, took in nodes.seconds.items():
                if spent.get(path):
                    self.node_s.setdefault(path, []).append((took, len(spent[path])))
        measured = sum(spent.get(top, [])) + (seconds or 0.0)
        record_timed(measured)  # measured work, as a timed run's
        self.out.timed_s += measured
        for path, each in spent.items():
            self.per_pass.setdefault(path, []).append((math.fsum(each), len(each)))
        if seconds is not None:
            self.bwd_s.setdefault(top, []).append(seconds)
        self.done[top] = i
        return measured


def _time_top(
    top: str,
    replay_of: Callable[[str], Replay],
    run: _Pass,
    tally: _Tally,
    rounds: range,
    budget_s: float | None,
    guard: PassGuard | None,
    by_nodes: bool,
) -> None:
    """The passes ``rounds`` of one top (pass 0 the untimed warm-up), each told to ``guard``; the first
    that raises ends them (``tally.out.errors[top]``); after the first timed one they stop once they took
    ``budget_s``. ``by_nodes``: each timed pass also clocks the autograd nodes every module built."""
    replay: Replay | None = None
    top_s = 0.0
    for i in rounds:
        nodes = NodeClock() if by_nodes and i > 0 else None
        error: str | None = None
        if guard is not None:
            guard.begin(top)
        try:
            replay = replay_of(top) if replay is None else replay
            spent, seconds = run(replay, nodes=nodes, warm_up=i == 0)
        except Exception as e:
            error = error_text(e)
            if guard is not None:
                guard.failed()
        finally:
            if nodes is not None:
                nodes.close()
        if guard is not None:
            error = guard.end(error)
        if error is not None:
            tally.out.errors[top] = error
            break
        if i == 0:
            continue
        top_s += tally.add(top, i, spent, seconds, nodes)
        if budget_s is not None and top_s >= budget_s:
            break


def _one_pass(
    replay: Replay,
    root: nn.Module,
    clock: HookClock,
    only: set[str] | None,
    device: torch.device,
    backward: bool,
    nodes: NodeClock | None,
    warm_up: bool,
    collectives: bool = False,
) -> tuple[dict[str, list[float]], float | None]:
    """One forward of a top with every module's calls marked on ``clock`` (their durations), then its
    backward: untimed in the ``warm_up`` (the first backward allocates what later ones reuse), else its
    seconds (``None``: no backward). With ``nodes``, the calls claim the nodes they build, through the
    backward too: a reentrant checkpoint's recompute runs its calls there, and its inner backward the
    nodes they build."""
    clock.clear()
    inputs = replay.fresh_inputs()
    refuse = contextlib.nullcontext if collectives else refuse_collectives
    with refuse(), hook_clock(root, clock, only, nodes):
        result = replay.forward(inputs)
    spent = clock.durations()
    back = replay.backward(inputs, result) if backward else None
    del result
    if back is None:
        return spent, None
    if warm_up:
        back.run()
        return spent, None
    claims = hook_clock(root, HookClock(device), only, nodes) if nodes else contextlib.nullcontext()
    with refuse(), claims:
        return spent, _timed(back.run, device)


def _medians(
    per_pass: Mapping[str, list[tuple[float, int]]],
    bwd_s: Mapping[str, list[float]],
    node_s: Mapping[str, list[tuple[float, int]]],
    passes: int,
) -> dict[str, InSitu]:
    """Each path's :class:`InSitu` from its passes: ``per_pass`` its forward (seconds, calls) per pass,
    ``bwd_s`` a top's whole backward, ``node_s`` a module's nodes' (seconds, calls); a path timed in
    fewer than ``passes`` passes (called in some only, or its top raised) has none."""
    out: dict[str, InSitu] = {}
    for path, runs in per_pass.items():
        if len(runs) < passes or not runs:
            continue
        per_call = [s * 1e3 / n for s, n in runs if n]
        mid = statistics.median(per_call)
        spread = (max(per_call) - min(per_call)) / mid if mid > 0 and len(per_call) > 1 else _NAN
        if path in bwd_s:  # a top runs once a pass: its whole backward
            bwd = statistics.median(bwd_s[path]) * 1e3
        elif len(node_s.get(path, ())) == len(runs):  # its nodes' time, every pass
            bwd = statistics.median(b * 1e3 / n for b, n in node_s[path])
        else:
            bwd = _NAN
        out[path] = InSitu(mid, runs[-1][1], spread, bwd)
    return out


def _timed(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds ``fn`` takes (on CUDA: device time between two events, synchronised after)."""
    if device.type == "cuda" and torch.cuda.is_available():
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
