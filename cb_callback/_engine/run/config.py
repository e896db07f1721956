"""``BenchmarkConfig``: every option of a profiling run, validated."""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from cb_callback._types import OptionValue

__all__ = ["ARTIFACT_KINDS", "COMPILE_OPTIONS", "BenchmarkConfig", "config_or_default"]

#: The built-in artifact kinds ``artifacts`` may name (their plugins: :mod:`cb_callback._metrics.artifacts`).
ARTIFACT_KINDS: tuple[str, ...] = ("trace", "ops", "memory")

#: The ``torch.compile`` arguments ``compile_options`` may set.
COMPILE_OPTIONS = ("backend", "mode", "dynamic", "fullgraph", "options")

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "tf32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "float64": torch.float64,
    "fp64": torch.float64,
    "double": torch.float64,
}


@dataclass
class BenchmarkConfig:
    """Options of :func:`cb_callback.profile_components`.

    Args:
        max_depth: deepest component profiled (root is 0); ``None`` for all.
        include: glob patterns (:mod:`fnmatch`, ``*`` also matches dots) on the
            dotted path; only matching components and the ancestors that lead to
            them (the root included) are profiled, the rest become ``skipped``.
            A pattern that matches no component warns once. Empty: all.
        exclude: glob patterns; matching components become ``skipped``. Exclude
            wins over include: an excluded match is skipped and keeps no ancestors.
        backward: also replay and measure the backward pass.
        warmup: untimed runs before timing, per pass; the engine's instrumented
            pass (FLOPs, bytes, memory) counts as the first.
        min_run_time_s: timing budget per component and pass (repeats adapt to it).
        min_repeats: timed runs per pass, at least (also past ``min_run_time_s``),
            for a component whose run is shorter than its budget. A longer one
            (a step that takes seconds) stops once two runs or more agree (IQR
            within 5 % of the median, ``details["timing"]["settled"]``):
            ``min_repeats`` is then the most it takes. ``min_run_time_s=0``
            asks every component for exactly ``min_repeats`` per pass (a
            re-measured one takes a second pass, which never stops early).
        max_repeats: timed runs per pass, at most.
        rounds: the timed runs of all components are taken in this many
            interleaved rounds (each component gets its share of runs in every
            round), so a burst of load from elsewhere spreads over the
            components instead of landing on one. ``1``: one component after
            the other.
        max_total_time_s: wall-clock budget of the components' replays; those not
            started in time become ``skipped``. The clock starts after the one-off
            peak calibration (CPU), whose seconds the report records in
            ``metadata["timing"]["calibration_s"]``. With a budget above 0 the root
            is always measured (it is first); ``0`` measures nothing (every row
            ``skipped``). A component that runs past the budget is not
            interrupted. ``None``: no limit.
        budget_s: seconds for the whole profile after the peak calibration: the
            in-situ pass and the triage first, then the isolated replays in
            order of their in-situ share of the step, largest first (the root's
            is 1; without in-situ times, breadth-first), each started while the
            seconds spent and those committed to the replays already started
            (their timing budget each, at least) stay under it. A component not
            started is ``skipped`` with ``details["unreplayed"] = "budget_s"``;
            its in-situ time (``insitu_ms``) stands, and
            ``metadata["cost"]["budget"]`` and the summary say how many were
            left. Unlike ``max_total_time_s`` the root is not exempt: a budget
            too small for it leaves every row to its in-situ time. ``None``: no
            budget. Not under several ranks yet (their plans would differ).
        descend: ``"hotspots"`` (the default) spends the isolated replays where
            the time is. With the in-situ times (``insitu_passes``) it decides
            before any replay (:func:`cb_callback._engine.selection.triage.triage`): a
            component is descended into (its children replayed) when its in-situ
            share of the step reaches ``descend_share``; siblings that repeat
            (same class, parameter shapes and input signature: transformer
            blocks, equal tables, experts) are one group whose
            ``representatives`` members nearest its median in-situ time are measured in depth when the group's
            *total* share reaches it, the other members getting a row at their
            own level (the representative's, or replayed alone when its in-situ
            time differs from the representative's beyond noise: ``details["as"]``), and all replays are timed in
            one interleaving. Without in-situ times (``insitu_passes=0``, a top
            component whose pass raised, on any rank) it goes level by level on
            the measured ``share`` (``total_ms * calls`` over the root's). The
            subtrees not descended into become ``skipped``, the note naming the
            ancestor and its share. A component without a time of its own (a
            container such as a ``ModuleList``) is always descended into: its
            share is its children's sum. ``"all"`` profiles every component (one
            interleaved timing over all of them, no groups): the complete tree.
            A component that never ran stays ``not_run``.
        descend_share: the share a component needs for ``descend="hotspots"``
            to profile its children, in ``[0, 1]``; ``0`` descends everywhere.
        representatives: with ``descend="hotspots"``, the members of a group of
            repeated siblings measured in depth (``1``; ``2`` to check that they
            agree: ``details["group"]["agree"]``); ``0`` groups nothing.
        insitu_passes: timed passes of the in-situ pass (after one warm-up): the
            captured step's outermost called components run whole with a clock
            hook on every module, giving ``insitu_ms`` and the triage's times.
            ``0``: no in-situ pass. Under several ranks every rank runs it at
            once, collectives running, and the triage decides on the max over
            the ranks (docs/distributed.md).
        harness_floor: measure the replay harness's fixed cost per run (an
            identity component on the component's inputs, timed alike) and
            subtract it from ``fwd_ms``/``bwd_ms`` (``details["floor_ms"]``);
            only with the built-in latency metric. See docs/quality.md.
        device: where to replay; ``None`` means where the model's parameters are.
        dtype: compute dtype used to choose the peak for MFU (``"bf16"``, ``"tf32"``,
            ``"fp64"`` …); ``None`` infers it (autocast, else the parameters' dtype).
            A dtype without a peak (``torch.int8``) leaves MFU empty, with one
            warning; the rest of the report is unaffected.
        peak_flops: override of the peak FLOP/s (wins over datasheet/measured).
        peak_bandwidth: override of the peak memory bandwidth in bytes/s.
        batch_size: replicate captured inputs along dim 0 to this batch size.
        preprocessors: :class:`cb_callback.plugins.Preprocessor` plugins, applied in order
            after the built-ins.
        metrics: extra :class:`cb_callback.plugins.MetricPlugin` plugins, run after the
            built-ins.
        reporters: :class:`cb_callback.reporters.Reporter` plugins called with the report.
        output_dir: where reporters and metric artifacts write files; ``None``:
            nothing is written. ``profile_components`` with an ``output_dir``
            and no ``reporters`` of the caller's own writes the report's files
            there (a ``FileReporter``).
        seed: seed of the random gradient of the outputs in the backward replay: an integer
            ``torch.manual_seed`` takes (-2**63 to 2**64 - 1).
        progress: called as ``progress(done, total, path)`` after each component.
        artifacts: per-component artifacts to write under
            ``<output_dir>/artifacts/<path or "root">/``, each from an isolated
            forward + backward of its own after the timed runs: ``"trace"``
            (a Kineto trace, ``trace.json.gz``), ``"ops"`` (the operator table,
            ``ops.csv``), ``"memory"`` (CUDA: an allocator snapshot; CPU: the
            allocation timeline). Empty: none. Needs ``output_dir``.
        artifacts_top: write artifacts only for the ``K`` most expensive
            components (``total_ms × calls``); ``None``: every measured one.
        load_plugins: also use plugins registered under the entry-point group
            ``cb_callback.plugins``.
        log_scalars: how many components :class:`cb_callback.reporters.TensorBoardReporter`
            logs scalars for, besides the root (always logged): the ``n`` measured
            components that cost the most time over the step (``total_ms * calls``,
            at any depth); ``"all"``: every component; ``0``: no scalars at all;
            ``None`` (default): the root's alone for a report that is the run's only
            capture (one dot per chart is no chart: the table and icicles hold the
            rest), the root and the 10 costliest components when the callback
            captures the run several times (``metadata["capture_series"]``: curves).
            The engine does not use it: it reaches the reporter through
            ``report.metadata["config"]``.
        ranks: under a process group of several ranks (each calls the engine
            with its own replica or shard and inputs): ``"all"`` every rank
            profiles every component and rank 0's report adds each row's spread
            over the ranks (``details["ranks"]``); ``"zero"`` rank 0 profiles, the
            others only take part in the replays that communicate (they return a
            report of those). The components that communicate are replayed on
            every rank together either way (:mod:`cb_callback._engine.distributed.lockstep`).
        lockstep_timeout_s: how long a rank waits for the others at an agreement
            point of the lockstep replays; ``None``: 900 s (half the default
            process group timeout).
        compile: the compile what-if: after every component's eager timing,
            compile each chosen component alone with ``torch.compile`` and time
            it as its eager run was timed (same captured inputs, warm-up and
            repeat rules; forward + backward), interleaved with its eager runs.
            Fills ``compiled_ms`` and ``compile_speedup``; ``details["compile"]``
            holds the compile seconds, graphs, graph breaks and their reasons
            (``torch._dynamo.explain``), recompilations and any compile error (the
            eager row stays ``ok``). Dynamo's caches are reset before each
            component and after the last: the process's own compiled functions
            recompile on their next call. ``False``: nothing is compiled.
        compile_options: keyword arguments of ``torch.compile`` (``backend``,
            ``mode``, ``dynamic``, ``fullgraph``, ``options``); ``None``: its defaults.
        compile_top: compile only the ``K`` most expensive measured components
            (``total_ms × calls``, as measured; the root is a candidate like any
            other, first only when its times read highest); ``None``: every
            measured one, most expensive first, while ``max_total_time_s`` lasts.
    """

    max_depth: int | None = None
    include: Sequence[str] = ()
    exclude: Sequence[str] = ()
    backward: bool = True
    warmup: int = 1
    min_run_time_s: float = 0.1
    min_repeats: int = 5
    max_repeats: int = 1000
    rounds: int = 5
    max_total_time_s: float | None = None
    budget_s: float | None = None
    descend: Literal["all", "hotspots"] = "hotspots"
    descend_share: float = 0.05
    representatives: int = 1
    insitu_passes: int = 3
    harness_floor: bool = True
    device: str | torch.device | None = None
    dtype: str | torch.dtype | None = None
    peak_flops: float | None = None
    peak_bandwidth: float | None = None
    batch_size: int | None = None
    preprocessors: Sequence[Any] = ()
    metrics: Sequence[Any] = ()
    reporters: Sequence[Any] = ()
    output_dir: str | None = None
    seed: int = 0
    progress: Callable[[int, int, str], object] | None = field(default=None, repr=False, compare=False)
    artifacts: Sequence[str] = ()
    artifacts_top: int | None = None
    load_plugins: bool = True
    log_scalars: int | Literal["all"] | None = None
    compile: bool = False
    compile_options: Mapping[str, OptionValue] | None = None
    compile_top: int | None = None
    ranks: Literal["all", "zero"] = "all"
    lockstep_timeout_s: float | None = None

    def __post_init__(self) -> None:
        self._check_artifacts()
        self._check_compile()

        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"BenchmarkConfig.{name}={getattr(self, name)!r} is invalid: {why}")

        def non_negative_int(name: str, allow_none: bool = False, least: int = 0, also: str = "") -> None:
            # one message for a value of another type and one below the bound: the bound itself
            v = getattr(self, name)
            if v is None and allow_none:
                return
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise bad(name, f"expected an integer >= {least}{also}" + (" or None" if allow_none else ""))

        def positive_number(name: str, allow_none: bool = False, allow_zero: bool = False) -> None:
            v = getattr(self, name)
            if v is None and allow_none:
                return
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if not ok or v < 0 or (v == 0 and not allow_zero):
                bound = ">= 0" if allow_zero else "> 0"
                raise bad(name, f"expected a finite number {bound}" + (" or None" if allow_none else ""))

        non_negative_int("max_depth", allow_none=True)
        non_negative_int("warmup")
        non_negative_int("min_repeats")
        non_negative_int("max_repeats", least=max(self.min_repeats, 1), also=" (max(min_repeats, 1))")
        non_negative_int("rounds", least=1)
        positive_number("min_run_time_s", allow_zero=True)
        positive_number("max_total_time_s", allow_none=True, allow_zero=True)
        positive_number("budget_s", allow_none=True, allow_zero=True)
        positive_number("peak_flops", allow_none=True)
        if self.descend not in ("all", "hotspots"):
            raise bad("descend", "expected 'all' or 'hotspots'")
        if self.ranks not in ("all", "zero"):
            raise bad("ranks", "expected 'all' or 'zero'")
        if self.lockstep_timeout_s is not None:
            positive_number("lockstep_timeout_s")
        non_negative_int("representatives")
        non_negative_int("insitu_passes")
        if not isinstance(self.harness_floor, bool):
            raise bad("harness_floor", "expected True or False")
        positive_number("descend_share", allow_zero=True)
        if self.descend_share > 1:
            raise bad("descend_share", "expected a share in [0, 1]")
        positive_number("peak_bandwidth", allow_none=True)
        non_negative_int("batch_size", allow_none=True, least=1)
        if not isinstance(self.backward, bool):
            raise bad("backward", "expected True or False")
        for name in ("include", "exclude"):
            v = getattr(self, name)
            if isinstance(v, str):
                setattr(self, name, (v,))
            elif not isinstance(v, (list, tuple, set, frozenset)) or not all(isinstance(p, str) for p in v):
                raise bad(name, "expected glob patterns (a string or a list of strings)")
            else:
                setattr(self, name, tuple(v))
        for name in ("preprocessors", "metrics", "reporters"):
            v = getattr(self, name)
            if not isinstance(v, (list, tuple)):
                raise bad(name, "expected a list of plugins")
            setattr(self, name, tuple(v))
        if self.device is not None:
            try:
                torch.device(self.device)
            except (RuntimeError, TypeError) as e:
                raise bad("device", str(e)) from None
        if self.dtype is not None and not isinstance(self.dtype, torch.dtype) and self.dtype not in _DTYPES:
            raise bad("dtype", f"expected a torch.dtype or one of {sorted(_DTYPES)}")
        if self.log_scalars not in ("all", None):
            non_negative_int("log_scalars", allow_none=True, also=", 'all'")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not -(2**63) <= self.seed < 2**64:
            raise bad("seed", "expected an integer from -2**63 to 2**64 - 1 (what torch.manual_seed takes)")
        if self.progress is not None and not callable(self.progress):
            raise bad("progress", "expected a callable progress(done, total, path)")

    def _check_artifacts(self) -> None:
        kinds = (self.artifacts,) if isinstance(self.artifacts, str) else self.artifacts
        if isinstance(self.artifacts, str) and "," in self.artifacts:
            kinds = tuple(k.strip() for k in self.artifacts.split(",") if k.strip())
        if not isinstance(kinds, (list, tuple)) or any(k not in ARTIFACT_KINDS for k in kinds):
            raise ValueError(
                f"BenchmarkConfig.artifacts={self.artifacts!r} is invalid: expected kinds from {list(ARTIFACT_KINDS)}"
            )
        self.artifacts = tuple(dict.fromkeys(kinds))
        top = self.artifacts_top
        if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 1):
            raise ValueError(f"BenchmarkConfig.artifacts_top={top!r} is invalid: expected an integer >= 1 or None")

    def _check_compile(self) -> None:
        if not isinstance(self.compile, bool):
            raise ValueError(f"BenchmarkConfig.compile={self.compile!r} is invalid: expected True or False")
        opts = self.compile_options
        if opts is not None:
            if not isinstance(opts, Mapping) or set(opts) - set(COMPILE_OPTIONS):
                raise ValueError(
                    f"BenchmarkConfig.compile_options={opts!r} is invalid: expected None or a dict with keys "
                    f"from {list(COMPILE_OPTIONS)} (torch.compile's arguments)"
                )
            self.compile_options = dict(opts)
        top = self.compile_top
        if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 1):
            raise ValueError(f"BenchmarkConfig.compile_top={top!r} is invalid: expected an integer >= 1 or None")

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The names accepted as ``**options``."""
        return tuple(f.name for f in dataclasses.fields(cls))

    def replace(self, **options: OptionValue) -> BenchmarkConfig:
        """A copy with ``options`` changed; unknown names raise ``ValueError``."""
        unknown = sorted(set(options) - set(self.field_names()))
        if unknown:
            close = {n: difflib.get_close_matches(n, self.field_names(), n=3) for n in unknown}
            hints = "; ".join(f"{n!r}: did you mean {' or '.join(map(repr, c))}?" for n, c in close.items() if c)
            raise ValueError(
                f"unknown option(s) {unknown}{'; ' + hints if hints else ''}; "
                f"BenchmarkConfig fields are {list(self.field_names())}"
            )
        return dataclasses.replace(self, **options)

    def to_metadata(self) -> dict[str, Any]:
        """A JSON-friendly view of the options (plugins by class name)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in ("preprocessors", "metrics", "reporters"):
                v = [type(p).__name__ for p in v]
            elif f.name == "progress":
                continue
            elif f.name == "compile_options" and v is not None:
                v = {
                    k: x if isinstance(x, (str, int, float, bool, dict)) or x is None else repr(x) for k, x in v.items()
                }
            elif isinstance(v, (torch.device, torch.dtype)):
                v = str(v)
            elif isinstance(v, tuple):
                v = list(v)
            out[f.name] = v
        return out


