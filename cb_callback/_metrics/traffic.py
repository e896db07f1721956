"""Memory traffic of the isolated forward and backward: bytes each aten op reads and writes."""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from torch.utils._python_dispatch import TorchDispatchMode

from cb_callback._engine.capture.storage import storage_key
from cb_callback._engine.counting.byte_rules import op_bytes as _op_bytes
from cb_callback._engine.counting.byte_rules import register_traffic_rule, tensor_bytes
from cb_callback._engine.counting.byte_rules import storage_bytes as _storage_bytes
from cb_callback._engine.counting.byte_rules import tensors_in as _tensors
from cb_callback._engine.replay.isolate import PassContext, Phase, unobserved
from cb_callback._engine.run.plugins import MeasureContext
from cb_callback._metrics._observing import ObservingMetric
from cb_callback._types import OpValue

if TYPE_CHECKING:
    from torch._ops import OpOverload

__all__ = ["TrafficMetric", "register_traffic_rule", "tensor_bytes"]


class _TrafficMode(TorchDispatchMode):
    def __init__(self, storages: dict[object, int]) -> None:
        super().__init__()
        self.bytes = 0
        self.by_op: dict[str, int] = {}
        #: Every storage an op that moves data touched: the working set (shared with the other phase).
        self.storages = storages

    def __torch_dispatch__(
        self,
        func: OpOverload,
        types: Collection[type],
        args: tuple[OpValue, ...] = (),
        kwargs: dict[str, OpValue] | None = None,
    ) -> OpValue:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        with unobserved():  # a rule's own tensor ops are not the component's
            n = _op_bytes(func, args, kwargs, out)
        if n:
            self.bytes += n
            name = str(func.overloadpacket)
            self.by_op[name] = self.by_op.get(name, 0) + n
            with unobserved():
                for t in _tensors((args, kwargs, out)):
                    key = storage_key(t)
                    self.storages[("tensor", id(t)) if key is None else key] = _storage_bytes(t)
        return out


class _TrafficInstrument:
    def __init__(self) -> None:
        self.bytes: dict[Phase, int] = {}
        self.by_op: dict[str, int] = {}
        self.storages: dict[object, int] = {}

    @contextlib.contextmanager
    def observe(self, ctx: PassContext) -> Iterator[None]:
        if ctx.phase is Phase.PASS:
            yield
            return
        mode = _TrafficMode(self.storages)
        with mode:
            yield
        self.bytes[ctx.phase] = mode.bytes
        for k, v in mode.by_op.items():
            self.by_op[k] = self.by_op.get(k, 0) + v

    def values(self) -> Mapping[str, Any]:
        fwd, bwd = self.bytes.get(Phase.FORWARD, 0), self.bytes.get(Phase.BACKWARD, 0)
        top = dict(sorted(self.by_op.items(), key=lambda kv: -kv[1])[:5])
        return {
            "bytes": float(fwd + bwd), "fwd_bytes": fwd, "bwd_bytes": bwd, "top_bytes_ops": top,
            "working_set_bytes": sum(self.storages.values()),
        }  # fmt: skip


class TrafficMetric(ObservingMetric):
    """``bytes``: a lower bound of memory traffic over forward and backward.

    Fills ``bytes`` and details ``fwd_bytes``, ``bwd_bytes``, ``top_bytes_ops`` and
    ``working_set_bytes``: the bytes of every distinct storage those ops touched
    (parameters, inputs, activations, gradients) over both passes — what must stay
    in a cache for the repeated runs to be served from it, so what decides the
    bandwidth ceiling the row is judged against. Storages are told apart by
    their address, so memory freed and reused by a later tensor counts once, as
    the cache sees it.

    Notes:
        Per aten op, the bytes of its input and output tensors (each distinct
        tensor once, an expanded tensor at most its storage); views and reshapes
        move nothing. Gathers and scatters (embedding, embedding_bag,
        index_select, gather, index_add, scatter_add and their backwards) count
        the rows they touch, not the whole table: a lookup into a 10 GiB table
        does not move 10 GiB. A *dense* embedding backward does also zero-fill a
        table-sized gradient inside its kernel; that write is not counted, so
        such a backward's time can far exceed what its bytes explain (a hint to
        use sparse gradients or a fused optimizer). It is a lower bound: it assumes
        each tensor crosses memory once per op, and it does not see traffic inside
        a kernel (a matmul re-reading tiles) or cache reuse across ops.
    """

    name = "traffic"

    def instrument(self, ctx: MeasureContext) -> _TrafficInstrument:
        """An observer of the engine's shared instrumented pass."""
        return _TrafficInstrument()

    def from_census(self, counted: Mapping[str, Any]) -> Mapping[str, Any]:
        """The census counts with this metric's per-op rule: its values of the component, as counted in the step."""
        keys = ("bytes", "fwd_bytes", "bwd_bytes", "top_bytes_ops", "working_set_bytes")
        return {k: counted[k] for k in keys}
