"""What a plugin measured inside a component, and a planner's estimate of it: the values derived from both.

Two ``details`` keys a metric plugin may fill, which the engine completes once
the row's times are known (:func:`derive_parts`, called with the other derived
values):

* ``details["parts"]``: pieces of a component that are not modules of the tree
  but were measured on their own (the torchrec integration's local embedding
  lookups of a sharded module: hidden in plain lists, they are no rows). Each
  part is a dict with ``name`` and, when measured, ``fwd_ms`` (a forward of the
  part alone, per call of the component) and ``bytes`` (its memory traffic); the
  engine adds ``gbps`` (``bytes / fwd_ms``) and ``bw_util`` (that over the peak
  bandwidth: the copy ceiling a CPU calibrates, the device's table figure on a
  GPU). Other keys are the plugin's.
* ``details["planned"]``: a planner's estimate of the component (torchrec's
  ``EmbeddingPerfEstimator`` for a sharded embedding module), with
  ``fwd_compute_ms``, ``fwd_comms_ms``, ``bwd_compute_ms``, ``bwd_comms_ms`` and
  optionally ``input_dist_comms_ms`` (a forward collective the planner reports
  apart) and ``total_ms`` (the planner's own total, which may leave that out).
  The engine adds ``measured``: the same split of this row, see
  :func:`measured_split`, and ``ratio`` (measured over planned, per part).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeGuard

from cb_callback._report.model import ComponentRow

__all__ = ["PLANNED_PARTS", "derive_parts", "measured_split"]

#: The parts of a measured-vs-planned comparison, in the order they are shown.
PLANNED_PARTS = ("fwd_compute_ms", "fwd_comms_ms", "bwd_compute_ms", "bwd_comms_ms", "total_ms")


def _finite(x: Any) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _comm_ms(row: ComponentRow, phase: str) -> float | None:
    """The time of the row's collectives in ``phase`` (``details["comm"]``), ``None`` if untimed."""
    table = row.details.get("comm")
    if not table:
        return 0.0 if row.comm_bytes == 0 else None
    times = [c.get("ms") for c in table if c.get("phase") == phase]
    if not all(_finite(t) for t in times):
        return None
    return float(sum(times))


def measured_split(row: ComponentRow) -> dict[str, float | None]:
    """This row's time split as a planner splits it (ms per call; ``None`` where unknown).

    * ``fwd_comms_ms`` / ``bwd_comms_ms``: the row's collectives of that phase
      (``details["comm"]``: each waited for as it was issued, in passes of their
      own), all of them: a planner's ``input_dist_comms_ms`` is compared to a
      part of ``fwd_comms_ms``, so the planned side adds it in.
    * ``fwd_compute_ms``: the measured parts' ``fwd_ms`` summed when the row has
      parts (the local lookups alone), else ``fwd_ms`` minus ``fwd_comms_ms``;
      ``bwd_compute_ms``: ``bwd_ms`` minus ``bwd_comms_ms``. A difference is
      what the timed runs spent outside waited collectives: where the real step
      overlaps communication with compute, it is an upper bound of the compute.
    * ``total_ms``: the row's ``total_ms``.
    """
    fwd_comm, bwd_comm = _comm_ms(row, "forward"), _comm_ms(row, "backward")
    parts = [p.get("fwd_ms") for p in row.details.get("parts") or () if isinstance(p, Mapping)]
    timed = [float(t) for t in parts if _finite(t)]
    if parts and len(timed) == len(parts):
        fwd_compute: float | None = sum(timed)
    elif _finite(row.fwd_ms) and fwd_comm is not None:
        fwd_compute = max(row.fwd_ms - fwd_comm, 0.0)
    else:
        fwd_compute = None
    bwd_compute = max(row.bwd_ms - bwd_comm, 0.0) if _finite(row.bwd_ms) and bwd_comm is not None else None
    return {
        "fwd_compute_ms": fwd_compute,
        "fwd_comms_ms": fwd_comm,
        "bwd_compute_ms": bwd_compute,
        "bwd_comms_ms": bwd_comm if _finite(row.bwd_ms) else None,
        "total_ms": row.total_ms if _finite(row.total_ms) else None,
    }


def _planned_split(planned: Mapping[str, Any]) -> dict[str, float | None]:
    """The planner's figures on the measured split: its input-dist comms in the forward comms and the total."""
    extra = planned.get("input_dist_comms_ms")
    extra = float(extra) if _finite(extra) else 0.0
    out: dict[str, float | None] = {}
    for key in PLANNED_PARTS:
        v = planned.get(key)
        out[key] = float(v) + (extra if key in ("fwd_comms_ms", "total_ms") else 0.0) if _finite(v) else None
    return out


def derive_parts(row: ComponentRow, peak_bandwidth: float | None) -> None:
    """Complete ``details["parts"]`` and ``details["planned"]`` of ``row`` (module docstring)."""
    for part in row.details.get("parts") or ():
        if not isinstance(part, dict):
            continue
        ms, nbytes = part.get("fwd_ms"), part.get("bytes")
        if _finite(ms) and _finite(nbytes) and ms > 0:
            part["gbps"] = nbytes / (ms / 1e3) / 1e9
            part["bw_util"] = nbytes / (ms / 1e3) / peak_bandwidth if peak_bandwidth else None
    planned = row.details.get("planned")
    if not isinstance(planned, dict) or "error" in planned:
        return
    measured = measured_split(row)
    on_split = _planned_split(planned)
    planned["measured"] = measured
    planned["planned_on_split"] = on_split
    ratio: dict[str, float | None] = {}
    for key in PLANNED_PARTS:
        m, p = measured[key], on_split[key]
        ratio[key] = m / p if m is not None and p else None
    planned["ratio"] = ratio
