"""A sharded embedding module's stages: input all-to-all, local lookups, output all-to-all; and its planned Perf.

A torchrec ``ShardedEmbeddingBagCollection`` (or ``ShardedEmbeddingCollection``)
keeps its input dists, lookups and output dists in plain lists, so they are no
modules of the tree and get no rows. :class:`ShardedEmbeddingMetric` observes the
row's instrumented pass (replayed on every rank in lockstep) and splits it:

* ``details["torchrec"]["stages"]``: the forward's collectives by stage,
  ``input_dist`` (every collective before the first lookup: the KJT all-to-all of
  lengths, then of ids) and ``output_dist:<sharding type>`` (after that lookup:
  the pooled embeddings' all-to-all, or row-wise's reduce-scatter), each with the
  payload (``comm_bytes``, nccl-tests' count) and the ops. Their times are in the
  row's ``details["comm"]`` (per op and phase).
* ``details["parts"]``: one part per local lookup (``lookup:<sharding type>``):
  its tables on this rank, the ids it received after the input all-to-all, the
  memory traffic of its TBE forward (``bytes``: the rows gathered, fbgemm's
  kernels charged by :mod:`._traffic`) and ``fwd_ms``, its forward timed alone on
  this rank (no collective: a lookup is local), from which the engine derives
  ``gbps`` and ``bw_util`` against the copy ceiling.
* ``details["planned"]``: torchrec's ``EmbeddingPerfEstimator`` for this
  module's shards on this rank (:func:`._planner.planned_perf`'s per-rank sums)
  at the batch size the row was captured with; the engine adds the measured
  split beside it (:mod:`cb_callback._engine.derive.parts`).

Registered on import of :mod:`cb_callback.integrations.torchrec` (every
profile uses it); a row that is not a sharded embedding module gets nothing.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import cb_callback
import cb_callback.plugins

from ._hidden import tbe_modules
from ._planner import module_perf, rank_topology
from ._traffic import tbe_op_bytes

if TYPE_CHECKING:
    from torch._ops import OpOverload
    from torch.utils.hooks import RemovableHandle
    from torchrec.distributed.planner.types import ParameterConstraints, Topology
    from torchrec.distributed.types import ParameterSharding

__all__ = [
    "ShardedEmbeddingMetric", "is_sharded_embedding", "register_default_sharded_metric", "register_sharded_metric",
]  # fmt: skip

_LOCKSTEP_WHY = (
    "a torchrec sharded embedding module communicates (its all-to-alls; a data-parallel table's lookup is a "
    "DistributedDataParallel outside the module tree that all-reduces its gradient in the backward)"
)

#: Timing a lookup alone: at least this many runs, and at least this long (then the median).
_MIN_RUNS, _MIN_S, _MAX_RUNS = 5, 0.02, 200


def is_sharded_embedding(module: nn.Module) -> bool:
    """A torchrec sharded embedding (bag) collection: lookups and output dists in lists, and a sharding plan."""
    return (
        isinstance(getattr(module, "_lookups", None), list)
        and isinstance(getattr(module, "_sharding_types", None), list)
        and isinstance(getattr(module, "module_sharding_plan", None), Mapping)
    )


def _env_value(module: nn.Module, name: str) -> int:
    """The sharded module's ``ShardingEnv`` ``rank`` or ``world_size``, else the default process group's."""
    value = getattr(getattr(module, "_env", None), name, None)
    if isinstance(value, int):
        return value
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return 0 if name == "rank" else 1
    return int(dist.get_rank() if name == "rank" else dist.get_world_size())


def _inner(lookup: nn.Module) -> nn.Module:
    """A data-parallel lookup is wrapped in ``DistributedDataParallel``: time the lookup, not the wrapper."""
    inner = getattr(lookup, "module", None)
    return inner if type(lookup).__name__ == "DistributedDataParallel" and isinstance(inner, nn.Module) else lookup


def _cached(lookup: nn.Module) -> bool:
    """Whether a TBE of the lookup has a cache (its forward would update the cache: not timed alone)."""
    for m in _inner(lookup).modules():
        cache = getattr(m, "lxu_cache_weights", None)
        if isinstance(cache, torch.Tensor) and cache.numel() > 0:
            return True
    return False


def _ids(kjt: object) -> int | None:
    values = getattr(kjt, "values", None)
    if callable(values):
        with contextlib.suppress(Exception):
            return int(values().numel())
    return None


def _batch_size(inputs: cb_callback.plugins.ReplayInputs) -> int | None:
    """The local batch size of the module's input KJT (its ``stride``)."""
    for value in (*inputs.args, *inputs.kwargs.values()):
        stride = getattr(value, "stride", None)
        if callable(stride) and hasattr(value, "keys"):
            with contextlib.suppress(Exception):
                return int(stride())
    return None


