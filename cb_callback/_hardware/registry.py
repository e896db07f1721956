"""The GPU entries peaks resolve from: the built-in table plus the user's registrations.

A user with a GPU the table lacks (GH200, MI300X, a new part) adds it once with
:func:`register_device_peaks` instead of passing ``peak_flops=`` / ``peak_bandwidth=``
at every call; :func:`gpu_spec` looks a device name up in both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from cb_callback._hardware.names import (
    FORMS,
    device_tokens,
    is_memory_token,
    match_spec,
    name_form,
    overlap,
)
from cb_callback._hardware.table import DTYPES, GPU_SPECS, GpuSpec

__all__ = ["gpu_spec", "is_registered", "register_device_peaks", "registered_specs"]

#: The user's entries, in registration order (tests replace the list).
_REGISTERED: list[GpuSpec] = []


def registered_specs() -> tuple[GpuSpec, ...]:
    """The entries added with :func:`register_device_peaks` in this process."""
    return tuple(_REGISTERED)


def is_registered(spec: GpuSpec) -> bool:
    """Whether ``spec`` is a user registration rather than a built-in table entry."""
    return any(spec is entry for entry in _REGISTERED)


def gpu_spec(device_name: str) -> GpuSpec | None:
    """The table entry for a CUDA device name, or ``None`` if no entry (or several) match.

    Args:
        device_name: what ``torch.cuda.get_device_name()`` returns, e.g.
            ``"NVIDIA H100 80GB HBM3"`` or ``"Tesla V100-SXM2-16GB"``.

    Returns:
        The single entry, built-in or registered, whose model token, form factor
        and memory size the name matches (see
        :func:`cb_callback._hardware.names.match_spec`), or ``None`` when none or
        several do.

    Notes:
        The matching rules are :func:`cb_callback._hardware.names.match_spec`'s
        (whole tokens: ``"L4"`` never matches ``"L40S"``). Registrations never
        overlap an existing entry, so which table a name matches in never
        depends on order.
    """
    return match_spec(device_name, (*_REGISTERED, *GPU_SPECS))


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _describe(spec: GpuSpec) -> str:
    return (
        f"{'registered' if is_registered(spec) else 'built-in'} entry {spec.name!r} "
        f"(model {spec.model!r}, form {spec.form!r}, memory_gb {spec.memory_gb!r})"
    )


def _checked_entry(
    where: str,
    name: object,
    model: object,
    flops: object,
    bandwidth: object,
    source: object,
    form: object,
    memory_gb: object,
    default_form: object,
    verified: object,
) -> str:
    """The entry's model word, lower-cased, once every argument is valid.

    Raises:
        ValueError: naming the argument and what it must be.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{where}: name must be a non-empty string")
    if not isinstance(source, str) or not source.strip():
        raise ValueError(f"{where}: source= must say where the figures come from")
    if not isinstance(verified, bool):
        raise ValueError(f"{where}: verified= must be True or False, not {verified!r}")
    token = model.lower() if isinstance(model, str) else model
    if (
        not isinstance(token, str)
        or device_tokens(token) != [token]
        or name_form([token]) is not None
        or is_memory_token(token)
    ):
        raise ValueError(
            f"{where}: model={model!r} must be one model word of the device name, "
            "e.g. 'gh200' for 'NVIDIA GH200 480GB' (letters and digits, not a vendor, "
            "form-factor or memory-size word)"
        )
    if form is not None and form not in FORMS:
        raise ValueError(f"{where}: form={form!r} must be None or one of {FORMS}")
    if memory_gb is not None and (isinstance(memory_gb, bool) or not isinstance(memory_gb, int) or memory_gb <= 0):
        raise ValueError(f"{where}: memory_gb={memory_gb!r} must be None or a positive int")
    if not isinstance(default_form, bool):
        raise ValueError(f"{where}: default_form= must be True or False")
    if not isinstance(flops, Mapping) or not flops:
        raise ValueError(f"{where}: flops= must map at least one peak key in {DTYPES} to FLOP/s")
    unknown = sorted(str(key) for key in flops if key not in DTYPES)
    if unknown:
        raise ValueError(f"{where}: flops= has unknown peak keys {unknown}; use keys of {DTYPES}")
    for key, value in flops.items():
        if not _positive(value):
            raise ValueError(f"{where}: flops[{key!r}]={value!r} must be a positive finite number (FLOP/s)")
    if not _positive(bandwidth):
        raise ValueError(f"{where}: bandwidth={bandwidth!r} must be a positive finite number (bytes/s)")
    return token


