"""Default tolerances for comparing tensors, by dtype (those of ``torch.testing.assert_close``)."""

from __future__ import annotations

import torch

__all__ = ["DEFAULT_TOLERANCES", "default_tolerances"]

#: ``dtype -> (rtol, atol)``: the defaults of :func:`torch.testing.assert_close`
#: (its ``_DTYPE_PRECISIONS``); integer and bool tensors must be equal (0, 0).
DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex32: (1e-3, 1e-5),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}


def default_tolerances(dtype: torch.dtype) -> tuple[float, float]:
    """``(rtol, atol)`` for comparing tensors of ``dtype`` (see :data:`DEFAULT_TOLERANCES`)."""
    return DEFAULT_TOLERANCES.get(dtype, (0.0, 0.0))
