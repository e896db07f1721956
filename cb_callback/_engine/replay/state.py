"""Save and restore everything profiling could change: buffers, written weights, grads, flags, RNG."""

from __future__ import annotations

import collections
import contextlib
import random
import warnings
from collections.abc import Callable, Collection, Iterable, Iterator
from types import TracebackType
from typing import TypeAlias

import numpy as np
import torch
from torch import nn

from cb_callback._types import UserValue

__all__ = ["RngState", "StateGuard", "register_state_saver", "seeded"]

# Extra savers: callables ``saver(module) -> restore()`` for state the guard does not restore
# itself (e.g. a fused kernel's tables, or the attributes of an object a module holds).
_SAVERS: list[Callable[[nn.Module], Callable[[], None]]] = []
# Per saver, the parameters whose values and gradients it puts back itself (the guard does not judge them).
_OWNS: list[Callable[[nn.Module], Iterable[torch.Tensor]]] = []


def register_state_saver(
    saver: Callable[[nn.Module], Callable[[], None]],
    owns: Callable[[nn.Module], Iterable[torch.Tensor]] | None = None,
) -> None:
    """Register ``saver(root) -> restore`` for state :class:`StateGuard` does not know.

    ``saver`` is called on entering the guard with the guarded module and returns
    a function that puts that state back. Integrations use it for fused
    optimizers whose step counters are plain attributes and whose kernels write
    tables without bumping a version counter; a parameter that a replay writes in
    a way the guard cannot foresee (see :class:`StateGuard`) needs one too.
    ``owns(root)``, when given, lists the parameters whose values and ``.grad`` the
    saver puts back itself: the guard does not warn about their version counters.
    """
    if saver in _SAVERS:
        raise ValueError(f"state saver {saver!r} is already registered")
    _SAVERS.append(saver)
    if owns is not None:
        _OWNS.append(owns)


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t``'s data in host memory (pinned when ``t`` is on a CUDA device).

    Pinned memory lets the copy back be a plain DMA; when it cannot be had (pinned
    memory is limited), the copy is pageable.
    """
    src = t.detach()
    if src.device.type == "cuda":
        try:
            return torch.empty_like(src, device="cpu", pin_memory=True).copy_(src)
        except RuntimeError:
            pass
    return src.to("cpu", copy=True)


class RngState:
    """The torch CPU and CUDA, python ``random`` and numpy generator states."""

    def __init__(self) -> None:
        self.torch_cpu = torch.get_rng_state()
        self.torch_cuda = (
            torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        )
        self.python = random.getstate()
        self.numpy = np.random.get_state()

    def restore(self) -> None:
        """Put every generator back where it was."""
        torch.set_rng_state(self.torch_cpu)
        if self.torch_cuda is not None:
            torch.cuda.set_rng_state_all(self.torch_cuda)
        random.setstate(self.python)
        np.random.set_state(self.numpy)


def _written_by_replays(module: nn.Module) -> set[int]:
    """Ids of the parameters a replay may write in place, as far as the tree shows.

    * a parameter with a gradient hook (``register_hook``) or a post-accumulate-grad
      hook: how optimizers in backward (fused SGD, Adagrad …) are written in Python;
    * the weight of an ``nn.Embedding`` / ``nn.EmbeddingBag`` with ``max_norm``,
      which the forward renormalises in place.
    """
    out: set[int] = set()
    for p in module.parameters():
        if p._backward_hooks or getattr(p, "_post_accumulate_grad_hooks", None):
            out.add(id(p))
    for m in module.modules():
        if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.max_norm is not None:
            out.add(id(m.weight))
    return out


class _Param:
    """One parameter's saved state: its ``.grad`` object, versions, and host copies if written."""

    __slots__ = ("data", "grad", "grad_copy", "grad_version", "name", "owned", "param", "version")

    def __init__(self, name: str, p: nn.Parameter, written: bool, owned: bool = False) -> None:
        self.name, self.param, self.owned = name, p, owned
        self.version = p._version
        self.grad = p.grad
        self.grad_version = None if p.grad is None else p.grad._version
        self.data = _host_copy(p) if written and p.device.type != "meta" else None
        self.grad_copy = _host_copy(p.grad) if self.data is not None and p.grad is not None else None

    def restore(self) -> str | None:
        """Put it back; the parameter's name when it was written and cannot be."""
        p = self.param
        if self.data is not None:
            p.data.copy_(self.data)
        if p.grad is not self.grad:
            p.grad = self.grad
        if self.owned:  # a registered saver puts its values and gradient back
            return None
        lost = self.data is None and p._version != self.version
        if self.grad is not None and self.grad._version != self.grad_version:
            if self.grad_copy is not None:
                self.grad.copy_(self.grad_copy)
            else:
                lost = True
        return self.name if lost else None


