"""Capture every submodule's real inputs during one real forward."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from cb_callback._engine.clock import HookClock
from cb_callback._engine.inputs import (
    ComponentInputs,
    InputCopyError,
    copy_call,
    leading_batch_size,
    slice_batch,
)
from cb_callback._engine.tree import component_paths, owner

__all__ = ["Capture"]


class Capture:
    """Forward pre-hooks that record each module's first call and count its calls.

    Use as a context manager around one real forward (a training step)::

        with Capture(model) as cap:
            loss = model(x).sum()
        cap.calls[""]  # ComponentInputs of the root

    Args:
        root: the module tree to capture.
        paths: the dotted paths to capture (default: every node of
            :func:`cb_callback._engine.tree.component_paths`: each module once per
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

        Each record's ``insitu_ms`` is the module's forward per call in the
        captured step, filled when the hooks come off: the hooks mark a clock
        when a module's own work starts and ends, and bracket their own work
        (the copy of the call) so that it is left out of every time, the
        parent's included (:class:`cb_callback._engine.clock.HookClock`; on CUDA
        events, read once when the hooks come off). The copies still leave
        caches colder than an unhooked step would: the engine's in-situ pass
        (``insitu_ms`` of the report) copies nothing.
    """

    def __init__(
        self,
        root: nn.Module,
        paths: Iterable[str] | None = None,
        *,
        keep_samples: int | None = None,
        skip: Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], bool] | None = None,
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

    def _hook(self, places: list[tuple[str, str | None]]) -> Callable[..., None]:
        def pre_hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            path = places[0][0]
            clock = self._clock
            clock.hook_start()  # what the hook does (the copy above all) is left out of every time
            try:
                path = owner(places, self._stack)
                self._stack.append(path)
                if self._paths is None or path in self._paths:
                    self._record(path, module, args, kwargs)
            except Exception as e:  # never into the user's step
                if path not in self.calls:
                    text = f"{type(e).__name__}: {e}".strip()
                    self._failed(path, module, f"capturing the call raised {text[:400]}")
            clock.hook_end()
            clock.open(path)

        return pre_hook

    def _post_hook(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._stack:
            self._clock.close(self._stack.pop())

    def _fill_times(self) -> None:
        """Each record's ``insitu_ms``: its forward per call in the captured step, the hooks' own work
        (the copies) left out (:class:`cb_callback._engine.clock.HookClock`; on CUDA read here, after the step)."""
        for path, each in self._clock.durations().items():
            inputs = self.calls.get(path)
            if inputs is not None and each and inputs.capture_error is None:
                inputs.insitu_ms = sum(each) * 1e3 / len(each)
        self._clock.clear()

    def _record(self, path: str, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._skip is not None and self._skip(module, args, kwargs):
            return
        seen = self.calls.get(path)
        if seen is not None:
            seen.calls += 1
            return
        if self.batch_size is None:
            # The first call is the root's (or the first captured module's).
            self.batch_size = leading_batch_size((args, kwargs))
        tree: Any = (args, kwargs)
        if self._keep is not None and self.batch_size is not None:
            tree = slice_batch(tree, self.batch_size, self._keep)
        try:
            c_args, c_kwargs = copy_call(tuple(tree[0]), dict(tree[1]))
        except InputCopyError as e:
            unknown = [f"{e.where}: {e.type_name}"] if e.uncopyable else []
            self._failed(path, module, str(e), unknown)
            return
        self.calls[path] = ComponentInputs(
            args=c_args,
            kwargs=c_kwargs,
            calls=1,
            training=module.training,
            order=self._order,
            grad_enabled=torch.is_grad_enabled(),
        )
        self._order += 1

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
        try:
            for key, module in modules.items():
                mine = places[key]
                if self._paths is not None and not any(p in self._paths for p, _ in mine):
                    continue
                self._handles.append(module.register_forward_pre_hook(self._hook(mine), with_kwargs=True))
                # always_call: the stack is popped also when the forward raises.
                self._handles.append(module.register_forward_hook(self._post_hook, always_call=True))
        except BaseException:
            self.remove()
            raise
        return self

    def remove(self) -> None:
        """Remove every hook and fill the records' ``modes`` (idempotent)."""
        if not self._handles:
            return
        for h in self._handles:
            h.remove()
        self._handles.clear()
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


def _device_of(root: nn.Module) -> torch.device | None:
    """The device of ``root``'s first parameter or buffer (``None`` for a module without any)."""
    for t in (*root.parameters(), *root.buffers()):
        return t.device
    return None
