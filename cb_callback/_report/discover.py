"""Find component reports under a directory (a Lightning log directory, a TensorBoard logdir), pick one by step.

The rules the ``cb`` commands and the TensorBoard tab share:

- a directory that holds the file (``report.json``, a snapshot's ``snapshot.pt``)
  is that one;
- a file names that very file: a report is read from it whatever its name
  (``notes.json`` that is not a report is refused, naming ``notes.json``:
  another report is never substituted); a snapshot's file names its directory;
- any other directory is searched (itself and below, at most 20,000 directories)
  and the *newest* one found is taken: the most recently written file;
- a capture step (``metadata["capture_step"]``, which the callback records; with
  ``capture_every`` each capture is its own ``step_<N>/`` folder) picks among
  those found the one of that step (the newest of them if several have it);
- ``DIR@N`` is shorthand for "DIR, capture step N" unless a path of that very
  name exists; ``DIR@x``, ``DIR@`` or ``DIR@-1`` where ``DIR`` exists (and
  ``DIR@x`` does not) is refused (:class:`InvalidStepError`, naming the steps
  under ``DIR``): ``N`` must be a capture step number, 0 or more.

:func:`resolve_report_dir` is the one implementation: ``cb report``, ``cb diff``
and :meth:`Report.load <cb_callback._report.model.Report.load>` all call it
(``cb replay`` / ``cb compare`` call :func:`resolve` for snapshots), so the
three accept the same locations and say the same things. This module imports
the standard library only: it sits in the model-of-results layer.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "REPORT_FILE",
    "Found",
    "InvalidStepError",
    "Resolved",
    "StepNotFoundError",
    "capture_step",
    "describe",
    "find_dirs",
    "find_reports",
    "malformed_step",
    "report_step",
    "resolve",
    "resolve_report_dir",
    "run_of",
    "split_location",
]

REPORT_FILE = "report.json"
_MAX_DIRS = 20_000  # directories walked at most
_AT_STEP = re.compile(r"^(?P<base>.*)@(?P<step>\d+)$")
_STEP_DIR = re.compile(r"^step_\d+$")


class StepNotFoundError(LookupError):
    """No report (snapshot) of the capture step asked for; the message names the steps there are."""


class InvalidStepError(StepNotFoundError, ValueError):
    """``DIR@N`` whose ``N`` is not a capture step number (``run@x``, ``run@``, ``run@-1``).

    A :class:`StepNotFoundError` (what was asked for is not there: the message
    names the capture steps under ``DIR``) and a :class:`ValueError` (the
    argument is malformed), so that a caller catching either sees it.
    """


@dataclass(frozen=True)
class Found:
    """One report (or snapshot) directory found.

    Attributes:
        directory: the directory holding the file.
        mtime: the file's modification time (seconds since the epoch): "newest" is the largest.
        step: its capture step (``metadata["capture_step"]``), ``None`` when it records none.
    """

    directory: Path
    mtime: float
    step: int | None


@dataclass(frozen=True)
class Resolved:
    """What a location names: the directory taken and, when it was searched for, what else was found.

    Attributes:
        directory: the directory taken.
        step: its capture step, when known (always when one was asked for).
        found: every candidate found under the searched directory, the one taken included;
            empty when the location named one directly (a directory holding the file, the file).
        searched: the directory searched (``None`` when the location named one directly).
        asked: whether a capture step was asked for.
        file: the file the location named, when it named one and files name themselves
            (reports: ``cb report notes.json`` reads ``notes.json``); ``None`` otherwise.
    """

    directory: Path
    step: int | None = None
    found: list[Found] = field(default_factory=list)
    searched: Path | None = None
    asked: bool = False
    file: Path | None = None

    def path(self, filename: str) -> Path:
        """The file to read: the file named (:attr:`file`), else ``directory / filename``."""
        return self.file if self.file is not None else self.directory / filename


def capture_step(metadata: object) -> int | None:
    """``metadata["capture_step"]`` when it is a non-negative integer, else ``None``."""
    step = metadata.get("capture_step") if isinstance(metadata, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None


def report_step(directory: Path) -> int | None:
    """The capture step ``directory/report.json`` records (``directory`` may be the report file itself);
    ``None`` when none or unreadable."""
    file = directory if directory.is_file() else directory / REPORT_FILE
    try:
        data = json.loads(file.read_text(), parse_constant=lambda _: None)
    except (OSError, ValueError):
        return None
    return capture_step(data.get("metadata")) if isinstance(data, dict) else None


def split_location(location: str | Path) -> tuple[Path, int | None]:
    """``DIR@N`` as ``(DIR, N)``; anything else, or a path of that very name that exists, as ``(path, None)``.

    A malformed ``DIR@x`` is returned whole, ``(Path("DIR@x"), None)``: :func:`malformed_step`
    tells it apart from a path.
    """
    text = str(location)
    match = _AT_STEP.match(text)
    if match is None or Path(text).exists():
        return Path(text), None
    return Path(match["base"] or "."), int(match["step"])


def malformed_step(location: str | Path) -> tuple[Path, str] | None:
    """``(DIR, tail)`` when ``location`` is ``DIR@tail`` with a ``tail`` that is no capture step number.

    Only when ``DIR`` exists and ``location`` itself does not (a path named with an ``@``
    is a path), and ``tail`` holds no path separator (``/data/a@b/run`` is a path too);
    ``None`` otherwise, a well-formed ``DIR@N`` included.
    """
    text = str(location)
    base, sep, tail = text.rpartition("@")
    if not sep or _AT_STEP.match(text) or "/" in tail or os.sep in tail or Path(text).exists():
        return None
    directory = Path(base or ".")
    return (directory, tail) if directory.exists() else None


def _looks_like_report(path: Path) -> bool:
    """A ``report.json`` of ours: a JSON object naming ``metadata`` or ``rows`` early on."""
    try:
        with path.open("rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return head.lstrip().startswith(b"{") and (b'"rows"' in head or b'"metadata"' in head)


def find_dirs(root: str | Path, filename: str, accept: Callable[[Path], bool] | None = None) -> list[Path]:
    """Directories under ``root`` (itself included) holding ``filename`` (that ``accept`` takes), sorted.

    Walks at most 20,000 directories, each directory's entries in name order.
    """
    found: list[Path] = []
    for seen, (dirpath, dirnames, filenames) in enumerate(os.walk(Path(root)), start=1):
        if seen > _MAX_DIRS:
            break
        dirnames.sort()
        if filename in filenames and (accept is None or accept(Path(dirpath) / filename)):
            found.append(Path(dirpath))
    return sorted(found)


def find_reports(root: str | Path) -> list[Path]:
    """Directories under ``root`` (itself included) that hold a component report, sorted.

    Walks at most 20,000 directories; a ``report.json`` counts when it looks like
    one of ours (a JSON object with ``metadata`` / ``rows``).
    """
    return find_dirs(root, REPORT_FILE, _looks_like_report)


def run_of(directory: Path) -> Path:
    """The run a report belongs to: its directory without a last ``step_<N>`` folder (a capture of several)."""
    return directory.parent if _STEP_DIR.match(directory.name) else directory


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return float("-inf")


def _steps_text(found: Sequence[Found]) -> str:
    """``8, 10, 500`` (each step once, ascending), plus how many record none."""
    steps = sorted({f.step for f in found if f.step is not None})
    without = sum(f.step is None for f in found)
    text = ", ".join(str(s) for s in steps) if steps else "none"
    return text + (f" (and {without} without a capture step)" if without and steps else "")


def _refuse_malformed(
    text: str, filename: str, find: Callable[[Path], list[Path]], step_of: Callable[[Path], int | None]
) -> None:
    """Raise :class:`InvalidStepError` when ``text`` is a malformed ``DIR@N`` (:func:`malformed_step`)."""
    bad = malformed_step(text)
    if bad is None:
        return
    directory, tail = bad
    dirs = find(directory) if directory.is_dir() else [directory.parent]  # DIR@x's DIR: a directory or the file
    got = f"not {tail!r}" if tail else "nothing after the '@'"
    there = (
        f"capture steps at or under {directory}: {_steps_text([Found(d, 0.0, step_of(d)) for d in dirs])}"
        if dirs
        else f"there is no {filename} at or under {directory}"
    )
    raise InvalidStepError(f"{text}: in DIR@N, N must be a capture step number (0, 1, 2 ...), {got}; {there}")


def _the_file(file: Path, step: int | None, what: str, step_of: Callable[[Path], int | None]) -> Resolved:
    """A file named: that file, checked against the capture step asked for (never another one)."""
    if step is None:
        return Resolved(file.parent, file=file)
    recorded = step_of(file)
    if recorded != step:
        has = f"capture step {recorded}" if recorded is not None else "no capture step"
        raise StepNotFoundError(f"no {what} of capture step {step} at {file}: it records {has}")
    return Resolved(file.parent, step, file=file, asked=True)


def resolve(
    location: str | Path,
    step: int | None,
    *,
    filename: str,
    what: str,
    find: Callable[[Path], list[Path]],
    step_of: Callable[[Path], int | None],
    missing: str | None = None,
    files_name_themselves: bool = False,
) -> Resolved:
    """The directory ``location`` names, by the rules of this module's docstring.

    Args:
        location: a directory holding ``filename``, the file, a directory above such
            directories, or any of those as ``DIR@N`` (capture step ``N``).
        step: the capture step to pick (``None``: the one ``DIR@N`` names, else the one
            named, else the newest found).
        filename: the file that marks a directory (``report.json``, ``snapshot.pt``).
        what: the noun for messages (``"report"``, ``"snapshot"``).
        find: the directories under a directory holding ``filename``.
        step_of: a directory's capture step.
        missing: the message when nothing is found (``{path}`` is replaced);
            default ``no <filename> at or under <path>``.
        files_name_themselves: a file named is that file, whatever its name
            (:attr:`Resolved.file`; ``step_of`` is then asked about the file itself);
            else (snapshots) a file names its directory.

    Raises:
        FileNotFoundError: nothing at or under ``location``.
        StepNotFoundError: none of those found has capture step ``step`` (the message lists theirs).
        InvalidStepError: ``DIR@x``: not a capture step number (the message lists the steps under ``DIR``).
        ValueError: ``DIR@N`` and ``step`` name different steps.
    """
    text = str(location)
    _refuse_malformed(text, filename, find, step_of)
    p, at = split_location(text)
    if at is not None and step is not None and at != step:
        raise ValueError(f"{text} and step {step} name different steps")
    step = at if at is not None else step
    if files_name_themselves and p.is_file():
        return _the_file(p, step, what, step_of)
    named = p.parent if p.is_file() else (p if (p / filename).is_file() else None)
    if named is not None and step is None:
        return Resolved(named)
    dirs = find(p) if p.is_dir() else ([named] if named is not None else [])
    if not dirs:
        raise FileNotFoundError(f"no {filename} at or under {p}" if missing is None else missing.format(path=p))
    found = [Found(d, _mtime(d / filename), step_of(d)) for d in dirs]
    if step is None:
        newest = max(found, key=lambda f: f.mtime)
        return Resolved(newest.directory, newest.step, found, p)
    mine = [f for f in found if f.step == step]
    if not mine:
        raise StepNotFoundError(
            f"no {what} of capture step {step} at or under {p}; capture steps there: {_steps_text(found)}"
        )
    newest = max(mine, key=lambda f: f.mtime)
    return Resolved(newest.directory, step, found, p, asked=True)


def resolve_report_dir(path: str | Path, step: int | None = None) -> Resolved:
    """The report a user means by ``path`` (and ``step``): see this module's docstring.

    ``path`` may be a report directory, a report file (any name: that file is read,
    :attr:`Resolved.file`), or any directory
    above reports (``lightning_logs/``, ``lightning_logs/version_0``): then the
    most recently written report under it is taken, or with ``step`` (or
    ``path@N``) the one of that capture step.

    Raises:
        FileNotFoundError: when there is no report at or under ``path``.
        StepNotFoundError: when none there is of capture step ``step``.
        InvalidStepError: ``path`` is ``DIR@x``, no capture step number.
        ValueError: ``DIR@N`` and ``step`` name different steps.
    """
    return resolve(
        path,
        step,
        filename=REPORT_FILE,
        what="report",
        find=find_reports,
        step_of=report_step,
        files_name_themselves=True,
    )


def describe(resolved: Resolved, what: str, filename: str) -> str | None:
    """The line saying which one was taken; ``None`` when the location named it directly.

    Several found, none asked for: ``cb: using DIR/report.json (capture step 500, the
    newest of 3 reports under LOGS; capture steps: 8, 10, 500; pick one with --step N
    or DIR@N)``. A step asked for: ``cb: using DIR/report.json (capture step 10;
    capture steps under LOGS: 8, 10, 500)``, saying so when several have that step.
    One found: ``cb: using DIR/report.json`` (and its step, when it records one).
    """
    if resolved.searched is None:
        return None
    taken, found, where = resolved.directory / filename, resolved.found, resolved.searched
    step = f"capture step {resolved.step}" if resolved.step is not None else None
    if len(found) == 1:
        return f"cb: using {taken}" + (f" ({step})" if step else "")
    steps = _steps_text(found)
    if not resolved.asked:
        about = f"{step}, " if step else ""
        listed = f"; capture steps: {steps}; pick one with --step N or DIR@N" if steps != "none" else ""
        return f"cb: using {taken} ({about}the newest of {len(found)} {what}s under {where}{listed})"
    same = sum(f.step == resolved.step for f in found)
    several = f", the newest of {same} {what}s of that step" if same > 1 else ""
    return f"cb: using {taken} ({step}{several}; capture steps under {where}: {steps})"