def config_or_default(config: object) -> BenchmarkConfig:
    """``config`` as the run's options: a :class:`BenchmarkConfig` itself, ``None`` the defaults.

    Raises:
        TypeError: anything else, naming what it is; a mapping (``config={"max_depth": 0}``) is
            told the two ways its fields are given, ``BenchmarkConfig(**...)`` or keywords.
    """
    if config is None:
        return BenchmarkConfig()
    if isinstance(config, BenchmarkConfig):
        return config
    shown = repr(config) if len(repr(config)) <= 80 else repr(config)[:77] + "..."
    how = (
        "pass config=BenchmarkConfig(**options) or the options themselves as keywords"
        if isinstance(config, Mapping)
        else "pass a BenchmarkConfig or None"
    )
    raise TypeError(f"config={shown}: expected a BenchmarkConfig, got {type(config).__name__}; {how}")


_PEAK_KEYS = {
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float64: "fp64",
    torch.float8_e4m3fn: "fp8",
    torch.float8_e5m2: "fp8",
}
_NAME_KEYS = {
    "float32": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float64": "fp64",
    "double": "fp64",
}


def resolve_dtype(value: str | torch.dtype) -> tuple[torch.dtype, str]:
    """``(torch dtype, peak key)``; the key tells tf32 from plain fp32.

    A dtype with a peak key gets it (``torch.float64`` -> ``"fp64"``); any other
    gets its full torch name (``torch.int8`` -> ``"torch.int8"``), which
    :func:`cb_callback._hardware.peaks.resolve_peaks` takes as "no FLOP peak known".
    """
    if isinstance(value, torch.dtype):
        return value, _PEAK_KEYS.get(value, str(value))
    return _DTYPES[value], _NAME_KEYS.get(value, value)