# --- plain Python attributes of the modules ------------------------------------------------

# torch's own entries of every module's ``__dict__`` (parameter/buffer/submodule tables, hook
# tables, ``training``): the guard never touches them (hooks the engine installs and removes, and
# the flags, which are restored on their own). ``_compiled_call_impl`` is added by ``Module.compile``.
_TORCH_KEYS: frozenset[str] = frozenset(nn.Module().__dict__) | {"_compiled_call_impl"}
# Values that cannot change in place: putting the object back restores them exactly.
_ATOMS: frozenset[type] = frozenset(
    {type(None), bool, int, float, complex, str, bytes, range, torch.dtype, torch.device, torch.layout}
)
# Mutable containers whose items are snapshotted (shallow) and put back into the same object.
_CONTAINERS = (list, dict, set, collections.deque, bytearray)
# A tensor held in a plain attribute (not a buffer) up to this size is copied on its device on
# entry and put back if a write moved its version counter; a larger one is only watched.
_TENSOR_COPY_BYTES = 1 << 20
# The walk into nested containers stops below this depth, or at a container with more items
# (such a container's own items are still restored, those items' contents are not).
_WALK_DEPTH = 8
_WALK_ITEMS = 10_000
_MISSING = object()

#: A mutable container a module attribute holds (one of ``_CONTAINERS``), of the user's values.
_Container: TypeAlias = (
    "list[UserValue] | dict[UserValue, UserValue] | set[UserValue] | collections.deque[UserValue] | bytearray"
)


class _Contents:
    """A mutable container's items at entry, put back into the same object (references elsewhere see it)."""

    __slots__ = ("items", "obj")

    def __init__(self, obj: _Container) -> None:
        self.obj = obj
        self.items: Collection[UserValue] = (
            list(obj.items()) if isinstance(obj, dict) else bytes(obj) if isinstance(obj, bytearray) else list(obj)
        )

    def restore(self) -> None:
        """Put the items back (a dict's and a list's order too)."""
        obj = self.obj
        if isinstance(obj, (list, bytearray)):
            obj[:] = self.items
        elif isinstance(obj, collections.deque):
            obj.clear()
            obj.extend(self.items)
        else:  # dict (OrderedDict, defaultdict …) or set
            obj.clear()
            obj.update(self.items)


class _TensorAttr:
    """A tensor held outside the buffers (an attribute, or in a list/dict attribute): version and small copy."""

    __slots__ = ("copy", "tensor", "version", "where")

    def __init__(self, where: str, t: torch.Tensor, version: int) -> None:
        self.where, self.tensor, self.version = where, t, version
        small = t.numel() * t.element_size() <= _TENSOR_COPY_BYTES
        self.copy = t.detach().clone() if small else None

    def restore(self) -> str | None:
        """Put its values back if written in place; its name when it was and cannot be."""
        t = self.tensor
        if t._version == self.version:
            return None  # untouched: nothing is written (a graph that saved it stays valid)
        if self.copy is None or t.shape != self.copy.shape:
            return self.where
        with torch.no_grad():
            t.copy_(self.copy)
        self.version = t._version  # a second restore() compares with the restored values
        return None