class _StageMode(TorchDispatchMode):
    """Attributes each collective and each TBE forward to the stage running when it is dispatched."""

    def __init__(self, owner: _StagesInstrument) -> None:
        super().__init__()
        self.owner = owner

    def __torch_dispatch__(
        self,
        func: OpOverload,
        types: Collection[type],
        args: tuple[object, ...] = (),
        kwargs: dict[str, object] | None = None,
    ) -> object:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        with cb_callback.plugins.unobserved():
            self.owner.saw(func, args, kwargs, out)
        return out


class _StagesInstrument:
    def __init__(self, module: nn.Module, metric: ShardedEmbeddingMetric) -> None:
        self.module = module
        self.metric = metric
        found: dict[str, Any] = vars(module)  # plain attributes of a torchrec sharded module (is_sharded_embedding)
        self.types: list[str] = list(found["_sharding_types"])
        self.lookups: list[nn.Module] = list(found["_lookups"])
        self.plan: Mapping[str, ParameterSharding] = found["module_sharding_plan"]
        self.stage = "input_dist"
        self.lookup: int | None = None
        self.stages: dict[str, dict[str, Any]] = {}
        self.lookup_bytes: dict[int, int] = {}
        self.lookup_inputs: dict[int, tuple[tuple[object, ...], dict[str, object]]] = {}
        self.batch_size: int | None = None

    def saw(self, func: OpOverload, args: tuple[object, ...], kwargs: Mapping[str, object], out: object) -> None:
        nbytes = cb_callback.plugins.collective_bytes(func, args, kwargs, out)
        if nbytes is not None:
            entry = self.stages.setdefault(self.stage, {"stage": self.stage, "comm_bytes": 0, "ops": {}})
            entry["comm_bytes"] += nbytes
            name = f"{func.namespace}.{func.overloadpacket.__name__}"
            entry["ops"][name] = entry["ops"].get(name, 0) + 1
            return
        if self.lookup is not None:
            tbe = tbe_op_bytes(func, args, kwargs, out)
            if tbe is not None:
                self.lookup_bytes[self.lookup] = self.lookup_bytes.get(self.lookup, 0) + tbe

    def _hooks(self) -> list[RemovableHandle]:
        handles = []
        for i, lookup in enumerate(self.lookups):

            def pre(_: nn.Module, args: tuple[object, ...], kwargs: dict[str, object], i: int = i) -> None:
                self.lookup, self.stage = i, f"lookup:{self.types[i]}"
                self.lookup_inputs.setdefault(i, (args, kwargs))  # fresh per pass; a lookup does not change it

            def post(*_: object, i: int = i) -> None:
                self.lookup, self.stage = None, f"output_dist:{self.types[i]}"

            handles.append(lookup.register_forward_pre_hook(pre, with_kwargs=True))
            handles.append(lookup.register_forward_hook(post))
        return handles

    @contextlib.contextmanager
    def observe(self, ctx: cb_callback.plugins.PassContext) -> Iterator[None]:
        if ctx.phase is not cb_callback.plugins.Phase.FORWARD:
            yield
            return
        self.batch_size = _batch_size(ctx.inputs)
        handles = self._hooks()
        try:
            with _StageMode(self):
                yield
        finally:
            for h in handles:
                h.remove()

    def _time(self, i: int) -> dict[str, Any]:
        """The lookup alone, on this rank (no collective): its forward's and its backward's median ms, runs.

        The backward is timed on its own (:func:`_backward_ms`): the sharded
        row's backward compute is measured, not its ``bwd_ms`` minus the
        collectives' times of other passes.
        """
        lookup = self.lookups[i]
        if _cached(lookup):
            return {"not_timed": "a lookup with a cache updates it in its forward: not replayed alone"}
        args, kwargs = self.lookup_inputs[i]
        inner = _inner(lookup)
        device = next((t.device for t in (*inner.parameters(), *inner.buffers())), torch.device("cpu"))

        def sync() -> None:
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        def forward() -> None:
            inner(*args, **kwargs)

        with torch.no_grad():
            out: dict[str, Any] = _median_ms(forward, sync)
        try:
            out.update(_backward_ms(inner, args, kwargs, sync))
        except Exception as e:  # the part keeps its forward; the split says the backward compute is unknown
            out["bwd_not_timed"] = f"its backward alone raised {type(e).__name__}: {e}"
        return out

    def _parts(self) -> list[dict[str, Any]]:
        rank, plan = _env_value(self.module, "rank"), self.plan
        parts = []
        for i, sharding in enumerate(self.types):
            tables = sorted(
                t for t, ps in plan.items() if ps.sharding_type == sharding and rank in (ps.ranks or [rank])
            )
            part: dict[str, Any] = {"name": f"lookup:{sharding}", "kind": "lookup", "tables": tables}
            if i not in self.lookup_inputs:
                part["not_timed"] = "the lookup did not run in the observed forward"
                parts.append(part)
                continue
            args, _ = self.lookup_inputs[i]
            part["ids"] = _ids(args[0]) if args else None
            part["bytes"] = self.lookup_bytes.get(i, 0)
            try:
                part.update(self._time(i))
            except Exception as e:  # the part has no time; the row's measurements stand
                part["not_timed"] = f"its forward alone raised {type(e).__name__}: {e}"
            parts.append(part)
        return parts

    def _planned(self) -> dict[str, Any]:
        if self.batch_size is None:
            return {"error": "the module's input has no KJT to read the batch size from"}
        rank, world = _env_value(self.module, "rank"), _env_value(self.module, "world_size")
        topology = self.metric.topology or rank_topology(world, _device_type(self.module))
        try:
            entry = module_perf("", self.plan, self.module, topology, self.batch_size, self.metric.constraints)
        except Exception as e:
            return {"error": f"torchrec's estimator: {type(e).__name__}: {e}"}
        if "error" in entry:
            return {"error": entry["error"]}
        mine = dict(entry["ranks"].get(str(rank), {}))
        return {"source": "torchrec EmbeddingPerfEstimator", "rank": rank, **mine, "assumptions": entry["assumptions"]}

    def values(self) -> Mapping[str, Any]:
        stages = list(self.stages.values())
        return {
            "torchrec": {"sharding_types": self.types, "stages": stages},
            "parts": self._parts(),
            "planned": self._planned(),
        }


