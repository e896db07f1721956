"""Names the results model and its renderers share (a leaf: imports nothing of the package).

The types of a row's data: its :data:`Status`, and :class:`RowDetails`, the keys
of ``ComponentRow.details`` the package writes, each documented where it is
declared (docs/columns.md lists the same keys: a test holds the two together).

A float below is NaN when unknown; ``report.json`` has no NaN (it writes
``null``), so a loaded report holds ``None`` where the run held NaN: the keys
that can be NaN are typed ``float | None``.

Plugins add keys of their own (``MetricPlugin.measure`` returns any key that is
not a column): a ``RowDetails`` is a plain ``dict`` at run time and keeps them,
in ``report.json`` too. A type checker knows only the keys declared here: a
plugin's own key is read with ``row.details.get("my_key")`` (typed ``object``)
or through a cast to ``dict[str, Any]``; the engine writes them through
:func:`plugin_details`, which is that cast.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict, cast, get_args

__all__ = [
    "SCHEMA_VERSION",
    "STATUSES",
    "AboveParent",
    "As",
    "BwCeiling",
    "CallSet",
    "FloorMs",
    "Group",
    "InSitu",
    "Lockstep",
    "Roofline",
    "RowDetails",
    "Sharded",
    "Status",
    "Timing",
    "plugin_details",
]

#: The version of ``report.json``'s layout, written at its top level as ``"schema_version"``.
#: A file without it is version 1 (cb_callback before the key: the same rows and metadata).
SCHEMA_VERSION = 2

#: A row's status. See docs/columns.md for their meaning.
Status = Literal["ok", "estimated", "failed", "not_run", "skipped"]

#: Every status a row can have, in the order the tables count them.
STATUSES: tuple[Status, ...] = get_args(Status)

#: ``details["as"]``: how a row of repeated structure, or one left in situ, got its numbers.
As = Literal["measured", "representative", "insitu"]


class Timing(TypedDict, total=False):
    """``details["timing"]``: how the latency metric's timed runs went."""

    #: Interleaved rounds the runs were spread over.
    rounds: int
    #: Involuntary context switches per second of sampling (NaN when nothing was timed).
    switches_per_s: float | None
    #: Whether the component was measured again (its first runs were disturbed).
    remeasured: bool
    #: Whether a component longer than its budget stopped before ``min_repeats``: its runs agreed.
    settled: bool


class Roofline(TypedDict, total=False):
    """``details["roofline"]``: how ``bound`` was decided (docs/columns.md, "bound: the roofline")."""

    #: The row's ``bound``: ``"compute"``, ``"memory"`` or ``"latency"`` (``None`` at the floor).
    bound: str | None
    #: The roof that binds at this intensity: ``"compute"`` or ``"memory"`` (needs no time).
    roof: str
    #: The row's fraction of that roof (NaN without a time).
    roof_util: float | None
    #: The ridge point, FLOP per byte: peak FLOP/s ÷ the bandwidth used.
    ridge: float
    #: The memory roof used, 1e9 bytes per second.
    bandwidth_gbps: float
    #: The cache level whose ceiling is the memory roof (``details["bw_ceiling"]["level"]``), where the row has one.
    ceiling: str | None


class BwCeiling(TypedDict, total=False):
    """``details["bw_ceiling"]``: the memory level ``gbps`` is judged against (the working set fits it)."""

    #: The level's name (``"L2"``, ``"DRAM"`` …).
    level: str
    #: Its bandwidth, 1e9 bytes per second.
    gbps: float


class AboveParent(TypedDict):
    """``details["above_parent"]``: an estimate above its measured parent (flag ``above_parent``)."""

    #: The measured parent's path.
    parent: str
    #: The estimate's time over the parent's.
    ratio: float
    #: Why an estimate can exceed what it estimates, in words.
    why: str


class CallSet(TypedDict, total=False):
    """``details["call_set"]``: how a component whose calls differ was replayed (docs/columns.md)."""

    #: Calls replayed per run.
    replayed: int
    #: The step's calls they stand for.
    step_calls: int
    #: Whether some calls were counted as a kept kind (beyond the capture's cap).
    approximated: bool
    #: Replayed calls whose backward ran.
    backward_calls: int
    #: Replayed calls run under ``no_grad``.
    no_grad_calls: int
    #: Calls of kinds beyond the capture's cap, replayed as a kept kind.
    unrepresented: int


