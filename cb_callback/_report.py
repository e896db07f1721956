"""The model of results: one :class:`ComponentRow` per component, in a :class:`Report`."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import pandas as pd

from cb_callback._schema import STATUSES

__all__ = ["COLUMNS", "STATUSES", "ComponentRow", "Report", "error_text"]

_NAN = float("nan")


@dataclass
class ComponentRow:
    """Per-call measurements of one component (an ``nn.Module`` of the tree).

    Units are in the names: ``*_ms`` milliseconds, ``*_mb`` MiB, ``bytes`` bytes,
    ``gbps`` 1e9 bytes per second, ``tflops`` 1e12 FLOP per second. ``mfu`` and
    ``bw_util`` are fractions (0.25 = 25 % of the device's peak). ``share`` is
    this component's time over the whole step as a fraction of the root's
    (``total_ms * calls / (root total_ms * root calls)``); ``noise`` the relative spread of
    its timed runs (IQR ÷ median of fwd + bwd). ``compiled_ms`` is fwd + bwd of
    the component compiled alone with ``torch.compile`` (``BenchmarkConfig.compile``;
    NaN when not compiled) and ``compile_speedup`` is ``total_ms / compiled_ms``.
    ``details["flags"]`` lists the
    row's measurement-quality flags (see :mod:`cb_callback._quality`).

    Notes:
        All values describe one call of the component, replayed alone on its first
        captured call's inputs. Isolation cannot see cross-module fusion, cache
        state left by the previous module, or overlap with communication; ``calls``
        says how often the real step called it.
    """

    path: str
    module_type: str
    depth: int
    parent: str | None
    status: str = "not_run"
    error: str | None = None
    note: str | None = None
    calls: int = 0
    fwd_ms: float = _NAN
    bwd_ms: float = _NAN
    total_ms: float = _NAN
    cpu_ms: float = _NAN
    device_ms: float = _NAN
    fwd_flops: float = _NAN
    bwd_flops: float = _NAN
    tflops: float = _NAN
    mfu: float = _NAN
    params_mb: float = _NAN
    activation_mb: float = _NAN
    peak_mem_mb: float = _NAN
    bytes: float = _NAN
    gbps: float = _NAN
    bw_util: float = _NAN
    intensity: float = _NAN
    bound: str | None = None
    share: float = _NAN
    noise: float = _NAN
    compiled_ms: float = _NAN
    compile_speedup: float = _NAN
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status={self.status!r} is not one of {STATUSES}")


#: The DataFrame columns, in order (a contract: see the README).
COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(ComponentRow) if f.name != "details")


def error_text(e: BaseException) -> str:
    """An exception as a row's ``error`` (or a detail's) reads: ``Type: message``, at most 500 characters."""
    text = f"{type(e).__name__}: {e}".strip()
    return text if len(text) <= 500 else text[:497] + "..."


def _json_safe(value: Any) -> Any:
    """Replace NaN/inf by ``None`` (JSON has no NaN) and containers recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


_ROW_FIELDS = {f.name for f in fields(ComponentRow)}


def _from_json(data: dict[str, Any]) -> ComponentRow:
    values = {k: v for k, v in data.items() if k in _ROW_FIELDS}
    extra = {k: v for k, v in data.items() if k not in _ROW_FIELDS}
    if extra:  # written by a newer version: keep what we cannot place
        values["details"] = {**(values.get("details") or {}), **extra}
    for name in COLUMNS:
        if values.get(name) is None and name not in ("error", "note", "parent", "bound"):
            values[name] = _NAN
    return ComponentRow(**values)


class Report:
    """The result of :func:`cb_callback.profile_components`: rows and metadata.

    Args:
        rows: one row per component, breadth-first (depth, then first execution).
        metadata: device name, dtype, peaks and their source, versions, config.
    """

    REPORT_FILE = "report.json"
    CSV_FILE = "components.csv"

    def __init__(self, rows: Iterable[ComponentRow], metadata: dict[str, Any] | None = None):
        self.rows: list[ComponentRow] = list(rows)
        self.metadata: dict[str, Any] = dict(metadata or {})

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[ComponentRow]:
        return iter(self.rows)

    def __repr__(self) -> str:
        return f"Report({len(self.rows)} components, device={self.metadata.get('device_name')!r})"

    def row(self, path: str) -> ComponentRow:
        """The row of the component at ``path`` (``""`` is the root)."""
        for r in self.rows:
            if r.path == path:
                return r
        raise KeyError(f"no component at path {path!r}; known: {[r.path for r in self.rows][:20]}")

    def children(self, path: str) -> list[ComponentRow]:
        """The rows whose parent is ``path``, in report order."""
        return [r for r in self.rows if r.parent == path]

    def to_dataframe(self) -> pd.DataFrame:
        """One row per component with exactly the columns of :data:`COLUMNS`."""
        return pd.DataFrame([{c: getattr(r, c) for c in COLUMNS} for r in self.rows], columns=list(COLUMNS))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (NaN becomes ``None``) of rows and metadata."""
        return {
            "metadata": _json_safe(self.metadata),
            "rows": [_json_safe(asdict(r)) for r in self.rows],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        """Inverse of :meth:`to_dict`."""
        return cls([_from_json(r) for r in data["rows"]], data.get("metadata", {}))

    def save(self, directory: str | Path) -> Path:
        """Write ``report.json`` (everything) and ``components.csv`` (the columns).

        Returns:
            The directory, created if missing.
        """
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        (out / self.REPORT_FILE).write_text(json.dumps(self.to_dict(), indent=1, allow_nan=False))
        self.to_dataframe().to_csv(out / self.CSV_FILE, index=False)
        return out

    @classmethod
    def load(cls, directory: str | Path) -> Report:
        """Read a report written by :meth:`save` (a directory or its ``report.json``)."""
        path = Path(directory)
        if path.is_dir():
            path = path / cls.REPORT_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no {cls.REPORT_FILE} at {path}")
        return cls.from_dict(json.loads(path.read_text()))

    def hotspots(self, top: int = 10) -> list[ComponentRow]:
        """The leaf-most measured rows that cost the most time over the step.

        A row's cost is ``total_ms * calls`` (with several batches, its
        ``share``: time over all the batches, a component that ran in one batch of
        four counted once). A row with a measured (or estimated) child is left
        out, so a hotspot is a place to act on.
        """
        measured = ("ok", "estimated")
        parents = {r.parent for r in self.rows if r.parent is not None and r.status in measured}
        leaves = [
            r for r in self.rows
            if r.path not in parents and r.status in measured and math.isfinite(r.total_ms)
        ]
        batches = self.metadata.get("batches")
        if isinstance(batches, int) and batches > 1 and all(math.isfinite(r.share) for r in leaves):
            return sorted(leaves, key=lambda r: -r.share)[:top]
        return sorted(leaves, key=lambda r: -r.total_ms * max(r.calls, 1))[:top]

    def summary(self, top: int = 10) -> str:
        """A human table: the whole model first, then the ``top`` hotspots.

        This is :func:`cb_callback.reporters.format_summary`; rendering is the
        layer above the results, so it is imported here, when called.
        """
        from cb_callback._table import format_summary

        return format_summary(self, top=top)
