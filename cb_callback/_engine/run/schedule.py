"""The schedule of a run: which components start, level by level, their interleaved timed runs,
then the compile what-ifs and the artifact passes, and what ``max_total_time_s`` allows."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from cb_callback._engine.capture.tree import SCRIPTED, Node, filter_reasons, scripted
from cb_callback._engine.clocks.insitu import InSituTimes
from cb_callback._engine.clocks.timing import SampleSet, cpu_canary, interleave
from cb_callback._engine.derive.quality import inconsistent_pairs, is_noisy
from cb_callback._engine.distributed.collectives import lockstep_reasons
from cb_callback._engine.distributed.fsdp import has_unit, is_unit, shard_bytes, unit_of
from cb_callback._engine.replay.batches import input_signature, merge_batches
from cb_callback._engine.run.component import Pending, params_mb
from cb_callback._engine.run.config import BenchmarkConfig
from cb_callback._engine.run.context import RunContext
from cb_callback._engine.selection.descend import (
    below_cold,
    descendants_called,
    levels,
    not_descended_note,
    step_cost_ms,
)
from cb_callback._engine.selection.groups import take_row
from cb_callback._engine.selection.triage import Plan
from cb_callback._report.finite import is_nan
from cb_callback._report.model import ComponentRow
from cb_callback._report.schema import Group, InSitu

__all__ = ["Schedule", "artifact_targets", "budget_note"]


class Schedule:
    """The components of one run, started and timed level by level.

    With ``descend="all"`` every node is one level, timed in one interleaving;
    with ``"hotspots"`` each depth is a level, and a level's components start
    only below those whose share of the root's time was at least
    ``descend_share`` (:func:`cb_callback._engine.selection.descend.below_cold`). With
    several captured batches a component starts once per batch it ran in, each
    with a row of its own (``per_batch``), merged into its median batch after
    its level is timed.

    Attributes:
        rows: every node's row, by path, as far as filled.
        per_batch: with several batches, each component's row per batch.
        samples: the timed samples the quality checks read (the row's batch's).
        pending: every started component (of every batch), in start order.
        canary_s: the CPU reference GEMM's time before each round.
    """

    def __init__(
        self,
        ctx: RunContext,
        budget0: float,
        insitu: Sequence[InSituTimes] = (),
        plan: Plan | None = None,
    ) -> None:
        #: The run's measurer, tree, batches and ranks (shared with the triage and the lockstep phase).
        self.ctx = ctx
        nodes, modules, batches, calls, cfg = ctx.nodes, ctx.modules, ctx.batches, ctx.calls, ctx.cfg
        self.run, self.nodes, self.modules, self.cfg, self.device = ctx.run, nodes, modules, cfg, ctx.device
        #: The lockstep coordinator under several ranks (``None``: one process).
        self.coord = coord = ctx.coord
        #: Whether this rank fills rows (``ranks="zero"``: rank 0 alone; every rank replays in lockstep).
        self.profiles = coord is None or cfg.ranks == "all" or coord.rank == 0
        self.units = {p for p, m in modules.items() if is_unit(m)} if coord is not None else set()
        # Components whose collectives a rank-local probe would not see (DDP's backward all-reduce).
        self._lockstep_why = lockstep_reasons(modules) if coord is not None else {}
        self.batches, self.calls, self.budget0 = list(batches), calls, budget0
        self.multi = len(self.batches) > 1
        self.by_path = {n.path: n for n in nodes}
        self.rows: dict[str, ComponentRow] = {}
        self.per_batch: dict[str, dict[int, ComponentRow]] = {}
        self.samples: dict[str, SampleSet] = {}
        self.pending: list[Pending] = []
        self.canary_s: list[float] = []
        self._called = descendants_called(list(nodes), calls)
        self._filtered = filter_reasons([n.path for n in nodes], cfg.include, cfg.exclude)
        self._not_descended: dict[str, tuple[str, float]] = {}  # path -> (ancestor not descended, its share)
        #: Each captured batch's in-situ pass (empty: none ran).
        self.insitu = list(insitu)
        #: The triage's decisions, made from the in-situ times before any replay (``None``: none).
        self.plan = plan
        self._copies: list[str] = []  # rows taken from a group's representative, filled after the timing
        self._descent_skipped: set[str] = set()  # skipped because an ancestor was not descended into
        self._forced: set[str] = set()  # below a failed component: started whatever the share
        self._opened: set[str] = set()  # failed components descended into all the same
        self._own: set[str] = set()  # rows the plan copied from a source that failed: replayed themselves
        self._levels = [list(nodes)] if cfg.descend == "all" or plan is not None else levels(nodes)
        self._steps = len(nodes) + cfg.rounds * len(self._levels)
        self._done = 0
        self._budget_left = 0  # replays budget_s did not start

    def run_levels(self) -> None:
        """Start and time every level, shallowest first; then, while any, the components a failure
        calls for (:meth:`_after_failures`), as one more level each time."""
        for level in self._levels:
            self._run_level(level)
            if self.cfg.descend == "hotspots" and self.plan is None:
                cold = below_cold(
                    level, self.by_path, self.rows, self.cfg.descend_share, self._not_descended, self.per_batch
                )
                self._not_descended.update(cold)
        while self.plan is not None and (more := self._after_failures()):
            self._steps += len(more) + self.cfg.rounds
            self._run_level(more)

    def _run_level(self, level: Sequence[Node]) -> None:
        """Start the level's components, then time them in one interleaving and fill their rows.

        With ``budget_s`` and the triage's shares, the largest in-situ share starts first
        (:meth:`_budget_order`); the rows stay in tree order."""
        started: list[Pending] = []
        for node in self._budget_order(level):
            self._done += 1
            self._start(node, started)
            if self.cfg.progress is not None:
                self.cfg.progress(self._done, self._steps, node.path)
        order = {n.path: i for i, n in enumerate(self.nodes)}
        self.rows = dict(sorted(self.rows.items(), key=lambda kv: order.get(kv[0], len(order))))
        timed = time_interleaved(started, self.rows, self.cfg, self._done, self._steps, self.device, self.canary_s)
        self._done += self.cfg.rounds
        self._finish(level, started, timed)
        self.pending += started

    def _budget_order(self, level: Sequence[Node]) -> list[Node]:
        """``level`` in the order its replays start: with ``budget_s`` and the triage's in-situ shares, the
        share each replay stands for (its group's, times the members it stands for) largest first, ties in
        tree order; else as given (breadth-first)."""
        plan = self.plan
        if self.cfg.budget_s is None or plan is None:
            return list(level)

        def share(node: Node) -> float:
            s = plan.effective.get(node.path)
            s = plan.shares.get(node.path) if s is None else s
            return s if s is not None and math.isfinite(s) else 0.0

        return sorted(level, key=lambda n: -share(n))  # stable: ties keep tree order

    def budget_info(self) -> dict[str, Any] | None:
        """``metadata["cost"]["budget"]``: ``budget_s``, the rows it left unreplayed and the largest in-situ
        share among them (``None`` without ``budget_s``)."""
        if self.cfg.budget_s is None:
            return None
        left = [r for r in self.rows.values() if r.details.get("unreplayed") == "budget_s"]
        shares = [s for r in left if (s := (r.details.get("insitu") or {}).get("share")) is not None]
        root = self.rows.get("")
        insitu = (root.details.get("insitu") or {}) if root is not None else {}
        return {
            "budget_s": self.cfg.budget_s,
            "unreplayed": len(left),
            # of them the triage's own replays (not a representative's copies, not containers)
            "replays_left": self._budget_left,
            "with_insitu": sum(1 for r in left if math.isfinite(r.insitu_ms)),
            "largest_unreplayed_share": max(shares) if shares else None,
            "root_unreplayed": any(r.path == "" for r in left),
            "root_insitu_ms": [insitu.get("fwd_ms"), insitu.get("bwd_ms")] if insitu else None,
        }

    def _after_failures(self) -> list[Node]:
        """What the triage's failures call for, in tree order (empty: nothing more).

        - A failed component whose children the triage did not descend into (its
          share was under ``descend_share``) is descended into all the same, as
          under ``descend="all"``: its children are replayed, so that it is
          estimated from them (its ``note`` says so); a child that fails in
          turn is descended into likewise.
        - A row to be taken from a source whose replay failed is replayed itself
          instead (every member of a group whose representative failed is
          measured on its own calls: none inherits a failure it never had).
        """
        plan = self.plan
        assert plan is not None
        out: list[Node] = []
        for node in self.nodes:
            path = node.path
            if path in self._copies and self.rows[self._source(path)].status == "failed":
                self._copies.remove(path)
                self._own.add(path)
                out.append(node)
            row = self.rows[path]
            if row.status != "failed" or path in self._opened:
                continue
            below = [c for c in node.children if c in self._descent_skipped]
            if not below:
                continue
            self._opened.add(path)
            why = plan.skip[below[0]] if below[0] in plan.skip else self._not_descended.get(below[0])
            share = f" (share {why[1]:.3g} < descend_share {self.cfg.descend_share:g})" if why else ""
            row.note = _joined(
                row.note, f"its replay failed: descended into all the same{share}, its {len(below)} children replayed"
            )
            for child in below:
                self._descent_skipped.discard(child)
                self._forced.add(child)
            out += [self.by_path[c] for c in below]
        order = {n.path: i for i, n in enumerate(self.nodes)}
        return sorted(out, key=lambda n: order[n.path])

    def _source(self, path: str) -> str:
        """The row ``path``'s copy is taken from in the end (a copy of a copy names the measured one)."""
        plan = self.plan
        assert plan is not None
        seen = {path}
        source = plan.copy[path]
        while source in self._copies and source not in seen:
            seen.add(source)
            source = plan.copy[source]
        return source

    def cost(self, path: str) -> float | None:
        """What every selection ranks by: :func:`cb_callback._engine.selection.descend.step_cost_ms`."""
        return step_cost_ms(path, self.by_path, self.rows, self.per_batch)

    def _row(self, node: Node) -> ComponentRow:
        row = ComponentRow(
            path=node.path, module_type=node.module_type, depth=node.depth, parent=node.parent,
            calls=self.calls[node.path].calls if node.path in self.calls else 0,
            params_mb=params_mb(self.modules[node.path]),
        )  # fmt: skip
        self._put_insitu(row, node.path, 0)
        if scripted(self.modules[node.path]):  # a later status's note (not_run, a copy ...) says more
            row.note = SCRIPTED
        if node.aliases:
            row.details["aliases"] = list(node.aliases)
        if node.shared_with:
            row.details["shared_with"] = list(node.shared_with)
        if self.coord is not None and has_unit(self.modules[node.path]):
            local, full = shard_bytes(self.modules[node.path])  # params_mb counts the unsharded parameters
            row.details["sharded"] = {"params_local_mb": local / 2**20, "params_full_mb": full / 2**20}
        self.rows[node.path] = row
        return row

    def _put_insitu(self, row: ComponentRow, path: str, batch: int) -> None:
        """The row's in-situ forward from batch ``batch``'s in-situ pass (``insitu_ms``, ``details["insitu"]``),
        and the captured step's own (``capture_ms``, when the capture timed it)."""
        info: InSitu = {}
        captured = self.batches[batch].get(path) if batch < len(self.batches) else None
        if captured is not None and captured.insitu_ms is not None:
            info["capture_ms"] = captured.insitu_ms
        mine = self.insitu[batch].times.get(path) if batch < len(self.insitu) else None
        if mine is not None:
            row.insitu_ms = mine.fwd_ms
            info.update({"fwd_ms": mine.fwd_ms, "spread": mine.spread, "passes": self.insitu[batch].passes})
            if math.isfinite(mine.bwd_ms):  # a top's whole backward; below, on CPU, its nodes'
                info["bwd_ms"] = mine.bwd_ms
        if self.plan is not None and (share := self.plan.shares.get(path)) is not None:
            info["share"] = share
        if info:
            row.details["insitu"] = info

    def _start(self, node: Node, started: list[Pending]) -> None:
        """Make the node's row; start it (each batch it ran in), or say why not."""
        row, cfg, path = self._row(node), self.cfg, node.path
        reason = self._filtered.get(path)
        plan = self.plan
        forced = path in self._forced  # below a failed component: descended into whatever its share
        if reason is None and plan is not None and path in plan.skip and self._called[path] and not forced:
            group = len(plan.groups[path]["members"]) if path in plan.groups else 0
            reason = not_descended_note(node, *plan.skip[path], cfg.descend_share, group)
            self._descent_skipped.add(path)
        if reason is None and path in self._not_descended and self._called[path] and not forced:
            reason = not_descended_note(node, *self._not_descended[path], cfg.descend_share)
            self._descent_skipped.add(path)
        own = path in self._own  # its source failed: measured on its own call
        if reason is None and plan is not None and path in plan.copy and self._called[path] and not own:
            self._copies.append(path)  # filled from its representative after the timing
            return
        if plan is not None and path in plan.not_copies:
            row.details["not_copy"] = plan.not_copies[path]
        if own:
            row.details["not_copy"] = f"its source {plan.copy[path] if plan else ''} failed: measured on its own call"
        # The timed runs come later: count the budget they will take.
        spent = time.perf_counter() - self.budget0
        committed = sum(p.committed_s for p in started)
        over = cfg.max_total_time_s is not None and spent + committed >= cfg.max_total_time_s
        if reason is not None:
            row.status, row.note = "skipped", reason
        elif cfg.budget_s is not None and spent + committed >= cfg.budget_s and path in self.calls:
            row.status = "skipped"
            ranks = " (its in-situ share ranks below those started)" if started and plan is not None else ""
            row.note = budget_note(cfg.budget_s, spent, committed, len(started), name="budget_s") + (
                f": not replayed{ranks}; its in-situ time stands"
                if math.isfinite(row.insitu_ms)
                else ": not replayed, and without an in-situ time (no in-situ pass ran): no numbers"
            )
            row.details["unreplayed"] = "budget_s"
            self._budget_left += 1
        elif over and (path != "" or cfg.max_total_time_s == 0):
            row.status, row.note = "skipped", budget_note(cfg.max_total_time_s or 0.0, spent, committed, len(started))
        elif path in self.calls and self._lockstep_only(node, row):
            pass
        elif path in self.calls and not self.multi:
            begun = self.run.start(row, self.modules[path])
            if begun is not None:
                started.append(begun)
        elif path in self.calls:  # every batch it ran in, each with a row of its own
            for b, batch_calls in enumerate(self.batches):
                if path in batch_calls:
                    row_b = dataclasses.replace(row, calls=batch_calls[path].calls, details={})
                    self._put_insitu(row_b, path, b)
                    self.per_batch.setdefault(path, {})[b] = row_b
                    begun = self.run.start(row_b, self.modules[path], batch_calls, b)
                    if begun is not None:
                        started.append(begun)
        elif self._called[path]:
            row.status, row.note = "estimated", "never called itself (a container)"
        else:
            row.status, row.note = "not_run", "neither it nor a descendant ran in the captured forward"

    def _lockstep_only(self, node: Node, row: ComponentRow) -> bool:
        """Whether the component is left to the lockstep phase (an FSDP2 unit's child: its parameters
        are sharded until its unit is unsharded), or not replayed here at all (``ranks="zero"``)."""
        if self.coord is None:
            return False
        unit = unit_of(node.path, self.units) if node.path not in self.units else None
        if unit is not None:
            for b, batch_calls in enumerate(self.batches):
                if node.path in batch_calls:
                    row_b = self.row_of(node.path, b) if self.multi else row
                    self.run.defer(row_b, b, f"its FSDP2 unit {unit or 'root'} holds its parameters sharded")
            return True
        why = self._lockstep_why.get(node.path)
        if why is not None:
            for b, batch_calls in enumerate(self.batches):
                if node.path in batch_calls:
                    self.run.defer(self.row_of(node.path, b) if self.multi else row, b, why)
            return True
        if not self.profiles:
            row.status, row.note = "skipped", "profiled on rank 0 (ranks='zero'): this rank replays in lockstep only"
            return True
        return False

    def fill_copies(self) -> None:
        """The rows the triage gave a representative's measurement (after every timed run and what-if),
        then each group member's ``details["group"]`` and ``details["as"]``."""
        plan = self.plan
        if plan is None:
            return
        done: set[str] = set()

        def fill(path: str) -> None:
            if path in done:
                return
            done.add(path)
            source = plan.copy[path]
            if source in plan.copy and source in self._copies:
                fill(source)  # a representative's own descendant may repeat too (experts in a block)
            take_row(self.rows[path], self.rows[source])
            if self.multi and source in self.per_batch:
                for b, r in self.per_batch[source].items():
                    if path in self.batches[b]:
                        mine = take_row(dataclasses.replace(self.rows[path], details={}), r)
                        mine.calls = self.batches[b][path].calls
                        self.per_batch.setdefault(path, {})[b] = mine

        for path in self._copies:
            fill(path)
        for path, info in plan.groups.items():
            row = self.rows.get(path)
            if row is None:
                continue
            row.details["group"] = _group_details(info, self.rows)
            if path in info["representatives"] or path in plan.alone or "not_copy" in row.details:
                row.details["as"] = "measured"
        for path in plan.not_copies:  # a descendant of a member replayed itself
            row = self.rows.get(path)
            if row is not None and "as" not in row.details:
                row.details["as"] = "measured"

    def fill_insitu(self) -> None:
        """The rows left unreplayed (not descended into, or left by ``budget_s``) that have an in-situ time:
        ``details["as"] = "insitu"``, with their FLOPs and bytes per call from the step's census
        (:attr:`cb_callback._engine.selection.triage.Plan.census`: each module's work in one forward and backward of
        its top, as the step ran it). Their status stays ``"skipped"``: no time of their own but ``insitu_ms``
        (the forward inside the step) and, on CPU, ``details["insitu"]["bwd_ms"]`` (the backward of the
        autograd nodes its forward built), no activation memory.

        Where the census's count is not the component's own: a shared module (one module at several
        paths) and an uncounted top have none (``details["insitu"]["counted"]`` says why); the backward
        of a module includes the step's gradient accumulation where its input is read twice (a residual),
        which a replay alone, given one gradient, does not do."""
        plan = self.plan
        if plan is None:
            return
        for path, row in self.rows.items():
            if row.status != "skipped" or not self._left(path, row) or not math.isfinite(row.insitu_ms):
                continue
            row.details["as"] = "insitu"
            info = row.details.setdefault("insitu", {})
            counts = [(b, c[path]) for b, c in enumerate(plan.census) if path in c]
            if not plan.census:
                info["counted"] = "no census of the step ran: FLOPs and bytes not counted"
                continue
            if not counts or any(x is None for _, x in counts):
                info["counted"] = (
                    "not counted by the census (its module is reachable from several paths, or it is outside the tops)"
                    if not counts
                    else "the census of its top raised: FLOPs and bytes not counted"
                )
                continue
            # The census replays each top once, as the in-situ pass does: a node's calls in that pass, not
            # the step's (a top the step called twice alike is replayed on one call)
            calls = sum(self._pass_calls(path, b) for b, _ in counts)
            if calls <= 0:
                continue
            fwd, bwd, moved = (sum(x[i] for _, x in counts if x is not None) for i in range(3))
            row.fwd_flops = fwd / calls
            row.bwd_flops = bwd / calls if self.cfg.backward else math.nan
            row.bytes = moved / calls
            info["counted"] = "census"

    def _pass_calls(self, path: str, batch: int) -> int:
        """``path``'s calls in one replay of its top on batch ``batch``: the in-situ pass's count, else the
        captured step's."""
        mine = self.insitu[batch].times.get(path) if batch < len(self.insitu) else None
        if mine is not None and mine.calls > 0:
            return mine.calls
        return self.batches[batch][path].calls if path in self.batches[batch] else 0

    def _left(self, path: str, row: ComponentRow) -> bool:
        """Whether ``row`` was left unreplayed by the triage or ``budget_s``: not descended into, left by the
        budget, or a copy of a representative that was (it keeps ``details["from"]``, whose decision it
        shares, and takes its own census counts, not the representative's)."""
        if path in self._descent_skipped or row.details.get("unreplayed") == "budget_s":
            return True
        source = self.rows.get(row.details.get("from") or "") if row.details.get("as") == "representative" else None
        return source is not None and source.status == "skipped"

    def row_of(self, path: str, batch: int) -> ComponentRow:
        """The row of ``path`` for ``batch`` (with several batches, its batch's own, made when first asked)."""
        if not self.multi:
            return self.rows[path]
        rows = self.per_batch.setdefault(path, {})
        if batch not in rows:
            calls = self.batches[batch][path].calls if path in self.batches[batch] else 0
            rows[batch] = dataclasses.replace(self.rows[path], calls=calls, details={})
        return rows[batch]

    def time_local(self, started: list[Pending]) -> None:
        """Time rank-local components outside the levels (an FSDP2 unit's children) and fill their rows."""
        timed = time_interleaved(started, self.rows, self.cfg, self._done, self._steps, self.device, self.canary_s)
        for p in started:
            self.run.finish(p, timed[p.key])
            if not self.multi:
                self.samples[p.row.path] = timed[p.key]
        self.pending += started

    def merge(self, paths: set[str]) -> None:
        """With several batches: merge the per-batch rows of ``paths`` (filled outside their level)."""
        if not self.multi:
            return
        for path in paths:
            if path in self.per_batch:
                shapes = {
                    b: input_signature(self.batches[b][path]) for b in self.per_batch[path] if path in self.batches[b]
                }
                merge_batches(self.rows[path], self.per_batch[path], shapes)

    def _finish(
        self, level: Sequence[Node], started: Sequence[Pending], timed: Mapping[tuple[str, int], SampleSet]
    ) -> None:
        """Fill the level's rows from their samples; merge each component's batches into its median one."""
        for p in started:
            self.run.finish(p, timed[p.key])
            if not self.multi:
                self.samples[p.row.path] = timed[p.key]
        replayed = {p.key: p.ctx.replay.inputs for p in started}  # after preprocessing (batch_size)
        for node in level:
            if node.path not in self.per_batch:
                continue
            shapes = {
                b: input_signature(replayed.get((node.path, b), self.batches[b][node.path]))
                for b in self.per_batch[node.path]
            }  # fmt: skip
            mid = merge_batches(self.rows[node.path], self.per_batch[node.path], shapes)
            if mid is not None and (node.path, mid) in timed:  # the quality checks: its batch's
                self.samples[node.path] = timed[(node.path, mid)]

    def compile_phase(self) -> None:
        """The compile what-if of the measured components, most expensive first.

        Most expensive by :meth:`cost` (``total_ms × calls`` summed over the
        batches a component ran in, as ``share`` counts it). ``compile_top``
        limits it to the first ``K``; with ``max_total_time_s`` a component is
        compiled only while the budget left covers the longest what-if so far
        (the first is not bounded: a compile cannot be interrupted); the others'
        ``details["compile"]["skipped"]`` says so. Dynamo is reset after each.
        """
        cfg = self.cfg
        measured: dict[str, list[Pending]] = {}
        for p in self.pending:
            if p.row.status == "ok" and not _across_ranks(p.row):
                measured.setdefault(p.row.path, []).append(p)
        over = {path: self.cost(path) or 0.0 for path in measured}
        ok = [self.rows[path] for path in measured if self.rows[path].status == "ok"]
        ok.sort(key=lambda r: over[r.path], reverse=True)
        chosen = ok if cfg.compile_top is None else ok[: cfg.compile_top]
        canary = cpu_canary() if self.device.type == "cpu" and chosen else None
        longest = 0.0  # the longest what-if so far: what the next one is expected to take at most
        for i, row in enumerate(chosen):
            elapsed = time.perf_counter() - self.budget0
            if cfg.max_total_time_s is not None and elapsed + longest >= cfg.max_total_time_s:
                for r in chosen[i:]:
                    r.details["compile"] = {
                        "skipped": f"max_total_time_s={cfg.max_total_time_s} spent ({elapsed:.2f} s elapsed, "
                        f"{longest:.2f} s for the longest compile what-if so far)"
                    }
                return
            t0 = time.perf_counter()
            self.run.compile(row, measured[row.path], canary)
            longest = max(longest, time.perf_counter() - t0)
            if cfg.progress is not None:
                cfg.progress(i + 1, len(chosen), f"compile what-if {row.path or 'root'}")

    def artifact_passes(self) -> None:
        """Each chosen component's artifacts, from passes of their own (after every timed run: never timed)."""
        cost = {n.path: self.cost(n.path) for n in self.nodes}
        for p in artifact_targets(self.pending, self.cfg, self.rows, cost):
            self.run.record_artifacts(p)
            if p.row is not self.rows[p.row.path]:  # one batch of several: the artifacts are the median batch's
                for key in ("artifacts", "metric_errors"):
                    if key in p.row.details:
                        self.rows[p.row.path].details[key] = p.row.details[key]


def time_interleaved(
    pending: Sequence[Pending],
    rows: Mapping[str, ComponentRow],
    cfg: BenchmarkConfig,
    done: int,
    total_steps: int,
    device: torch.device,
    canary_s: list[float],
) -> dict[tuple[str, int], SampleSet]:
    """The timed runs of the started components, interleaved in ``cfg.rounds`` rounds.

    Keyed by ``(path, batch)`` (:attr:`Pending.key`); with several batches a
    child slower than its parent is looked for batch by batch.

    With ``descend="all"`` these are every component; with ``"hotspots"`` one
    depth level's, so a child and its parent are never in the same call and a
    child slower than its parent is not re-measured (the quality assessment
    still flags the pair ``slower_than_parent``). Components that come out
    inconsistent (``noise`` above the noisy threshold, or a child slower than
    its parent) get the same number of rounds again, interleaved among
    themselves, once; their samples are pooled. On CPU a reference GEMM (the
    canary) is timed before every round into ``canary_s``.
    """
    canary = cpu_canary() if device.type == "cpu" and pending else None

    def progress(r: int) -> None:
        if cfg.progress is not None:
            cfg.progress(done + r, total_steps, f"timing round {r}/{cfg.rounds}")

    def run(items: Sequence[Pending], extend: list[SampleSet] | None = None) -> list[SampleSet]:
        return interleave(
            [p.sampler for p in items],
            budgets_s=[p.budget_s for p in items],
            rounds=cfg.rounds,
            min_repeats=cfg.min_repeats,
            max_repeats=cfg.max_repeats,
            sets=extend,
            on_round=progress if extend is None else None,
            canary=canary,
            canary_s=canary_s,
        )

    sets = run(pending)
    by_key = {p.key: s for p, s in zip(pending, sets, strict=True)}
    again = {key for key, s in by_key.items() if s.error is None and is_noisy(s)}
    for b in sorted({p.batch for p in pending}):
        mine = {p.row.path: p.row for p in pending if p.batch == b}
        batch_rows = {**rows, **mine}  # a parent timed in another level keeps its merged row
        medians = {
            path: by_key[(path, b)].median() for path in mine
            if by_key[(path, b)].samples and by_key[(path, b)].error is None
        }  # fmt: skip
        for child, parent in inconsistent_pairs(batch_rows, medians):
            again.update(((child, b), (parent, b)))
    redo = [i for i, p in enumerate(pending) if p.key in again]
    if redo:
        run([pending[i] for i in redo], [sets[i] for i in redo])
        for i in redo:
            sets[i].remeasured = True
    return by_key


def artifact_targets(
    pending: Sequence[Pending],
    cfg: BenchmarkConfig,
    rows: Mapping[str, ComponentRow],
    cost: Mapping[str, float | None],
) -> list[Pending]:
    """The components artifacts are written for: all, or the ``artifacts_top`` most expensive.

    Most expensive by ``cost`` (:func:`cb_callback._engine.selection.descend.step_cost_ms`:
    over every batch, as ``share``) among the measured (``ok``) rows. With
    several batches a component's artifacts come from the batch its row is (its
    median batch). ``pending`` holds :class:`Pending` (anything with ``row`` and
    ``batch``).
    """
    chosen: dict[str, Pending] = {}
    for p in pending:
        if p.row.status != "ok" or _across_ranks(p.row):
            continue
        mid = rows[p.row.path].details.get("median_batch")
        if p.row.path not in chosen or p.batch == mid:
            chosen[p.row.path] = p
    ok = list(chosen.values())
    if cfg.artifacts_top is None:
        return ok
    top = {id(p) for p in sorted(ok, key=lambda p: cost.get(p.row.path) or 0.0, reverse=True)[: cfg.artifacts_top]}
    return [p for p in ok if id(p) in top]


def _joined(first: str | None, then: str) -> str:
    return then if not first else f"{first}; {then}"


def _group_details(info: dict[str, Any], rows: Mapping[str, ComponentRow]) -> Group:
    """A group member's ``details["group"]``: its members, representatives, in-situ share and, with two
    or more representatives measured, how far apart they came (``spread``) and whether that is within
    their noise (``agree``)."""
    out: Group = {"members": list(info["members"]), "representatives": list(info["representatives"])}
    if info.get("share") is not None:
        out["insitu_share"] = info["share"]
    reps = [rows[r] for r in info["representatives"] if r in rows and rows[r].status == "ok"]
    totals = [r.fwd_ms + (0.0 if is_nan(r.bwd_ms) else r.bwd_ms) for r in reps]
    if len(totals) >= 2 and min(totals) > 0:
        spread = (max(totals) - min(totals)) / min(totals)
        noise = sum(r.noise for r in reps if not is_nan(r.noise))
        out["spread"] = spread
        out["agree"] = spread <= 2 * noise + 0.10
    return out


def _across_ranks(row: ComponentRow) -> bool:
    """Replayed in lockstep, or under its FSDP unit unsharded: not replayed again on one rank (the
    compile what-if and the artifacts replay alone)."""
    return "lockstep" in row.details or "fsdp" in row.details


def budget_note(limit: float, spent: float, committed: float, started: int, name: str = "max_total_time_s") -> str:
    """Why a component was not started within ``max_total_time_s`` (or ``name``): what was spent, what was
    still owed."""
    owed = (
        f" and {committed:.2f} s more committed to the timed runs of the {started} component"
        f"{'s' if started != 1 else ''} started before it (at least their timing budget each)"
        if started
        else ""
    )
    return f"{name}={limit:g} reached: {spent:.2f} s spent profiling so far{owed}"
