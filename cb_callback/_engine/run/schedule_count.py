"""A run's progress: components, timing rounds and compile what-ifs counted apart.

The engine reports progress as ``progress(done, total, label)``
(:class:`cb_callback.BenchmarkConfig`'s ``progress``) with one count over its
schedule (:class:`cb_callback._engine.run.schedule.Schedule`): ``total`` is the
components plus ``rounds`` timing rounds per level (one level with
``descend="all"``, one per depth with ``"hotspots"``); ``label`` is a
component's path (``""`` for the root), ``timing round r/R``, or, counted on
its own, ``compile what-if PATH``. :class:`ScheduleCount` reads those apart
(the ``cb`` CLI's :class:`ConsoleProgress` and the Lightning callback's bar
draw what it counts).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TextIO

from torch import nn

from cb_callback._engine.capture.inputs import ComponentInputs
from cb_callback._engine.capture.tree import build_tree
from cb_callback._engine.replay.batches import merged_calls
from cb_callback._engine.run.config import BenchmarkConfig
from cb_callback._engine.selection.descend import levels

__all__ = ["ConsoleProgress", "ProgressEvent", "ScheduleCount"]

_ROUND = re.compile(r"^timing round (\d+)/(\d+)$")  # Schedule's labels (schedule.time_interleaved)
_COMPILE = "compile what-if "  # Schedule.compile_phase


@dataclass(frozen=True)
class ProgressEvent:
    """One progress call of the engine, read.

    Attributes:
        kind: ``"component"`` (one more component started), ``"round"`` (a
            timing round done) or ``"compile"`` (a compile what-if done).
        text: what it is about: the component's path (``"root"`` for the
            root), ``timing round r/R``, or ``compile what-if d/n (PATH)``.
        milestone: whether it ends a phase: a level's last timing round, or
            the last compile what-if.
    """

    kind: Literal["component", "round", "compile"]
    text: str
    milestone: bool


class ScheduleCount:
    """What the engine's progress calls count, read apart: components started, timing rounds done, the level.

    Args:
        components: how many components the run has (``None``: count without a total).
        rounds: timing rounds per level (``BenchmarkConfig.rounds``).
        levels: how many levels the components are timed in.
        sizes: the components of each level (``[components]`` by default with one level).
        other_sizes: those of the ``other_levels``.
        other_levels: the number of levels the engine may take instead (one per
            depth, when ``descend="hotspots"`` finds no in-situ times), told by its
            first call's ``total``.

    Attributes:
        started: components started so far (at most ``components`` when the total is right).
        rounds_done: timing rounds done so far, over all levels.
        level: the level being timed (1-based; 0 before the first round).
        sizes: the components of each level, in order (``None``: not known; then
            the rounds phase begins at the first round's call, not before it).
        phase: what the run is doing now: ``"components"`` (starting them),
            ``"rounds"`` (timing a level: from its last component's start to its
            last round) or ``"compile"`` (the compile what-ifs).
        phase_done, phase_total: in the rounds phase, the level's timing rounds
            done and its ``rounds``; in the compile phase, what-ifs done and their
            number (0 and 0 in the component phase).
        levels_done: levels whose last timing round is done.

    Notes:
        When the engine's first ``total`` is ``components + rounds × other_levels``
        (the triage found no in-situ times and went level by level), those
        levels are taken; when it is neither (a preprocessor that changed the
        model's tree), ``components`` becomes ``None``: counted without a total
        rather than with a wrong one. A ``total`` that grows later by ``k +
        rounds`` is one more level of ``k`` components (the components a
        failure calls for, ``Schedule.run_levels``).
    """

    def __init__(
        self,
        components: int | None,
        rounds: int,
        levels: int,
        other_levels: int | None = None,
        *,
        sizes: Sequence[int] | None = None,
        other_sizes: Sequence[int] | None = None,
    ) -> None:
        self.components, self.rounds, self.levels, self.other_levels = components, rounds, levels, other_levels
        self.started = self.rounds_done = self.level = 0
        self.phase: Literal["components", "rounds", "compile"] = "components"
        self.phase_done, self.phase_total = 0, 0
        if sizes is None and levels == 1 and components is not None:
            sizes = [components]
        self.sizes: list[int] | None = list(sizes) if sizes is not None else None
        self._other_sizes = list(other_sizes) if other_sizes is not None else None
        self.levels_done = 0  # levels whose last timing round is done
        self._total: int | None = None  # the engine's total last seen (None: not checked yet)

    @classmethod
    def for_run(
        cls, model: nn.Module, batches: Sequence[Mapping[str, ComponentInputs]], config: BenchmarkConfig
    ) -> ScheduleCount:
        """The count of profiling ``model`` on ``batches`` with ``config``: the components of its tree.

        The tree is the engine's (:func:`cb_callback._engine.capture.tree.build_tree`,
        as ``profile_captured`` builds it, ``max_depth`` applied).
        """
        nodes, _ = build_tree(model, merged_calls(batches), config.max_depth)
        # One level when everything is timed at once (descend="all", or the triage's plan from in-situ
        # times); the engine's first call corrects it (one level per depth without in-situ times).
        depths = [len(level) for level in levels(nodes)]
        if config.descend == "all":
            return cls(len(nodes), config.rounds, 1)
        if config.insitu_passes > 0:
            return cls(len(nodes), config.rounds, 1, other_levels=len(depths), other_sizes=depths)
        return cls(len(nodes), config.rounds, len(depths), sizes=depths)

    @property
    def total_rounds(self) -> int:
        """The timing rounds of the run: ``rounds`` per level."""
        return self.rounds * self.levels

    def read(self, done: int, total: int, label: str) -> ProgressEvent:
        """Count one progress call of the engine (see the module docstring) and say what it was."""
        if label.startswith(_COMPILE):
            self.phase, self.phase_done, self.phase_total = "compile", done, total
            return ProgressEvent("compile", f"compile what-if {done}/{total} ({label[len(_COMPILE) :]})", done == total)
        self._check(total)
        match = _ROUND.match(label)
        if match is None:
            self.started += 1
            self.phase, self.phase_done, self.phase_total = "components", 0, 0
            if self.started == self._level_end():  # the level's last component: its timing rounds come next
                self.phase, self.phase_total = "rounds", self.rounds
            return ProgressEvent("component", label or "root", False)
        r, of = int(match[1]), int(match[2])
        self.level += r == 1
        self.rounds_done += 1
        self.phase, self.phase_done, self.phase_total = "rounds", r, of
        self.levels_done += r == of
        return ProgressEvent("round", label, r == of)

    def _level_end(self) -> int | None:
        """The components started when the current level's are (``None``: not known)."""
        if self.components is None or self.sizes is None or self.levels_done >= len(self.sizes):
            return None
        return sum(self.sizes[: self.levels_done + 1])

    def _check(self, total: int) -> None:
        if self._total is None and self.components is not None:
            if total != self.components + self.rounds * self.levels:
                other = self.other_levels
                if other is not None and total == self.components + self.rounds * other:
                    self.levels = other  # the engine timed level by level after all (no in-situ times)
                    self.sizes = self._other_sizes
                else:
                    self.components = self.sizes = None
        elif self._total is not None and total > self._total and self.components is not None:
            more = total - self._total - self.rounds  # one more level (Schedule.run_levels)
            self.components += more
            self.levels += 1
            if self.sizes is not None:
                self.sizes.append(more)
        self._total = total

    def counts(self, *, rounds: bool) -> str:
        """``components 5/12``, with ``rounds``: ``, timing rounds 3/15 (level 2 of 3)``."""
        text = f"components {self.started}" + (f"/{self.components}" if self.components is not None else "")
        if rounds:
            text += f", timing rounds {self.rounds_done}/{self.total_rounds}"
            if self.levels > 1:
                text += f" (level {self.level} of {self.levels})"
        return text


class ConsoleProgress:
    """``progress(done, total, label)`` written to ``stream`` as ``cb: components 5/12, timing rounds 3/15``.

    Args:
        stream: where to write (``sys.stderr``).
        components, rounds, levels, other_levels: :class:`ScheduleCount`'s.

    Notes:
        On a terminal (``stream.isatty()``) one line is rewritten in place
        (``\\r``, then erase to the end of the line) and :meth:`close` ends it.
        Into a file or a pipe it writes plain lines only, without ``\\r`` or
        escape codes: one when a level's timing rounds are done (``(level 2 of
        3)`` with several), one when the compile what-ifs are, and at
        :meth:`close` the last state if it was not written yet. What the
        counts are, and when they go without a total: :class:`ScheduleCount`.
    """

    def __init__(
        self, stream: TextIO, components: int | None, rounds: int, levels: int, other_levels: int | None = None
    ) -> None:
        self.stream = stream
        self.count = ScheduleCount(components, rounds, levels, other_levels)
        isatty = getattr(stream, "isatty", None)
        self.tty = bool(isatty()) if callable(isatty) else False
        self._last = ""  # the state last written
        self._printed = ""  # the state last written as a plain line

    @classmethod
    def for_run(
        cls,
        model: nn.Module,
        batches: Sequence[Mapping[str, ComponentInputs]],
        config: BenchmarkConfig,
        stream: TextIO,
    ) -> ConsoleProgress:
        """The progress of profiling ``model`` on ``batches`` with ``config`` (:meth:`ScheduleCount.for_run`)."""
        count = ScheduleCount.for_run(model, batches, config)
        return cls(stream, count.components, count.rounds, count.levels, count.other_levels)

    def __call__(self, done: int, total: int, label: str) -> None:
        """One progress call of the engine (see the module docstring)."""
        event = self.count.read(done, total, label)
        if event.kind == "compile":
            self._write(f"cb: {event.text}", event.milestone)
        elif event.kind == "component":
            self._write(f"cb: {self.count.counts(rounds=False)} ({event.text})", False)
        else:
            self._write(f"cb: {self.count.counts(rounds=True)}", event.milestone)

    def _write(self, state: str, milestone: bool) -> None:
        self._last = state
        if self.tty:
            self.stream.write(f"\r{state}\033[K")
            self.stream.flush()
        elif milestone:
            self._line(state)

    def _line(self, state: str) -> None:
        self.stream.write(state + "\n")
        self.stream.flush()
        self._printed = state

    def close(self) -> None:
        """End the terminal's line; into a file, write the last state unless it was the last line written."""
        if self.tty and self._last:
            self.stream.write("\n")
            self.stream.flush()
        elif not self.tty and self._last and self._last != self._printed:
            self._line(self._last)
        self._last = ""
