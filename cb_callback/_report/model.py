"""The model of results: one :class:`ComponentRow` per component, in a :class:`Report`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

import json
import math
import shutil
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeAlias

from cb_callback._report.discover import resolve_report_dir  # the standard library only: no heavy import
from cb_callback._report.headroom import missing_headroom
from cb_callback._report.schema import SCHEMA_VERSION, STATUSES, RowDetails, Status

__all__ = ["COLUMNS", "RENDERERS", "STATUSES", "ComponentRow", "Renderers", "Report", "error_text"]

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
    ``comm_bytes`` is the payload of the collectives the component issues per call,
    forward and backward (as nccl-tests counts it; 0 when it issues none) and
    ``comm_ms`` their time (measured when it was replayed in lockstep across ranks,
    each collective waited for as it is issued; NaN otherwise).
    ``insitu_ms`` is the component's forward per call inside the real forward
    (the in-situ pass: its top component run whole, every module's calls timed
    by hooks, the hooks' own time left out; NaN when it did not run there), the
    figure ``fwd_ms`` is checked against (flag ``insitu_mismatch``).
    ``headroom_ms`` is the time per call it would save at its own roof: per pass
    ``max(0, t - max(flops / peak FLOP/s, bytes / its bandwidth ceiling))``, forward
    plus backward (NaN without a trustworthy time or counts; docs/columns.md).
    ``details["flags"]`` lists the
    row's measurement-quality flags (see :mod:`cb_callback._engine.derive.quality`).

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
    status: Status = "not_run"
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
    comm_bytes: float = _NAN
    comm_ms: float = _NAN
    insitu_ms: float = _NAN
    headroom_ms: float = _NAN
    details: RowDetails = field(default_factory=RowDetails)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status={self.status!r} is not one of {STATUSES}")


#: The DataFrame columns, in order (a contract: see docs/columns.md).
COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(ComponentRow) if f.name != "details")


def error_text(e: BaseException) -> str:
    """An exception as a row's ``error`` (or a detail's) reads: ``Type: message``, at most 500 characters."""
    text = f"{type(e).__name__}: {e}".strip()
    return text if len(text) <= 500 else text[:497] + "..."


#: A value ``json.dumps`` writes as it is (``allow_nan=False``: no NaN or inf).
_JSON: TypeAlias = "bool | int | float | str | list[_JSON] | dict[str, _JSON] | None"


def _is_numpy_scalar(value: object) -> bool:
    """Whether ``value`` is a numpy scalar (``np.int64``, ``np.float32``, ``np.bool_``, ...), numpy not imported."""
    kind = type(value)
    return kind.__module__ == "numpy" and callable(getattr(value, "item", None)) and getattr(value, "shape", None) == ()


def _json_safe(value: object) -> _JSON:
    """Replace NaN/inf by ``None`` (JSON has no NaN) and containers recursively.

    A numpy scalar (what ``np.prod(shape)`` or a numpy metric gives a plugin) is written as the
    Python number or bool it holds (``.item()``), never as its text: the file must load again.
    """
    if _is_numpy_scalar(value):
        value = value.item()  # type: ignore[attr-defined]
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
_REQUIRED = ("path", "module_type", "depth", "parent")  # the fields without a default
_TEXT = ("path", "module_type", "status")  # str
_OPTIONAL_TEXT = ("parent", "error", "note", "bound")  # str or null
_INTEGERS = ("depth", "calls")  # int
_LARGEST_FLOAT = int(sys.float_info.max)  # a number column's integer past it cannot be a float
_NUMBERS = tuple(c for c in COLUMNS if c not in (*_TEXT, *_OPTIONAL_TEXT, *_INTEGERS))  # number or null (NaN)


def _kind(value: object) -> str:
    """The JSON value's Python type as a message names it (``None`` for null)."""
    return "None" if value is None else type(value).__name__


def _checked(where: str, value: object, ok: bool, expected: str) -> None:
    if not ok:
        raise ValueError(f"{where} is {_kind(value)}, expected {expected}")


