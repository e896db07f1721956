"""Snapshots: a model, its captured inputs and the options, saved to profile elsewhere.

A snapshot directory holds two files:

- ``snapshot.pt``: a :func:`torch.save` pickle of the model object (its class is
  pickled by reference: module and name), the captured first call of every
  component, the benchmark options that can be pickled, and the metadata.
- ``snapshot.json``: a human-readable description (the model's class, the torch
  version, the device and precision it was captured with, the options, the
  training script), read without unpickling anything.

Classes defined in the training script itself (``__main__``) are pickled as
``__main__.Name``; loading imports that script the way ``multiprocessing``'s
``spawn`` does (its ``if __name__ == "__main__":`` block does not run), from the
recorded path or from ``load_snapshot(..., script=...)`` / ``cb replay --script``.

The Lightning callback writes one in ``mode="fork"`` and profiles it in a child
process; ``cb replay SNAPSHOT_DIR`` profiles one offline, e.g. on another machine.

Warning:
    A snapshot is a pickle: loading one runs code named by its author. Only load
    snapshots you trust (your own runs).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import io
import json
import os
import pickle
import runpy
import sys
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cb_callback._engine.capture.inputs import ComponentInputs
from cb_callback._engine.capture.storage import model_device
from cb_callback._engine.capture.tree import scripted
from cb_callback._engine.run.config import BenchmarkConfig, config_or_default
from cb_callback._engine.run.precision import AUTOCAST_DTYPES, DEFAULT_DTYPES
from cb_callback._engine.run.profile import profile_captured
from cb_callback._hardware.devices import device_problem
from cb_callback._report.discover import Resolved, capture_step, find_dirs, resolve
from cb_callback._report.model import Report
from cb_callback._types import OptionValue

__all__ = [
    "META_FILE",
    "SNAPSHOT_FILE",
    "Snapshot",
    "SnapshotError",
    "load_snapshot",
    "precision_context",
    "resolve_snapshot_dir",
    "save_snapshot",
]

SNAPSHOT_FILE = "snapshot.pt"
META_FILE = "snapshot.json"
FORMAT = 1

# Options that describe where a run writes or reports progress: they belong to the
# process that profiles the snapshot, not to the snapshot.
_LOCAL_OPTIONS = ("progress", "output_dir")
_PLUGIN_OPTIONS = ("preprocessors", "metrics", "reporters")

_IMPORT_HINT = (
    "Define the class in an importable module or at the top level of the training "
    "script (not in `__main__` of a notebook, a `python -c` string or an interactive "
    "session) and make that module importable here (install it or add it to "
    "PYTHONPATH); for a class in the training script, pass the script with "
    "`cb replay --script PATH` (load_snapshot(..., script=PATH)) if it moved. The "
    'training script needs an `if __name__ == "__main__":` guard around its training '
    "code, because loading the snapshot (and mode='fork''s spawned process) imports it."
)


# What torch.load raises for a file that is not a (complete) torch.save zip archive.
_FORMAT_ERRORS = ("PytorchStreamReader", "zip archive", "magic number")


class SnapshotError(RuntimeError):
    """A snapshot cannot be written or read (the message says why and the fix)."""


def _os_error(e: BaseException) -> OSError | None:
    """``e`` or the ``OSError`` behind it (torch turns a failed write into a ``RuntimeError``)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [e]
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, OSError):
            return x
        todo += [x.__cause__, x.__context__]
    return None


def _with_path(e: OSError, path: Path) -> OSError:
    """``e``, naming ``path`` when it names no file (a failed ``write`` does not)."""
    if e.filename is not None or e.errno is None:
        return e
    named = OSError(e.errno, e.strerror, str(path))
    named.__cause__ = e
    return named


