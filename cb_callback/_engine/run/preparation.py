"""One preparation path for every entry point: the device, the plugins, the prepared model, the dtype."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from cb_callback._engine.capture.storage import model_device
from cb_callback._engine.run.config import BenchmarkConfig, resolve_dtype
from cb_callback._engine.run.plugins import (
    Metric,
    PrepareContext,
    Preprocessor,
    load_entry_point_plugins,
    registered_metrics,
    validate_plugin,
)
from cb_callback._hardware.devices import device_problem
from cb_callback._report.context import Reporter

__all__ = ["Prepared", "infer_dtype", "prepare", "resolve_device"]


@dataclass
class Prepared:
    """A model made ready to profile, and what its run needs.

    Attributes:
        model: the model after the user's ``prepare_model`` hooks, on ``device``
            (a deep copy when it had to move; the caller's model stays where it is).
        config: the run's options.
        device: where components are replayed.
        context: what preprocessors get (its ``batch_size`` is the captured one
            once the capture is known: :meth:`with_batch_size`).
        preprocessors: the user's preprocessors (entry points included).
        metrics: the user's metric plugins (entry points included).
        reporters: the reporters the finished report is written by.
        metadata: the report's metadata so far.
    """

    model: nn.Module
    config: BenchmarkConfig
    device: torch.device
    context: PrepareContext
    preprocessors: list[Preprocessor]
    metrics: list[Metric]
    reporters: list[Reporter]
    metadata: dict[str, Any] = field(default_factory=dict)

    def with_batch_size(self, batch_size: int | None) -> Prepared:
        """This preparation, its context holding the captured inputs' ``batch_size``."""
        return dataclasses.replace(self, context=dataclasses.replace(self.context, batch_size=batch_size))


def resolve_device(wanted: str | torch.device | None, model: nn.Module) -> torch.device:
    """The device to replay on: ``wanted`` (checked to exist here), else the model's.

    Raises:
        ValueError: a device this machine lacks (CUDA on a CPU build, a GPU index
            past the visible ones, an unknown device string), with the fix.
    """
    if wanted is None:
        return model_device(model)
    problem = device_problem(wanted)
    if problem is not None:
        raise ValueError(f"device={str(wanted)!r}: {problem}; use device='cpu' or a device this machine has")
    return torch.device(wanted)


def _plugins(cfg: BenchmarkConfig) -> tuple[list[Preprocessor], list[Metric], list[Reporter]]:
    """The user's preprocessors, metric plugins (after the registered ones) and reporters, validated;
    then the entry points'."""
    found = load_entry_point_plugins() if cfg.load_plugins else {"metric": [], "reporter": [], "preprocessor": []}
    pre = [validate_plugin(p, "preprocessor") for p in cfg.preprocessors] + found["preprocessor"]
    mine = [validate_plugin(p, "metric") for p in cfg.metrics]
    names = {p.name for p in mine}  # a plugin passed in metrics= wins over a registered one of its name
    met = [p for p in registered_metrics() if p.name not in names] + mine + found["metric"]
    rep = [validate_plugin(p, "reporter") for p in cfg.reporters] + found["reporter"]
    return pre, met, rep


def prepare(
    model: nn.Module,
    cfg: BenchmarkConfig,
    metadata: dict[str, Any],
    batch_size: int | None,
    *,
    apply: bool = True,
) -> Prepared:
    """Resolve the device and the plugins, run the ``prepare_model`` hooks, move the model.

    Args:
        model: the root of the tree.
        cfg: the run's options.
        metadata: the report's metadata so far (preprocessors may add to it).
        batch_size: the inputs' batch size, as far as known.
        apply: run the preprocessors' ``prepare_model`` (``False``: the model was
            prepared already, e.g. before a capture).

    Raises:
        ValueError: a device this machine lacks, or a plugin that breaks its contract.
    """
    device = resolve_device(cfg.device, model)
    pre, met, rep = _plugins(cfg)
    context = PrepareContext(cfg, device, metadata, batch_size)
    if apply:
        for p in pre:
            model = p.prepare_model(model, context)
    if model_device(model) != device:
        model = copy.deepcopy(model).to(device)
    return Prepared(model, cfg, device, context, pre, met, rep, metadata)


def infer_dtype(
    model: nn.Module,
    device: torch.device,
    cfg: BenchmarkConfig,
    forward_context: Callable[[], AbstractContextManager[object]] | None = None,
) -> str:
    """The peak key MFU is judged by: ``cfg.dtype``; else, for a model whose first floating parameter is
    float32, the autocast the replays run under on ``device``'s type (the caller's, around
    ``profile_components``, or the one ``forward_context`` enters: the step's ``*-mixed`` precision); else
    that parameter's dtype (``fp32`` on CUDA with TF32 matmuls allowed is ``tf32``).

    Autocast casts float32 only: a float64 model under it still computes in float64. What this cannot see: a
    forward that turns autocast off inside itself (its matmuls run in float32 and are judged by the
    autocast dtype's peak: pass ``dtype`` then)."""
    if cfg.dtype is not None:
        return resolve_dtype(cfg.dtype)[1]
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    autocast = _autocast_dtype(device, forward_context) if dtype == torch.float32 else None
    if autocast is not None:
        return resolve_dtype(autocast)[1]
    key = resolve_dtype(dtype)[1]
    if key == "fp32" and device.type == "cuda" and torch.get_float32_matmul_precision() != "highest":
        return "tf32"
    return key


def _autocast_dtype(
    device: torch.device, forward_context: Callable[[], AbstractContextManager[object]] | None
) -> torch.dtype | None:
    """The dtype autocast computes in on ``device``'s type here (inside ``forward_context`` when given), or
    ``None`` where autocast is off."""
    kind = device.type

    def read() -> torch.dtype | None:
        return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None

    if forward_context is None:
        return read()
    with forward_context():
        return read()
