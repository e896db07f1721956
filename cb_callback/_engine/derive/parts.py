"""What a plugin measured inside a component, and a planner's estimate of it: the values derived from both.

Two ``details`` keys a metric plugin may fill, which the engine completes once
the row's times are known (:func:`derive_parts`, called with the other derived
values):

* ``details["parts"]``: pieces of a component that are not modules of the tree
  but were measured on their own (the torchrec integration's local embedding
  lookups of a sharded module: hidden in plain lists, they are no rows). Each
  part is a dict with ``name`` and, when measured, ``fwd_ms`` (a forward of the
  part alone, per call of the component), ``bwd_ms`` (its backward alone) and
  ``bytes`` (its memory traffic); the
  engine adds ``gbps`` (``bytes / fwd_ms``) and ``bw_util`` (that over the peak
  bandwidth: the copy ceiling a CPU calibrates, the device's table figure on a
  GPU). Other keys are the plugin's.
* ``details["planned"]``: a planner's estimate of the component (torchrec's
  ``EmbeddingPerfEstimator`` for a sharded embedding module), with
  ``fwd_compute_ms``, ``fwd_comms_ms``, ``bwd_compute_ms``, ``bwd_comms_ms`` and
  optionally ``input_dist_comms_ms`` (a forward collective the planner reports
  apart) and ``total_ms`` (the planner's own total, which may leave that out).
  The engine adds ``measured``: the same split of this row, see
  :func:`measured_split`; ``measured_how``: whether each compute value was
  measured (the parts timed alone) or derived (the row's time minus its
  collectives'), see :func:`split_sources`; ``derived_negative`` (only when a
  derivation came out below zero: its raw value, the value itself being
  ``None``, and the row's ``details["own_flags"]`` gets ``"derived_negative"``);
  and ``ratio`` (measured over planned, per part).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from cb_callback._report.finite import finite, is_nan, ratio
from cb_callback._report.model import ComponentRow

__all__ = ["PLANNED_PARTS", "derive_parts", "measured_split", "split_sources"]

#: The parts of a measured-vs-planned comparison, in the order they are shown.
PLANNED_PARTS = ("fwd_compute_ms", "fwd_comms_ms", "bwd_compute_ms", "bwd_comms_ms", "total_ms")


def _comm_ms(row: ComponentRow, phase: str) -> float | None:
    """The time of the row's collectives in ``phase`` (``details["comm"]``), ``None`` if untimed."""
    table = row.details.get("comm")
    if not table:
        return 0.0 if row.comm_bytes == 0 else None
    times = [c.get("ms", math.nan) for c in table if c.get("phase") == phase]
    if not all(finite(t) for t in times):
        return None
    return float(sum(times))


def _parts_sum(row: ComponentRow, key: str) -> float | None:
    """``key`` (``fwd_ms`` / ``bwd_ms``) summed over the row's parts when every part has it, else ``None``."""
    parts = [p for p in row.details.get("parts") or () if isinstance(p, Mapping)]
    values = [v for p in parts if finite(v := p.get(key))]
    if not parts or len(values) != len(parts):
        return None
    return float(sum(values))


def _difference(total: float, comm: float | None) -> float | None:
    """``total - comm``: what the timed runs spent outside waited collectives; ``None`` below zero or unknown."""
    if not finite(total) or comm is None:
        return None
    diff = total - comm
    return diff if diff >= 0 else None