def _median_ms(run: Callable[[], object], sync: Callable[[], None]) -> dict[str, Any]:
    """``run`` timed alone after one warm-up: ``fwd_ms`` (median ms) and ``runs``."""
    run()
    sync()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < _MAX_RUNS and (len(times) < _MIN_RUNS or time.perf_counter() - start < _MIN_S):
        t0 = time.perf_counter()
        run()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return {"fwd_ms": statistics.median(times), "runs": len(times)}


def _backward_ms(
    inner: nn.Module, args: tuple[object, ...], kwargs: Mapping[str, object], sync: Callable[[], None]
) -> dict[str, Any]:
    """The lookup's backward alone, on this rank: ``bwd_ms`` (median ms of the backward only) and ``bwd_runs``.

    Each run builds the lookup's graph with an untimed forward, then times
    ``torch.autograd.grad`` of its outputs (gradient of ones) w.r.t. its
    TBEs (:func:`_lookup_grad_targets`): a fused TBE's placeholder (its backward is
    the gradient scatter and the fused optimizer update, undone with the rest
    of the fused state after the run by the integration's state saver), a dense
    TBE's weights (``autograd.grad`` writes no ``.grad``). No collective runs in
    it: a data-parallel lookup's all-reduce is its ``DistributedDataParallel``
    wrapper's, which is not called. ``bwd_not_timed`` says why when the lookup
    has no backward.
    """
    targets = _lookup_grad_targets(inner)
    if not targets:
        return {"bwd_not_timed": "the lookup has no TBE or parameter that requires grad"}

    def graph() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        with torch.enable_grad():
            result = inner(*args, **kwargs)
        outs = [t for t in torch.utils._pytree.tree_leaves(result) if isinstance(t, torch.Tensor) and t.requires_grad]
        return outs, [torch.ones_like(t) for t in outs]

    outs, grads = graph()
    if not outs:
        return {"bwd_not_timed": "the lookup's output does not require grad"}
    torch.autograd.grad(outs, targets, grads, allow_unused=True)  # warm-up
    sync()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < _MAX_RUNS and (len(times) < _MIN_RUNS or time.perf_counter() - start < _MIN_S):
        outs, grads = graph()
        sync()
        t0 = time.perf_counter()
        torch.autograd.grad(outs, targets, grads, allow_unused=True)
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return {"bwd_ms": statistics.median(times), "bwd_runs": len(times)}


