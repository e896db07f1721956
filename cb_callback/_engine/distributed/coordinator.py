"""The coordinator of several ranks: agreement points, broadcasts and gathers on a gloo group of its own.

Every lockstep replay (:mod:`cb_callback._engine.distributed.lockstep`) and every ranked triage
(:mod:`cb_callback._engine.selection.ranked_triage`) agrees through one :class:`Coordinator`,
whose timeout bounds each agreement.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import torch

from cb_callback._engine.distributed.collectives import distributed_world_size
from cb_callback._engine.distributed.ledger import Ledger
from cb_callback._types import RankValue

__all__ = ["DEFAULT_TIMEOUT_S", "Coordinator"]

#: The coordinator's timeout without ``lockstep_timeout_s``: half the default process group's (30 min).
DEFAULT_TIMEOUT_S = 900.0


class Coordinator:
    """Agreement among the ranks of the default process group, on a gloo group of its own.

    Args:
        timeout_s: how long an agreement waits for the slowest rank.
    """

    def __init__(self, timeout_s: float) -> None:
        dist = torch.distributed
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.timeout_s = timeout_s
        self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        #: Why the ranks stopped agreeing (a rank died, or did not answer within ``timeout_s``): after it
        #: nothing more is asked of the others (``None``: they agree).
        self.lost: str | None = None
        Coordinator._made += 1  # every rank makes as many coordinators (lockstep needs every rank's profile)
        self._id, self._ledgers = Coordinator._made, 0

    #: Coordinators made in this process: a key that names this one on every rank.
    _made = 0

    def ledger(self) -> Ledger:
        """A ledger for the next component's first lockstep pass (the same key on every rank)."""
        self._ledgers += 1
        store = torch.distributed.distributed_c10d._get_default_store()
        return Ledger(store, f"{self._id}/{self._ledgers}", self.rank, self.world, self.timeout_s)

    def lost_message(self, at: str, error: BaseException) -> str:
        """What a rank says when the others stopped answering while it replayed ``at``."""
        others = [r for r in range(self.world) if r != self.rank]
        who = f"rank {others[0]}" if len(others) == 1 else f"one of ranks {others}"
        first = (str(error).strip().splitlines() or [""])[0][:300]
        return (
            f"lost {who} during the lockstep replay of {at or 'root'}: it died or did not answer within "
            f"lockstep_timeout_s={self.timeout_s:g} s ({type(error).__name__}: {first}); nothing after it was "
            "replayed in lockstep"
        )

    @classmethod
    def create(cls, timeout_s: float | None) -> Coordinator | None:
        """A coordinator when the default process group has several ranks, else ``None``."""
        if distributed_world_size() <= 1:
            return None
        return cls(DEFAULT_TIMEOUT_S if timeout_s is None else float(timeout_s))

    def agree(self, error: str | None) -> str | None:
        """An agreement point: every rank's ``error``, the first one (named by its rank when another's),
        else ``None``; the same on every rank."""
        return self.first_error(self.gather(error))

    def gather(self, obj: object) -> list[RankValue]:
        """Every rank's ``obj``, in rank order, on every rank."""
        out: list[RankValue] = [None] * self.world
        torch.distributed.all_gather_object(out, obj, group=self.group)
        return out

    def broadcast(self, obj: object) -> RankValue:
        """Rank 0's ``obj`` on every rank."""
        box = [obj if self.rank == 0 else None]
        torch.distributed.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def first_error(self, errors: Sequence[str | None]) -> str | None:
        """The first of every rank's ``errors`` (gathered, in rank order), named by its rank when it is
        another rank's, else ``None``."""
        first = next(((r, e) for r, e in enumerate(errors) if e is not None), None)
        if first is None:
            return None
        rank, text = first
        return text if rank == self.rank else f"on rank {rank}: {text}"