def register_device_peaks(
    name: str,
    *,
    model: str,
    flops: Mapping[str, float],
    bandwidth: float,
    source: str,
    verified: bool = False,
    form: str | None = None,
    memory_gb: int | None = None,
    default_form: bool = False,
) -> GpuSpec:
    """Add a GPU the datasheet table lacks, once per process, for every later profile.

    Example::

        import cb_callback

        cb_callback.register_device_peaks(
            "GH200 96GB",
            model="gh200",  # torch.cuda.get_device_name() == "NVIDIA GH200 480GB"
            flops={"fp32": 67e12, "tf32": 494.5e12, "bf16": 989.5e12, "fp16": 989.5e12,
                   "fp8": 1979e12},  # dense; NVIDIA's "with sparsity" figures halved
            bandwidth=4.0e12,  # bytes/s
            source="NVIDIA GH200 Grace Hopper Superchip datasheet, GPU column",
            verified=True,
        )

    Args:
        name: the entry's name, shown in the report's peak reference; unique.
        model: the model token the device name must contain, as one lower-case
            word of ``torch.cuda.get_device_name()`` split on anything that is not
            a letter or digit (``"gh200"`` for ``"NVIDIA GH200 480GB"``,
            ``"mi300x"`` for ``"AMD Instinct MI300X"``); case does not matter.
        flops: dense peak FLOP/s per peak key (``"fp32"``, ``"tf32"``, ``"bf16"``,
            ``"fp16"``, ``"fp8"``, ``"fp64"``); at least one. A key left out is
            unknown: its MFU is empty, with one warning.
        bandwidth: peak memory bandwidth in bytes/s.
        source: where the figures come from (a datasheet and its URL); it is
            recorded in ``report.metadata["peaks"]["reference"]``.
        verified: whether the figures were checked against that source; an
            unverified entry says so in the report's metadata (``"verified": false``).
        form: the form-factor token the name must carry (``"sxm"``, ``"pcie"``,
            ``"nvl"``), or ``None`` to match every form.
        memory_gb: the ``"<n>GB"`` token the name must carry, or ``None`` to match
            every memory size.
        default_form: with ``form`` set, whether a name without any form token
            means this entry too.

    Returns:
        The new :class:`~cb_callback._hardware.table.GpuSpec`.

    Raises:
        ValueError: for a non-positive or non-finite figure, an unknown peak key,
            an empty ``flops``, ``name`` or ``source``, a ``model`` that is not one
            token of a device name, an unknown ``form``, or an entry that would
            duplicate an existing one: the same name, or a model / form / memory
            that some device name could match together with an existing entry,
            built-in or registered (that name would then resolve to neither).

    Notes:
        Registrations take no precedence over the built-in table and the table
        none over them: an overlapping entry is refused, so every device name
        means at most one entry. To correct a built-in entry's figures, pass
        ``peak_flops=`` / ``peak_bandwidth=`` (they win over every table).
        The registry is per process: register at import time (module level of the
        training script or a module it imports) so that ``mode="fork"``'s spawned
        child, which re-imports ``__main__``, and ``cb replay --script`` see it.
        Resolved figures carry the source ``"registered"``.
    """
    where = f"register_device_peaks({name!r})"
    token = _checked_entry(where, name, model, flops, bandwidth, source, form, memory_gb, default_form, verified)

    spec = _new_spec(name, token, flops, bandwidth, source, verified, form, memory_gb, default_form)
    _refuse_duplicate(where, spec)
    _REGISTERED.append(spec)
    return spec


def _new_spec(
    name: str,
    token: str,
    flops: Mapping[str, float],
    bandwidth: float,
    source: str,
    verified: bool,
    form: str | None,
    memory_gb: int | None,
    default_form: bool,
) -> GpuSpec:
    """The checked arguments as a :class:`GpuSpec`: figures as floats, a peak key left out ``None``."""
    figures = {key: float(flops[key]) if key in flops else None for key in DTYPES}
    return GpuSpec(
        name=name,
        model=token,
        form=form,
        memory_gb=memory_gb,
        default_form=default_form,
        fp32=figures["fp32"],
        tf32=figures["tf32"],
        bf16=figures["bf16"],
        fp16=figures["fp16"],
        fp8=figures["fp8"],
        bandwidth=float(bandwidth),
        reference=source,
        verified=verified,
        fp64=figures["fp64"],
    )


def _refuse_duplicate(where: str, spec: GpuSpec) -> None:
    """Raise unless ``spec`` is new: no entry, built-in or registered, has its name or overlaps it.

    Raises:
        ValueError: naming the first such entry (built-in ones first, then in registration order).
    """
    for existing in (*GPU_SPECS, *_REGISTERED):
        if existing.name.lower() == spec.name.lower():
            raise ValueError(f"{where}: the {_describe(existing)} already has this name")
        if overlap(existing, spec):
            raise ValueError(
                f"{where}: duplicates the {_describe(existing)}: a device name could match "
                "both and would then resolve to neither. Give a form=<'sxm', 'pcie' or 'nvl'> or "
                "memory_gb=<GB> that "
                "tells them apart, or pass peak_flops=<FLOP/s> / peak_bandwidth=<bytes/s> to override a "
                "built-in entry's figures"
            )
