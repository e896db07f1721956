"""The compile what-if: one component compiled alone with ``torch.compile``, timed like its eager run.

What the paper did by hand before integrating PT2 (a component isolated at
83 ms compiled to 50 ms): the component's captured inputs, its flags and its
backward are the eager replay's (:meth:`Replay.with_call`); only the call is
``torch.compile(module, **compile_options)``. The compiled runs are sampled in
the same interleaved rounds as a new set of the component's eager runs, so the
two are compared under the same load.

What isolation cannot see here either: a component compiled alone cannot fuse
with its neighbours; a parent compiled whole can fuse across its children's
boundaries (the parent's ``compiled_ms`` against :func:`children_separately_ms`
sizes exactly that).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import torch

from cb_callback._engine.clocks.timing import Sample, SampleSet, interleave
from cb_callback._engine.replay.isolate import Replay, flatten_output
from cb_callback._engine.replay.state import StateGuard, seeded
from cb_callback._engine.run.config import BenchmarkConfig
from cb_callback._engine.run.extensions import WhatIfInput
from cb_callback._report.finite import finite
from cb_callback._report.model import ComponentRow
from cb_callback._report.model import error_text as _error_text
from cb_callback._whatif.tolerances import (
    NUMBER_TYPES,
    Closeness,
    compare_numbers,
    compare_tensors,
    default_tolerances,
    number_tolerances,
)

__all__ = [
    "WhatIfInput",
    "children_separately",
    "compile_speedup",
    "compile_what_if",
    "explain_breaks",
    "fill_children_separately",
    "outputs_agree",
]

#: Break reasons kept per component (the first line of each distinct one).
MAX_REASONS = 10


def _reason(text: str) -> str:
    """The first line of a dynamo break reason, at most 200 characters."""
    first = str(text).strip().splitlines()[0] if str(text).strip() else "(no reason given)"
    return first if len(first) <= 200 else first[:197] + "..."


def _unique_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def explain_breaks(replay: Replay) -> dict[str, Any]:
    """Graphs, graph breaks and their reasons of one forward (``torch._dynamo.explain``).

    Returns:
        ``{"graphs", "graph_breaks", "break_reasons"}``; ``break_reasons`` holds
        each distinct reason once (its first line), with how often it broke and
        where (``file:line`` of the user frame), at most :data:`MAX_REASONS`.
    """
    import torch._dynamo as dynamo

    explained = replay.with_call(dynamo.explain(replay.module), first_only=True).forward()
    reasons: dict[str, dict[str, Any]] = {}
    for r in explained.break_reasons:
        text = _reason(getattr(r, "reason", r))
        stack = getattr(r, "user_stack", None) or []
        where = f"{stack[-1].filename}:{stack[-1].lineno}" if stack else None
        entry = reasons.setdefault(text, {"reason": text, "count": 0, "where": where})
        entry["count"] += 1
    return {
        "graphs": int(explained.graph_count),
        "graph_breaks": int(explained.graph_break_count),
        "break_reasons": list(reasons.values())[:MAX_REASONS],
    }


def compile_what_if(
    items: Sequence[WhatIfInput],
    sampler: Callable[[Replay], Callable[[], Sample]],
    *,
    config: BenchmarkConfig,
    canary: Callable[[], float] | None = None,
    report_batch: int | None = None,
) -> tuple[float, dict[str, Any]]:
    """Compile one component alone and time it against its eager runs, on each of its batches.

    Dynamo is reset first (a component compiled before must not count towards
    this one's recompile limit or be reused across instances) and after.
    The component is compiled once; on each batch the first compiled forward +
    backward compiles for that batch's shapes (``compile_s`` is its wall time,
    compilation included) and ``max(warmup, 2)`` more untimed runs follow
    (``mode="reduce-overhead"`` records its CUDA graphs in them). Then the
    compiled runs and a fresh set of eager runs of every batch are sampled in
    ``config.rounds`` interleaved rounds with the eager timing's budget and
    repeat rules.

    Args:
        items: the component on each batch it ran in (one item with one batch).
        sampler: makes the sampler of a replay (the latency metric's).
        config: the options (``compile_options``, warm-up, repeats, rounds).
        canary: the reference GEMM timed before each round (CPU), if any.
        report_batch: with several batches, the one whose compiled time is
            returned (the row's median batch); ``None``: the median one.

    Returns:
        ``(compiled_ms, details)``: ``compiled_ms`` is the median compiled
        forward + median compiled backward (with several batches, that of
        ``report_batch``, else of the batch with the median compiled time — the
        lower middle one); NaN when the compile failed. The per-run figures
        below (``fwd_ms`` … ``eager_ms_same_rounds``) are that batch's. ``details`` has
        ``compile_s``, ``graphs`` (dynamo graphs compiled during the first batch's
        warm-up: one more than the breaks of a plain forward), ``graph_breaks``
        and ``break_reasons`` (from ``torch._dynamo.explain`` on the first batch),
        ``recompiles`` (graphs compiled after the first batch's warm-up: for the
        other batches' shapes, and during the timed runs), ``fwd_ms``/``bwd_ms``/
        ``noise`` of the compiled runs, ``eager_ms_same_rounds`` (the eager median
        of the same rounds), ``outputs_close``/``max_abs_error``/``max_rel_error``
        (:func:`outputs_agree`, over every batch), ``options``, and with several
        batches ``batches`` (per batch: ``compiled_ms``, ``eager_ms_same_rounds``,
        ``graphs``, ``compile_s``); or ``error`` when compiling or a compiled run
        raised.
    """
    import torch._dynamo as dynamo

    options = dict(config.compile_options or {})
    info: dict[str, Any] = {
        "options": {k: v if isinstance(v, (str, int, float, bool)) else repr(v) for k, v in options.items()}
    }
    limit = contextlib.ExitStack()
    try:
        if not items:
            raise ValueError("nothing to compile: no measured batch")
        first = items[0].replay
        _explain_into(info, first)
        limit.enter_context(_recompile_limit(len(items)))
        compiled_fn = torch.compile(first.module, **options)
        runs, per, agree = _compile_and_warm(items, compiled_fn, sampler, config)
        warm = _unique_graphs()
        info["compile_s"], info["graphs"] = per[0]["compile_s"], per[0]["graphs"]
        sets = _timed_rounds(items, runs, config, canary)
        info["recompiles"] = sum(p["graphs"] for p in per[1:]) + _unique_graphs() - warm
        compiled_ms = _report_batch(info, per, agree, sets, config.backward, report_batch)
        if len(items) > 1:
            info["batches"] = per
        return compiled_ms, info
    except Exception as e:
        if isinstance(e, torch.cuda.OutOfMemoryError) and torch.cuda.is_available():
            torch.cuda.empty_cache()
        info["error"] = _error_text(e)
        return math.nan, info
    finally:
        limit.close()
        dynamo.reset()


def _explain_into(info: dict[str, Any], first: Replay) -> None:
    """Put :func:`explain_breaks` of ``first`` into ``info`` (else ``explain_error``), dynamo reset before and after."""
    import torch._dynamo as dynamo

    dynamo.reset()
    try:
        info.update(explain_breaks(first))
    except Exception as e:  # explain is a diagnostic: the what-if goes on without it
        info["explain_error"] = _error_text(e)
    dynamo.reset()


def _timed_rounds(
    items: Sequence[WhatIfInput],
    runs: Sequence[Callable[[], Sample]],
    config: BenchmarkConfig,
    canary: Callable[[], float] | None,
) -> list[SampleSet]:
    """Every batch's eager runs, then its compiled ``runs``, sampled in the same interleaved rounds.

    Raises:
        Exception: the first error a sampled run raised.
    """
    sets = interleave(
        [*(i.eager for i in items), *runs],
        budgets_s=[i.budget_s for i in items] * 2,
        rounds=config.rounds,
        min_repeats=config.min_repeats,
        max_repeats=config.max_repeats,
        canary=canary,
    )
    for s in sets:
        if s.error is not None:
            raise s.error
    return sets


def _compile_and_warm(
    items: Sequence[WhatIfInput],
    compiled_fn: Callable[..., Any],
    sampler: Callable[[Replay], Callable[[], Sample]],
    config: BenchmarkConfig,
) -> tuple[list[Callable[[], Sample]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Each batch's compiled run: its first call compiles (``compile_s``, the graphs it made), then
    ``max(warmup, 2)`` warm-up calls; and its outputs checked against eager's.

    Raises:
        RuntimeError: dynamo compiled no graph (the component would run eagerly).
    """
    runs: list[Callable[[], Sample]] = []
    per: list[dict[str, Any]] = []
    agree: list[dict[str, Any]] = []
    start = _unique_graphs()
    for item in items:
        compiled = item.replay.with_call(compiled_fn)
        run = sampler(compiled)
        g0, t0 = _unique_graphs(), time.perf_counter()
        run()
        compile_s = time.perf_counter() - t0
        for _ in range(max(config.warmup, 2)):
            run()
        agree.append(outputs_agree(item.replay, compiled, config.seed))
        per.append({"batch": item.batch, "graphs": _unique_graphs() - g0, "compile_s": compile_s})
        runs.append(run)
    if _unique_graphs() == start:
        raise RuntimeError("dynamo compiled no graph: the component would run eagerly")
    return runs, per, agree


def _report_batch(
    info: dict[str, Any],
    per: list[dict[str, Any]],
    agree: Sequence[Mapping[str, Any]],
    sets: Sequence[SampleSet],
    backward: bool,
    report_batch: int | None,
) -> float:
    """Fill ``info`` with the reported batch's figures (the row's median batch, else the batch
    with the median compiled time) and each batch's in ``per``; return its compiled ms."""
    n = len(per)
    eager_sets, compiled_sets = sets[:n], sets[n:]
    totals = [_total(c, backward) for c in compiled_sets]
    eager = [_total(es, backward) for es in eager_sets]
    for p, c, et in zip(per, totals, eager, strict=True):
        p.update(compiled_ms=c, eager_ms_same_rounds=et)
    at = [i for i, p in enumerate(per) if p["batch"] == report_batch]
    k = at[0] if at else sorted(range(n), key=totals.__getitem__)[(n - 1) // 2]
    mid = compiled_sets[k]
    info.update(
        fwd_ms=mid.median("fwd_ms"),
        bwd_ms=mid.median("bwd_ms") if backward else math.nan,
        noise=mid.noise,
        repeats=len(mid.samples),
        eager_ms_same_rounds=eager[k],
        outputs_close=all(a["outputs_close"] for a in agree),
        max_abs_error=max(a["max_abs_error"] for a in agree),
        max_rel_error=max(a["max_rel_error"] for a in agree),
    )
    return totals[k]


def _recompile_limit(batches: int) -> contextlib.AbstractContextManager[Any]:
    """Dynamo's recompile limit raised to leave room for one graph per batch (and its breaks).

    Past the limit dynamo runs the frame eagerly without an error: with
    ``dynamic=False`` and more distinct shapes than the limit (8), the later
    batches' "compiled" times would be eager times.
    """
    import torch._dynamo.config as dc

    name = "recompile_limit" if hasattr(dc, "recompile_limit") else "cache_size_limit"
    current = int(getattr(dc, name))
    return cast(contextlib.AbstractContextManager[Any], dc.patch({name: max(current, 2 * batches + 8)}))


def outputs_agree(eager: Replay, compiled: Replay, seed: int) -> dict[str, Any]:
    """Whether the compiled forward returns what the eager one does on the same inputs and state.

    Both run on one fresh copy of the inputs each, the CPU generator and the
    device's seeded with ``seed`` before each (:func:`cb_callback._engine.replay.state.seeded`:
    restored afterwards), and from the same module state: a
    :class:`~cb_callback._engine.replay.state.StateGuard` taken before the eager forward puts
    the buffers (a call counter, a KV cache kept in a buffer, BatchNorm
    statistics), the ``training`` flags and the RNG streams back before the
    compiled forward and again after it, so a stateful module is not read as a
    compile error and is left as it was found. Output leaves
    (:func:`flatten_output`: dataclasses opened) are compared pairwise by
    :func:`compare_tensors`, the rule of ``compare_components`` too: tensors
    within :func:`default_tolerances` of their dtype (integers and bools
    exactly), equal values (infinities of the same sign, NaN against NaN) close,
    an infinity or NaN against anything else not close; Python numbers (an
    ``aux.item()``) alike, at :func:`number_tolerances` (a float: fp32's; an int
    or bool: exact), of the same type; other plain values with ``==``; other
    objects only by type.

    Returns:
        ``outputs_close`` (every tensor and number leaf close, equal dtypes and
        shapes, other leaves equal, same structure), ``max_abs_error`` and
        ``max_rel_error`` over the tensor and number leaves (``inf`` where one
        side is infinite or NaN and the other differs). Randomness (dropout in
        train mode) is drawn differently by inductor: such a component is not
        close.
    """
    leaves = []
    with StateGuard(eager.module) as guard:
        for i, r in enumerate((eager, compiled)):
            if i:
                guard.restore()  # the compiled forward starts from the state the eager one started from
            with seeded(seed, r.device):
                out = r.forward(r.fresh_inputs())
            leaves.append(flatten_output(out))
            del out
    (a, spec_a), (b, spec_b) = leaves
    close = spec_a == spec_b and len(a) == len(b)
    max_abs = max_rel = 0.0
    for x, y in zip(a, b, strict=False):
        got = _leaf_closeness(x, y)
        if got is None:
            close = close and _equal(x, y)
            continue
        close = close and got.close
        if not math.isnan(got.max_abs):  # NaN: shapes differ, nothing to measure
            max_abs, max_rel = max(max_abs, got.max_abs), max(max_rel, got.max_rel)
    return {"outputs_close": bool(close), "max_abs_error": max_abs, "max_rel_error": max_rel}


def _leaf_closeness(x: object, y: object) -> Closeness | None:
    """Two tensors or two Python numbers by :func:`compare_tensors` (a differing dtype, shape or
    number type is not close); ``None`` for other leaves (:func:`_equal`)."""
    if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
        if x.shape != y.shape:
            return Closeness(False, math.nan, math.nan)
        got = compare_tensors(x, y, *default_tolerances(x.dtype))
        return got if x.dtype == y.dtype else Closeness(False, got.max_abs, got.max_rel)
    if isinstance(x, NUMBER_TYPES) and isinstance(y, NUMBER_TYPES):
        got = compare_numbers(x, y, *number_tolerances(x))
        return got if type(x) is type(y) else Closeness(False, got.max_abs, got.max_rel)
    return None


_VALUES = (str, bytes, type(None), torch.Size, torch.dtype, torch.device)


def _equal(x: object, y: object) -> bool:
    """Two output leaves that are not both tensors nor both numbers agree: a tensor against anything
    else never; plain values (strings, ``None``, sizes, dtypes, devices) ``==``; other objects (a
    cache object of each run, not a dataclass) only need the same type — their contents are not
    compared."""
    if isinstance(x, (torch.Tensor, *NUMBER_TYPES)) or isinstance(y, (torch.Tensor, *NUMBER_TYPES)):
        return False
    if isinstance(x, _VALUES) or isinstance(y, _VALUES):
        return type(x) is type(y) and bool(x == y)
    return type(x) is type(y)


def _total(s: SampleSet, backward: bool) -> float:
    bwd = s.median("bwd_ms") if backward else 0.0
    return s.median("fwd_ms") + (bwd if math.isfinite(bwd) else 0.0)


def children_separately(
    row: ComponentRow,
    children: Sequence[ComponentRow],
    below: Callable[[ComponentRow], Sequence[ComponentRow]] | None = None,
    batch: int | None = None,
) -> dict[str, Any] | None:
    """The parent's time if each of its children were compiled on its own, the rest eager.

    ``children_separately_ms = total_ms − Σ (child eager − child compiled_ms) ×
    child calls ÷ parent calls`` over the children compiled, where a child's
    eager time is ``eager_ms_same_rounds`` (its eager runs sampled in the same
    rounds as its compiled ones: the saving under one load) when known, else its
    ``total_ms``. The parent's own work and the children not compiled stay eager.
    A child without a time of its own (an ``estimated`` container such as a
    ``ModuleList``) stands for its children (``below(child)``), recursively.
    With several batches, ``batch`` is the batch the parent's row is (its median
    batch): every child's figures are that batch's, and a child that did not run
    in it does not count. Against the parent's ``compiled_ms`` this is the fusion
    opportunity that only appears across its children's boundaries.

    Returns:
        ``{"children_separately_ms", "children_compiled"}`` (``"2/3"``: of the
        children with a time), or ``None`` when ``row`` has no time or no child
        was compiled.
    """
    parent_calls = row.calls if batch is None else _batch_entry(row, batch).get("calls", row.calls)
    timed: list[tuple[float, float, int]] = []
    todo = list(children)
    while todo:
        c = todo.pop(0)
        found = _child_figures(c, batch)
        if found is not None:
            timed.append(found)
        elif c.status == "estimated" and below is not None:
            todo = [*below(c), *todo]
    done = [t for t in timed if math.isfinite(t[1])]
    if not done or not math.isfinite(row.total_ms):
        return None
    saved = sum((eager - compiled) * max(calls, 1) for eager, compiled, calls in done) / max(parent_calls, 1)
    return {"children_separately_ms": row.total_ms - saved, "children_compiled": f"{len(done)}/{len(timed)}"}


def _batch_entry(row: ComponentRow, batch: int) -> dict[str, Any]:
    """``row.details["batches"]``'s entry of ``batch`` (empty when it did not run there)."""
    for e in row.details.get("batches") or []:
        if isinstance(e, Mapping) and e.get("batch") == batch:
            return dict(e)
    return {}


def _child_figures(c: ComponentRow, batch: int | None) -> tuple[float, float, int] | None:
    """``(eager ms, compiled ms or NaN, calls)`` of a measured child, on ``batch`` (``None``: its row);
    ``None`` when it has no time there (not measured, or did not run in that batch)."""
    if c.status != "ok" or not math.isfinite(c.total_ms):
        return None
    if batch is None:
        return _paired_eager(c), c.compiled_ms, c.calls
    entry = _batch_entry(c, batch)
    total = entry.get("total_ms")
    if entry.get("status") != "ok" or not isinstance(total, (int, float)) or not math.isfinite(total):
        return None
    eager, compiled = float(total), math.nan
    info = c.details.get("compile")
    per = info.get("batches") if isinstance(info, Mapping) else None
    if isinstance(per, list):
        for p in per:
            if isinstance(p, Mapping) and p.get("batch") == batch:
                compiled = float(p.get("compiled_ms", math.nan))
                same = p.get("eager_ms_same_rounds")
                eager = float(same) if finite(same) else eager
    elif c.details.get("median_batch") == batch:  # compiled on its one batch
        eager, compiled = _paired_eager(c), c.compiled_ms
    return eager, compiled, int(entry.get("calls", c.calls))


def _paired_eager(row: ComponentRow) -> float:
    """A compiled row's eager time from its what-if's rounds, else its ``total_ms``."""
    info = row.details.get("compile")
    same = info.get("eager_ms_same_rounds") if isinstance(info, Mapping) else None
    return float(same) if finite(same) else row.total_ms


def compile_speedup(row: ComponentRow) -> float:
    """``total_ms / compiled_ms`` where both are known, else NaN."""
    ok = math.isfinite(row.total_ms) and math.isfinite(row.compiled_ms) and row.compiled_ms > 0
    return row.total_ms / row.compiled_ms if ok else math.nan


def fill_children_separately(rows: Mapping[str, ComponentRow], children: Mapping[str, Sequence[str]]) -> None:
    """Add :func:`children_separately` to every compiled parent's ``details["compile"]``."""

    def below(r: ComponentRow) -> list[ComponentRow]:
        return [rows[k] for k in children.get(r.path, ()) if k in rows]

    for path, kids in children.items():
        row = rows.get(path)
        if row is None or not isinstance(row.details.get("compile"), dict) or not kids:
            continue
        batch = row.details.get("median_batch") if "batches" in row.details else None
        found = children_separately(row, [rows[k] for k in kids if k in rows], below, batch)
        if found is not None:
            row.details["compile"].update(found)