def _version(t: torch.Tensor) -> int | None:
    """``t``'s version counter; ``None`` for a tensor without one (inference tensors)."""
    try:
        return int(t._version)
    except (RuntimeError, AttributeError):
        return None


class _PyState:
    """Each module's own plain Python attributes (its ``__dict__`` less torch's entries).

    * every attribute's object, by reference: one rebound is put back, one added is
      removed, one deleted is restored. Immutable values (numbers, strings, ``None``,
      tuples of them …) are thereby restored exactly;
    * the items of every mutable container (list, dict, set, deque, bytearray) an
      attribute holds, nested ones included: put back into the same object;
    * tensors found there that are not a parameter or buffer of the tree: see
      :class:`_TensorAttr` (plain tensors only: a tensor subclass held in an
      attribute, a ``ShardedTensor`` or ``DTensor``, is kept by reference).

    Not restored: changes made *inside* other objects (an attribute holding a
    scheduler object whose own counter moves, numpy arrays), globals, closures,
    state of other Python objects; register a state saver for those.
    """

    def __init__(self, named: Iterable[tuple[str, nn.Module]], tree_tensors: set[int]) -> None:
        self.dicts: list[tuple[dict[str, UserValue], dict[str, UserValue], int]] = []
        self.contents: list[_Contents] = []
        self.tensors: list[_TensorAttr] = []
        self._skip = tree_tensors
        seen: set[int] = set()
        for path, mod in named:
            d = mod.__dict__
            own = {k: d[k] for k in d.keys() - _TORCH_KEYS}
            self.dicts.append((d, own, len(d)))
            for k, v in own.items():
                if type(v) not in _ATOMS:
                    self._walk(v, (path, k), seen, 0)

    def _walk(self, value: object, where: tuple[str, str], seen: set[int], depth: int) -> None:
        """Note the containers and tensors ``value`` holds (``where``: the module path and attribute)."""
        if isinstance(value, torch.Tensor):
            if type(value) not in (torch.Tensor, nn.Parameter):
                return  # a tensor subclass (ShardedTensor, DTensor): its reference only, its attributes may raise
            base = value._base
            if id(value) in seen or id(value) in self._skip or (base is not None and id(base) in self._skip):
                return  # a parameter or buffer (or a view of one): restored as such
            seen.add(id(value))
            if (version := _version(value)) is not None:
                self.tensors.append(_TensorAttr(f"{where[0]}.{where[1]}" if where[0] else where[1], value, version))
            return
        children: Collection[object]
        if isinstance(value, _CONTAINERS):
            if id(value) in seen:
                return
            seen.add(id(value))
            self.contents.append(_Contents(value))
            children = (
                value.values() if isinstance(value, dict) else () if isinstance(value, (set, bytearray)) else value
            )
        elif isinstance(value, tuple):  # immutable itself; what it holds may not be
            children = value
        else:
            return  # any other object: its reference only
        if depth < _WALK_DEPTH and len(children) <= _WALK_ITEMS:
            for child in children:
                if type(child) not in _ATOMS:
                    self._walk(child, where, seen, depth + 1)

    def restore(self) -> list[str]:
        """Put every attribute back; the names of tensors written in place that cannot be."""
        lost = [w for t in self.tensors if (w := t.restore()) is not None]
        for d, own, n in self.dicts:
            for k, v in own.items():
                if d.get(k, _MISSING) is not v:
                    d[k] = v  # rebound or deleted while profiling
            if len(d) != n:  # (only then can an attribute have been added)
                for k in d.keys() - _TORCH_KEYS - own.keys():
                    del d[k]  # added while profiling
        for c in self.contents:
            c.restore()
        return lost

    def copies(self) -> list[torch.Tensor]:
        """The copies held of small tensor attributes."""
        return [t.copy for t in self.tensors if t.copy is not None]