def _lookup_grad_targets(inner: nn.Module) -> list[torch.Tensor]:
    """What a lookup's backward differentiates against so that its TBEs' backward runs.

    torchrec's lookups expose per-table *views* of a TBE's weights as their
    parameters, which are not in the autograd graph: differentiating against
    them prunes the TBE's backward. Each TBE's ``placeholder_autograd_tensor``
    (a fused TBE: the input of its autograd function), or a dense TBE's own
    weights, is what the graph holds (as the engine's grad targets,
    :mod:`._grad_targets`); the lookup's other parameters that require grad
    are added, duplicates dropped by identity.
    """
    out: list[torch.Tensor] = []
    for tbe in tbe_modules(inner):
        placeholder = getattr(tbe, "placeholder_autograd_tensor", None)
        if isinstance(placeholder, torch.Tensor) and placeholder.requires_grad:
            out.append(placeholder)
        else:
            out.extend(p for p in tbe._parameters.values() if p is not None and p.requires_grad)
    out.extend(p for p in inner.parameters() if p.requires_grad)
    unique: dict[int, torch.Tensor] = {}
    for t in out:
        unique.setdefault(id(t), t)
    return list(unique.values())


def _device_type(module: nn.Module) -> str:
    device = getattr(module, "_device", None)
    return device.type if isinstance(device, torch.device) else "cpu"


class _Nothing:
    """The instrument of a row a metric has nothing to observe on."""

    @contextlib.contextmanager
    def observe(self, ctx: cb_callback.plugins.PassContext) -> Iterator[None]:
        yield

    def values(self) -> Mapping[str, Any]:
        return {}


class ShardedEmbeddingMetric:
    """Splits a sharded embedding module's row into its stages, its local lookups and its planned ``Perf``.

    See the module docstring for what each ``details`` key holds.

    Args:
        topology: the torchrec ``Topology`` the planned figures assume; default:
            the one DMP builds when it plans by itself (this world size,
            ``LOCAL_WORLD_SIZE`` or the world size, the module's device type,
            torchrec's default bandwidths).
        constraints: torchrec ``ParameterConstraints`` by table (their pooling
            factors and batch sizes change the estimate; default: 1 id per bag).

    Notes:
        The stages' payloads come from the one instrumented forward; a lookup's
        ``fwd_ms`` is its forward alone on this rank, after the input
        all-to-all, so it holds no collective and no wait for another rank. The
        lookups' backward (the fused TBE's gradient scatter and optimizer
        update) runs inside the row's ``bwd_ms`` and is not split out.
    """

    name = "torchrec_sharded"

    def __init__(
        self, topology: Topology | None = None, constraints: Mapping[str, ParameterConstraints] | None = None
    ) -> None:
        self.topology = topology
        self.constraints = dict(constraints) if constraints else None

    def from_census(self, counted: Mapping[str, object]) -> dict[str, Any] | None:
        """Nothing to add to a row the census counted without a process group (``{}``: no module is
        sharded); with one, ``None``: it observes each row's own pass."""
        return None if torch.distributed.is_available() and torch.distributed.is_initialized() else {}

    def instrument(self, ctx: cb_callback.plugins.MeasureContext) -> cb_callback.plugins.Instrument:
        """Observe the pass of a sharded embedding module; nothing for any other row."""
        if not is_sharded_embedding(ctx.module):
            return _Nothing()
        return _StagesInstrument(ctx.module, self)


def register_sharded_metric(
    topology: Topology | None = None, constraints: Mapping[str, ParameterConstraints] | None = None
) -> None:
    """(Re-)register :class:`ShardedEmbeddingMetric` for every profile, with these planner assumptions.

    The integration registers one with the defaults on import; call this to
    have the planned figures assume your planner's ``Topology`` and
    ``ParameterConstraints`` instead.
    """
    global _registered
    cb_callback.plugins.register_metric(ShardedEmbeddingMetric(topology=topology, constraints=constraints))
    cb_callback.plugins.register_lockstep_module(is_sharded_embedding, _LOCKSTEP_WHY)
    _registered = True


def register_default_sharded_metric() -> None:
    """Register :class:`ShardedEmbeddingMetric` with the defaults unless one was registered (idempotent)."""
    if not _registered:
        register_sharded_metric()


_registered = False
