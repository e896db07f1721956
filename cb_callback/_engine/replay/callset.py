"""Which calls one replay runs, for a component called in several ways in the step.

A component whose calls differ (``ComponentInputs.variants``: other shapes, other
non-tensor arguments, another grad mode) or only some of whose calls have a
backward (``grad_calls``) is replayed on its *call set*: one replayed forward runs
each kind of call, under its own grad mode, as many times as it stands for (all
the step's calls when they are at most :data:`MAX_EXACT`; otherwise about
:data:`MAX_EXACT`, each kind in proportion to its calls and at least once); the
backward runs through the outputs of the calls that built
graph the step's backward ran through. The engine divides the set's additive
values (times, FLOPs, bytes, activation memory, communication) by the number of
calls replayed, so a row stays per call and ``share = total × calls`` stays the
step's.

A set is ``approximated`` (and its note says so) when it replays fewer calls than
the step made, or replays some calls as another kind than theirs: the capture
keeps at most :data:`cb_callback._engine.capture.capture.MAX_VARIANTS` kinds and counts a
call of a further kind in the last kept kind of its grad mode and wrapper
(``ComponentInputs.unrepresented``). Otherwise its values are those of the step.
"""

from __future__ import annotations

from dataclasses import dataclass

from cb_callback._engine.capture.inputs import ComponentInputs

__all__ = ["MAX_EXACT", "CallPlan", "PlannedCall", "call_plan", "reaches_no_loss"]

#: At most this many calls are replayed one for one; more are approximated by kind.
MAX_EXACT = 16


@dataclass(frozen=True)
class PlannedCall:
    """One call of a replayed call set."""

    #: The kind's captured (and preprocessed) call.
    inputs: ComponentInputs
    #: Replayed with grad (as the step ran it).
    grad: bool
    #: Its outputs join the backward (it built graph the step's backward ran through).
    backward: bool


@dataclass(frozen=True)
class CallPlan:
    """The calls one replay runs, and what they stand for."""

    calls: tuple[PlannedCall, ...]
    #: The step's calls the set stands for.
    step_calls: int
    #: Fewer calls replayed than the step made (each kind weighted by its share of the calls).
    approximated: bool
    #: What the row's note says about it.
    note: str
    #: Of ``step_calls``, those replayed as another kind than theirs (beyond the capture's cap on kinds).
    unrepresented: int = 0


@dataclass(frozen=True)
class _Kind:
    inputs: ComponentInputs
    calls: int
    grad_calls: int
    #: Of ``calls``, those of other kinds counted in it (beyond the capture's cap: replayed as it).
    unlike: int = 0


def _kinds(inputs: ComponentInputs) -> list[_Kind]:
    first_grad = inputs.own_grad_calls
    own = inputs.own_calls
    out = [_Kind(inputs, own, _grads(inputs, own, first_grad), min(inputs.unrepresented, own))]
    out += [_Kind(v, v.calls, _grads(v, v.calls, v.grad_calls), min(v.unrepresented, v.calls)) for v in inputs.variants]
    return [k for k in out if k.calls > 0]


def _grads(kind: ComponentInputs, calls: int, known: int | None) -> int:
    """The kind's calls with a backward (unknown: all of them if it ran with grad)."""
    if not kind.grad_enabled:
        return 0
    return calls if known is None else min(known, calls)


def reaches_no_loss(inputs: ComponentInputs) -> bool:
    """Whether a component called one way (no variants) ran with grad but its output reached no
    tensor the step's backward ran through (then its replay has no backward)."""
    return not inputs.variants and inputs.grad_enabled and inputs.grad_calls == 0


def call_plan(inputs: ComponentInputs) -> CallPlan | None:
    """The call set to replay, or ``None`` when one call stands for all of the step's
    (one kind of call, each with a backward or none with one)."""
    kinds = _kinds(inputs)
    if len(kinds) <= 1 and all(k.grad_calls in (0, k.calls) and not k.unlike for k in kinds):
        return None
    total = sum(k.calls for k in kinds)
    scaled = total > MAX_EXACT
    planned: list[PlannedCall] = []
    for k in kinds:
        reps, back = k.calls, k.grad_calls
        if scaled:
            reps = max(1, round(MAX_EXACT * k.calls / total))
            back = 0 if k.grad_calls == 0 else min(reps, max(1, round(reps * k.grad_calls / k.calls)))
        planned += [PlannedCall(k.inputs, k.inputs.grad_enabled, i < back) for i in range(reps)]
    # Exact only when every call is replayed one for one, each as the kind it is.
    approximated = len(planned) != total or any(k.unlike for k in kinds)
    note = _note(kinds, len(planned), approximated)
    return CallPlan(tuple(planned), total, approximated, note, sum(k.unlike for k in kinds))


def _note(kinds: list[_Kind], replayed: int, approximated: bool) -> str:
    """``"replayed on its 2 calls (2 kinds); backward from 1 of 2 calls; the other ran under no_grad; …"``."""
    total = sum(k.calls for k in kinds)
    with_grad = sum(k.calls for k in kinds if k.inputs.grad_enabled)
    back = sum(k.grad_calls for k in kinds)
    unlike = sum(k.unlike for k in kinds)
    text = f"replayed on its {total} calls ({len(kinds)} kinds)" if not approximated else (
        f"approximated: {replayed} replayed calls stand for its {total} ({len(kinds)} kinds, weighted by their calls)"
    )  # fmt: skip
    if unlike:
        text += (
            f"; {unlike} of its calls are of kinds beyond the capture's cap, each replayed as the last kept kind"
            " of its grad mode"
        )
    text += f"; backward from {back} of {total} calls"
    why = []
    if total - with_grad:
        why.append(f"{total - with_grad} ran under no_grad")
    if with_grad - back:
        why.append(f"{with_grad - back} reached no loss")
    if len(why) == 1 and back + 1 == total:
        why = [why[0].replace("1 ", "the other ", 1)]
    return text + (f"; {', '.join(why)}" if why else "") + "; values per call"
