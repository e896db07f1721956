"""Capture every submodule's real inputs during one real forward."""

from __future__ import annotations

import sys
import types
import weakref
from collections.abc import Callable, Iterable
from types import TracebackType

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils import _pytree as pytree
from torch.utils.hooks import RemovableHandle

from cb_callback._engine.capture.inputs import (
    ComponentInputs,
    InputCopyError,
    copy_call,
    leading_batch_size,
    slice_batch,
)
from cb_callback._engine.capture.reach import CallOutputs, call_outputs, fill_reach, mark, walk
from cb_callback._engine.capture.tree import SCRIPTED_UNREAD, component_paths, owner, scripted
from cb_callback._engine.clocks.clock import HookClock
from cb_callback._engine.replay.batches import input_signature
from cb_callback._engine.replay.isolate import flatten_output
from cb_callback._types import UserValue

__all__ = ["MAX_VARIANTS", "Capture"]

#: Distinct kinds of call kept per component beyond its first (``ComponentInputs.variants``).
MAX_VARIANTS = 32
#: The copies of all variants of one capture hold at most this many bytes of tensors (beyond it a new
#: kind is kept only when its grad mode and wrapper are not yet represented: see :meth:`Capture._count`).
MAX_VARIANT_BYTES = 256 * 1024 * 1024


