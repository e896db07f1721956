"""``compare_components``: is a re-authored component numerically the same, and is it faster?"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

import copy
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from cb_callback._engine.capture.inputs import ComponentInputs, to_device
from cb_callback._engine.capture.storage import model_device
from cb_callback._engine.replay.isolate import Replay, ReplayInputs, flatten_output
from cb_callback._engine.replay.state import StateGuard, seeded
from cb_callback._engine.run.config import BenchmarkConfig, config_or_default
from cb_callback._engine.run.profile import profile_captured
from cb_callback._report.finite import is_nan, ratio
from cb_callback._report.model import ComponentRow, Report
from cb_callback._types import OptionValue, UserValue
from cb_callback._whatif.tolerances import (
    DEFAULT_TOLERANCES,
    NUMBER_TYPES,
    compare_numbers,
    compare_tensors,
    default_tolerances,
    number_tolerances,
)

__all__ = [
    "DEFAULT_TOLERANCES",
    "Comparison",
    "TensorComparison",
    "check_tolerance",
    "compare_components",
    "default_tolerances",
]

#: The Python numbers an output leaf may be (compared like 0-d tensors).
Number = bool | int | float | complex

#: The metrics shown side by side (columns of :class:`ComponentRow`).
_METRICS = (
    "status", "fwd_ms", "bwd_ms", "total_ms", "fwd_flops", "bwd_flops", "bytes", "tflops", "mfu",
    "gbps", "bw_util", "intensity", "bound", "peak_mem_mb", "noise", "compiled_ms", "compile_speedup",
)  # fmt: skip


@dataclass
class TensorComparison:
    """One compared tensor: an output leaf or a gradient.

    Attributes:
        name: ``output[i]`` (the ``i``-th leaf of the output pytree: a tensor, or
            a Python number such as ``x.sum().item()``), ``grad[input i]``
            (w.r.t. the ``i``-th input that requires grad) or
            ``grad[<parameter name>]``.
        shape_ref: the reference's shape (``()`` for a number; ``None``: the
            reference has no such tensor).
        shape_cand: the candidate's shape (``None``: the candidate has none).
        dtype_ref: the reference's dtype, as a string (``float32``); for a
            number leaf its Python type (``float``, ``int``, ``bool``, ``complex``).
        dtype_cand: the candidate's dtype, or a number leaf's Python type.
        max_abs: ``max |cand - ref|`` (:func:`cb_callback._whatif.tolerances.compare_tensors`:
            floats in float64; integers exactly, rounded once to a float); 0 for
            equal elements (infinities of the same sign, NaN against NaN), ``inf``
            where one side is infinite or NaN and the other differs; NaN when not
            comparable.
        max_rel: ``max |cand - ref| / |ref|`` (0 where both are equal, inf where
            only ``ref`` is 0 or the difference is inf); NaN when not comparable.
        rtol: the relative tolerance applied.
        atol: the absolute tolerance applied.
        ok: every element close (``|cand - ref| <= atol + rtol * |ref|`` with
            both finite, or equal values: same-sign infinities, NaN with NaN;
            an infinity or NaN against anything else is never close), with
            equal shapes and dtypes (number leaves: equal Python types).
        mismatch: why the tensors could not be compared or cannot be ok (shape,
            dtype or type, missing), or ``None``.
    """

    name: str
    shape_ref: tuple[int, ...] | None
    shape_cand: tuple[int, ...] | None
    dtype_ref: str | None
    dtype_cand: str | None
    max_abs: float
    max_rel: float
    rtol: float
    atol: float
    ok: bool
    mismatch: str | None = None


@dataclass
class Comparison:
    """The result of :func:`compare_components`.

    Attributes:
        tensors: every compared output leaf and gradient, outputs first.
        rows: the reference's and the candidate's :class:`ComponentRow`, measured
            by the engine in one run (interleaved timing rounds, the same peaks);
            their ``path`` is ``"reference"`` / ``"candidate"``.
        report: that run's report (metadata: device, dtype, peaks).
        state_loaded: candidate ``state_dict`` keys loaded from the reference.
        state_missing: candidate keys the reference has no tensor of that name
            and shape for (the candidate keeps its own values).
        state_unused: reference keys the candidate did not take.
        not_compared: parameters whose gradient was not compared, with why (only
            one module has it, or it does not require grad on one side).
        notes: other facts (no backward, ``load_state`` used).
    """

    tensors: list[TensorComparison]
    rows: tuple[ComponentRow, ComponentRow]
    report: Report
    state_loaded: list[str] = field(default_factory=list)
    state_missing: list[str] = field(default_factory=list)
    state_unused: list[str] = field(default_factory=list)
    not_compared: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def equivalent(self) -> bool:
        """At least one tensor was compared, every one is allclose, none is missing or mismatched."""
        return bool(self.tensors) and all(t.ok for t in self.tensors)

    @property
    def failing(self) -> list[TensorComparison]:
        """The tensors that are not ok, mismatches first, then by ``max_rel``, largest first."""
        bad = [t for t in self.tensors if not t.ok]
        return sorted(bad, key=lambda t: (t.mismatch is None, -_nan_low(t.max_rel), -_nan_low(t.max_abs)))

    def tensor(self, name: str) -> TensorComparison:
        """The comparison of the tensor ``name`` (``"output[0]"``, ``"grad[weight]"``).

        Raises:
            KeyError: no tensor of that name was compared.
        """
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(f"no compared tensor {name!r}; compared: {[t.name for t in self.tensors]}")

    def to_dataframe(self) -> pd.DataFrame:
        """One row per compared tensor: name, shape_ref, shape_cand, max_abs, max_rel, rtol, atol, ok,
        then dtype_ref, dtype_cand, mismatch."""
        cols = ["name", "shape_ref", "shape_cand", "max_abs", "max_rel", "rtol", "atol", "ok",
                "dtype_ref", "dtype_cand", "mismatch"]  # fmt: skip
        import pandas as pd  # only here: importing cb_callback does not import pandas

        return pd.DataFrame([{c: getattr(t, c) for c in cols} for t in self.tensors], columns=cols)

    def summary(self) -> str:
        """Printable: the verdict, the failing tensors first, the others, then the metrics side by side."""
        n_bad = len(self.failing)
        if self.equivalent:
            lines = [f"equivalent: all {len(self.tensors)} compared tensors are allclose"]
        elif not self.tensors:
            lines = ["NOT equivalent: no tensor was compared"]
        else:
            lines = [f"NOT equivalent: {n_bad} of {len(self.tensors)} compared tensors differ"]
        failing = self.failing
        rest = [t for t in self.tensors if t.ok]
        header = ["tensor", "shape ref", "shape cand", "max_abs", "max_rel", "rtol", "atol", "ok"]
        cells = [_tensor_cells(t) for t in [*failing, *rest]]
        if cells:
            lines += ["", *_aligned(header, cells)]
        for t in failing:
            if t.mismatch:
                lines.append(f"  {t.name}: {t.mismatch}")
        if self.not_compared:
            lines.append("not compared: " + ", ".join(f"{k} ({v})" for k, v in self.not_compared.items()))
        if self.state_loaded or self.state_missing or self.state_unused:
            lines.append(
                f"state: {len(self.state_loaded)} key(s) loaded from the reference"
                + (f"; candidate keys not loaded: {', '.join(self.state_missing)}" if self.state_missing else "")
                + (f"; reference keys unused: {', '.join(self.state_unused)}" if self.state_unused else "")
            )
        lines += [f"note: {n}" for n in self.notes]
        ref, cand = self.rows
        metric_cells = [
            [m, _metric(getattr(ref, m)), _metric(getattr(cand, m)), _ratio(getattr(ref, m), getattr(cand, m))]
            for m in _METRICS
        ]
        lines += ["", *_aligned(["metric", "reference", "candidate", "cand/ref"], metric_cells)]
        for row in self.rows:
            if row.error:
                lines.append(f"{row.path}: {row.error}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def _nan_low(x: float) -> float:
    return x if not math.isnan(x) else -math.inf


def _num(x: float) -> str:
    return f"{x:.3g}" if math.isfinite(x) else ("inf" if x == math.inf else "-")


def _tensor_cells(t: TensorComparison) -> list[str]:
    def shape(s: tuple[int, ...] | None) -> str:
        return "-" if s is None else str(s)

    return [t.name, shape(t.shape_ref), shape(t.shape_cand), _num(t.max_abs), _num(t.max_rel),
            f"{t.rtol:g}", f"{t.atol:g}", "ok" if t.ok else "FAIL"]  # fmt: skip


def _metric(v: object) -> str:
    if isinstance(v, float):
        return _num(v) if not (math.isfinite(v) and abs(v) >= 1e4) else f"{v:.4g}"
    return "-" if v is None else str(v)


def _ratio(a: object, b: object) -> str:
    """The ``cand/ref`` cell: ``b / a`` to 3 significant figures, empty where undefined (:func:`ratio`)."""
    r = ratio(b, a)
    return "" if is_nan(r) else f"{r:.3g}"


def _aligned(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    out = ["  ".join(c.ljust(w) for c, w in zip(header, widths, strict=True)).rstrip()]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return out


def _compare(
    name: str, ref: torch.Tensor | None, cand: torch.Tensor | None, rtol: float | None, atol: float | None
) -> TensorComparison:
    """Compare two tensors (either may be missing) by :func:`compare_tensors`, naming a shape or dtype mismatch."""
    dtype = ref.dtype if ref is not None else (cand.dtype if cand is not None else torch.float32)
    d_rtol, d_atol = default_tolerances(dtype)
    r_tol = d_rtol if rtol is None else rtol
    a_tol = d_atol if atol is None else atol
    nan = math.nan
    out = TensorComparison(
        name,
        None if ref is None else tuple(ref.shape),
        None if cand is None else tuple(cand.shape),
        None if ref is None else str(ref.dtype).removeprefix("torch."),
        None if cand is None else str(cand.dtype).removeprefix("torch."),
        nan, nan, r_tol, a_tol, False,
    )  # fmt: skip
    if ref is None or cand is None:
        out.mismatch = "only in the " + ("candidate" if ref is None else "reference")
        return out
    if ref.shape != cand.shape:
        out.mismatch = f"shape differs: reference {tuple(ref.shape)}, candidate {tuple(cand.shape)}"
        return out
    got = compare_tensors(ref, cand, r_tol, a_tol)
    out.max_abs, out.max_rel = got.max_abs, got.max_rel
    if ref.dtype != cand.dtype:
        exact = not (ref.is_floating_point() or ref.is_complex() or cand.is_floating_point() or cand.is_complex())
        how = "exactly, as integers" if exact else "in float64"
        out.mismatch = f"dtype differs: reference {out.dtype_ref}, candidate {out.dtype_cand} (values compared {how})"
        return out
    out.ok = got.close
    return out


def _compare_numbers(name: str, ref: Number, cand: Number, rtol: float | None, atol: float | None) -> TensorComparison:
    """Two Python-number output leaves (``x.sum().item()``), like two 0-d tensors.

    Tolerances: the user's, else :func:`number_tolerances` of the reference (a
    float: fp32's; an int or bool: exact). Their types must agree (an int
    against a float is a mismatch, as a dtype mismatch of tensors is).
    """
    d_rtol, d_atol = number_tolerances(ref)
    r_tol = d_rtol if rtol is None else rtol
    a_tol = d_atol if atol is None else atol
    got = compare_numbers(ref, cand, r_tol, a_tol)
    t_ref, t_cand = type(ref).__name__, type(cand).__name__
    out = TensorComparison(name, (), (), t_ref, t_cand, got.max_abs, got.max_rel, r_tol, a_tol, got.close)
    if type(ref) is not type(cand):
        out.ok = False
        out.mismatch = f"type differs: reference {t_ref}, candidate {t_cand} (values compared)"
    return out


def _load_state(reference: nn.Module, candidate: nn.Module) -> tuple[list[str], list[str], list[str]]:
    """Load the reference's tensors into the candidate where name and shape match (``strict=False``).

    Returns:
        ``(loaded, missing, unused)``: candidate keys loaded, candidate keys not
        loaded, reference keys the candidate did not take.
    """
    ref_state = reference.state_dict()
    cand_state = candidate.state_dict()
    take = {
        k: v for k, v in ref_state.items()
        if k in cand_state and isinstance(v, torch.Tensor) and tuple(v.shape) == tuple(cand_state[k].shape)
    }  # fmt: skip
    if take:
        candidate.load_state_dict(take, strict=False)
    loaded = [k for k in cand_state if k in take]
    missing = [k for k in cand_state if k not in take]
    unused = [k for k in ref_state if k not in take]
    return loaded, missing, unused


@dataclass
class _Run:
    outputs: list[UserValue]
    spec: object  # the output's structure, compared with ==
    input_grads: list[torch.Tensor]
    param_grads: dict[str, torch.Tensor]


def _grad_outputs(outputs: list[Any], seed: int) -> list[torch.Tensor | None]:
    """Seeded standard-normal output gradients, one per floating output leaf (else ``None``)."""
    gen: dict[torch.device, torch.Generator] = {}
    out: list[torch.Tensor | None] = []
    for t in outputs:
        if not isinstance(t, torch.Tensor) or not (t.is_floating_point() or t.is_complex()):
            out.append(None)
            continue
        if t.device not in gen:
            gen[t.device] = torch.Generator(device=t.device)
            gen[t.device].manual_seed(seed)
        out.append(torch.randn(t.shape, generator=gen[t.device], device=t.device, dtype=t.dtype))
    return out


def _run(
    module: nn.Module,
    inputs: ComponentInputs,
    device: torch.device,
    seed: int,
    backward: bool,
    params: Sequence[str],
    grad_outputs: list[torch.Tensor | None] | None,
    forward_context: Callable[[], AbstractContextManager[Any]] | None,
) -> tuple[_Run, list[torch.Tensor | None]]:
    """One seeded forward (and backward) of ``module`` on a fresh copy of ``inputs``.

    ``grad_outputs`` (``None``: drawn here, seeded) weight the output leaves; the
    gradients are w.r.t. the inputs that require grad and the named ``params``.
    """
    grad = backward and inputs.grad_enabled
    replay = Replay(module, inputs, device=device, seed=seed, forward_context=forward_context, grad_enabled=grad)
    fresh: ReplayInputs = replay.fresh_inputs()
    named = dict(module.named_parameters())
    with StateGuard(module), seeded(seed, device):
        out = replay.forward(fresh)
        leaves, spec = flatten_output(out)
        if grad_outputs is None:
            grad_outputs = _grad_outputs(leaves, seed)
        targets = [*fresh.leaves, *(named[n] for n in params)]
        pairs = [
            (t, g) for t, g in zip(leaves, grad_outputs, strict=False)
            if isinstance(t, torch.Tensor) and g is not None and t.requires_grad and t.shape == g.shape
        ]  # fmt: skip
        grads: list[torch.Tensor] = []
        if grad and targets:
            if pairs:
                found = torch.autograd.grad(
                    [t for t, _ in pairs], targets, [g for _, g in pairs], allow_unused=True, materialize_grads=True
                )
                grads = [g.detach() for g in found]
            else:  # nothing of the output depends on anything: every gradient is zero
                grads = [torch.zeros_like(t) for t in targets]
        leaves = [x.detach() if isinstance(x, torch.Tensor) else x for x in leaves]
    n = len(fresh.leaves)
    run = _Run(leaves, spec, grads[:n], dict(zip(params, grads[n:], strict=True)) if grads else {})
    return run, grad_outputs


class _Pair(nn.Module):
    """Both modules as children of one root, so that the engine measures them in one run."""

    def __init__(self, reference: nn.Module, candidate: nn.Module) -> None:
        super().__init__()
        self.reference = reference
        self.candidate = candidate


def _as_inputs(inputs: ComponentInputs | tuple[Any, Any], reference: nn.Module) -> ComponentInputs:
    if isinstance(inputs, ComponentInputs):
        if inputs.capture_error is not None:
            raise ValueError(f"inputs cannot be replayed: {inputs.capture_error}")
        return inputs
    if isinstance(inputs, tuple) and len(inputs) == 2 and isinstance(inputs[1], Mapping):
        args, kwargs = inputs
        args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
        return ComponentInputs(args=args, kwargs=dict(kwargs), training=reference.training)
    raise ValueError(
        f"inputs={type(inputs).__name__!r}: expected a ComponentInputs (a snapshot's calls[path]) or an "
        "(args, kwargs) tuple"
    )


def compare_components(
    reference: nn.Module,
    candidate: nn.Module,
    inputs: ComponentInputs | tuple[Any, Any],
    *,
    rtol: float | None = None,
    atol: float | None = None,
    backward: bool = True,
    load_state: Callable[[nn.Module, nn.Module], Any] | None = None,
    forward_context: Callable[[], AbstractContextManager[Any]] | None = None,
    config: BenchmarkConfig | None = None,
    **options: OptionValue,
) -> Comparison:
    """Check that ``candidate`` computes what ``reference`` does on one captured call, and time both.

    Both modules run on fresh copies of the same inputs, with the same RNG seed
    (``seed`` option) set before each forward, so dropout-like randomness
    matches when both draw the same numbers in the same order. The backward
    weights every floating output leaf with the same seeded standard-normal
    gradient and differentiates w.r.t. the inputs that require grad and the
    parameters both modules have under the same name.

    Args:
        reference: the component as it is.
        candidate: the re-authored component. It is deep-copied first: the
            reference's state is loaded into the copy (the caller's candidate is
            not changed).
        inputs: one captured call: a :class:`ComponentInputs` (a snapshot's
            ``calls[path]``) or ``(args, kwargs)`` (the tensors that require grad
            are the inputs differentiated against; ``training`` is the
            reference's flag).
        rtol: relative tolerance for every tensor and Python-number output
            leaf; ``None``: by the reference tensor's dtype
            (:data:`DEFAULT_TOLERANCES`, those of
            :func:`torch.testing.assert_close`: fp32 1.3e-6, fp16 1e-3, bf16
            1.6e-2, fp64 1e-7; integers and bools 0, compared exactly in
            64-bit integers), a ``float`` leaf fp32's, an ``int``/``bool`` leaf 0.
        atol: absolute tolerance; ``None``: by dtype (fp32/fp16/bf16 1e-5,
            fp64 1e-7; integers 0), a ``float`` leaf 1e-5, an ``int``/``bool`` 0.
        backward: also compare gradients and measure the backward.
        load_state: ``load_state(reference, candidate_copy)`` instead of loading
            the reference's ``state_dict`` where names and shapes match.
        forward_context: a context entered around each forward (autocast for a
            mixed-precision snapshot), in the comparison and the timed runs.
        config: a :class:`BenchmarkConfig`; ``options`` override its fields.
        **options: :class:`BenchmarkConfig` fields (``device``, ``seed``,
            ``min_run_time_s`` …). ``max_depth``, ``include`` and ``exclude`` are
            set by the comparison.

    Returns:
        A :class:`Comparison`: ``equivalent``, the tensors compared
        (``to_dataframe()``), the two engine rows side by side (``summary()``).

    Raises:
        ValueError: ``inputs`` of another kind or with a capture error, an invalid option, or
            a tolerance not a finite number >= 0 (``rtol=inf`` calls any candidate equivalent).

    Notes:
        Closeness is :func:`torch.isclose`'s with ``equal_nan=True``
        (:func:`cb_callback._whatif.tolerances.compare_tensors`): infinities of the
        same sign are equal, NaN against NaN at the same position is equal, an
        infinity or NaN against anything else is never close.
        Equivalence is shown on these inputs, this device and dtype only: other
        inputs (other shapes, values that hit another branch), other devices or
        kernels (cuBLAS vs CPU, TF32) and ``torch.compile`` may differ; a
        tolerance cannot tell an acceptable reassociation from a small bug. Buffers
        (BatchNorm statistics) are compared only through the outputs, and in-place
        changes of the inputs are not compared. Randomness matches only if both
        modules consume the RNG identically. Timings are the engine's isolated
        replays of each module (interleaved rounds, one calibration of the peaks):
        they cannot see fusion with the neighbours in the real model, which is
        often why a component is re-authored.
    """
    check_tolerance("rtol", rtol)
    check_tolerance("atol", atol)
    cfg = _checked_config(reference, candidate, config, options, backward)
    sides = _place(reference, candidate, _as_inputs(inputs, reference), cfg, load_state)
    tensors, not_compared = _compare_numerics(sides, cfg, backward, rtol, atol, forward_context)
    report = _time_both(sides, cfg, forward_context)
    return sides.comparison(tensors, report, not_compared)


def check_tolerance(name: str, value: object) -> None:
    """Refuse a tolerance that is not ``None`` or a finite number >= 0 (``inf`` accepts any candidate, a
    negative or NaN one none), naming it (``rtol=inf is invalid: ...``).

    Raises:
        ValueError: naming ``name`` and the value.
    """
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}={value!r} is invalid: expected a finite number >= 0 (or None: by dtype)")


def _checked_config(
    reference: nn.Module,
    candidate: nn.Module,
    config: BenchmarkConfig | None,
    options: dict[str, Any],
    backward: bool,
) -> BenchmarkConfig:
    """The comparison's config (``config`` with ``options`` and ``backward``), after checking both are modules.

    Raises:
        ValueError: an invalid option, or ``reference`` or ``candidate`` not an ``nn.Module``.
    """
    base = config_or_default(config)
    cfg = base.replace(**options) if options else base
    cfg = cfg.replace(backward=backward)
    if not isinstance(reference, nn.Module) or not isinstance(candidate, nn.Module):
        raise ValueError("reference and candidate must be nn.Modules")
    return cfg


@dataclass
class _Sides:
    """Both modules on the comparison's device and the captured call moved there.

    Attributes:
        reference: the reference (a copy when it had to move to ``device``).
        candidate: the copy of the candidate, holding the reference's state.
        captured: the captured call, its arguments on ``device``.
        device: where both run.
        loaded: candidate keys loaded from the reference (empty with ``load_state``).
        missing: candidate keys not loaded.
        unused: reference keys the candidate did not take.
        notes: lines for the comparison's summary, appended to by later steps.
    """

    reference: nn.Module
    candidate: nn.Module
    captured: ComponentInputs
    device: torch.device
    loaded: list[str]
    missing: list[str]
    unused: list[str]
    notes: list[str]

    def comparison(self, tensors: list[TensorComparison], report: Report, not_compared: dict[str, str]) -> Comparison:
        """The :class:`Comparison` of these sides: the compared ``tensors`` and both rows of ``report``."""
        rows = (report.row("reference"), report.row("candidate"))
        return Comparison(tensors, rows, report, self.loaded, self.missing, self.unused, not_compared, self.notes)


def _place(
    reference: nn.Module,
    candidate: nn.Module,
    captured: ComponentInputs,
    cfg: BenchmarkConfig,
    load_state: Callable[[nn.Module, nn.Module], Any] | None,
) -> _Sides:
    """Move the reference (a copy) to the config's device, copy the candidate there, load its state, move the inputs."""
    device = torch.device(cfg.device) if cfg.device is not None else model_device(reference)
    if model_device(reference) != device:
        reference = copy.deepcopy(reference).to(device)
    cand = copy.deepcopy(candidate).to(device)
    notes: list[str] = []
    loaded: list[str] = []
    missing: list[str] = []
    unused: list[str] = []
    if load_state is not None:
        load_state(reference, cand)
        notes.append("state loaded by load_state")
    else:
        loaded, missing, unused = _load_state(reference, cand)
    args, kwargs = to_device((captured.args, captured.kwargs), device)
    captured = dataclasses.replace(captured, args=tuple(args), kwargs=dict(kwargs))
    return _Sides(reference, cand, captured, device, loaded, missing, unused, notes)


def _compare_numerics(
    sides: _Sides,
    cfg: BenchmarkConfig,
    backward: bool,
    rtol: float | None,
    atol: float | None,
    forward_context: Callable[[], AbstractContextManager[Any]] | None,
) -> tuple[list[TensorComparison], dict[str, str]]:
    """Run both sides seeded and compare their outputs, then (when the call ran with grad) their gradients.

    Returns:
        ``(tensors, not_compared)``: the compared tensors, and the parameters whose
        gradients are not compared with why (:func:`_shared_parameters`). A call
        captured without grad adds a note to ``sides.notes``.
    """
    params, not_compared = _shared_parameters(sides.reference, sides.candidate, backward)
    captured, device = sides.captured, sides.device
    # Shapes that differ are compared as a mismatch: gradients w.r.t. each side's own parameter.
    ref_run, gouts = _run(sides.reference, captured, device, cfg.seed, backward, params, None, forward_context)
    cand_run, _ = _run(sides.candidate, captured, device, cfg.seed, backward, params, gouts, forward_context)

    tensors = _compare_outputs(ref_run, cand_run, rtol, atol)
    grad_ran = backward and captured.grad_enabled
    if grad_ran:
        for i, (g_ref, g_cand) in enumerate(zip(ref_run.input_grads, cand_run.input_grads, strict=True)):
            tensors.append(_compare(f"grad[input {i}]", g_ref, g_cand, rtol, atol))
        for n in params:
            tensors.append(_compare(f"grad[{n}]", ref_run.param_grads[n], cand_run.param_grads[n], rtol, atol))
    elif backward:
        sides.notes.append("the captured call ran without grad (no_grad): outputs compared only")
    return tensors, not_compared


def _time_both(
    sides: _Sides, cfg: BenchmarkConfig, forward_context: Callable[[], AbstractContextManager[Any]] | None
) -> Report:
    """Time both sides in one engine run (children of one root, on the same captured call)."""
    return profile_captured(
        _Pair(sides.reference, sides.candidate),
        {"reference": sides.captured, "candidate": sides.captured},
        config=cfg.replace(max_depth=1, include=(), exclude=()),
        forward_context=forward_context,
    )


def _shared_parameters(reference: nn.Module, candidate: nn.Module, backward: bool) -> tuple[list[str], dict[str, str]]:
    """The parameters whose gradients are compared (both sides have them under one name, both
    requiring grad), and why each other one is not (only with ``backward``)."""
    ref_params = {n: p for n, p in reference.named_parameters() if p.requires_grad}
    cand_params = {n: p for n, p in candidate.named_parameters() if p.requires_grad}
    all_ref = dict(reference.named_parameters())
    all_cand = dict(candidate.named_parameters())
    params = [n for n in ref_params if n in cand_params]
    not_compared: dict[str, str] = {}
    if backward:
        for n in [*ref_params, *(k for k in cand_params if k not in ref_params)]:
            if n in params:
                continue
            if n in ref_params and n not in all_cand:
                not_compared[n] = "only in the reference"
            elif n in cand_params and n not in all_ref:
                not_compared[n] = "only in the candidate"
            else:
                not_compared[n] = "requires grad on one side only"
    return params, not_compared


def _kind(x: object) -> str:
    return f"a {str(x.dtype).removeprefix('torch.')} tensor" if isinstance(x, torch.Tensor) else f"a {type(x).__name__}"


def _compare_outputs(ref: _Run, cand: _Run, rtol: float | None, atol: float | None) -> list[TensorComparison]:
    """Output leaves pairwise, by index among the pytree's leaves (``output[i]``)."""
    out: list[TensorComparison] = []
    n = max(len(ref.outputs), len(cand.outputs))
    structure = ref.spec == cand.spec
    for i in range(n):
        r = ref.outputs[i] if i < len(ref.outputs) else None
        c = cand.outputs[i] if i < len(cand.outputs) else None
        both = i < len(ref.outputs) and i < len(cand.outputs)
        if both and isinstance(r, NUMBER_TYPES) and isinstance(c, NUMBER_TYPES):
            t = _compare_numbers(f"output[{i}]", r, c, rtol, atol)
        elif both and isinstance(r, torch.Tensor) != isinstance(c, torch.Tensor):
            why = f"type differs: reference {_kind(r)}, candidate {_kind(c)}"
            nan = math.nan
            t = TensorComparison(f"output[{i}]", None, None, None, None, nan, nan, 0.0, 0.0, False, why)
        elif both and not isinstance(r, torch.Tensor) and not isinstance(c, torch.Tensor):
            if r != c:  # another non-tensor leaf (a string, None): must be equal
                why = f"non-tensor output differs: reference {r!r}, candidate {c!r}"
                nan = math.nan
                out.append(TensorComparison(f"output[{i}]", None, None, None, None, nan, nan, 0.0, 0.0, False, why))
            continue
        else:
            t = _compare(
                f"output[{i}]",
                r if isinstance(r, torch.Tensor) else None,
                c if isinstance(c, torch.Tensor) else None,
                rtol,
                atol,
            )
        if t.mismatch is None and not structure:
            t.ok = False
            t.mismatch = "the output structures differ (containers or keys)"
        out.append(t)
    return out
