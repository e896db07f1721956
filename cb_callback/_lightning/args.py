"""Validation of ``ComponentBenchmark``'s own arguments (the engine's are ``BenchmarkConfig``'s).

Each bad value raises a ``ValueError`` that names the argument and what it
expects, when the callback is built (before any training).
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
import os
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from cb_callback._engine.run.config import BenchmarkConfig
from cb_callback._lightning.placement import RANKS

__all__ = [
    "DISABLE_ENV",
    "ENGINE_OPTIONS",
    "FLAGS",
    "MODES",
    "active",
    "check_callback_args",
    "disabled_by_env",
    "state_key_fields",
    "with_engine_options",
]

#: Environment variable that disables every ``ComponentBenchmark`` when set to a true value.
DISABLE_ENV = "CB_DISABLE"

#: ``"pause"``: profile in-process; ``"fork"``: in a spawned child.
MODES = ("pause", "fork")

#: The callback's boolean arguments.
FLAGS = ("log_to_tensorboard", "stop_after", "enabled")

#: The engine's options the callback takes as arguments (all but what it owns).
ENGINE_OPTIONS = frozenset(f.name for f in dataclasses.fields(BenchmarkConfig)) - {"progress", "output_dir"}


def disabled_by_env() -> bool:
    """Whether ``CB_DISABLE`` is set to a true value (anything but empty, ``0``, ``false``, ``no``, ``off``)."""
    return os.environ.get(DISABLE_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def active(enabled: bool, log: Callable[[str], Any]) -> bool:
    """Whether the callback profiles: ``enabled`` and not disabled by ``CB_DISABLE`` (then ``log`` says so)."""
    if enabled and disabled_by_env():
        log(f"cb_callback: ComponentBenchmark is disabled by {DISABLE_ENV}=1")
    return enabled and not disabled_by_env()


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_schedule(args: Mapping[str, Any]) -> None:
    """``capture_every`` (an integer >= ``capture_batches``) or ``capture_steps`` (integers >= 0), not both;
    ``stop_after`` needs a schedule with an end."""
    every, steps, batches = args.get("capture_every"), args.get("capture_steps"), args["capture_batches"]
    if every is not None and steps is not None:
        raise ValueError("ComponentBenchmark: pass capture_every or capture_steps, not both")
    if every is not None and (not _is_int(every) or every < batches):  # capture_batches is checked already
        raise ValueError(
            f"ComponentBenchmark(capture_every={every!r}): expected an integer >= capture_batches ({batches!r}), "
            "so that one capture's steps end before the next one's begin"
        )
    if steps is not None and (
        isinstance(steps, (str, bytes)) or not hasattr(steps, "__iter__") or not list(steps)
        or not all(_is_int(x) and x >= 0 for x in steps)
    ):  # fmt: skip
        raise ValueError(f"ComponentBenchmark(capture_steps={steps!r}): expected a non-empty list of integers >= 0")
    if every is not None and args["stop_after"]:
        raise ValueError(
            "ComponentBenchmark(stop_after=True, capture_every=...): capture_every has no last capture to stop "
            "after; give capture_steps=[...] instead"
        )


def with_engine_options(init: Callable[..., None]) -> inspect.Signature:
    """``init``'s signature with its ``**options`` replaced by every engine option, derived from the dataclass.

    The callback declares only its own arguments; each :data:`ENGINE_OPTIONS` field of
    :class:`BenchmarkConfig` becomes a keyword-only parameter after them, with the
    field's resolved type and default, in the dataclass's order. ``help()``,
    ``inspect.signature`` and LightningCLI (jsonargparse reads ``__signature__``) see
    them all; annotations are resolved (not strings) so that a parser needs no
    namespace.
    """
    own = inspect.signature(init)
    hints = typing.get_type_hints(init)
    params = [
        p.replace(annotation=hints.get(p.name, p.annotation))
        for p in own.parameters.values()
        if p.kind is not inspect.Parameter.VAR_KEYWORD
    ]
    taken = {p.name for p in params}
    engine_hints, defaults = typing.get_type_hints(BenchmarkConfig), BenchmarkConfig()
    params += [
        inspect.Parameter(
            f.name, inspect.Parameter.KEYWORD_ONLY, default=getattr(defaults, f.name), annotation=engine_hints[f.name]
        )
        for f in dataclasses.fields(BenchmarkConfig)
        if f.name in ENGINE_OPTIONS and f.name not in taken
    ]
    return own.replace(parameters=params, return_annotation=hints.get("return", own.return_annotation))


def state_key_fields(
    capture_step: int,
    mode: str,
    ranks: str,
    config: BenchmarkConfig,
    output_dir: str | None,
    capture_every: int | None,
    capture_steps: Sequence[int] | None,
) -> dict[str, Any]:
    """What tells two callbacks' checkpointed states apart (``Callback._generate_state_key``'s fields).

    ``capture_every`` and ``capture_steps`` enter only when given: without them the
    key is that of a checkpoint written before they existed.
    """
    when = {"capture_every": capture_every, "capture_steps": list(capture_steps or []) or None}
    return {
        "capture_step": capture_step, "mode": mode, "ranks": ranks, "max_depth": config.max_depth,
        "include": list(config.include), "exclude": list(config.exclude), "output_dir": output_dir,
        **{k: v for k, v in when.items() if v is not None},
    }  # fmt: skip


def _check_option_names(options: Mapping[str, Any], own: Iterable[str] = ()) -> None:
    """A keyword the callback does not take raises the ``TypeError`` Python would, with the closest names.

    The names offered are the engine's options and the callback's ``own`` arguments
    (``capture_stpe`` is told ``capture_step``).
    """
    names = sorted(set(ENGINE_OPTIONS) | set(own))
    for name in options:
        if name not in ENGINE_OPTIONS:
            close = difflib.get_close_matches(name, names, n=3)
            hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            raise TypeError(f"ComponentBenchmark() got an unexpected keyword argument {name!r}{hint}")


def check_callback_args(args: Mapping[str, Any], options: Mapping[str, Any] | None = None) -> BenchmarkConfig:
    """Check ``ComponentBenchmark``'s arguments; build the engine's options from them.

    Args:
        args: every argument by name (the engine's options among them).
        options: the keywords the callback took as ``**options`` (each must be an
            :data:`ENGINE_OPTIONS` name; they are in ``args`` too).

    Returns:
        The :class:`BenchmarkConfig` of the engine's options.

    Raises:
        TypeError: a keyword in ``options`` that is no engine option (with the closest names).
        ValueError: ``ComponentBenchmark(<name>=<value>): expected ...`` for the
            callback's own arguments, ``ComponentBenchmark: <BenchmarkConfig's message>``
            for the engine's.
    """
    options = options or {}
    _check_option_names(options, own=[n for n in args if n not in ENGINE_OPTIONS and n not in options])
    capture_step, capture_batch_size = args["capture_step"], args["capture_batch_size"]
    fork_timeout_s, output_dir = args["fork_timeout_s"], args["output_dir"]
    if not _is_int(capture_step) or capture_step < 0:
        raise ValueError(f"ComponentBenchmark(capture_step={capture_step!r}): expected an integer >= 0")
    if not _is_int(args["capture_batches"]) or args["capture_batches"] < 1:
        raise ValueError(f"ComponentBenchmark(capture_batches={args['capture_batches']!r}): expected an integer >= 1")
    _check_schedule(args)
    for name, allowed in (("mode", MODES), ("ranks", RANKS)):
        if args[name] not in allowed:
            raise ValueError(f"ComponentBenchmark({name}={args[name]!r}): expected one of {allowed}")
    if capture_batch_size is not None and (not _is_int(capture_batch_size) or capture_batch_size < 1):
        raise ValueError(
            f"ComponentBenchmark(capture_batch_size={capture_batch_size!r}): expected an integer >= 1 or None"
        )
    for name in FLAGS:
        if not isinstance(args[name], bool):
            raise ValueError(f"ComponentBenchmark({name}={args[name]!r}): expected True or False")
    if fork_timeout_s is not None and (
        isinstance(fork_timeout_s, bool)
        or not isinstance(fork_timeout_s, (int, float))
        or not math.isfinite(fork_timeout_s)
        or fork_timeout_s < 0
    ):
        raise ValueError(
            f"ComponentBenchmark(fork_timeout_s={fork_timeout_s!r}): expected a finite number >= 0 or None"
        )
    if output_dir is not None and not isinstance(output_dir, (str, os.PathLike)):
        raise ValueError(f"ComponentBenchmark(output_dir={output_dir!r}): expected a path or None")
    try:
        return BenchmarkConfig(**{name: value for name, value in args.items() if name in ENGINE_OPTIONS})
    except ValueError as e:
        raise ValueError(f"ComponentBenchmark: {e}") from None
