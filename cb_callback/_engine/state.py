"""Save and restore everything profiling could change: buffers, written weights, grads, flags, RNG."""

from __future__ import annotations

import contextlib
import random
import warnings
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType

import numpy as np
import torch
from torch import nn

__all__ = ["RngState", "StateGuard", "register_state_saver", "seeded"]

# Extra savers: callables ``saver(module) -> restore()`` for state that is not a
# parameter or buffer (e.g. an optimizer step counter kept as a python attribute).
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

    Args:
        module: the tree to guard.
    """

    def __init__(self, module: nn.Module) -> None:
        self._module = module
        self._params: list[_Param] = []
        self._buffers: list[tuple[nn.Module, str, torch.Tensor | None, torch.Tensor | None]] = []
        self._flags: list[tuple[nn.Module, bool]] = []
        self._restorers: list[Callable[[], None]] = []
        self._rng: RngState | None = None
        self._grad_mode = True

    def __enter__(self) -> StateGuard:
        written = _written_by_replays(self._module)
        owned = {id(t) for owns in _OWNS for t in owns(self._module)}
        with torch.no_grad():
            for name, p in self._module.named_parameters():
                self._params.append(_Param(name, p, id(p) in written and id(p) not in owned, id(p) in owned))
            for mod in self._module.modules():
                self._flags.append((mod, mod.training))
                for name, buf in mod._buffers.items():
                    self._buffers.append((mod, name, buf, None if buf is None else buf.detach().clone()))
        self._restorers = [saver(self._module) for saver in _SAVERS]
        self._rng = RngState()
        self._grad_mode = torch.is_grad_enabled()
        return self

    def copied_bytes(self) -> dict[str, int]:
        """Bytes of the guard's own copies by the device that holds them (``"cpu"``, ``"cuda:0"``).

        Buffers' copies are on their device; written parameters' and their
        gradients' copies on the host (``"cpu"``). Savers' copies are not counted.
        """
        out: dict[str, int] = {}
        copies = [c for *_, c in self._buffers] + [t for s in self._params for t in (s.data, s.grad_copy)]
        for c in copies:
            if c is not None:
                out[str(c.device)] = out.get(str(c.device), 0) + c.numel() * c.element_size()
        return out

    def restore(self) -> None:
        """Put everything back (the guard stays usable)."""
        lost: list[str] = []
        with torch.no_grad():
            for saved in self._params:
                name = saved.restore()
                if name is not None:
                    lost.append(name)
            for mod, name, original, copy in self._buffers:
                if original is None or copy is None:
                    mod._buffers[name] = original
                    continue
                if mod._buffers.get(name) is not original:
                    mod._buffers[name] = original
                original.copy_(copy)
        for mod, flag in self._flags:
            mod.training = flag
        for restore in self._restorers:
            restore()
        if self._rng is not None:
            self._rng.restore()
        torch.set_grad_enabled(self._grad_mode)
        if lost:
            warnings.warn(
                f"cb_callback: profiling wrote {len(lost)} parameter(s) or gradient(s) in place that the "
                f"state guard holds no copy of ({', '.join(lost[:5])}{' …' if len(lost) > 5 else ''}), so they "
                "keep the changed values. Only parameters with gradient hooks and max_norm embeddings are "
                "copied; register a state saver (cb_callback.register_state_saver) for the others.",
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