@dataclass
class Snapshot:
    """A loaded snapshot.

    Attributes:
        model: the root module (on the ``map_location`` it was loaded to).
        calls: the captured first call of every component, by path (the first batch's).
        config: :class:`BenchmarkConfig` options as saved (picklable ones only).
        captured_batch_size: the batch size the stored inputs hold.
        precision: the Lightning precision the step ran with (``"bf16-mixed"`` …),
            or ``None``.
        metadata: what the capturing run recorded (capture step, rank, device …).
        more_calls: the calls of the batches after the first
            (``ComponentBenchmark(capture_batches=k)``), empty with one batch.
    """

    model: nn.Module
    calls: dict[str, ComponentInputs]
    config: dict[str, Any] = field(default_factory=dict)
    captured_batch_size: int | None = None
    precision: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    more_calls: list[dict[str, ComponentInputs]] = field(default_factory=list)

    @property
    def batches(self) -> list[dict[str, ComponentInputs]]:
        """The captured calls of every batch, the first one first."""
        return [self.calls, *self.more_calls]

    def benchmark_config(self, **overrides: OptionValue) -> BenchmarkConfig:
        """The saved options as a :class:`BenchmarkConfig`, with ``overrides`` applied.

        Raises:
            ValueError: an unknown option or an invalid value (naming it).
        """
        known = set(BenchmarkConfig.field_names())
        saved = {k: v for k, v in self.config.items() if k in known}
        return BenchmarkConfig(**saved).replace(**overrides)

    def profile(
        self,
        *,
        device: str | torch.device | None = None,
        output_dir: str | Path | None = None,
        progress: Callable[[int, int, str], None] | None = None,
        **overrides: OptionValue,
    ) -> Report:
        """Profile the snapshot with :func:`cb_callback.profile_captured`.

        Args:
            device: where to replay (the model is moved there); ``None`` keeps the
                saved ``device`` option, else where the model's parameters are.
            output_dir: passed to the options (user reporters write there).
            progress: ``progress(done, total, path)`` after each component.
            **overrides: other :class:`BenchmarkConfig` options.

        Returns:
            The report; its metadata holds the snapshot's metadata and
            ``snapshot_precision``.

        Notes:
            The replay runs inside the autocast (``*-mixed``) or default-dtype
            (``*-true``) context of the saved precision, rebuilt with torch alone,
            like Lightning's precision plugin's ``forward_context``.
        """
        opts: dict[str, Any] = dict(overrides)
        if device is not None:
            opts["device"] = str(device)
        opts["output_dir"] = None if output_dir is None else str(output_dir)
        opts["progress"] = progress
        cfg = self.benchmark_config(**opts)
        model = self.model
        if cfg.device is not None:
            model = model.to(torch.device(cfg.device))
        target = torch.device(cfg.device) if cfg.device is not None else model_device(model)
        meta = dict(self.metadata)
        meta["snapshot_precision"] = self.precision
        return profile_captured(
            model,
            self.calls if not self.more_calls else self.batches,
            config=cfg,
            captured_batch_size=self.captured_batch_size,
            forward_context=precision_context(self.precision, target.type),
            metadata=meta,
        )


def precision_context(precision: str | None, device_type: str) -> Callable[[], AbstractContextManager[Any]] | None:
    """A factory of the forward context of a Lightning ``precision`` string, built on torch.

    ``"bf16-mixed"`` / ``"16-mixed"`` give :func:`torch.autocast` on ``device_type``;
    ``"bf16-true"`` / ``"16-true"`` / ``"64-true"`` set the default dtype (tensors
    created inside the forward take it); anything else (``"32-true"``, ``None``)
    gives ``None``: no context.
    """
    if precision in AUTOCAST_DTYPES:
        dtype = AUTOCAST_DTYPES[precision]
        return lambda: torch.autocast(device_type, dtype=dtype)
    if precision in DEFAULT_DTYPES:
        return lambda: _default_dtype(DEFAULT_DTYPES[precision])
    return None


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _class_path(obj: object) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _picklable(value: object) -> bool:
    try:
        pickle.dumps(value)
    except Exception:
        return False
    return True


def _config_fields(config: BenchmarkConfig) -> tuple[dict[str, Any], list[str]]:
    """The options to save, and the names of plugins left out (not picklable)."""
    saved: dict[str, Any] = {}
    dropped: list[str] = []
    for f in dataclasses.fields(config):
        if f.name in _LOCAL_OPTIONS:
            continue
        value = getattr(config, f.name)
        if f.name in _PLUGIN_OPTIONS:
            kept = []
            for plugin in value:
                if _picklable(plugin):
                    kept.append(plugin)
                else:
                    dropped.append(f"{f.name}: {getattr(plugin, 'name', type(plugin).__name__)}")
            value = tuple(kept)
        elif isinstance(value, torch.device):
            value = str(value)
        saved[f.name] = value
    return saved, dropped


def _inputs_to_plain(ci: ComponentInputs) -> dict[str, Any]:
    # A plain dict (its variants too), so that a later ComponentInputs (new fields) still reads old snapshots.
    out = {f.name: getattr(ci, f.name) for f in dataclasses.fields(ComponentInputs)}
    out["variants"] = [_inputs_to_plain(v) for v in ci.variants]
    return out


