"""Many batches (dynamic shapes): one row from a component's measurements on each batch.

With several captured batches (``profile_components(model, batches=[...])``,
``ComponentBenchmark(capture_batches=k)``) every component is replayed and timed
on each batch it ran in; its row is its median batch, and ``details`` holds the
per-batch numbers, the p90 and the distinct input shapes.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from cb_callback._engine.capture.inputs import ComponentInputs, leading_batch_size
from cb_callback._report.model import ComponentRow

__all__ = [
    "MEASURED_COLUMNS",
    "batch_size_of",
    "input_signature",
    "median_batch",
    "merge_batches",
    "merged_calls",
    "p90",
]

#: The measured columns a multi-batch row takes from its median batch.
MEASURED_COLUMNS = (
    "fwd_ms", "bwd_ms", "cpu_ms", "device_ms", "fwd_flops", "bwd_flops", "activation_mb",
    "peak_mem_mb", "bytes", "noise", "comm_bytes", "comm_ms", "insitu_ms",
)  # fmt: skip

#: Leaves listed per signature, at most.
_MAX_LEAVES = 8


def p90(values: Sequence[float]) -> float:
    """The 90th percentile, linearly interpolated between order statistics (NaN if empty)."""
    xs = sorted(v for v in values if math.isfinite(v))
    if not xs:
        return math.nan
    pos = 0.9 * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _leaf(x: object) -> str | None:
    if isinstance(x, torch.Tensor):
        return f"{str(x.dtype).removeprefix('torch.')}[{','.join(map(str, x.shape))}]"
    keys, per_key = getattr(x, "keys", None), getattr(x, "length_per_key", None)
    if callable(keys) and callable(per_key):  # a torchrec KeyedJaggedTensor: values per feature
        try:
            return "KJT(" + ",".join(f"{k}:{n}" for k, n in zip(keys(), per_key(), strict=True)) + ")"
        except Exception:
            return f"{type(x).__name__}(?)"
    return None


def input_signature(inputs: ComponentInputs) -> str:
    """The shapes of one call: tensors as ``float32[8,128]``, a KJT as ``KJT(f1:37,f2:52)``.

    Walks tuples, lists and dicts of the call (arguments, then keyword
    arguments by name); other objects are left out. At most 8 leaves, then ``…``.
    """
    out: list[str] = []

    def walk(x: object, name: str = "") -> None:
        if len(out) > _MAX_LEAVES:
            return
        found = _leaf(x)
        if found is not None:
            out.append(f"{name}={found}" if name else found)
        elif isinstance(x, (tuple, list)):
            for v in x:
                walk(v, name)
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(v, str(k))
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            for f in dataclasses.fields(x):
                walk(getattr(x, f.name), f.name)

    walk(inputs.args)
    walk(inputs.kwargs)
    if len(out) > _MAX_LEAVES:
        out = [*out[:_MAX_LEAVES], "…"]
    return ", ".join(out) if out else "(no tensors)"


def merged_calls(batches: Sequence[Mapping[str, ComponentInputs]]) -> dict[str, ComponentInputs]:
    """Every component's call from the first batch it ran in (the tree's order is the first batch's)."""
    out: dict[str, ComponentInputs] = {}
    for calls in batches:
        for path, inputs in calls.items():
            out.setdefault(path, inputs)
    return out


def _total(r: ComponentRow) -> float:
    if not math.isfinite(r.fwd_ms):
        return math.nan
    return r.fwd_ms + (r.bwd_ms if math.isfinite(r.bwd_ms) else 0.0)


def median_batch(per_batch: Mapping[int, ComponentRow]) -> int | None:
    """The ``ok`` batch whose ``fwd_ms + bwd_ms`` is the median (the lower middle one
    for an even count; ties by batch order); ``None`` when none is ``ok``."""
    ok = sorted((b for b, r in per_batch.items() if r.status == "ok"), key=lambda b: (_total(per_batch[b]), b))
    return ok[(len(ok) - 1) // 2] if ok else None


def merge_batches(row: ComponentRow, per_batch: Mapping[int, ComponentRow], shapes: Mapping[int, str]) -> int | None:
    """Fill ``row`` from the component's rows of each batch it ran in (``{batch: row}``).

    The row is ``ok`` when at least one batch measured it, and is then its
    *median batch* (:func:`median_batch`): every column of
    :data:`MEASURED_COLUMNS` and the details are that batch's, so time, FLOPs,
    bytes and the rates derived from them describe one run (``total_ms`` is the
    median of the per-batch ``fwd_ms + bwd_ms``). ``calls`` is the low median
    over the batches it ran in. ``details`` adds ``batches`` (per batch:
    ``status``, ``calls``, ``fwd_ms``, ``bwd_ms``, ``total_ms``, ``flops``,
    ``shape`` and any ``error``), ``median_batch``, ``median_ms`` and ``p90_ms``
    of the per-batch ``fwd_ms + bwd_ms`` and ``shapes`` (the distinct input
    signatures, :func:`input_signature`). A batch it failed on is named in
    ``error`` (the row stays ``ok``: the other batches measured it). With no
    ``ok`` batch the row takes the first batch's status, error and note.

    Returns:
        The median batch, or ``None`` when no batch measured the component.
    """
    order = sorted(per_batch)
    row.calls = statistics.median_low([per_batch[b].calls for b in order]) if order else row.calls
    table = []
    for b in order:
        r = per_batch[b]
        flops = [v for v in (r.fwd_flops, r.bwd_flops) if math.isfinite(v)]
        entry: dict[str, Any] = {
            "batch": b, "status": r.status, "calls": r.calls, "fwd_ms": r.fwd_ms, "bwd_ms": r.bwd_ms,
            "total_ms": _total(r), "flops": math.fsum(flops) if flops else math.nan, "shape": shapes.get(b),
        }  # fmt: skip
        if r.error:
            entry["error"] = r.error
        table.append(entry)
    mid = median_batch(per_batch)
    if mid is None:
        first = per_batch[order[0]] if order else None
        if first is not None:
            row.status, row.error, row.note = first.status, first.error, first.note
            row.details = {**first.details, "batches": table}
        return None
    rep = per_batch[mid]
    for name in MEASURED_COLUMNS:
        setattr(row, name, getattr(rep, name))
    ok = [b for b in order if per_batch[b].status == "ok"]
    bad = [f"batch {b}: {per_batch[b].error or per_batch[b].note or per_batch[b].status}" for b in order if b not in ok]
    row.status, row.note = "ok", rep.note
    row.error = f"not measured on {len(bad)} of {len(order)} batches ({'; '.join(bad)})" if bad else None
    distinct = list(dict.fromkeys(s for s in (shapes.get(b) for b in order) if s is not None))
    row.details = {
        **rep.details,
        "batches": table,
        "median_batch": mid,
        "median_ms": _total(rep),
        "p90_ms": p90([_total(per_batch[b]) for b in ok]),
        "shapes": distinct,
    }
    return mid


def batch_size_of(calls: Mapping[str, ComponentInputs]) -> int | None:
    """The leading batch size of a batch's first captured call (its capture's ``batch_size``)."""
    first = min(calls.values(), key=lambda c: c.order, default=None)
    return None if first is None else leading_batch_size((first.args, first.kwargs))
