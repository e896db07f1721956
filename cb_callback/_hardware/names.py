"""Matching CUDA device names to table entries by whole tokens.

``torch.cuda.get_device_name()`` strings come in many spellings
(``"NVIDIA A100-SXM4-80GB"``, ``"NVIDIA A100 80GB PCIe"``, ``"NVIDIA H100 80GB HBM3"``);
an entry names the tokens it needs (model, form factor, memory size) and this
module decides which entries a name means. Pure functions over the entries given.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from cb_callback._hardware.table import GpuSpec

__all__ = [
    "FORMS",
    "device_tokens",
    "is_memory_token",
    "match_spec",
    "name_form",
    "name_memory_gb",
    "overlap",
]

#: The form-factor tokens a device name can carry, as :func:`name_form` reports them.
FORMS: tuple[str, ...] = ("sxm", "pcie", "nvl")

_VENDOR_TOKENS = frozenset({"nvidia", "tesla", "geforce", "quadro"})
_MEMORY_TOKEN = re.compile(r"^(\d+)gb$")


def device_tokens(device_name: str) -> list[str]:
    """Lower-case alphanumeric tokens: ``"NVIDIA A100-SXM4-80GB"`` -> ``[a100, sxm4, 80gb]``.

    Vendor words (``nvidia``, ``tesla``, ``geforce``, ``quadro``) are dropped.
    """
    return [t for t in re.split(r"[^a-z0-9]+", device_name.lower()) if t and t not in _VENDOR_TOKENS]


def name_form(tokens: list[str]) -> str | None:
    """The form factor the tokens name (one of :data:`FORMS`), ``None`` if none."""
    if "nvl" in tokens:
        return "nvl"
    if any(t in ("pcie", "pci") for t in tokens):
        return "pcie"
    if any(re.fullmatch(r"sxm\d*", t) for t in tokens):
        return "sxm"
    return None


def name_memory_gb(tokens: list[str]) -> int | None:
    """The memory size a ``"<n>gb"`` token names, ``None`` if there is none."""
    return next((int(m.group(1)) for t in tokens if (m := _MEMORY_TOKEN.match(t))), None)


def is_memory_token(token: str) -> bool:
    """Whether ``token`` is a memory size such as ``"80gb"``."""
    return _MEMORY_TOKEN.match(token) is not None


def _accepts(spec: GpuSpec, form: str | None, memory: int | None) -> bool:
    """Whether a name of ``spec``'s model with this form and memory token means ``spec``."""
    return (spec.form is None or spec.form == form or (form is None and spec.default_form)) and (
        spec.memory_gb is None or spec.memory_gb == memory
    )


def match_spec(device_name: str, specs: Iterable[GpuSpec]) -> GpuSpec | None:
    """The single entry of ``specs`` that ``device_name`` means, or ``None``.

    Args:
        device_name: what ``torch.cuda.get_device_name()`` returns.
        specs: the entries to choose from.

    Returns:
        The one entry whose model token, form factor and memory size the name
        matches, or ``None`` when none or several do.

    Notes:
        Matching is by whole tokens after lower-casing and splitting on anything
        that is not a letter or digit, so ``"L4"`` never matches ``"L40S"``,
        ``"A10"`` never matches ``"A100"`` and ``"H20"`` never matches ``"H200"``.
        A name without a form-factor token means the model's default entry
        (``"NVIDIA H200"`` is the SXM part); an entry with a memory size needs the
        name to carry it (an A100 name must say its form factor and memory size,
        because the bandwidths of the four SKUs differ).
    """
    specs = list(specs)
    models = {spec.model for spec in specs}
    tokens = device_tokens(device_name)
    model = next((t for t in tokens if t in models), None)
    if model is None:
        return None
    form, memory = name_form(tokens), name_memory_gb(tokens)
    matches = [spec for spec in specs if spec.model == model and _accepts(spec, form, memory)]
    return matches[0] if len(matches) == 1 else None


def overlap(a: GpuSpec, b: GpuSpec) -> bool:
    """Whether some device name could mean both entries (so neither would be chosen).

    Notes:
        Two entries of one model overlap when a form token (or none) and a memory
        token (or none) exist that both accept: checking no form, each entry's own
        form and each entry's own memory size (or none) covers every case, since a
        name's other tokens are accepted only by entries that leave them open.
    """
    if a.model != b.model:
        return False
    forms = {None, a.form, b.form}
    memories = {None, a.memory_gb, b.memory_gb}
    return any(_accepts(a, f, m) and _accepts(b, f, m) for f in forms for m in memories)