def _from_json(data: object, where: str) -> ComponentRow:
    """One row of ``report.json``; ``where`` (``rows[3]``) names it in the error.

    Raises:
        ValueError: the row is not an object, a field has the wrong JSON type
            (``rows[0].path is int, expected str``), a field without a default is
            missing or the status is unknown (the first found, in that order).
    """
    _checked(where, data, isinstance(data, dict), "an object (dict)")
    assert isinstance(data, dict)  # checked above: narrows the JSON value for mypy
    for name, value in data.items():
        at = f"{where}.{name}"
        if name in _TEXT:
            _checked(at, value, isinstance(value, str), "str")
        elif name in _OPTIONAL_TEXT:
            _checked(at, value, value is None or isinstance(value, str), "str or None")
        elif name in _INTEGERS:
            _checked(at, value, isinstance(value, int) and not isinstance(value, bool), "int")
        elif name in _NUMBERS:
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            _checked(at, value, value is None or number, "a number or None")
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _LARGEST_FLOAT:
                raise ValueError(f"{at} is an integer of {len(str(abs(value)))} digits, too large for a float")
        elif name == "details":
            _checked(at, value, value is None or isinstance(value, dict), "an object (dict)")
    for name in _REQUIRED:
        if name not in data:
            raise ValueError(f"{where}: {name!r} missing")
    if data.get("status", "not_run") not in STATUSES:
        raise ValueError(f"{where}.status is {data['status']!r}, expected one of {STATUSES}")
    values = {k: v for k, v in data.items() if k in _ROW_FIELDS}
    values["details"] = dict(values.get("details") or {})
    extra = {k: v for k, v in data.items() if k not in _ROW_FIELDS}
    if extra:  # written by a newer version: keep what we cannot place
        values["details"].update(extra)
    for name in _NUMBERS:
        if values.get(name) is None:
            values[name] = _NAN
    return ComponentRow(**values)


def _schema_version(data: dict[str, Any]) -> int:
    """``data["schema_version"]``, or 1 when it has none (a report written before the key).

    Raises:
        ValueError: it is not an integer from 1 to :data:`~cb_callback._report.schema.SCHEMA_VERSION`.
    """
    version = data.get("schema_version", 1)
    _checked("schema_version", version, isinstance(version, int) and not isinstance(version, bool), "int")
    if version < 1:
        raise ValueError(f"schema_version is {version}, expected 1 to {SCHEMA_VERSION}")
    if version > SCHEMA_VERSION:
        raise ValueError(
            f"schema_version {version} is newer than this cb_callback reads (1 to {SCHEMA_VERSION}): "
            "upgrade cb_callback to read it"
        )
    return version


@dataclass
class Renderers:
    """What :class:`Report` calls but may not import: its renderers, set by the layer above.

    The model of results imports none of its formatters, not even inside a
    function (no import cycle of any kind); :mod:`cb_callback._api`, which the
    package's ``__init__`` imports, sets these. Any import of a module of the
    package runs that ``__init__`` first, so they are set whenever a
    :class:`Report` exists; ``None`` means not set.

    Attributes:
        summary: ``summary(report, top) -> str``, what :meth:`Report.summary` returns.
        page: ``page(report, directory) -> Path``, writes ``report.html`` in
            ``directory`` (:meth:`Report.save`).
    """

    summary: Callable[[Report, int], str] | None = None
    page: Callable[[Report, Path], Path] | None = None


#: The renderers :class:`Report` uses (set by :mod:`cb_callback._api`).
RENDERERS = Renderers()


def _artifact_links(rows: Iterable[ComponentRow]) -> list[str]:
    """Every artifact file the rows link (``details["artifacts"]``: paths relative to the report)."""
    out: list[str] = []
    for r in rows:
        arts = r.details.get("artifacts")
        if isinstance(arts, dict):
            out += [str(v) for v in arts.values() if str(v) not in out]
    return out


def _inside(home: Path, rel: str) -> Path | None:
    """``home / rel`` when ``rel`` is a relative path that stays under ``home``; else ``None``."""
    if "\\" in rel or Path(rel).is_absolute() or ":" in rel.split("/", 1)[0]:
        return None  # an absolute path or a URL: the page does not link it either
    target = (home / rel).resolve()
    return target if target.is_relative_to(home.resolve()) else None