class FloorMs(TypedDict, total=False):
    """``details["floor_ms"]``: the harness floor taken off each pass (docs/quality.md, "the harness floor")."""

    #: The floor subtracted from the forward, ms.
    fwd: float
    #: The floor subtracted from the backward, ms (0 without a backward).
    bwd: float
    #: The forward's median before the subtraction, ms.
    raw_fwd_ms: float | None
    #: The backward's median before the subtraction, ms.
    raw_bwd_ms: float | None
    #: The floor's own spread (IQR) in the forward, ms.
    fwd_iqr_ms: float
    #: The floor's own spread (IQR) in the backward, ms.
    bwd_iqr_ms: float
    #: The passes within the floor's noise (``"fwd"``, ``"bwd"``); an estimate's ``["children"]``.
    at_floor: list[str]
    #: On an estimate whose every child is at the floor: those children's paths.
    children: list[str]


class Sharded(TypedDict):
    """``details["sharded"]``: an FSDP2 module's parameter sizes."""

    #: This rank's shards, MiB.
    params_local_mb: float
    #: The unsharded parameters, MiB.
    params_full_mb: float


class Lockstep(TypedDict):
    """``details["lockstep"]``: a component replayed on every rank at once."""

    #: Ranks that replayed it together.
    ranks: int
    #: Timed runs per rank.
    repeats: int


class InSitu(TypedDict, total=False):
    """``details["insitu"]``: the component inside the real step (docs/quality.md, "in situ vs isolated")."""

    #: The in-situ pass's forward per call, ms (= ``insitu_ms``).
    fwd_ms: float
    #: Relative spread of that forward over the passes; NaN (``None`` once loaded: JSON has no NaN)
    #: when one pass was timed.
    spread: float | None
    #: In-situ passes timed.
    passes: int
    #: Its backward in the step per call, ms (a top's whole backward; below a top, on CPU, its autograd nodes').
    bwd_ms: float
    #: Its in-situ share of the step (a fraction).
    share: float
    #: The captured step's own forward per call, ms (the capture's copies left out).
    capture_ms: float
    #: On a row left in situ: ``"census"`` when the census counted its FLOPs and bytes, else why not.
    counted: str


class Group(TypedDict, total=False):
    """``details["group"]``: the repeated-structure group a row belongs to (docs/columns.md)."""

    #: Every member's path.
    members: list[str]
    #: The members measured in depth.
    representatives: list[str]
    #: The group's total in-situ share of the step (a fraction).
    insitu_share: float
    #: With two representatives measured: (slowest - fastest) ÷ fastest of their fwd + bwd.
    spread: float
    #: Whether that spread is within their noise.
    agree: bool


# ``as`` and ``from`` are Python keywords: the functional form declares them (its types as strings,
# as ``from __future__ import annotations`` leaves the class form's).
_Keywords = TypedDict(
    "_Keywords",
    {
        # How a row of repeated structure, or one not replayed, got its numbers: "measured" (a group
        # member replayed), "representative" (the measurement of details["from"]), "insitu" (not
        # replayed: the step's own numbers).
        "as": "As",
        # On an "as": "representative" row: the path of the row whose measurement it is.
        "from": "str",
    },
    total=False,
)


