"""Whether a device exists on this machine, said in words (one check for every entry point)."""

from __future__ import annotations

import torch

__all__ = ["device_problem"]


def device_problem(device: str | torch.device) -> str | None:
    """Why ``device`` cannot be used on this machine, in words; ``None`` when it can.

    Checked: that torch knows the device string, that CUDA is built into this
    torch and finds a device, that a ``cuda:N`` index exists, and for other
    device types (``mps``, ``xpu`` ...) their backend's ``is_available()``.
    """
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        return f"{str(device)!r} is not a device torch knows ({e})"
    build = f"torch {torch.__version__}"
    if dev.type == "cuda":
        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            return f"CUDA is not available: {build} is built without CUDA (torch.version.cuda is None)"
        if not torch.cuda.is_available():
            return (
                f"CUDA is not available: {build} is built with CUDA {torch.version.cuda or torch.version.hip} "
                "but finds no CUDA device (torch.cuda.is_available() is False: no GPU, its driver, or "
                "CUDA_VISIBLE_DEVICES)"
            )
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            return f"there is no {dev}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
        return None
    if dev.type == "mps":
        return None if torch.backends.mps.is_available() else f"MPS is not available in {build} on this machine"
    is_available = getattr(getattr(torch, dev.type, None), "is_available", None)
    if callable(is_available) and not is_available():
        return f"{dev.type} is not available in {build} on this machine ({dev.type}.is_available() is False)"
    return None