class Report:
    """The result of :func:`cb_callback.profile_components`: rows and metadata.

    Args:
        rows: one row per component, breadth-first (depth, then first execution).
        metadata: device name, dtype, peaks and their source, versions, config.
        source_dir: the directory the report's artifact files (``details["artifacts"]``,
            paths relative to it) are under; :meth:`load`, :meth:`save` and
            :func:`cb_callback.profile_components` (its ``output_dir``) set it.
            It is not saved in ``report.json``.
    """

    REPORT_FILE = "report.json"
    CSV_FILE = "components.csv"

    def __init__(
        self,
        rows: Iterable[ComponentRow],
        metadata: dict[str, Any] | None = None,
        *,
        source_dir: str | Path | None = None,
    ):
        self.rows: list[ComponentRow] = list(rows)
        self.metadata: dict[str, Any] = dict(metadata or {})
        self.source_dir: Path | None = None if source_dir is None else Path(source_dir)

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
        import pandas as pd  # only here: importing cb_callback does not import pandas

        return pd.DataFrame([{c: getattr(r, c) for c in COLUMNS} for r in self.rows], columns=list(COLUMNS))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (NaN becomes ``None``) of rows and metadata, and the layout's ``schema_version``
        (:data:`~cb_callback._report.schema.SCHEMA_VERSION`)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "metadata": _json_safe(self.metadata),
            "rows": [_json_safe(asdict(r)) for r in self.rows],
        }

    @classmethod
    def from_dict(cls, data: object) -> Report:
        """Inverse of :meth:`to_dict`; reads every ``schema_version`` up to this one's.

        A dict without ``schema_version`` is version 1 (written before the key
        existed): its rows and metadata have the layout of version 2, which only
        adds the key.

        Raises:
            ValueError: ``data`` is not ``{"rows": [...], "metadata": {...}}`` of
                rows as :meth:`to_dict` writes them, saying what is wrong where
                (``'rows' missing``, ``rows[0].path is int, expected str``), or its
                ``schema_version`` is not an integer from 1 to this one's (a newer
                cb_callback wrote it: the message says to upgrade).
                Keys a row does not know are kept in its ``details``.

        A row without ``headroom_ms`` (a report written before the column) gets it derived from its
        counts, times and the peaks in ``metadata`` (:func:`cb_callback._report.headroom.headroom_ms`).
        """
        _checked("the top level", data, isinstance(data, dict), "an object (dict) with 'rows'")
        assert isinstance(data, dict)  # checked above: narrows the JSON value for mypy
        _schema_version(data)  # versions 1 and 2 lay out rows and metadata alike: nothing to convert
        if "rows" not in data:
            raise ValueError("'rows' missing")
        rows, metadata = data["rows"], data.get("metadata")
        _checked("rows", rows, isinstance(rows, list), "a list")
        parsed = [_from_json(r, f"rows[{i}]") for i, r in enumerate(rows)]
        _checked("metadata", metadata, metadata is None or isinstance(metadata, dict), "an object (dict)")
        for row, derived in zip(parsed, missing_headroom(parsed, rows, metadata or {}), strict=True):
            if derived is not None:  # a report.json written before the column
                row.headroom_ms = derived
        return cls(parsed, metadata or {})

    def save(self, directory: str | Path, *, html: bool = True) -> Path:
        """Write ``report.json`` (everything), ``components.csv`` (the columns) and ``report.html``.

        The artifact files the rows link (``details["artifacts"]``, relative
        paths) are copied from :attr:`source_dir` into ``directory``, keeping
        their relative paths, so the page's links resolve wherever the report
        is saved. Afterwards :attr:`source_dir` is ``directory``.

        Args:
            directory: where to write (created if missing).
            html: also write ``report.html``, the interactive page (about 5 MB:
                plotly.js is inlined so it opens offline).

        Returns:
            The directory.

        Warns:
            RuntimeWarning: naming the linked artifact files that are not in
            ``directory`` afterwards: :attr:`source_dir` is unknown (a report
            built in memory, by :meth:`from_dict`) or lacks them. Their links
            are kept (the files may be put there by hand).
        """
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        self._copy_artifacts(out)
        (out / self.REPORT_FILE).write_text(json.dumps(self.to_dict(), indent=1, allow_nan=False))
        self.to_dataframe().to_csv(out / self.CSV_FILE, index=False)
        if html and RENDERERS.page is not None:
            RENDERERS.page(self, out)
        self.source_dir = out.absolute()
        return out

    def _copy_artifacts(self, out: Path) -> None:
        """Copy the linked artifact files from :attr:`source_dir` into ``out`` (see :meth:`save`)."""
        links = _artifact_links(self.rows)
        source = self.source_dir
        same = source is not None and source.resolve() == out.resolve()
        missing = []
        for rel in links:
            target = _inside(out, rel)
            if target is None:
                continue  # not a relative path under the report: never linked, never copied
            origin = None if source is None or same else _inside(source, rel)
            if origin is not None and origin.is_file():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, target)
            elif not target.is_file():
                missing.append(rel)
        if missing:
            where = "its source directory is unknown" if source is None else f"not in {source}"
            shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            warnings.warn(
                f"cb_callback: {len(missing)} artifact file(s) the report links are not in {out} ({where}): "
                f"{shown}; their links in report.html will not resolve (set report.source_dir to the "
                "directory the report was written to, or Report.load it from there, before saving)",
                RuntimeWarning,
                stacklevel=3,
            )

    @classmethod
    def load(cls, location: str | Path, *, step: int | None = None) -> Report:
        """Read a report written by :meth:`save`, found as ``cb report`` finds it.

        ``location`` is what ``cb report`` accepts (one implementation:
        :func:`cb_callback._report.discover.resolve_report_dir`):

        - a report file (``report.json`` or any other name: that file is read, never
          another report in its directory), or the directory holding ``report.json``;
        - a directory above reports (a run's ``output_dir`` with ``capture_every``,
          ``lightning_logs/``): the most recently written report under it;
        - ``DIR@N`` (or ``step=N``): the report of capture step ``N`` under ``DIR``
          (the newest of them if several have it). A path named with an ``@`` that
          exists is that path.

        Its :attr:`source_dir` is the directory it was read from: the one taken.

        Raises:
            FileNotFoundError: no ``report.json`` at or under ``location``
                (``no report.json at or under DIR``).
            StepNotFoundError: (a :class:`LookupError`) none there of capture step ``N``;
                the message lists the steps there are.
            InvalidStepError: (a :class:`StepNotFoundError` and a :class:`ValueError`)
                ``DIR@x``, ``DIR@``, ``DIR@-1``: ``N`` must be a capture step number; the
                message lists the steps under ``DIR``.
            ValueError: ``cannot read a report at <file>: <why>``: not JSON, not
                UTF-8, or not a report's schema (see :meth:`from_dict`); or ``DIR@N``
                and ``step`` name different steps.
        """
        path = resolve_report_dir(location, step).path(cls.REPORT_FILE)  # a file named is that file
        try:
            report = cls.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except UnicodeDecodeError as e:
            raise ValueError(f"cannot read a report at {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"cannot read a report at {path}: not JSON ({e})") from None
        except ValueError as e:
            raise ValueError(f"cannot read a report at {path}: {e}") from None
        report.source_dir = path.parent.absolute()
        return report

    def hotspot_ranking(self) -> str:
        """What :meth:`hotspots` ranks by: ``"share"`` or ``"total_ms x calls"``.

        ``"share"`` (time over every batch) with several batches when every
        candidate has one; else ``"total_ms x calls"`` (time over the step).
        """
        leaves = self._hotspot_candidates()
        batches = self.metadata.get("batches")
        if isinstance(batches, int) and batches > 1 and all(math.isfinite(r.share) for r in leaves):
            return "share"
        return "total_ms x calls"

    def _hotspot_candidates(self) -> list[ComponentRow]:
        """The leaf-most measured rows: ``ok``/``estimated``, finite ``total_ms``, no ``ok``/``estimated`` child."""
        measured = ("ok", "estimated")
        parents = {r.parent for r in self.rows if r.parent is not None and r.status in measured}
        return [r for r in self.rows if r.path not in parents and r.status in measured and math.isfinite(r.total_ms)]

    def hotspots(self, top: int = 10) -> list[ComponentRow]:
        """The leaf-most measured rows that cost the most time over the step.

        A candidate is a measured row (``ok`` or ``estimated``, finite
        ``total_ms``) none of whose children was measured: a leaf module, or
        one whose children were skipped, failed or not run. Its cost is
        ``total_ms * calls`` (with several batches, its ``share``: time over
        all the batches, a component that ran in one batch of four counted
        once); :meth:`hotspot_ranking` says which. So a hotspot is a place to act on.
        """
        leaves = self._hotspot_candidates()
        if self.hotspot_ranking() == "share":
            return sorted(leaves, key=lambda r: -r.share)[:top]
        return sorted(leaves, key=lambda r: -r.total_ms * max(r.calls, 1))[:top]

    def summary(self, top: int = 10) -> str:
        """A human table: the whole model first, then the ``top`` hotspots.

        This is :func:`cb_callback.reporters.format_summary`; rendering is the
        layer above the results, which registers it (:data:`RENDERERS`).
        """
        if RENDERERS.summary is None:  # pragma: no cover - set when cb_callback is imported
            raise RuntimeError("cb_callback: no summary renderer is registered (import cb_callback)")
        return RENDERERS.summary(self, top)