class Capture:
    """Forward hooks that record each module's first call, a copy of each kind of call unlike it,
    and count its calls.

    Use as a context manager around one real forward (a training step)::

        with Capture(model) as cap:
            loss = model(x).sum()
        cap.calls[""]  # ComponentInputs of the root

    Args:
        root: the module tree to capture.
        paths: the dotted paths to capture (default: every node of
            :func:`cb_callback._engine.capture.tree.component_paths`: each module once per
            parent it is reachable from).
        keep_samples: keep only the first ``k`` samples of every input whose
            leading dimension is the root's batch size (small-batch capture).
        skip: ``skip(module, args, kwargs)`` -> whether a call is not a real one
            (neither recorded nor counted), e.g. a framework calling ``forward``
            to redirect into ``training_step``.

    Notes:
        The copy is taken when the module is entered (:func:`copy_call`: tensors
        cloned, objects such as a KV cache deep-copied): an in-place op or an
        append later in the step does not change what was captured. The hooks
        run inside the user's real step and never raise into it: a call that
        cannot be copied (an uncopyable object, out of memory while cloning) is
        recorded with its ``capture_error`` and the step goes on. Each record's
        ``modes`` (the subtree's ``training`` flags) is filled when the hooks come
        off (``__exit__`` or :meth:`remove`). The hooks hold paths, not modules;
        the capture keeps only a weak reference to ``root``. Hooks come off in
        ``__exit__``, also when the forward raises.

        A module reachable from several parents (one ``Linear`` used inside ``a``
        and inside ``b``) is recorded per parent: a call belongs to the node
        (``a.lin`` or ``b.lin``) whose parent is the innermost module executing
        around it (a stack kept by the hooks), or to its first node when none of
        its parents is (called from elsewhere, or through a ``ModuleList`` alias).

        A TorchScript module refuses hooks of its own (``register_forward_pre_hook is not supported on
        ScriptModules``): while a tree holds one, global forward hooks
        (``register_module_forward_pre_hook``, ``register_module_forward_hook``) take its calls as the
        module hooks take any other's, its keyword arguments read from ``Module._call_impl``'s frame (a
        call where they cannot be read is recorded as failed); the modules inside it are no nodes
        (:func:`cb_callback._engine.capture.tree.component_paths`).

        Each record's ``insitu_ms`` is the module's forward per call in the
        captured step, filled when the hooks come off: the hooks mark a clock
        when a module's own work starts and ends, and bracket their own work
        (the copy of the call) so that it is left out of every time, the
        parent's included (:class:`cb_callback._engine.clocks.clock.HookClock`; on CUDA
        events, read once when the hooks come off). The copies still leave
        caches colder than an unhooked step would: the engine's in-situ pass
        (``insitu_ms`` of the report) copies nothing.

        A call unlike the module's first (another input signature, other
        non-tensor arguments, another grad mode or autograd wrapper) is copied
        into the record's ``variants``; a call like one already kept is counted in
        that kind's ``calls``. At most :data:`MAX_VARIANTS` kinds are kept per
        component, and :data:`MAX_VARIANT_BYTES` of copies per capture (each kind is
        a copy made inside the user's step: the bound keeps its memory so), except
        that a call whose grad mode and wrapper no kept kind has is always kept; a
        call of a further kind is counted in the last kept kind of its grad mode and
        wrapper, and in that kind's ``unrepresented`` (its row says it is
        approximated). Inside a reentrant checkpoint (its forward under no_grad) a
        call's floating-point inputs other than the checkpoint's own are copied as
        requiring grad when the checkpoint has a backward: the step's backward
        recomputes them with grad (:func:`_recompute_grads`). Calls made during a
        backward (``torch._C._current_graph_task_id() != -1``: an activation
        checkpoint's recomputation) are neither recorded nor counted nor timed:
        the backward of the call that checkpointed them holds that work; the
        call that ran under the checkpoint has ``wrapped`` set.

        Each call's output nodes are kept (not its tensors' data) until the
        hooks come off, so that :meth:`mark_backward` can tell from the step's
        autograd graph which calls the backward runs through
        (``reaches_loss``, ``grad_calls``). Without a :meth:`mark_backward` those
        fields stay ``None`` (every call with grad is taken to have a backward).
        The nodes of outputs no marked backward has reached yet are kept until
        the hooks come off (a later backward may reach them): a discarded graph
        (an output only logged) lives until then instead of being freed at once.
    """

    def __init__(
        self,
        root: nn.Module,
        paths: Iterable[str] | None = None,
        *,
        keep_samples: int | None = None,
        skip: Callable[[nn.Module, tuple[UserValue, ...], dict[str, UserValue]], bool] | None = None,
    ) -> None:
        self._root = weakref.ref(root)
        self._paths = None if paths is None else set(paths)
        self._keep = keep_samples
        self._skip = skip
        self._handles: list[RemovableHandle] = []
        self.calls: dict[str, ComponentInputs] = {}
        #: Leading dimension of the first captured call's inputs (the real batch size).
        self.batch_size: int | None = None
        self._order = 0
        # id(module) -> its training flag when the hooks went on, for ``modes``.
        self._flags: dict[int, bool] = {}
        # The nodes executing now, innermost last (which parent a shared module is called in).
        self._stack: list[str] = []
        # Marks each call's start and end, and the hooks' own work, for the step's in-situ times.
        self._clock = HookClock(_device_of(root))
        # Per open node of ``_stack``: the record its call counts in (None: not recorded).
        self._open: list[ComponentInputs | None] = []
        # Per recorded path: the kind key of its first call and of each variant.
        self._kinds: dict[str, list[tuple[object, ...]]] = {}
        # Bytes of tensors the variants' copies hold (bounded by MAX_VARIANT_BYTES).
        self._variant_bytes = 0
        # Per recorded path: each call's output nodes, until the hooks come off.
        self._outs: dict[str, list[CallOutputs]] = {}

    def _hook(self, places: list[tuple[str, str | None]]) -> Callable[..., None]:
        def pre_hook(module: nn.Module, args: tuple[UserValue, ...], kwargs: dict[str, UserValue]) -> None:
            if _in_backward():  # a checkpoint's recomputation: the backward holds its work
                return
            path = places[0][0]
            clock = self._clock
            clock.hook_start()  # what the hook does (the copy above all) is left out of every time
            kind: ComponentInputs | None = None
            try:
                path = owner(places, self._stack)
                self._stack.append(path)
                self._open.append(None)
                if self._paths is None or path in self._paths:
                    kind = self._record(path, module, args, kwargs)
                    self._open[-1] = kind
            except Exception as e:  # never into the user's step
                if len(self._open) < len(self._stack):
                    self._open.append(None)
                if path not in self.calls:
                    text = f"{type(e).__name__}: {e}".strip()
                    self._failed(path, module, f"capturing the call raised {text[:400]}")
            clock.hook_end()
            clock.open(path)

        return pre_hook

    def _scripted_hooks(
        self, sealed: dict[int, list[tuple[str, str | None]]]
    ) -> tuple[Callable[..., None], Callable[..., None]]:
        """Global forward hooks (pre and post) that capture the calls of the TorchScript modules (``sealed``:
        their nodes by ``id``) as the module hooks capture any other's; a call whose keyword arguments
        cannot be read (:func:`_call_kwargs`) is counted, and recorded as failed with
        :data:`SCRIPTED_UNREAD`. They run for every module's call while the capture is on (a ScriptModule
        refuses a hook of its own): a dict lookup for any other."""
        hooks = {key: self._hook(mine) for key, mine in sealed.items()}
        entered: list[bool] = []  # per open call of a sealed module: whether the capture's hooks took it

        def pre_hook(module: nn.Module, args: tuple[UserValue, ...]) -> None:
            hook = hooks.get(id(module))
            if hook is None:
                return
            kwargs = _call_kwargs()
            entered.append(kwargs is not None)
            if kwargs is not None:
                hook(module, args, kwargs)
                return
            try:
                path = owner(sealed[id(module)], self._stack)
                if _in_backward() or (self._paths is not None and path not in self._paths):
                    return
                seen = self.calls.get(path)
                if seen is not None:
                    seen.calls += 1
                else:
                    self._failed(path, module, SCRIPTED_UNREAD)
            except Exception:  # never into the user's step
                pass

        def post_hook(module: nn.Module, args: tuple[UserValue, ...], output: UserValue) -> None:
            if id(module) in hooks and entered and entered.pop():
                self._post_hook(module, args, output)

        return pre_hook, post_hook

    def _post_hook(self, module: nn.Module, args: tuple[UserValue, ...], output: UserValue) -> None:
        if not self._stack or _in_backward():
            return
        path = self._stack.pop()
        kind = self._open.pop() if self._open else None
        self._clock.close(path)
        if kind is None:
            return
        self._clock.hook_start()
        try:
            # A reentrant checkpoint's graph is built in the backward (its recomputation): reach unknown.
            reentrant = kind.wrapped == "checkpoint (reentrant)"
            grad = torch.is_grad_enabled() or reentrant
            self._outs.setdefault(path, []).append(call_outputs(kind, flatten_output(output)[0], grad, reentrant))
        except Exception:  # never into the user's step: the call's reach stays unknown
            self._outs.setdefault(path, []).append(CallOutputs(kind, torch.is_grad_enabled(), [], unknown=True))
        self._clock.hook_end()

    def mark_backward(self, roots: UserValue) -> None:
        """Mark what the step's backward runs through: call it with the loss (or the tensors whose
        graph is differentiated) before their backward runs; several calls add up (a union).

        Sets every record's ``reaches_loss``, ``grad_calls`` and ``output_mask``
        (and its variants'), walking the autograd graph from ``roots`` (a tensor or
        a pytree of them, dataclass outputs opened); roots without a tensor that
        requires grad mark nothing. Never raises (the fields stay
        as they were); the output nodes are dropped when the hooks come off.
        """
        try:
            tensors = [t for t in flatten_output(roots)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
            if not tensors:  # nothing the capture can see carries graph (an awaitable): reach stays unknown
                return
            nodes, leaves = walk(tensors)
            for outs in self._outs.values():
                mark(outs, nodes, leaves)
            self._fill_reach()
        except Exception:  # never into the user's step
            pass

    def _fill_reach(self) -> None:
        for path, outs in self._outs.items():
            first = self.calls.get(path)
            if first is not None and first.capture_error is None:
                fill_reach(first, outs)

    def _fill_times(self) -> None:
        """Each record's ``insitu_ms``: its forward per call in the captured step, the hooks' own work
        (the copies) left out (:class:`cb_callback._engine.clocks.clock.HookClock`; on CUDA read here,
        after the step)."""
        for path, each in self._clock.durations().items():
            inputs = self.calls.get(path)
            if inputs is not None and each and inputs.capture_error is None:
                inputs.insitu_ms = sum(each) * 1e3 / len(each)
        self._clock.clear()

    def _record(
        self, path: str, module: nn.Module, args: tuple[UserValue, ...], kwargs: dict[str, UserValue]
    ) -> ComponentInputs | None:
        """Record or count one call; return the record it counts in (``None``: not a real call)."""
        if self._skip is not None and self._skip(module, args, kwargs):
            return None
        grad, (wrapped, region) = torch.is_grad_enabled(), _wrapper()
        # A reentrant checkpoint's forward runs again with grad in the backward: that graph is what ran.
        regrad = _recompute_grads(args, kwargs, region) if region is not None else None
        if wrapped == "checkpoint (reentrant)":
            grad = True
        seen = self.calls.get(path)
        if seen is not None:
            seen.calls += 1
            return self._count(path, seen, module, args, kwargs, grad, wrapped, regrad)
        if self.batch_size is None:
            # The first call is the root's (or the first captured module's).
            self.batch_size = leading_batch_size((args, kwargs))
        copied = self._copy(path, module, args, kwargs)
        if copied is None:
            return None
        if regrad is not None:
            _set_recompute_grads(copied, regrad)
        self.calls[path] = ComponentInputs(
            args=copied[0],
            kwargs=copied[1],
            calls=1,
            training=module.training,
            order=self._order,
            grad_enabled=grad,
            wrapped=wrapped,
        )
        self._kinds[path] = [_kind_key(args, kwargs, grad, wrapped)]
        self._order += 1
        return self.calls[path]

    def _copy(
        self, path: str, module: nn.Module, args: tuple[UserValue, ...], kwargs: dict[str, UserValue], fail: bool = True
    ) -> tuple[tuple[UserValue, ...], dict[str, UserValue]] | None:
        """A copy of the call (sliced to ``keep_samples``); ``None`` when it cannot be copied
        (with ``fail``, the record then fails with why)."""
        tree: UserValue = (args, kwargs)
        if self._keep is not None and self.batch_size is not None:
            tree = slice_batch(tree, self.batch_size, self._keep)
        try:
            return copy_call(tuple(tree[0]), dict(tree[1]))
        except InputCopyError as e:
            if fail:
                unknown = [f"{e.where}: {e.type_name}"] if e.uncopyable else []
                self._failed(path, module, str(e), unknown)
            return None

    def _count(
        self,
        path: str,
        seen: ComponentInputs,
        module: nn.Module,
        args: tuple[UserValue, ...],
        kwargs: dict[str, UserValue],
        grad: bool,
        wrapped: str | None,
        regrad: list[bool] | None = None,
    ) -> ComponentInputs | None:
        """Count a later call in the kind it is like, or keep a copy of it as a new variant.

        Beyond :data:`MAX_VARIANTS` kinds, or :data:`MAX_VARIANT_BYTES` of copies, a call of a new
        kind is still kept when no kept kind has its grad mode and autograd wrapper (its class);
        otherwise it is counted in the last kept kind of its class (the nearest in a loop over a
        growing sequence) and in that kind's ``unrepresented``: its row is then approximated. Its
        reach is decided per call all the same (``grad_calls`` counts the calls whose output the
        step's backward ran through, whatever kind they are counted in)."""
        if seen.capture_error is not None:
            return None
        keys = self._kinds.setdefault(path, [])
        key = _kind_key(args, kwargs, grad, wrapped)
        kinds = [seen, *seen.variants]
        if key in keys:
            i = keys.index(key)
            if i > 0:
                kinds[i].calls += 1
            return kinds[i]
        same = [i for i, k in enumerate(keys) if k[-2:] == key[-2:]]  # kinds of its class (grad, wrapper)
        full = len(seen.variants) >= MAX_VARIANTS or self._variant_bytes >= MAX_VARIANT_BYTES
        copied = None if full and same else self._copy(path, module, args, kwargs, fail=False)
        if copied is None:  # beyond the cap (or not copyable): counted in the nearest kind of its class
            near = kinds[same[-1]] if same else seen
            near.unrepresented += 1
            if near is not seen:
                near.calls += 1
            return near
        if regrad is not None:
            _set_recompute_grads(copied, regrad)
        self._variant_bytes += _tensor_bytes(copied)
        variant = ComponentInputs(
            args=copied[0], kwargs=copied[1], calls=1, training=module.training, order=seen.order,
            grad_enabled=grad, wrapped=wrapped,
        )  # fmt: skip
        seen.variants.append(variant)
        keys.append(key)
        return variant

    def _failed(self, path: str, module: nn.Module, error: str, unknown: list[str] | None = None) -> None:
        """Record a call that could not be captured (its row fails with ``error``)."""
        self.calls[path] = ComponentInputs(
            args=(),
            kwargs={},
            calls=1,
            training=module.training,
            order=self._order,
            unknown_leaves=list(unknown or []),
            capture_error=error,
        )
        self._order += 1

    def _fill_modes(self) -> None:
        """Each record's ``modes``: its subtree's flags, as the real step ran them."""
        root = self._root()
        if root is None:
            return
        path_of = {id(m): p for p, m in root.named_modules()}
        by_path = {p: at.module for p, at in component_paths(root).items()}
        for path, inputs in self.calls.items():
            module = by_path.get(path)
            if module is None:
                continue
            modes: dict[str, bool] = {}
            for rel, m in module.named_modules():
                called = self.calls.get(path_of[id(m)]) if id(m) in path_of else None
                modes[rel] = called.training if called is not None else self._flags.get(id(m), m.training)
            modes[""] = inputs.training
            inputs.modes = modes

    def __enter__(self) -> Capture:
        root = self._root()
        if root is None:
            raise RuntimeError("the module to capture no longer exists")
        self._flags = {id(m): m.training for m in root.modules()}
        self._stack = []
        places: dict[int, list[tuple[str, str | None]]] = {}
        modules: dict[int, nn.Module] = {}
        for path, at in component_paths(root).items():
            places.setdefault(id(at.module), []).append((path, at.parent))
            modules[id(at.module)] = at.module
        sealed: dict[int, list[tuple[str, str | None]]] = {}  # the TorchScript modules' nodes
        try:
            for key, module in modules.items():
                mine = places[key]
                if self._paths is not None and not any(p in self._paths for p, _ in mine):
                    continue
                if scripted(module):
                    sealed[key] = mine
                    continue
                self._handles.append(module.register_forward_pre_hook(self._hook(mine), with_kwargs=True))
                # always_call: the stack is popped also when the forward raises.
                self._handles.append(module.register_forward_hook(self._post_hook, always_call=True))
            if sealed:  # hooks on every module's call (a ScriptModule refuses its own): only theirs count
                pre, post = self._scripted_hooks(sealed)
                self._handles.append(register_module_forward_pre_hook(pre))
                self._handles.append(register_module_forward_hook(post, always_call=True))
        except BaseException:
            self.remove()
            raise
        return self

    def remove(self) -> None:
        """Remove every hook, fill the records' ``modes`` and drop the calls' output nodes (idempotent)."""
        if not self._handles:
            return
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._outs.clear()  # the output nodes (and what they hold of the step's graph)
        self._open.clear()
        try:
            self._fill_modes()
        except Exception:  # never into the user's step; the replays fall back to ``training``
            for inputs in self.calls.values():
                inputs.modes = {}
        try:
            self._fill_times()
        except Exception:  # the times are a bonus: never into the user's step
            self._clock.clear()

    @property
    def stored_batch_size(self) -> int | None:
        """The batch size the stored inputs hold (``keep_samples`` if it sliced)."""
        if self.batch_size is None or self._keep is None:
            return self.batch_size
        return min(self.batch_size, self._keep)

    @property
    def active(self) -> bool:
        """Whether hooks are installed."""
        return bool(self._handles)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()


def _in_backward() -> bool:
    """Whether autograd is running a backward now (a checkpoint recomputing its forward)."""
    try:
        return bool(torch._C._current_graph_task_id() != -1)
    except Exception:
        return False


def _call_kwargs() -> dict[str, UserValue] | None:
    """The keyword arguments of the module call a global forward pre-hook runs in (``Module._call_impl``'s,
    which such a hook is not given), or ``None`` when that frame is not found (another torch)."""
    try:
        frame: types.FrameType | None = sys._getframe(1)
        for _ in range(6):
            if frame is None:
                return None
            if frame.f_code.co_name == "_call_impl":
                kwargs = frame.f_locals.get("kwargs")
                return dict(kwargs) if isinstance(kwargs, dict) else None
            frame = frame.f_back
    except Exception:  # never into the user's step: the call is then recorded as failed
        return None
    return None


def _reentrant_checkpoint() -> tuple[UserValue, ...] | None:
    """The arguments of the reentrant ``torch.utils.checkpoint`` the call runs inside (its forward
    under no_grad), or ``None`` when it runs in none."""
    frame: types.FrameType | None = sys._getframe(2)
    for _ in range(64):
        if frame is None:
            return None
        if getattr(frame.f_code, "co_qualname", frame.f_code.co_name) == "CheckpointFunction.forward":
            args = frame.f_locals.get("args", ())
            return tuple(args) if isinstance(args, tuple) else ()
        frame = frame.f_back
    return None


def _recompute_grads(
    args: tuple[UserValue, ...], kwargs: dict[str, UserValue], region: tuple[UserValue, ...]
) -> list[bool]:
    """Per leaf of a call inside a reentrant checkpoint, whether it requires grad in the recompute
    (what the step's backward ran): the region's own inputs keep their flag; any other floating-point
    tensor computed under the region's no_grad is taken to be derived from them or from the region's
    parameters (it requires grad when the step's backward recomputes it), if the region has a
    backward at all (one of its inputs requires grad: a reentrant checkpoint has none otherwise).
    An approximation: a constant tensor made inside the region is counted as derived too."""
    own = {id(t) for t in region if isinstance(t, torch.Tensor)}
    live = any(isinstance(t, torch.Tensor) and t.requires_grad for t in region)
    return [
        live and isinstance(x, torch.Tensor) and id(x) not in own and not x.requires_grad
        and (x.is_floating_point() or x.is_complex())
        for x in pytree.tree_leaves((args, kwargs))
    ]  # fmt: skip


def _set_recompute_grads(copied: tuple[tuple[UserValue, ...], dict[str, UserValue]], flags: list[bool]) -> None:
    """Mark the copy's leaves that require grad in the recompute (:func:`_recompute_grads`)."""
    leaves = pytree.tree_leaves(copied)
    if len(leaves) != len(flags):  # an object copied whole: its leaves are not the originals'
        return
    for x, flag in zip(leaves, flags, strict=True):
        if flag and isinstance(x, torch.Tensor) and x.is_leaf:
            x.requires_grad_(True)


def _wrapper() -> tuple[str | None, tuple[UserValue, ...] | None]:
    """The autograd wrapper a call runs under (``ComponentInputs.wrapped``), or ``None``; with it,
    the arguments of the reentrant checkpoint it runs inside (``None`` for any other)."""
    try:
        hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
    except Exception:  # a torch without it: no saved-tensor hooks are seen
        hooks = None
    if hooks is not None:
        name = getattr(hooks[0], "__qualname__", "")
        return ("checkpoint" if "_checkpoint_hook" in name else "saved_tensors_hooks"), None
    region = None if torch.is_grad_enabled() else _reentrant_checkpoint()
    if region is not None:
        return "checkpoint (reentrant)", region
    return None, None


_SCALARS = (int, float, bool, str, type(None))


def _kind_key(
    args: tuple[UserValue, ...], kwargs: dict[str, UserValue], grad: bool, wrapped: str | None
) -> tuple[object, ...]:
    """What tells one kind of call from another: its input signature, which input tensors require
    grad (their gradients are part of the backward), its non-tensor arguments (numbers, strings),
    its grad mode and its autograd wrapper."""
    leaves = pytree.tree_leaves((args, kwargs))
    scalars = tuple(repr(x)[:64] for x in leaves if isinstance(x, _SCALARS))
    needs = tuple(x.requires_grad for x in leaves if isinstance(x, torch.Tensor))
    return (input_signature(ComponentInputs(args=args, kwargs=kwargs)), needs[:64], scalars[:32], grad, wrapped)


def _tensor_bytes(tree: object) -> int:
    """Bytes of the tensors among ``tree``'s pytree leaves (an object copied whole counts 0)."""
    return sum(x.numel() * x.element_size() for x in pytree.tree_leaves(tree) if isinstance(x, torch.Tensor))


def _device_of(root: nn.Module) -> torch.device | None:
    """The device of ``root``'s first parameter or buffer (``None`` for a module without any)."""
    for t in (*root.parameters(), *root.buffers()):
        return t.device
    return None