def _inputs_from_plain(d: Mapping[str, Any]) -> ComponentInputs:
    known = {f.name for f in dataclasses.fields(ComponentInputs)}
    fields = {k: v for k, v in d.items() if k in known}
    fields["variants"] = [_inputs_from_plain(v) for v in d.get("variants", [])]
    return ComponentInputs(**fields)


def _calls_to_plain(calls: Mapping[str, ComponentInputs]) -> dict[str, dict[str, Any]]:
    return {path: _inputs_to_plain(ci) for path, ci in calls.items()}


def _calls_from_plain(data: Mapping[str, Mapping[str, Any]]) -> dict[str, ComponentInputs]:
    # Snapshots written before a field existed leave it at its default (no variants, reach unknown).
    return {path: _inputs_from_plain(d) for path, d in data.items()}


def _main_script() -> dict[str, str | None]:
    """Where this process's ``__main__`` comes from (what ``spawn`` would re-import).

    ``script``: its file, absolute; ``script_module``: its module name when run
    with ``python -m`` (``None`` otherwise); ``script_sys_path``: ``sys.path[0]``.
    All ``None`` for a notebook, ``python -c`` or an interactive session.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", None)
    if name is not None and (name == "__main__" or name.endswith(".__main__")):
        name = None  # a package's __main__: spawn does not re-run it either
    return {
        "script": os.path.abspath(path) if isinstance(path, str) else None,
        "script_module": name,
        "script_sys_path": sys.path[0] if sys.path and isinstance(path, str) else None,
    }


def save_snapshot(
    directory: str | Path,
    model: nn.Module,
    calls: Mapping[str, ComponentInputs] | Sequence[Mapping[str, ComponentInputs]],
    *,
    config: BenchmarkConfig | None = None,
    captured_batch_size: int | None = None,
    precision: str | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    """Write a snapshot of ``model`` and its captured ``calls`` into ``directory``.

    Args:
        directory: created if missing; ``snapshot.pt`` and ``snapshot.json`` are
            (over)written in it.
        model: the root module, pickled whole (its class by reference).
        calls: the captured calls (a :class:`cb_callback.Capture`'s ``calls``), or
            one such mapping per captured batch.
        config: the options; ``progress`` and ``output_dir`` are not saved, nor
            plugins that cannot be pickled (listed in the metadata under
            ``snapshot_dropped_plugins``).
        captured_batch_size: the batch size the stored inputs hold.
        precision: the Lightning precision string of the step, if any.
        metadata: JSON-friendly facts about the capturing run.

    Returns:
        The directory.

    Notes:
        The description also records the training script (``__main__``'s file,
        absolute, its module name under ``python -m``, and ``sys.path[0]``), so a
        class defined in it can be found when the snapshot is loaded.

    Raises:
        SnapshotError: when the model or an input cannot be pickled (a lambda, an
            open file, a class defined inside a function …), naming the object.
        OSError: when the directory cannot be written (a full disk: ``ENOSPC``),
            naming the file; a partly written ``snapshot.pt.tmp`` is removed.
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    batches = [calls] if isinstance(calls, Mapping) else list(calls)
    calls = batches[0]
    cfg = config_or_default(config)
    options, dropped = _config_fields(cfg)
    meta = dict(metadata or {})
    if dropped:
        meta["snapshot_dropped_plugins"] = dropped
    payload = {
        "format": FORMAT,
        "model": model,
        "calls": _calls_to_plain(calls),
        "more_calls": [_calls_to_plain(c) for c in batches[1:]],
        "config": options,
        "captured_batch_size": captured_batch_size,
        "precision": precision,
        "metadata": meta,
    }
    _write_pickle(out, payload, model)
    description = _description(model, batches, cfg, captured_batch_size, precision, meta)
    try:
        (out / META_FILE).write_text(json.dumps(description, indent=1, default=str))
    except OSError as e:
        raise _with_path(e, out / META_FILE) from e
    return out


def _load_script(data: bytes) -> torch.jit.ScriptModule:
    """A TorchScript module from its ``torch.jit.save`` bytes (what :class:`_ScriptPickler` wrote)."""
    return torch.jit.load(io.BytesIO(data))


class _ScriptPickler(pickle.Pickler):
    """A pickler that writes each TorchScript module as its ``torch.jit.save`` archive (pickle refuses
    one: ``Tried to serialize object __torch__... which does not have a __getstate__``); the rest as
    :class:`pickle.Pickler` does."""

    def reducer_override(self, obj: object) -> tuple[Callable[[bytes], torch.jit.ScriptModule], tuple[bytes]]:
        if isinstance(obj, nn.Module) and scripted(obj):
            buffer = io.BytesIO()
            torch.jit.save(obj, buffer)
            return _load_script, (buffer.getvalue(),)
        return NotImplemented  # the default reduction


#: ``torch.save``'s ``pickle_module`` for a model holding a TorchScript module (it reads ``Pickler``).
_SCRIPT_PICKLE = types.SimpleNamespace(__name__="pickle", Pickler=_ScriptPickler)


def _write_pickle(out: Path, payload: dict[str, Any], model: nn.Module) -> None:
    """``torch.save`` the payload into ``snapshot.pt.tmp``, then move it onto ``snapshot.pt``.

    A TorchScript module in the model is written as its ``torch.jit.save`` archive
    (:class:`_ScriptPickler`), read back by ``torch.jit.load`` on the device it was saved from; its
    parameters are then its own (a weight it shared with a Python module is two after loading).

    Raises:
        SnapshotError: something in the payload cannot be pickled (naming the model's class).
        OSError: the file cannot be written, naming it; the partial ``.tmp`` is removed.
    """
    tmp = out / (SNAPSHOT_FILE + ".tmp")
    try:
        with open(tmp, "wb") as f:  # a Python file: a failed write raises its OSError (ENOSPC ...)
            if any(scripted(m) for m in model.modules()):
                torch.save(payload, f, pickle_module=_SCRIPT_PICKLE)
            else:
                torch.save(payload, f)
    except (OSError, RuntimeError) as e:
        tmp.unlink(missing_ok=True)
        if (os_error := _os_error(e)) is None:
            raise
        raise _with_path(os_error, tmp) from e
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        tmp.unlink(missing_ok=True)
        raise SnapshotError(
            f"cannot pickle the model {_class_path(model)} or its captured inputs for a snapshot: "
            f"{type(e).__name__}: {e}. Snapshots pickle the module object (torch.save(module)); "
            "make its attributes picklable (no lambdas, open files, or classes defined inside "
            "functions), or use mode='pause'."
        ) from e
    tmp.replace(out / SNAPSHOT_FILE)


def _description(
    model: nn.Module,
    batches: Sequence[Mapping[str, ComponentInputs]],
    cfg: BenchmarkConfig,
    captured_batch_size: int | None,
    precision: str | None,
    meta: dict[str, Any],
) -> dict[str, Any]:
    """``snapshot.json``'s content: what was captured, when, with which torch and options, from which script."""
    return {
        "format": FORMAT,
        "model_class": _class_path(model),
        "components_captured": len(batches[0]),
        "batches": len(batches),
        "captured_batch_size": captured_batch_size,
        "precision": precision,
        "torch": torch.__version__,
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "config": cfg.to_metadata() | {"output_dir": None},
        "metadata": meta,
        **_main_script(),
        "warning": "snapshot.pt is a pickle: only load snapshots you trust.",
    }


def read_description(directory: str | Path) -> dict[str, Any]:
    """``snapshot.json`` of a snapshot directory (no unpickling), ``{}`` if missing or unreadable
    (:func:`description_problem` says why)."""
    try:
        data = json.loads((Path(directory) / META_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def description_problem(directory: str | Path) -> str | None:
    """Why the ``snapshot.json`` of ``directory`` cannot be read (``"PATH is unreadable (not JSON: ...)"``);
    ``None`` when it can, or when there is none (a snapshot written without it)."""
    path = Path(directory) / META_FILE
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        return f"{path} is unreadable ({e.strerror or e})"
    except ValueError as e:  # JSONDecodeError, or bytes that are not UTF-8
        return f"{path} is unreadable (not JSON: {e})"
    return None if isinstance(data, dict) else f"{path} is unreadable (not a JSON object: {type(data).__name__})"


def resolve_snapshot_dir(location: str | Path, step: int | None = None) -> Resolved:
    """The snapshot a user means by ``location`` (and ``step``), as ``cb report`` finds reports.

    A directory with ``snapshot.pt`` (or the file) is that snapshot; any other
    directory is searched and the newest ``snapshot.pt`` under it taken, or with
    ``step`` the one whose ``snapshot.json`` records that capture step
    (:mod:`cb_callback._report.discover`).

    Raises:
        FileNotFoundError: no snapshot at or under ``location``.
        StepNotFoundError: none there is of capture step ``step``.
    """
    return resolve(
        location, step, filename=SNAPSHOT_FILE, what="snapshot",
        find=lambda root: find_dirs(root, SNAPSHOT_FILE),
        step_of=lambda d: capture_step(read_description(d).get("metadata")),
        missing="no snapshot at or under {path}: expected a directory with " + SNAPSHOT_FILE + " in it or below",
    )  # fmt: skip


class _MainScript:
    """How to import the training script as ``__mp_main__``, as ``spawn`` does."""

    def __init__(
        self, description: Mapping[str, Any], override: str | Path | None, unreadable: str | None = None
    ) -> None:
        self.override = None if override is None else os.path.abspath(override)
        self.unreadable = unreadable  # why snapshot.json, where the script is recorded, cannot be read
        recorded = description.get("script")
        self.path: str | None = self.override or (recorded if isinstance(recorded, str) else None)
        module = description.get("script_module")
        self.module: str | None = module if self.override is None and isinstance(module, str) else None
        sys_path = description.get("script_sys_path")
        if self.override is not None:
            self.sys_path: str | None = os.path.dirname(self.override)
        else:
            self.sys_path = sys_path if isinstance(sys_path, str) else None
        self.loaded: types.ModuleType | None = None

    def describe(self) -> str:
        unknown = f"(not known: {self.unreadable})" if self.unreadable else "(not recorded)"
        return self.path or (f"-m {self.module}" if self.module else unknown)

    def already_main(self) -> bool:
        """Whether ``__main__`` already is that script (a spawned child, the script itself)."""
        current = getattr(sys.modules.get("__main__"), "__file__", None)
        return self.path is not None and isinstance(current, str) and os.path.abspath(current) == self.path

    def load(self) -> types.ModuleType | None:
        """Run the script as ``__mp_main__`` once (``None`` if it is already ``__main__``).

        Raises:
            SnapshotError: no script recorded or given, it is missing, or it raised.
        """
        if self.loaded is not None or self.already_main():
            return self.loaded
        path = self.path
        if self.module is None and (path is None or not os.path.isfile(path)):
            where = f"is not at {path}" if path is not None else "was not recorded"
            if path is None and self.unreadable:
                where = f"cannot be found: {self.unreadable}, where its path is recorded"
            raise SnapshotError(
                f"the snapshot's classes include some defined in its training script (`__main__`), "
                f"and the script {where}: pass it with `cb replay --script PATH` "
                "(load_snapshot(..., script=PATH))"
            )
        if self.sys_path is not None and self.sys_path not in sys.path:
            sys.path.insert(0, self.sys_path)
        try:
            if self.module is not None:
                content = runpy.run_module(self.module, run_name="__mp_main__", alter_sys=True)
            else:
                content = runpy.run_path(str(path), run_name="__mp_main__")
        except (Exception, SystemExit) as e:
            raise SnapshotError(
                f"importing the training script {self.describe()} (to find the classes it defines) "
                f"raised {type(e).__name__}: {e}"
            ) from e
        module = types.ModuleType("__mp_main__")
        module.__dict__.update(content)
        sys.modules["__mp_main__"] = module
        self.loaded = module
        return module

    @contextlib.contextmanager
    def as_main(self) -> Iterator[None]:
        """Resolve ``__main__.X`` to the loaded script while unpickling; ``__main__`` is put back."""
        if self.loaded is None:
            yield
            return
        before = sys.modules.get("__main__")
        sys.modules["__main__"] = self.loaded
        try:
            yield
        finally:
            if before is not None:
                sys.modules["__main__"] = before


def load_snapshot(
    directory: str | Path,
    *,
    map_location: str | torch.device | None = None,
    script: str | Path | None = None,
) -> Snapshot:
    """Read a snapshot written by :func:`save_snapshot`.

    Args:
        directory: the snapshot directory (or its ``snapshot.pt``).
        map_location: where to load tensors (``torch.load``'s ``map_location``),
            e.g. ``"cpu"`` for a snapshot taken on a GPU.
        script: the training script that defines classes pickled as
            ``__main__.X``, where the one recorded at save time moved; it is
            imported first.

    Returns:
        The snapshot.

    Raises:
        SnapshotError: no snapshot there, a file that is not a complete snapshot
            ("truncated or not a snapshot?": only for unpickling and archive
            errors), a format this version does not read, a class in it that
            cannot be imported (named, with the fix), or another error of
            ``torch.load`` (its type and message).
        ValueError: ``map_location`` is a device this machine does not have
            (see :func:`device_problem`), e.g. ``"cuda"`` on a CPU-only torch.

    Notes:
        Classes of ``__main__`` are found the way ``multiprocessing``'s ``spawn``
        finds them: the training script is run with ``__name__ == "__mp_main__"``
        (its ``if __name__ == "__main__":`` block does not run; its top level
        does) and stays in ``sys.modules`` as ``__mp_main__``; ``__main__``
        points to it only while unpickling. The script is imported when the
        model's class is in ``__main__``, when ``script`` is given, or when
        unpickling names a missing ``__main__`` attribute; not otherwise.

    Warning:
        This unpickles ``snapshot.pt`` (``torch.load(weights_only=False)``), which
        can run arbitrary code, and may run the training script's top level: only
        load snapshots you trust.
    """
    path = _snapshot_file(directory, map_location)
    description = read_description(path.parent)
    model_class = description.get("model_class", "the model's class")
    main = _MainScript(description, script, description_problem(path.parent))
    if script is not None or str(model_class).startswith("__main__."):
        main.load()
    payload = _unpickle(path, map_location, main, model_class)
    return _from_payload(path, payload)


def _snapshot_file(directory: str | Path, map_location: str | torch.device | None) -> Path:
    """The ``snapshot.pt`` of ``directory`` (or ``directory`` itself), once it exists and ``map_location`` is here.

    Raises:
        SnapshotError: no such file.
        ValueError: ``map_location`` is a device this machine does not have.
    """
    path = Path(directory)
    if path.is_dir():
        path = path / SNAPSHOT_FILE
    if not path.is_file():
        raise SnapshotError(f"no snapshot at {path}: expected a directory with {SNAPSHOT_FILE}")
    if isinstance(map_location, (str, torch.device)) and (problem := device_problem(map_location)) is not None:
        raise ValueError(f"map_location={str(map_location)!r}: {problem}")
    return path


def _unpickle(path: Path, map_location: str | torch.device | None, main: _MainScript, model_class: object) -> object:
    """``torch.load`` of ``path`` with ``__main__`` as the training script, which is imported on a first miss.

    Raises:
        SnapshotError: a class cannot be imported, the file is truncated or not a
            snapshot, or ``torch.load`` failed otherwise (each message names ``path``).
    """
    try:
        try:
            with main.as_main():
                return torch.load(path, map_location=map_location, weights_only=False)
        except AttributeError as e:
            if main.loaded is not None or main.already_main() or "__main__" not in str(e):
                raise
            main.load()
            with main.as_main():
                return torch.load(path, map_location=map_location, weights_only=False)
    except (AttributeError, ImportError) as e:
        raise SnapshotError(
            f"cannot load the snapshot {path}: a class it references cannot be imported here "
            f"({type(e).__name__}: {e}). The snapshot's model is {model_class}. Its training "
            f"script: {main.describe()}. {_IMPORT_HINT}"
        ) from e
    except (pickle.UnpicklingError, EOFError) as e:
        raise SnapshotError(f"cannot read the snapshot {path} (truncated or not a snapshot?): {e}") from e
    except SnapshotError:  # the training script's own message (not found, it raised): says it all, once
        raise
    except RuntimeError as e:
        if any(marker in str(e) for marker in _FORMAT_ERRORS):
            raise SnapshotError(f"cannot read the snapshot {path} (truncated or not a snapshot?): {e}") from e
        raise SnapshotError(f"cannot load the snapshot {path}: {type(e).__name__}: {e}") from e


def _from_payload(path: Path, payload: object) -> Snapshot:
    """The :class:`Snapshot` an unpickled payload holds, once it is one of a format this version reads.

    Raises:
        SnapshotError: not a cb_callback snapshot, or of a newer format.
    """
    if not isinstance(payload, dict) or "model" not in payload:
        raise SnapshotError(f"{path} is not a cb_callback snapshot")
    if payload.get("format", 0) > FORMAT:
        raise SnapshotError(
            f"{path} has snapshot format {payload.get('format')}; this cb_callback reads format "
            f"{FORMAT} and older: upgrade cb_callback"
        )
    return Snapshot(
        model=payload["model"],
        calls=_calls_from_plain(payload.get("calls", {})),
        config=dict(payload.get("config", {})),
        captured_batch_size=payload.get("captured_batch_size"),
        precision=payload.get("precision"),
        metadata=dict(payload.get("metadata", {})),
        more_calls=[_calls_from_plain(c) for c in payload.get("more_calls", [])],
    )
