"""Lockstep replay across two CPU ranks (gloo): FSDP2 measured whole, a plan mismatch, a rank that raises.

The scenarios run in ``tests/_lockstep_script.py``: those the selected tests need, once per module (the
``lockstep`` fixture), one after another on one process pair (each with its own model, seeds and output
folder; ``OWN_PAIR``'s, after which a rank's process group is no use, on pairs of their own). Every scenario
has a timeout that fails its test: nothing here can hang CI. A scenario that raised fails its own test with
its traceback; one that the batch did not reach (it ended at a failed scenario) runs alone.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests._lockstep_script import OWN_PAIR

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "tests" / "_lockstep_script.py"

# The FSDP2 model: three blocks Linear(16, 32) -> ReLU -> Linear(32, 16) and a head Linear(16, 4).
BLOCK_PARAMS = 16 * 32 + 32 + 32 * 16 + 16  # 1072 floats: one unit's flat parameter, all-gathered whole
HEAD_PARAMS = 16 * 4 + 4  # 68 floats: the root unit's own (the head's)
# A block unit per call: its forward all-gathers its 1072 floats, its backward all-gathers them again
# (resharded after forward) and reduce-scatters the 1072-float gradient: 3 x 1072 x 4 bytes.
BLOCK_COMM = 3 * BLOCK_PARAMS * 4
# The root: its own all-gather and reduce-scatter (a root is not resharded after forward: no backward
# all-gather) plus the three blocks'.
ROOT_COMM = 2 * HEAD_PARAMS * 4 + 3 * BLOCK_COMM

#: scenario -> its timeout in seconds (past it, its test fails)
TIMEOUT_S: dict[str, int] = {
    "mismatch": 120, "raise": 180, "settle": 180, "fsdp_raise_unwritable": 180, "fsdp_die": 180, "fsdp_insitu_die": 180,
}  # fmt: skip
DEFAULT_TIMEOUT_S = 240

F = TypeVar("F", bound=Callable[..., Any])


def scenarios(*names: str) -> Callable[[F], F]:
    """The scenarios a test reads (beyond its ``scenario`` parameter): the ``lockstep`` fixture runs them."""

    def mark(test: F) -> F:
        test.scenarios = names  # type: ignore[attr-defined]
        return test

    return mark


def _wanted(item: pytest.Item) -> list[str]:
    callspec = getattr(item, "callspec", None)
    param = [callspec.params["scenario"]] if callspec is not None and "scenario" in callspec.params else []
    return [*getattr(getattr(item, "function", None), "scenarios", ()), *param]


def _script(names: list[str], out: Path) -> subprocess.CompletedProcess[str]:
    """``names`` in one run of the script (each within its timeout; the run within their sum)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "CB_DISABLE": ""}
    arg = ",".join(f"{n}={TIMEOUT_S.get(n, DEFAULT_TIMEOUT_S)}" for n in names)
    timeout = sum(TIMEOUT_S.get(n, DEFAULT_TIMEOUT_S) for n in names) + 60
    return subprocess.run(
        [sys.executable, str(SCRIPT), arg, str(out)], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


class Lockstep:
    """The scenarios run by one run of the script: each test reads its own (:meth:`run`)."""

    def __init__(self, names: list[str], out: Path, proc: subprocess.CompletedProcess[str] | None) -> None:
        self.out, self.proc = out, proc
        #: the last scenario of the batch on one process pair
        self.last = next((n for n in reversed(names) if n != "unsharded" and n not in OWN_PAIR), None)

    def log(self, proc: subprocess.CompletedProcess[str] | None = None) -> str:
        proc = proc or self.proc
        return "" if proc is None else proc.stdout[-3000:] + proc.stderr[-3000:]

    def run(self, scenario: str, tmp_path: Path) -> Path:
        """The folder of ``scenario``'s results: the batch's, or (where the batch ended before it) its own run's
        in ``tmp_path``."""
        here = self.out / scenario
        timeout = here / "timeout.txt"
        assert not timeout.exists(), f"{scenario}: {timeout.read_text()} in the batch\n{self.log()}"
        for r in (0, 1):  # a rank that raised out of the scenario (the batch ended there)
            mine = here / f"rank_{r}.json"
            if mine.exists():
                assert "crash" not in (result := json.loads(mine.read_text())), result["crash"]
        done = {"unsharded": ["unsharded.json"]}.get(scenario, ["rank_0.json", "rank_1.json"])
        if all((here / f).exists() for f in done) or (here / "exitcodes.json").exists():
            # the batch's ranks exit cleanly after its last scenario (after any other, both agreed that they
            # finished it before they began the next)
            assert self.proc is None or self.proc.returncode == 0 or scenario != self.last, self.log()
            return here
        proc = _script([scenario], tmp_path)  # not reached by the batch: alone
        assert proc.returncode == 0, self.log(proc)
        return tmp_path / scenario


@pytest.fixture(scope="module")
def lockstep(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Lockstep:
    """Every scenario the selected tests of this module read, in one run of the script.

    Under pytest-xdist every worker given a test of this module gets here: the first runs the script, the
    others wait for it (a lock in the folder the workers share) and read its results (the same selection)."""
    here = [item for item in request.session.items if getattr(item, "module", None) is request.module]
    names = sorted({n for item in here for n in _wanted(item)})
    assert set(names) <= set(ALL), set(names) - set(ALL)  # (the tests' timeout counts every scenario's)
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        out = tmp_path_factory.mktemp("lockstep")
        return Lockstep(names, out, _script(names, out) if names else None)
    shared = tmp_path_factory.getbasetemp().parent / "lockstep"
    shared.mkdir(exist_ok=True)
    with open(shared / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        log = shared / "proc.json"
        if not log.exists():
            proc = _script(names, shared / "out") if names else None
            log.write_text(json.dumps(None if proc is None else [proc.args, proc.returncode, proc.stdout, proc.stderr]))
        ran = json.loads(log.read_text())
    return Lockstep(names, shared / "out", None if ran is None else subprocess.CompletedProcess(*ran))


def _run(scenario: str, lockstep: Lockstep, tmp_path: Path) -> list[dict[str, Any]]:
    here = lockstep.run(scenario, tmp_path)
    if scenario == "unsharded":
        return [json.loads((here / "unsharded.json").read_text())]
    if (here / "exitcodes.json").exists():  # a pair of its own: both ranks exited cleanly
        assert json.loads((here / "exitcodes.json").read_text()) == [0, 0], lockstep.log()
    results = [json.loads((here / f"rank_{r}.json").read_text()) for r in (0, 1)]
    for r in results:
        assert "crash" not in r, r["crash"]
    return results


@pytest.fixture(scope="module")
def unsharded(lockstep: Lockstep, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    (result,) = _run("unsharded", lockstep, tmp_path_factory.mktemp("unsharded"))
    return result


@pytest.mark.slow
@scenarios("fsdp", "unsharded")
def test_fsdp2_every_row_is_measured_with_its_communication_and_training_is_untouched(
    tmp_path: Path, lockstep: Lockstep, unsharded: dict[str, Any]
) -> None:
    ranks = _run("fsdp", lockstep, tmp_path)
    for rank, result in enumerate(ranks):
        # a step after profiling leaves the same local shards and gradients as on an unprofiled twin
        assert result["identical"] and result["identical_grads"], rank
        rows = result["rows"]
        # every unit and every child of a unit measured (before: 11 of 12 rows failed or estimated);
        # "blocks" is a ModuleList, never called itself: estimated from its three blocks as always
        assert {p: r["status"] for p, r in rows.items() if r["status"] != "ok"} == {"blocks": "estimated"}, rank
        for path, row in rows.items():  # FLOPs are the unsharded model's, forward and backward
            mine = unsharded["rows"][path]
            assert (row["fwd_flops"], row["bwd_flops"]) == (mine["fwd_flops"], mine["bwd_flops"]), path
        for b in range(3):
            assert rows[f"blocks.{b}"]["comm_bytes"] == BLOCK_COMM
            # a unit's children replay with the unit unsharded: compute alone
            assert rows[f"blocks.{b}.fc1"]["comm_bytes"] == rows[f"blocks.{b}.fc2"]["comm_bytes"] == 0
        assert rows[""]["comm_bytes"] == ROOT_COMM and rows["head"]["comm_bytes"] == 0
        table = {(c["op"], c["phase"]): (c["count"], c["bytes"]) for c in rows["blocks.1"]["comm"]}
        assert table == {
            ("c10d._allgather_base_", "forward"): (1, BLOCK_PARAMS * 4),
            ("c10d._allgather_base_", "backward"): (1, BLOCK_PARAMS * 4),
            ("c10d._reduce_scatter_base_", "backward"): (1, BLOCK_PARAMS * 4),
        }
        assert rows["blocks.1"]["comm_ms"] is not None and rows["blocks.1"]["comm_ms"] > 0  # finite, timed
    # ranks="all": each row's spread over the ranks, the same on both
    spread = ranks[0]["rows"][""]["ranks"]
    assert spread == ranks[1]["rows"][""]["ranks"]
    per_rank = spread["total_ms"]["per_rank"]
    assert len(per_rank) == 2 and spread["total_ms"]["max"] == max(per_rank)
    assert spread["straggler"] == per_rank.index(max(per_rank))
    assert ranks[0]["meta_ranks"] == {"world_size": 2, "rank": 0, "profiles": "all"}


@pytest.mark.slow
@scenarios("fsdp_zero")
def test_fsdp2_with_ranks_zero_every_rank_takes_part_in_the_lockstep_replays(
    tmp_path: Path, lockstep: Lockstep
) -> None:
    ranks = _run("fsdp_zero", lockstep, tmp_path)
    assert ranks[0]["identical"] and ranks[1]["identical"]
    zero, one = ranks[0]["rows"], ranks[1]["rows"]
    assert {p for p, r in zero.items() if r["status"] != "ok"} == {"blocks"}
    # rank 1 replayed the units with rank 0 (their collectives needed it) but not the rank-local rest
    assert one["blocks.0"]["status"] == "ok" and one["head"]["status"] == "skipped"
    assert zero[""]["ranks"] is None  # no spread over the ranks with ranks="zero"


@pytest.mark.slow
@scenarios("mismatch")
def test_a_plan_mismatch_is_an_error_on_every_rank_within_seconds(tmp_path: Path, lockstep: Lockstep) -> None:
    ranks = _run("mismatch", lockstep, tmp_path)
    message = (
        "cb_callback: the ranks cannot profile in lockstep: component 5 is missing on rank 0 and 4 (ReLU) on "
        "rank 1. Every rank must profile the same model (same tree) with the same options; nothing was replayed"
    )
    for result in ranks:
        assert result["error"] == message
        assert result["seconds"] < 30
        assert result["center_calls"] == 1  # the capture forward only: nothing was replayed
        assert result["untouched"] is True


@pytest.mark.slow
@scenarios("raise")
def test_a_rank_that_raises_mid_replay_fails_that_component_on_every_rank_and_the_run_goes_on(
    tmp_path: Path, lockstep: Lockstep
) -> None:
    ranks = _run("raise", lockstep, tmp_path)
    for rank, result in enumerate(ranks):
        rows = result["rows"]
        # Center (path 1) raises on rank 1 at its sixth call, a timed run of the root's lockstep
        # replay (call 1 the capture, 2 the rank-local probe, 3-5 the root's probe, pass and first
        # run). Rank 1 drained that run's all-reduce, so rank 0 finished it; then both failed the root
        # (estimated from its children) and went on: Center itself is measured.
        root = rows[""]
        assert root["status"] == "estimated", rank
        expected = "a timed run raised RuntimeError: rank 1 gives up"
        assert root["error"] == (expected if rank == 1 else f"on rank 1: {expected}")
        assert {p: r["status"] for p, r in rows.items() if p} == dict.fromkeys(["0", "1", "2", "3"], "ok")
        # one all-reduce per forward of a [1, 16] float32 sum: 64 bytes
        assert rows["1"]["comm_bytes"] == 64.0
        assert result["seconds"] < 120
        # the failed and drained runs left nothing behind: weights as before, no gradient
        assert result["untouched"] is True


@pytest.mark.slow
@scenarios("settle")
def test_a_long_component_in_lockstep_stops_on_every_rank_once_every_rank_agrees(
    tmp_path: Path, lockstep: Lockstep
) -> None:
    ranks = _run("settle", lockstep, tmp_path)
    for rank, result in enumerate(ranks):
        rows = result["rows"]
        # The root and SlowCenter (path 1) communicate: lockstep. Each run sleeps 150 ms, more than its
        # budget (2 x min_run_time_s = 0.1 s): long. Two sleeps agree within SETTLE_NOISE on both ranks,
        # so both stop at the second agreement point: 2 runs where the agreed count was min_repeats = 5.
        # On a busy machine two sleeps may disagree on one rank (seen with two CPU hogs beside the suite):
        # then no rank stops early and all run the agreed 5; either way every rank runs the same count.
        for path in ("", "1"):
            assert rows[path]["status"] == "ok", (rank, path, rows[path])
            assert rows[path]["lockstep"]["repeats"] == 5 and rows[path]["repeats"] in (2, 5), (rank, path)
            assert rows[path]["repeats"] == 5 or rows[path]["settled"] is True, (rank, path)  # 2: it settled
            assert rows[path]["repeats"] == ranks[1 - rank]["rows"][path]["repeats"], (rank, path)
        # the Linears are rank-local and short: a pass takes min(max_repeats = 50, budget 0.1 s / one run),
        # 50 on a quiet machine, and a re-measurement (first samples read noisy) as many again, pooled;
        # how many a busy machine leaves is its own (86 seen under a load of 9), but never more than two
        # passes' worth, never fewer than min_repeats, and a short component never settles
        for path in ("0", "2"):
            assert 5 <= rows[path]["repeats"] <= 100 and rows[path]["settled"] is False, (rank, path)


#: scenario -> where RaiseInRoot raises on rank 1 (see tests/_lockstep_script.py), and the error every rank
#: reports for the root (rank 0 names rank 1)
FAULTS = {
    "fsdp_raise": "a timed run raised RuntimeError: rank 1 runs out of memory",
    "fsdp_raise_bwd": "a timed run raised RuntimeError: rank 1 runs out of memory in the backward",
    "fsdp_raise_slice": "a timed run raised RuntimeError: rank 1 runs out of memory",
    "fsdp_raise_comm": "a communication timing pass raised RuntimeError: rank 1 runs out of memory",
    "fsdp_raise_pass": "replay raised RuntimeError: rank 1 runs out of memory",
    "fsdp_raise_pass_bwd": "replay raised RuntimeError: rank 1 runs out of memory in the backward",
}
TIMEOUT_S.update(dict.fromkeys(FAULTS, 180))


@pytest.mark.slow
@pytest.mark.parametrize("scenario", list(FAULTS))
def test_fsdp2_a_run_that_raises_on_one_rank_fails_that_component_on_every_rank_and_no_rank_hangs(
    tmp_path: Path, lockstep: Lockstep, scenario: str
) -> None:
    ranks = _run(scenario, lockstep, tmp_path)
    for rank, result in enumerate(ranks):
        rows = result["rows"]
        # RaiseInRoot (after the head) raises on rank 1 part way through one of the root's lockstep runs: in
        # a timed run's forward (the three block units all-gathered, the root unit unsharded and left in its
        # forward), in its backward, in the second run of a slice of four, or in a communication timing
        # pass. Rank 1 drains that run's other collectives and every later run of the slice (running it
        # again would skip the root's all-gather); both ranks fail the root at the next agreement point
        # (estimated from its children); rank 1's units are put back as before the root (the root
        # resharded), so the blocks' replays with their units unsharded all-gather on both ranks. Before,
        # rank 1 skipped that all-gather and timed out after lockstep_timeout_s (or, in a comm pass, raised).
        # In the root's first lockstep pass (forward or backward) there is no record of its own to drain
        # from: rank 1 reads the rest of rank 0's collectives from the store (the ledger) and issues them on
        # zeros. Before, both ranks waited lockstep_timeout_s=30 and then reported each other lost.
        root = rows[""]
        expected = FAULTS[scenario]
        assert root["status"] == "estimated", (rank, root)
        assert root["error"] == (expected if rank == 1 else f"on rank 1: {expected}")
        assert {p: r["status"] for p, r in rows.items() if p not in ("", "blocks")} == dict.fromkeys(
            ["head", "after", *(f"blocks.{i}{s}" for i in range(3) for s in ("", ".fc1", ".fc2"))], "ok"
        ), rank
        assert result["raised"] is (rank == 1)
        assert result["seconds"] < 25  # well within lockstep_timeout_s=30: nobody waited for a lost collective
        assert result["untouched"] is True  # shards as before and no gradient left


@pytest.mark.slow
@scenarios("fsdp_raise_unwritable")
def test_a_first_pass_that_cannot_be_finished_for_the_others_names_the_rank_and_its_error(
    tmp_path: Path, lockstep: Lockstep
) -> None:
    ranks = _run("fsdp_raise_unwritable", lockstep, tmp_path)
    # RaiseInRoot raises on rank 1 in the root's first lockstep pass (its forward, after the all-gathers);
    # the ledger cannot write down a reduce op here (patched), so rank 1 cannot issue rank 0's backward
    # reduce-scatters for it: rank 1 ends the lockstep phase with its own error (every row not measured yet
    # fails with it), and rank 0, left in its reduce-scatter, comes back when rank 1's process group closes.
    own = (
        "its first lockstep pass on rank 1 failed (replay raised RuntimeError: rank 1 runs out of memory) and "
        "could not be finished for the other ranks (another rank's collective could not be written down for "
        "this rank to issue); nothing after it was replayed in lockstep"
    )
    assert ranks[1]["lost"] == own
    assert ranks[1]["rows"]["head"] == {**ranks[1]["rows"]["head"], "status": "failed", "error": own}
    assert ranks[0]["lost"].startswith("lost rank 1 during the lockstep replay of root: ")
    for result in ranks:
        assert result["seconds"] < 25 and result["untouched"] is True


def _survivor(scenario: str, lockstep: Lockstep, tmp_path: Path) -> dict[str, Any]:
    """Rank 0's result of a scenario whose rank 1 process ends (exit code 3) part way; rank 0 exits cleanly."""
    here = lockstep.run(scenario, tmp_path)
    assert json.loads((here / "exitcodes.json").read_text()) == [0, 3]
    assert not (here / "rank_1.json").exists()
    result: dict[str, Any] = json.loads((here / "rank_0.json").read_text())
    assert "crash" not in result, result.get("crash")
    return result


@pytest.mark.slow
@scenarios("fsdp_die")
def test_a_rank_that_dies_leaves_the_others_a_report_that_names_it(tmp_path: Path, lockstep: Lockstep) -> None:
    # rank 1's process ends in the root's first timed run
    result = _survivor("fsdp_die", lockstep, tmp_path)
    # Rank 0's collective with the dead rank raised (gloo: connection reset or closed); the profile returns
    # a report within seconds, not at lockstep_timeout_s=30: every lockstep row not measured before fails
    # with the lost rank named, and metadata["ranks"]["lost"] says the same.
    lost = result["lost"]
    assert lost.startswith("lost rank 1 during the lockstep replay of root: it died or did not answer within ")
    assert "lockstep_timeout_s=30 s" in lost
    rows = result["rows"]
    # the root (failed, so estimated from its children if any had been measured) says so after it
    assert rows[""]["status"] == "failed"
    assert rows[""]["error"] == f"{lost}; no child could be measured to estimate it"
    # every other component of this FSDP2 model is replayed in lockstep (as a unit's children): failed with
    # it (a block, failed, then finds no measured child to estimate it from either)
    leaves = ["head", "after", *(f"blocks.{i}.fc{j}" for i in range(3) for j in (1, 2))]
    assert {p: rows[p]["error"] for p in leaves} == dict.fromkeys(leaves, lost)
    estimate = f"{lost}; no child could be measured to estimate it"
    assert {rows[f"blocks.{i}"]["error"] for i in range(3)} == {estimate}
    assert result["seconds"] < 20


#: The triage scenarios' model: FSDP2 blocks and the root unit as above, and ``after`` (a plain module after
#: the head) sleeping 0.2 s in every forward on both ranks: the step's hotspot, the blocks and the head
#: each well under descend_share=0.05 of a step of >= 200 ms (their in-situ forward and backward are a few
#: ms each on this machine, collectives included).
SMALL = ["head", "blocks.0.fc1"]


def _same_plan(ranks: list[dict[str, Any]]) -> None:
    """Both ranks replayed, copied and left in situ the same rows (the lockstep phase needs one plan)."""
    plans = [{p: (r["status"], r["as"], r["note"]) for p, r in result["rows"].items()} for result in ranks]
    assert plans[0] == plans[1]


@pytest.mark.slow
@scenarios("fsdp_triage")
def test_fsdp2_the_in_situ_pass_and_the_triage_run_on_every_rank_and_decide_one_plan(
    tmp_path: Path, lockstep: Lockstep
) -> None:
    ranks = _run("fsdp_triage", lockstep, tmp_path)
    _same_plan(ranks)
    for rank, result in enumerate(ranks):
        rows, insitu = result["rows"], result["insitu"]
        # the in-situ pass ran on both ranks at once (collectives running): a warm-up and 3 passes of the root
        assert insitu["ranks"] == 2 and insitu["passes"] == 3 and insitu["errors"] == {}, insitu
        assert insitu["shares_of"] == "forward and backward"  # CPU: every module's backward timed by its nodes
        # the triage decided a plan (on both ranks: _same_plan); the three blocks are one group when their
        # in-situ times agree (selection.triage.differs), which a busy machine can break (seen under xdist):
        # either way one plan, and never more than the one group
        assert result["triage"]["groups"] in (0, 1) and "skipped" not in result["triage"], result["triage"]
        # `after` sleeps 200 ms a call: replayed (its share ~0.9); the root always
        assert rows["after"]["status"] == "ok" and rows["after"]["as"] is None
        assert rows[""]["status"] == "ok" and rows[""]["lockstep"] == {"ranks": 2, "repeats": 2}
        assert rows["after"]["insitu_ms"] >= 200.0
        # the head is left in situ, with its own in-situ forward and backward (an FSDP2 unit's nodes run in
        # the in-situ backward: before, they led to no target and read 0)
        head = rows["head"]
        assert head["status"] == "skipped" and head["as"] == "insitu", head
        assert head["insitu_ms"] > 0 and head["insitu_bwd_ms"] > 0, head
        for i in range(3):
            assert rows[f"blocks.{i}"]["insitu_bwd_ms"] > 0, (rank, i, rows[f"blocks.{i}"])
        # every row has a time: replayed (ok), a representative's copy (ok), or in situ
        assert all(r["status"] in ("ok", "estimated", "skipped") for r in rows.values()), rows
        assert all(r["insitu_ms"] is not None for p, r in rows.items() if p != "blocks"), rows
        assert result["untouched"] is True  # shards as before the profile, no gradient left
        assert result["identical"] is True  # the step after it equals an unprofiled twin's, bit for bit
        # the root's forwards: 1 the real step, 2 the capture, 3 the in-situ warm-up (its collectives written
        # down: the ledger's dispatch mode), 4-6 the timed passes with no dispatch mode (nothing added to the
        # ops they time), 7 the census (its counting mode and the ledger's)
        assert result["modes"][:7] == [0, 0, 1, 0, 0, 0, 2], result["modes"]


#: scenario -> what every rank's metadata says of the in-situ pass or the census that raised on rank 1
INSITU_FAULTS = {
    "fsdp_insitu_raise": ("insitu", "the in-situ pass of root: RuntimeError: rank 1 runs out of memory"),
    "fsdp_insitu_raise_bwd": (
        "insitu", "the in-situ pass of root: RuntimeError: rank 1 runs out of memory in the backward"
    ),
    "fsdp_insitu_raise_timed": ("insitu", "the in-situ pass of root: RuntimeError: rank 1 runs out of memory"),
    "fsdp_insitu_raise_timed_bwd": (
        "insitu", "the in-situ pass of root: RuntimeError: rank 1 runs out of memory in the backward"
    ),
    "fsdp_census_raise": (
        "triage",
        "the census of root: RuntimeError: rank 1 runs out of memory; the ranks descend level by level instead",
    ),
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("scenario", list(INSITU_FAULTS))
def test_fsdp2_an_in_situ_pass_or_census_that_raises_on_one_rank_leaves_every_rank_measuring(
    tmp_path: Path, lockstep: Lockstep, scenario: str
) -> None:
    ranks = _run(scenario, lockstep, tmp_path)
    where, expected = INSITU_FAULTS[scenario]
    _same_plan(ranks)
    for rank, result in enumerate(ranks):
        # RaiseInRoot raises on rank 1 in the root's 3rd forward (the in-situ pass's warm-up) or its backward, in
        # the 5th forward (its second timed pass) or the 4th's backward (the first's), or in the 7th forward (the
        # census, after a warm-up and 3 timed passes). In the warm-up and the census rank 1
        # issues the rest of rank 0's collectives of that pass on zeros (read from the store: the ledger),
        # both agree on the error, and both go on without the triage (level by level): every row measured. In a
        # timed pass (no ledger: nothing may add to what it times) rank 1 counts the collectives it issued by its
        # groups' sequence numbers and issues the rest of the warm-up's record on zeros; both agree after the
        # pass. Before, rank 1 gave up after lockstep_timeout_s while rank 0 still waited in an all-gather, and
        # the next training step mismatched its collectives (gloo aborted the process).
        said = expected if rank == 1 else f"on rank 1: {expected}"
        if where == "insitu":
            assert result["insitu"] == {"errors": {"": said}, "ranks": 2}
            assert result["triage"] is None
        else:
            assert result["triage"] == {"skipped": said}
            assert result["insitu"]["errors"] == {} and result["insitu"]["passes"] == 3
        rows = result["rows"]
        assert {p: r["status"] for p, r in rows.items() if p != "blocks"} == dict.fromkeys(
            ["", "head", "after", *(f"blocks.{i}{s}" for i in range(3) for s in ("", ".fc1", ".fc2"))], "ok"
        ), rank
        assert result["raised"] is (rank == 1)
        assert result["seconds"] < 25  # well within lockstep_timeout_s=30: nobody waited for a lost collective
        assert result["untouched"] is True
        if "identical" in result:  # the step after the profile: its collectives match, its weights a twin's
            assert result["identical"] is True


@pytest.mark.slow
@scenarios("routed")
def test_members_called_alike_on_one_rank_only_are_not_copies_on_any_and_the_ranks_keep_one_plan(
    tmp_path: Path, lockstep: Lockstep
) -> None:
    ranks = _run("routed", lockstep, tmp_path)
    _same_plan(ranks)
    for rank, result in enumerate(ranks):
        # experts 0 and 1 are alike on rank 0 (4 rows each) and not on rank 1 (2 and 6 rows): they are no
        # group on either rank, both replayed (descend_share=0). Before, rank 0 copied expert 1 from expert 0,
        # rank 1 did not, the plans differed and both ranks dropped the triage.
        assert result["triage"]["groups"] == 0 and "skipped" not in result["triage"], (rank, result["triage"])
        for path in ("1.experts.0", "1.experts.1"):
            assert result["rows"][path]["status"] == "ok" and result["rows"][path]["as"] is None, (rank, path)


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["ddp_insitu_raise_timed_bwd", "ddp_insitu_raise_mid_bwd"])
def test_ddp_a_timed_in_situ_pass_whose_backward_raises_on_one_rank_is_drained_and_agreed_on(
    tmp_path: Path, lockstep: Lockstep, scenario: str
) -> None:
    # mid: the raise comes after the later blocks' buckets were all-reduced, DDP's reducer part way through an
    # iteration; every rank resets it after the failed pass (before, the root's replay and the next training
    # step raised "Expected to have finished reduction in the prior iteration" on rank 1)
    ranks = _run(scenario, lockstep, tmp_path)
    expected = "the in-situ pass of root: RuntimeError: rank 1 runs out of memory in the backward"
    _same_plan(ranks)
    for rank, result in enumerate(ranks):
        # DDP's reducer all-reduces its buckets from C++ in the backward; rank 1 raises in the first timed
        # pass's backward, before its all-reduce: it counts what it issued by the group's sequence number,
        # issues the rest of the warm-up's record on zeros, and both ranks agree after the pass
        assert result["insitu"] == {"errors": {"": expected if rank == 1 else f"on rank 1: {expected}"}, "ranks": 2}
        assert {r["status"] for p, r in result["rows"].items() if p != "module.blocks"} == {"ok"}, result["rows"]
        assert result["seconds"] < 25 and result["raised"] is (rank == 1)
        assert result["untouched"] is True and result["identical"] is True


@pytest.mark.slow
@scenarios("fsdp_insitu_die")
def test_a_rank_that_dies_in_the_in_situ_pass_leaves_the_other_a_report_that_names_it(
    tmp_path: Path, lockstep: Lockstep
) -> None:
    # rank 1's process ends in the root's 4th forward (the in-situ pass's first timed pass)
    result = _survivor("fsdp_insitu_die", lockstep, tmp_path)
    # rank 0's collective with the dead rank raised: the ranks are lost, no plan, and every component that
    # communicates (all of this FSDP2 model's) fails with that said, within seconds
    lost = result["lost"]
    assert lost.startswith("lost a rank during the in-situ pass: it died or did not answer ("), lost
    assert result["insitu"] == {"errors": {"": lost}, "ranks": 2}
    rows = result["rows"]
    leaves = ["head", "after", *(f"blocks.{i}.fc{j}" for i in range(3) for j in (1, 2))]
    assert {p: rows[p]["error"] for p in ["", *leaves]} == dict.fromkeys(["", *leaves], lost) | {
        "": f"{lost}; no child could be measured to estimate it"
    }
    assert result["seconds"] < 20


#: every scenario a test of this module reads
ALL = [
    "unsharded", "fsdp", "fsdp_zero", "mismatch", "raise", "settle", *FAULTS, "fsdp_raise_unwritable", "fsdp_die",
    "fsdp_triage", *INSITU_FAULTS, "routed", "ddp_insitu_raise_timed_bwd", "ddp_insitu_raise_mid_bwd",
    "fsdp_insitu_die",
]  # fmt: skip

# A hang fails the scenario's test at the scenario's timeout, not the whole run at pytest-timeout's 300 s: the
# test that runs the batch (the fixture) may take as long as every scenario's timeout together.
pytestmark = [
    pytest.mark.timeout(sum(TIMEOUT_S.get(n, DEFAULT_TIMEOUT_S) for n in ALL) + 120),
    pytest.mark.xdist_group("lockstep"),
]