def measured_split(row: ComponentRow) -> dict[str, float | None]:
    """This row's time split as a planner splits it (ms per call; ``None`` where unknown).

    * ``fwd_comms_ms`` / ``bwd_comms_ms``: the row's collectives of that phase
      (``details["comm"]``: each waited for as it was issued, in passes of their
      own), all of them: a planner's ``input_dist_comms_ms`` is compared to a
      part of ``fwd_comms_ms``, so the planned side adds it in.
    * ``fwd_compute_ms`` / ``bwd_compute_ms``: measured, where the row has parts
      timed alone (the local lookups, their forward resp. their backward, with
      no collective in them): their sum. Otherwise, derived: ``fwd_ms`` minus
      ``fwd_comms_ms`` (``bwd_ms`` minus ``bwd_comms_ms``), two times of
      separate passes; where the real step overlaps communication with compute
      that is an upper bound of the compute. A derivation below zero (the
      collectives' passes were slower than the row's: the ranks' skew) is no
      value, ``None``: :func:`split_sources` says so and the row gets the
      ``derived_negative`` flag, never a 0.
    * ``total_ms``: the row's ``total_ms``.
    """
    fwd_comm, bwd_comm = _comm_ms(row, "forward"), _comm_ms(row, "backward")
    fwd = _parts_sum(row, "fwd_ms")
    bwd = _parts_sum(row, "bwd_ms")
    return {
        "fwd_compute_ms": fwd if fwd is not None else _difference(row.fwd_ms, fwd_comm),
        "fwd_comms_ms": fwd_comm,
        "bwd_compute_ms": bwd if bwd is not None else _difference(row.bwd_ms, bwd_comm),
        "bwd_comms_ms": bwd_comm if finite(row.bwd_ms) else None,
        "total_ms": row.total_ms if finite(row.total_ms) else None,
    }


def split_sources(row: ComponentRow) -> dict[str, Any]:
    """How each compute value of :func:`measured_split` was obtained.

    ``{"fwd_compute_ms": how, "bwd_compute_ms": how}``, ``how`` one of
    ``"measured"`` (the parts timed alone), ``"derived"`` (the row's time minus
    its collectives'), ``"unknown"``; and ``"negative"``: the derivations that
    came out below zero, ``{key: row time - comms time}`` (ms), empty if none.
    """
    out: dict[str, Any] = {"negative": {}}
    for key, total, phase, part in (
        ("fwd_compute_ms", row.fwd_ms, "forward", "fwd_ms"),
        ("bwd_compute_ms", row.bwd_ms, "backward", "bwd_ms"),
    ):
        comm = _comm_ms(row, phase)
        if _parts_sum(row, part) is not None:
            out[key] = "measured"
        elif finite(total) and comm is not None:
            out[key] = "derived"
            if total - comm < 0:
                out["negative"][key] = total - comm
        else:
            out[key] = "unknown"
    return out


def _planned_split(planned: Mapping[str, Any]) -> dict[str, float | None]:
    """The planner's figures on the measured split: its input-dist comms in the forward comms and the total."""
    extra = planned.get("input_dist_comms_ms")
    extra = float(extra) if finite(extra) else 0.0
    out: dict[str, float | None] = {}
    for key in PLANNED_PARTS:
        v = planned.get(key)
        out[key] = float(v) + (extra if key in ("fwd_comms_ms", "total_ms") else 0.0) if finite(v) else None
    return out


def derive_parts(row: ComponentRow, peak_bandwidth: float | None) -> None:
    """Complete ``details["parts"]`` and ``details["planned"]`` of ``row`` (module docstring)."""
    for part in row.details.get("parts") or ():
        if not isinstance(part, dict):
            continue
        ms, nbytes = part.get("fwd_ms"), part.get("bytes")
        if finite(ms) and finite(nbytes) and ms > 0:
            part["gbps"] = nbytes / (ms / 1e3) / 1e9
            part["bw_util"] = nbytes / (ms / 1e3) / peak_bandwidth if peak_bandwidth else None
    planned = row.details.get("planned")
    if not isinstance(planned, dict) or "error" in planned:
        return
    measured = measured_split(row)
    on_split = _planned_split(planned)
    planned["measured"] = measured
    sources = split_sources(row)
    planned["measured_how"] = {k: v for k, v in sources.items() if k != "negative"}
    if sources["negative"]:
        planned["derived_negative"] = sources["negative"]
        flags = row.details.setdefault("own_flags", [])
        if "derived_negative" not in flags:
            flags.append("derived_negative")
    planned["planned_on_split"] = on_split
    ratios: dict[str, float | None] = {}
    for key in PLANNED_PARTS:
        r = ratio(measured[key], on_split[key])
        ratios[key] = None if is_nan(r) else r
    planned["ratio"] = ratios