class RowDetails(_Keywords, total=False):
    """``ComponentRow.details``: what explains a row's columns, by key (docs/columns.md, "details keys").

    Every key is optional. Times are milliseconds, memory MiB, bytes bytes, as the columns'.
    """

    #: Measurement-quality flags (``FLAGS`` of ``cb_callback._engine.derive.quality``), ``[]`` when clean.
    flags: list[str]
    #: Flags the engine or a plugin set before the assessment (``hash_reduced`` …), merged into ``flags``.
    own_flags: list[str]
    #: Spread (IQR) of the timed forwards, ms.
    fwd_iqr_ms: float | None
    #: Spread (IQR) of the timed backwards, ms.
    bwd_iqr_ms: float | None
    #: Timed forwards.
    fwd_repeats: int
    #: Timed backwards.
    bwd_repeats: int
    #: How the timed runs went.
    timing: Timing
    #: Ops without a FLOP formula (counted as 0 FLOPs).
    uncounted_ops: list[str]
    #: ``bytes`` of the forward, bytes.
    fwd_bytes: float
    #: ``bytes`` of the backward, bytes.
    bwd_bytes: float
    #: The five ops that moved the most bytes: op name to bytes.
    top_bytes_ops: dict[str, float]
    #: The distinct storages both passes touched, bytes.
    working_set_bytes: int
    #: Whether ``fwd_flops`` … ``working_set_bytes`` are the step's census (``"census"``) or ``"own pass: <why>"``.
    counted: str
    #: ``"census"`` when the census's pass of a top was its observed pass (its memory is that pass's).
    observed_in: str
    #: The memory level ``gbps`` is judged against.
    bw_ceiling: BwCeiling
    #: How ``bound`` was decided.
    roofline: Roofline
    #: On an estimate flagged ``above_parent``: the parent, the ratio, why.
    above_parent: AboveParent
    #: Where ``peak_mem_mb`` comes from (``"cpu_profiler_allocations"``, ``"cuda_caching_allocator"`` …).
    peak_mem_source: str
    #: Why ``peak_mem_mb`` is empty.
    peak_mem_unknown: str
    #: Whether the forward changes an input in place (each run then gets a fresh copy).
    mutates_inputs: bool
    #: Why no backward ran (``bwd_ms`` is then 0).
    no_backward: str
    #: How a component whose calls differ was replayed.
    call_set: CallSet
    #: The same module's rows under other parents.
    shared_with: list[str]
    #: The module's other names under this parent.
    aliases: list[str]
    #: The collective a rank-local probe refused.
    collective: str
    #: The collectives per op and phase: ``op``, ``phase``, ``count``, ``bytes`` (total), ``ms`` (total).
    comm: list[dict[str, Any]]
    #: The communication timing passes ``comm_ms`` is the median of.
    comm_passes: int
    #: ``total_ms`` and ``comm_ms`` over the ranks (each ``per_rank``, ``min``, ``median``, ``max``) and the
    #: ``straggler`` (the rank of the slowest ``total_ms``).
    ranks: dict[str, Any]
    #: An FSDP2 module's local and full parameter sizes.
    sharded: Sharded
    #: A component replayed in lockstep across ranks.
    lockstep: Lockstep
    #: How a module inside an FSDP unit was replayed (with its unit unsharded, compute only).
    fsdp: str
    #: Pieces measured on their own, not modules of the tree (``cb_callback._engine.derive.parts``).
    parts: list[dict[str, Any]]
    #: A planner's estimate beside the measured split (``cb_callback._engine.derive.parts``).
    planned: dict[str, Any]
    #: A torchrec sharded module: its ``sharding_types`` and the forward's collectives by ``stages``.
    torchrec: dict[str, Any]
    #: The tables ``ReduceHashSize`` shrank under the row: real and reduced rows, which columns are whose.
    hash_size: dict[str, Any]
    #: The component inside the real step.
    insitu: InSitu
    #: The repeated-structure group the row belongs to.
    group: Group
    #: Why a member of repeated structure was replayed itself instead of copied.
    not_copy: str
    #: Why a row was not replayed: ``"budget_s"`` (the triage's time budget ran out first).
    unreplayed: str
    #: The harness floor taken off each pass.
    floor_ms: FloorMs
    #: Arguments that could not be copied.
    unknown_leaves: list[str]
    #: With several batches, per batch: ``batch``, ``status``, ``calls``, ``fwd_ms``, ``bwd_ms``, ``total_ms``,
    #: ``flops``, ``shape`` and, if it failed, ``error``.
    batches: list[dict[str, Any]]
    #: With several batches: the batch whose measurement the row is (the median one).
    median_batch: int
    #: With several batches: that batch's ``fwd_ms + bwd_ms``, ms.
    median_ms: float | None
    #: With several batches: the 90th percentile of the batches' ``fwd_ms + bwd_ms``, ms.
    p90_ms: float | None
    #: With several batches: the distinct input shapes (``float32[8,128]``, ``KJT(f1:37,f2:52)``).
    shapes: list[str]
    #: The compile what-if (docs/whatif.md): ``compile_s``, ``graphs``, ``graph_breaks``, the compiled
    #: ``fwd_ms``/``bwd_ms``, ``eager_ms_same_rounds``, ``outputs_close`` …; or ``error``, or ``skipped``.
    compile: dict[str, Any]
    #: Files of artifact plugins: kind (``"trace"``, ``"ops"``, ``"memory"``) to a path relative to the report.
    artifacts: dict[str, str]
    #: Errors of user plugins: plugin name to ``Type: message``.
    metric_errors: dict[str, str]


def plugin_details(details: RowDetails) -> dict[str, Any]:
    """``details`` itself, typed as a plain dict: where a plugin's own keys are written and read.

    A plugin's keys (what its ``measure`` returns beside the columns) are not
    :class:`RowDetails`'s: the engine stores every value a plugin returns through
    this (``plugin_details(row.details)[key] = value``), the one place a key that
    is not a literal is written.
    """
    return cast("dict[str, Any]", details)
