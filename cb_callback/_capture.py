"""Capture every submodule's real inputs during one real forward."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any

from torch import nn
from torch.utils.hooks import RemovableHandle

from cb_callback._inputs import ComponentInputs, clone_tree, leading_batch_size, slice_batch

__all__ = ["Capture"]


class Capture:
    """Forward pre-hooks that record each module's first call and count its calls.

    Use as a context manager around one real forward (a training step)::

        with Capture(model) as cap:
            loss = model(x).sum()
        cap.calls[""]  # ComponentInputs of the root

    Args:
        root: the module tree to capture.
        paths: the dotted paths to capture (default: every module once, under the
            first name ``named_modules()`` gives it).
        keep_samples: keep only the first ``k`` samples of every input whose
            leading dimension is the root's batch size (small-batch capture).
        skip: ``skip(module, args, kwargs)`` -> whether a call is not a real one
            (neither recorded nor counted), e.g. a framework calling ``forward``
            to redirect into ``training_step``.

    Notes:
        The copy is taken when the module is entered: an in-place op later in the
        step does not change what was captured. The hooks hold paths, not
        modules; the capture keeps only a weak reference to ``root``. Hooks come
        off in ``__exit__``, also when the forward raises.
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

    def _hook(self, path: str) -> Callable[..., None]:
        def pre_hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if self._skip is not None and self._skip(module, args, kwargs):
                return
            seen = self.calls.get(path)
            if seen is not None:
                seen.calls += 1
                return
            if self.batch_size is None:
                # The first call is the root's (or the first captured module's).
                self.batch_size = leading_batch_size((args, kwargs))
            unknown: list[str] = []
            tree: Any = (args, kwargs)
            if self._keep is not None and self.batch_size is not None:
                tree = slice_batch(tree, self.batch_size, self._keep)
            c_args, c_kwargs = clone_tree(tree, unknown)
            self.calls[path] = ComponentInputs(
                args=tuple(c_args),
                kwargs=dict(c_kwargs),
                calls=1,
                training=module.training,
                order=self._order,
                unknown_leaves=sorted(set(unknown)),
            )
            self._order += 1

        return pre_hook

    def __enter__(self) -> Capture:
        root = self._root()
        if root is None:
            raise RuntimeError("the module to capture no longer exists")
        try:
            for path, module in root.named_modules():
                if self._paths is None or path in self._paths:
                    self._handles.append(
                        module.register_forward_pre_hook(self._hook(path), with_kwargs=True)
                    )
        except BaseException:
            self.remove()
            raise
        return self

    def remove(self) -> None:
        """Remove every hook (idempotent)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

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