class StateGuard:
    """Restores a module tree and the process's RNGs to their state at ``__enter__``.

    Only what profiling can change is saved, and the large copies are kept off
    the device:

    * every buffer (BatchNorm running statistics, counters): a copy on its own
      device, always put back. These are the guard's only device-side copies.
    * the parameters a replay may write in place — those with a gradient or
      post-accumulate-grad hook (an optimizer applied inside backward), and
      ``max_norm`` embedding weights (renormalised by the forward) — and their
      ``.grad``: a copy in host memory (pinned for CUDA tensors), taken on entry
      and always put back (a hook that writes through ``.data`` or a C++ kernel
      does not bump the version counter, so a moved counter cannot be the test).
    * every other parameter: no copy, only its version counter. The isolated
      replays differentiate with ``torch.autograd.grad``, which writes neither
      weights nor ``.grad``, so nothing else writes them; one whose counter moved
      anyway cannot be restored, and the guard warns naming it.
    * each ``.grad``: the tensor object and its version counter (no copy): a
      replaced ``.grad`` is put back as the same object.
    * each submodule's own plain Python attributes (its ``__dict__`` less torch's
      tables and flags): a counter ``self.t += 1``, a list appended to, a dict
      cache. Every attribute's object is kept by reference (one rebound is put
      back, one added is removed, one deleted restored), so immutable values —
      numbers, strings, ``None``, tuples and frozensets of them — come back
      exactly; the items of each list, dict, set, deque and bytearray held there
      (nested ones too) are copied shallowly and put back into the *same* object,
      so references held elsewhere see the restored items. A tensor found there
      that is no parameter or buffer of the tree (``self.count = torch.zeros(())``)
      gets its version counter saved and, up to 1 MiB, a copy on its device, put
      back only if its version moved; a larger one written in place is named in a
      warning (make it a buffer, ``register_buffer(..., persistent=False)``).
    * each submodule's ``training`` flag, grad mode, and the RNG streams; and what
      the registered savers (:func:`register_state_saver`) save — e.g. the
      torchrec integration's host copies of fused-optimizer tables, which fbgemm
      writes in backward without a version bump.

    Restored in place, so optimizers keep their references to the same tensors.

    Notes:
        Why copies are taken on entry and not lazily before the first replay that
        could write them: the engine replays the root first, and the root's
        backward reaches every hooked parameter, so a lazy copy would be taken
        at once anyway. A parameter written in place *without* a version bump
        and without a hook (a C++ kernel updating a plain parameter) is out of
        scope: version counters are how the guard sees writes; register a state
        saver for such state.

        Python state the guard does not restore: what changes *inside* any other
        object an attribute holds (a schedule object whose own counter moves, a
        numpy array written in place, a cache object appended to), module-level
        globals, closures and class attributes, and containers nested deeper than
        8 levels or below one of more than 10,000 items (that container's own
        items are restored). Register a state saver for such state. Its cost: one
        pass over each module's ``__dict__`` and a shallow copy of each container
        found: on 2,001 small modules (1,000 with an int and a str attribute)
        8 ms to save and restore on one CPU core, 23 ms when those 1,000 also
        hold a list, a dict and a nested list each; the rest of the guard takes
        about 50 ms on the same tree.

    Args:
        module: the tree to guard.
    """

    def __init__(self, module: nn.Module) -> None:
        self._module = module
        self._params: list[_Param] = []
        self._buffers: list[tuple[nn.Module, str, torch.Tensor | None, torch.Tensor | None]] = []
        self._flags: list[tuple[nn.Module, bool]] = []
        self._restorers: list[Callable[[], None]] = []
        self._python: _PyState | None = None
        self._rng: RngState | None = None
        self._grad_mode = True

    def __enter__(self) -> StateGuard:
        written = _written_by_replays(self._module)
        owned = {id(t) for owns in _OWNS for t in owns(self._module)}
        with torch.no_grad():
            for name, p in self._module.named_parameters():
                self._params.append(_Param(name, p, id(p) in written and id(p) not in owned, id(p) in owned))
            named = list(self._module.named_modules())
            for _, mod in named:
                self._flags.append((mod, mod.training))
                for name, buf in mod._buffers.items():
                    self._buffers.append((mod, name, buf, None if buf is None else buf.detach().clone()))
            tree = {id(s.param) for s in self._params} | {id(b) for *_, b, _ in self._buffers if b is not None}
            self._python = _PyState(named, tree)
        self._restorers = [saver(self._module) for saver in _SAVERS]
        self._rng = RngState()
        self._grad_mode = torch.is_grad_enabled()
        return self

    def copied_bytes(self) -> dict[str, int]:
        """Bytes of the guard's own copies by the device that holds them (``"cpu"``, ``"cuda:0"``).

        Buffers' copies and those of small tensors held in plain attributes are on
        their device; written parameters' and their gradients' copies on the host
        (``"cpu"``). Savers' copies are not counted.
        """
        out: dict[str, int] = {}
        copies = [c for *_, c in self._buffers] + [t for s in self._params for t in (s.data, s.grad_copy)]
        copies += self._python.copies() if self._python is not None else []
        for c in copies:
            if c is not None:
                out[str(c.device)] = out.get(str(c.device), 0) + c.numel() * c.element_size()
        return out

    def restore(self) -> None:
        """Put everything back (the guard stays usable)."""
        lost: list[str] = []
        # First the tensors held in attributes: their copies are checked before a buffer's restore can
        # bump the version of a tensor sharing its storage.
        lost_attrs = self._python.restore() if self._python is not None else []
        with torch.no_grad():
            for saved in self._params:
                name = saved.restore()
                if name is not None:
                    lost.append(name)
            for mod, name, original, copy in self._buffers:
                if original is None or copy is None:
                    mod._buffers[name] = original
                    continue
                # ``in``, then ``[]``: a TorchScript module's ``_buffers`` is an OrderedDictWrapper (no ``get``)
                if name not in mod._buffers or mod._buffers[name] is not original:
                    mod._buffers[name] = original
                original.copy_(copy)
        for mod, flag in self._flags:
            mod.training = flag
        for restore in self._restorers:
            restore()
        if self._rng is not None:
            self._rng.restore()
        torch.set_grad_enabled(self._grad_mode)
        if lost_attrs:
            warnings.warn(
                f"cb_callback: profiling wrote {len(lost_attrs)} tensor(s) held in plain module attributes in "
                f"place that the state guard holds no copy of ({', '.join(lost_attrs[:5])}"
                f"{' …' if len(lost_attrs) > 5 else ''}), so they keep the changed values: only tensors up to "
                f"{_TENSOR_COPY_BYTES >> 20} MiB are copied. Register them as buffers "
                "(module.register_buffer(name, tensor, persistent=False)) so that the guard copies them.",
                RuntimeWarning,
                stacklevel=2,
            )
        if lost:
            warnings.warn(
                f"cb_callback: profiling wrote {len(lost)} parameter(s) or gradient(s) in place that the "
                f"state guard holds no copy of ({', '.join(lost[:5])}{' …' if len(lost) > 5 else ''}), so they "
                "keep the changed values. Only parameters with gradient hooks and max_norm embeddings are "
                "copied; register a state saver (cb_callback.plugins.register_state_saver) for the others.",
                RuntimeWarning,
                stacklevel=2,
            )

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.restore()


@contextlib.contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    """The block runs with the CPU generator, and ``device``'s own when it is CUDA, seeded.

    Both generators are restored afterwards. Unlike :func:`torch.manual_seed`,
    nothing else is touched: no seed is queued for CUDA devices that are not
    initialised, MPS/XPU generators are left alone.
    """
    cpu = torch.default_generator
    saved_cpu = cpu.get_state()
    gen: torch.Generator | None = None
    if device.type == "cuda":
        gen = torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
    saved_dev = gen.get_state() if gen is not None else None
    try:
        cpu.manual_seed(seed)
        if gen is not None:
            gen.manual_seed(seed)
        yield
    finally:
        cpu.set_state(saved_cpu)
        if gen is not None and saved_dev is not None:
            gen.set_state(saved_dev)
