"""Lightning precision strings read with torch alone: compute dtype, autocast or not.

One table for every place that needs it: the callback (the MFU peak's dtype) and
snapshots (the replay's forward context), neither importing Lightning for it.
"""

from __future__ import annotations

import torch

from cb_callback._engine.run.config import resolve_dtype

__all__ = ["AUTOCAST_DTYPES", "DEFAULT_DTYPES", "PRECISIONS", "peak_dtype"]

#: Lightning precision -> (compute dtype, whether it autocasts). ``*-mixed`` (and the
#: short ``"bf16"`` / ``"16"``) autocast to the dtype; ``*-true`` (and ``"64"``) set
#: it as the default dtype. Precisions not listed (``"32-true"``) change nothing.
PRECISIONS: dict[str, tuple[torch.dtype, bool]] = {
    "bf16-mixed": (torch.bfloat16, True), "bf16": (torch.bfloat16, True),
    "16-mixed": (torch.float16, True), "16": (torch.float16, True),
    "bf16-true": (torch.bfloat16, False), "16-true": (torch.float16, False),
    "64-true": (torch.float64, False), "64": (torch.float64, False),
}  # fmt: skip

#: The autocasting precisions and their dtype.
AUTOCAST_DTYPES: dict[str, torch.dtype] = {p: d for p, (d, cast) in PRECISIONS.items() if cast}

#: The precisions that set the default dtype, and that dtype.
DEFAULT_DTYPES: dict[str, torch.dtype] = {p: d for p, (d, cast) in PRECISIONS.items() if not cast}


def peak_dtype(precision: object) -> str | None:
    """The MFU peak key of a Lightning precision, ``None`` to let the engine infer it.

    ``bf16-*`` -> ``"bf16"``, ``16-*`` -> ``"fp16"``, ``64-*`` -> ``"fp64"``;
    ``"32-true"``, ``None`` and anything unknown -> ``None``.
    """
    entry = PRECISIONS.get(str(precision)) if precision is not None else None
    return None if entry is None else resolve_dtype(entry[0])[1]
