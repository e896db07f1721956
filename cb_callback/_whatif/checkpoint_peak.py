"""The step's peak memory along its backward, from a report's rows: what checkpointing takes off it.

The backward meets the components in the reverse order of the forward. When it
runs one, ``e``, the step holds the activations of everything that ran before
``e`` (not yet freed), ``e``'s own isolated peak (``peak_mem_mb``: its
activations, its output and input gradients, its temporaries and its
parameters' gradients) and the gradients of the parameters of what ran after
it (already allocated). The step's peak is the largest of these over a cover
of the tree in the order of the forward (the report's row order: siblings by
first execution). Checkpointed modules hold nothing from their forward to
their backward: every position after one holds its saved bytes less; its own
position keeps its peak (its recompute holds its activations again). A module
called ``n`` times is met at its position by the backward of its last call,
with the ``n - 1`` earlier calls' activations still held (``earlier``);
checkpointed, those are freed too: its recompute holds one call's activations
at a time, so its position keeps one call's peak only.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from cb_callback._report.model import ComponentRow, Report

__all__ = ["Timeline"]

_MIB = 1024 * 1024


def _bytes(mb: float, calls: int = 1) -> int:
    return round(mb * _MIB) * calls if math.isfinite(mb) else 0


@dataclass(frozen=True)
class _Figures:
    held: int  # activation_mb x calls: held from its forward to its backward
    peak: int  # its own isolated peak (its held bytes when unmeasured)
    grads: int  # params_mb: the gradients its parameters get
    earlier: int = 0  # activation_mb x (calls - 1): the earlier calls' activations, held at its own position


class Timeline:
    """The report's tree in the order of the forward, with what each position holds along the backward."""

    def __init__(self, report: Report) -> None:
        self.kids: dict[str | None, list[str]] = {}
        self.parent: dict[str, str | None] = {}
        self.figures: dict[str, _Figures] = {}
        for r in report.rows:  # breadth-first: siblings in the order of first execution
            self.kids.setdefault(r.parent, []).append(r.path)
            self.parent[r.path] = r.parent
            self.figures[r.path] = self._figures(r)

    @staticmethod
    def _figures(r: ComponentRow) -> _Figures:
        held = _bytes(r.activation_mb, r.calls)
        earlier = _bytes(r.activation_mb, max(0, r.calls - 1))
        return _Figures(held, _bytes(r.peak_mem_mb) or held, _bytes(r.params_mb), earlier)

    def _cover(self, expand: set[str], under: str) -> Iterator[str]:
        """The positions below ``under``, in forward order, opening every row of ``expand``."""
        for k in self.kids.get(under, []):
            if k in expand:
                yield from self._cover(expand, k)
            else:
                yield k

    def positions(self, modules: Sequence[str]) -> list[str]:
        """A cover of the tree in forward order, in which each of ``modules`` is a position."""
        roots = self.kids.get(None, [])
        if not roots:
            return []
        expand = {roots[0]}
        for m in modules:
            up = self.parent.get(m)
            while up is not None and up not in expand:
                expand.add(up)
                up = self.parent.get(up)
        return list(self._cover(expand, roots[0]))

    def peak_saved(self, modules: Sequence[str], saved: Mapping[str, int]) -> int:
        """What checkpointing ``modules`` (``saved``: each one's saved bytes) takes off the step's peak, bytes."""
        if not modules:
            return 0
        order = self.positions(modules)
        chosen = set(modules)
        after = sum(self.figures[p].grads for p in order)
        before = freed = 0
        plain = wrapped = 0
        for p in order:
            f = self.figures[p]
            after -= f.grads
            here = before + f.earlier + f.peak + after
            plain, wrapped = max(plain, here), max(wrapped, here - freed - (f.earlier if p in chosen else 0))
            before += f.held
            freed += saved.get(p, 0) if p in chosen else 0
        return max(0, plain - wrapped)
