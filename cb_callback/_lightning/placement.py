"""Where the callback profiles and writes: directory, ranks, device, time bound (DDP).

Plain values in (paths, ranks, world size), so the policy is testable without a
Trainer; the callback reads them off the Trainer.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch

from cb_callback._hardware.devices import device_problem

__all__ = [
    "OUTPUT_SUBDIR",
    "RANKS",
    "check_pause_device",
    "check_writable",
    "output_dir",
    "profiles_on_rank",
    "time_bound_s",
]

#: The default output directory's name, under the Trainer's log (or root) directory.
OUTPUT_SUBDIR = "component_benchmark"

#: ``"zero"``: global rank 0 profiles; ``"all"``: every rank does.
RANKS = ("zero", "all")

# A collective timeout we cannot read: torch.distributed's default.
_DEFAULT_COLLECTIVE_TIMEOUT_S = 1800.0


def output_dir(explicit: str | None, log_dir: Callable[[], str], ranks: str, world_size: int, global_rank: int) -> Path:
    """The directory this process writes to.

    Args:
        explicit: the user's ``output_dir``, ``None`` for the default.
        log_dir: gives the Trainer's log directory (asked only for the default).
        ranks: the ``ranks`` policy.
        world_size: the number of processes.
        global_rank: this process's rank.

    Returns:
        ``explicit``, else ``<log_dir>/component_benchmark``; with ``rank_<global_rank>``
        under it when every rank of several profiles.
    """
    out = Path(explicit) if explicit is not None else Path(log_dir()) / OUTPUT_SUBDIR
    return out / f"rank_{global_rank}" if ranks == "all" and world_size > 1 else out


def profiles_on_rank(ranks: str, global_rank: int) -> bool:
    """Whether the process of ``global_rank`` profiles under the ``ranks`` policy."""
    return ranks == "all" or global_rank == 0


def time_bound_s(max_total_time_s: float | None, world_size: int, collective_timeout: timedelta | None) -> float | None:
    """The profile's time budget when the user gave none, so waiting ranks cannot time out.

    Args:
        max_total_time_s: the user's budget (``None``: none).
        world_size: the number of processes.
        collective_timeout: the strategy's collective timeout, ``None`` if unknown
            (then torch.distributed's default, 30 minutes).

    Returns:
        Half the collective timeout with several processes and no budget; else
        ``None`` (keep the user's budget).
    """
    if max_total_time_s is not None or world_size <= 1:
        return None
    seconds = _DEFAULT_COLLECTIVE_TIMEOUT_S if collective_timeout is None else collective_timeout.total_seconds()
    return seconds / 2


def check_writable(out: Path, *, fork: bool) -> bool:
    """Whether files can be written in ``out`` (created if missing); if not, one warning with the fix."""
    probe = out / ".cb_write_test"
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        extra = " fork mode keeps its snapshot in a temporary directory instead;" if fork else ""
        warnings.warn(
            f"cb_callback: output_dir {out} is not writable ({e}); the report files will not be written "
            f"there;{extra} the report is still kept in ComponentBenchmark.report and logged to "
            "TensorBoard if there is a TensorBoardLogger. Pass output_dir= a writable directory.",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    return True


def check_pause_device(device: str | torch.device | None) -> None:
    """Refuse a pause-mode ``device=`` this machine does not have (``None``: nothing to check).

    Any available device is fine: the engine profiles a copy of the module there.

    Raises:
        ValueError: ``device`` is one this machine lacks
            (:func:`cb_callback._hardware.devices.device_problem`), with the fix.
    """
    problem = None if device is None else device_problem(device)
    if problem is not None:
        raise ValueError(
            f"ComponentBenchmark(device={str(device)!r}): {problem}; drop device= to profile where the "
            "module lives, or replay the fork-mode snapshot on a machine that has it with `cb replay`"
        )
