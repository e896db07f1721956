"""The ``cb`` command: replay a snapshot, print a saved report or draw its roofline, compare reports or components."""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cb_callback._report.diff import compare_reports, format_diff
from cb_callback._report.discover import (
    REPORT_FILE,
    Resolved,
    StepNotFoundError,
    describe,
    resolve_report_dir,
    split_location,
)
from cb_callback._report.gate import DEFAULT_MIN_SHARE, gate_reports, parse_percent
from cb_callback._report.listing import format_listing, select_rows
from cb_callback._report.model import COLUMNS, Report

if TYPE_CHECKING:
    from cb_callback._whatif.checkpoint import CheckpointPlan
    from cb_callback._whatif.snapshot import Snapshot

__all__ = ["main"]

_TRUST = "Snapshots are pickles: only replay snapshots you trust."
_DIFF_METRICS = tuple(c for c in COLUMNS if c.endswith(("_ms", "_mb", "flops", "bytes", "gbps", "mfu", "util")))
_DIFF_SORTS = ("change", "path", "a", "b", "ratio")
_REPORT_SORTS = tuple(c for c in COLUMNS if c not in ("error", "note"))
_LOCATION_HELP = (
    "directory with {file} (or the file), or a directory above such as a Lightning log directory: the newest "
    "{what} under it is taken (which one, and the capture steps there, is said on stderr); DIR@N: the {what} of "
    "capture step N under DIR"
)
_STEP_HELP = (
    "take the {what} of capture step N (ComponentBenchmark(capture_every=...) writes one per capture, "
    "under step_<N>/); a step not there exits 2 naming the steps that are"
)


def _parser() -> argparse.ArgumentParser:
    """The ``cb`` parser: one sub-command each for ``replay``, ``report``, ``diff``, ``compare`` and ``roofline``."""
    parser = argparse.ArgumentParser(
        prog="cb",
        description="cb_callback component benchmark: replay snapshots, print, draw and compare reports. Every "
        "command ends with status 141 (as a command killed by SIGPIPE), quietly, when its reader stops early "
        "(cb report DIR | head).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_replay(sub)
    _add_report(sub)
    _add_diff(sub)
    _add_compare(sub)
    _add_roofline(sub)
    _add_checkpoint(sub)
    return parser


def _add_replay(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``cb replay``: profile a snapshot offline."""
    replay = sub.add_parser(
        "replay",
        help="profile a snapshot (written by ComponentBenchmark(mode='fork')) offline",
        description=f"Profile a snapshot offline, e.g. on another machine or GPU. Exit status: 0 profiled "
        "and written, 1 profiled but the report files could not be written, 2 could not replay (the "
        "snapshot cannot be read, none of the capture step asked for, the device is not available, an invalid "
        "option, an --out that is a file or cannot be made a directory: said before replaying). Progress goes "
        "to stderr: on a terminal one line rewritten in place; into a file or a pipe "
        f"plain lines, one per level of timing rounds. {_TRUST}",
    )
    _add_snapshot(replay)
    replay.add_argument(
        "--device",
        default=None,
        help="where to replay (cpu, cuda, cuda:1 ...); default: the device the snapshot was "
        "captured on when this machine has it, else cpu",
    )
    replay.add_argument(
        "--out", type=Path, default=None, help="where the report files go; default: the snapshot's directory/replay"
    )
    replay.add_argument("--top", type=_count, default=10, metavar="K", help="hotspots to print (default 10)")
    replay.add_argument(
        "--descend",
        choices=("all", "hotspots"),
        default=None,
        help="all: every component (the complete tree); hotspots: the triage from in-situ times, repeated "
        "structure measured once (default: as the snapshot was taken)",
    )
    _add_compile(replay, top=True)
    replay.add_argument(
        "--script",
        type=Path,
        default=None,
        help="the training script that defines the model's class (for a class in `__main__`), "
        "when it is no longer where the snapshot recorded it; its `if __name__ == '__main__':` "
        "block does not run",
    )


def _add_report(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``cb report``: print a saved report's summary and hotspots (or a listing)."""
    report = sub.add_parser(
        "report",
        help="print a saved report's summary and hotspots",
        description="Print a saved report's summary and hotspots; with --sort, --filter or --depth, the selected "
        "components in place of the hotspots (one listing). Exit status: 0 printed, 2 no report, none of "
        "the capture step asked for, one that cannot be read (not JSON, not a report's schema), or a report.html "
        "that cannot be written (--html).",
    )
    report.add_argument("report", metavar="DIR", help=_LOCATION_HELP.format(what="report", file=REPORT_FILE))
    report.add_argument("--step", type=_count, default=None, metavar="N", help=_STEP_HELP.format(what="report"))
    report.add_argument(
        "--top",
        type=_count,
        default=None,
        metavar="K",
        help="component lines to print: the K hotspots (default 10); with --sort, --filter or --depth the "
        "first K of the selected components (default all)",
    )
    report.add_argument("--html", action="store_true", help="(re)write report.html beside report.json")
    _add_selection(report, sorts=_REPORT_SORTS, default_sort=None)


def _add_diff(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``cb diff``: compare two saved reports component by component."""
    diff = sub.add_parser(
        "diff",
        help="compare two saved reports component by component",
        description="Compare two saved reports component by component: two runs, or two captures of one run "
        "(cb diff DIR@10 DIR@500). With --fail-over PCT, a regression gate: exit 1 when a component holding at "
        "least --min-share of the step (in either report) got worse by more than PCT and beyond both runs' noise. "
        "Exit status: 0 compared (and the gate passed), 1 the gate failed, 2 a report missing or unreadable, or "
        "an --html page that cannot be written. "
        "With --fail-over, 2 also when the gate could not compare: a report without rows or root, two different "
        "models (unless --allow-mismatch), a --filter matching nothing, or no component judged.",
    )
    diff.add_argument("a", metavar="A", help="baseline report: a location as for cb report, DIR@N for capture step N")
    diff.add_argument("b", metavar="B", help="report to compare with A (as A)")
    diff.add_argument(
        "--metric", default="total_ms", choices=_DIFF_METRICS, help="column to compare (default total_ms)"
    )
    diff.add_argument(
        "--html",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write a diff page (B's tree coloured by the change; both runs' quality in its header)",
    )
    diff.add_argument(
        "--fail-over",
        type=_percent,
        default=None,
        metavar="PCT",
        help="regression gate: exit 1 when a component got worse (slower; for memory, FLOPs, bytes: higher; for "
        "a throughput: lower) by more than PCT percent of A (10 and 10%% both mean 10 %%) and beyond the two "
        "runs' noise (2 x the larger relative IQR; 5 %% without a measured noise; none for a count or a size). "
        "Components failed, at the harness floor or without a value are not gated and are listed so",
    )
    diff.add_argument(
        "--min-share",
        type=_share_percent,
        default=DEFAULT_MIN_SHARE,
        metavar="PCT",
        help="with --fail-over: gate only the components holding at least PCT percent of the step's --metric in "
        "A or in B, 0 to 100 (default 1)",
    )
    diff.add_argument(
        "--allow-mismatch",
        action="store_true",
        help="with --fail-over: gate two reports that look like different models (by default that is exit 2, "
        "could not compare)",
    )
    diff.add_argument(
        "--absolute",
        action="store_true",
        help="with --fail-over: judge each component's time as measured; by default a change every component "
        "shares (the median change below the root: a slower machine) is discounted first",
    )
    diff.add_argument(
        "--format",
        default="text",
        choices=("text", "markdown", "json"),
        help="text (default): the diff, then the gate's verdict; markdown: the gate's table for a pull-request "
        "comment; json: every component's verdict (docs/explore.md has the schema). markdown and json need "
        "--fail-over",
    )
    _add_selection(diff, sorts=_DIFF_SORTS, default_sort="change")


def _percent(text: str) -> float:
    """A percent (``10``, ``10%``, ``2.5``) as a fraction, for argparse."""
    try:
        return parse_percent(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _share_percent(text: str) -> float:
    """A share of the step in percent, 0 to 100, as a fraction, for argparse."""
    value = _percent(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"expected a share of the step from 0 to 100 %, got {text!r}")
    return value


def _add_compare(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``cb compare``: check a re-authored component against a snapshot's component."""
    import re

    compare = sub.add_parser(
        "compare",
        help="check a re-authored component against a snapshot's component (numerics and speed)",
        description="Run a snapshot's component and a candidate module on the component's captured inputs, "
        "compare outputs and gradients, and time both. Exit status: 0 equivalent, 1 not equivalent, "
        f"2 could not compare. {_TRUST}",
    )
    # "--rtol -inf", "--atol -1": a value that looks negative is a value here, so _tolerance names what is wrong
    # with it (argparse would say "expected one argument"); this parser has no option named like one
    compare._negative_number_matcher = re.compile(r"^-(\.?\d|inf|nan)", re.IGNORECASE)
    _add_snapshot(compare)
    compare.add_argument("--path", required=True, help="the component's dotted path ('' for the root)")
    compare.add_argument(
        "--candidate",
        required=True,
        metavar="MODULE:FACTORY",
        help="package.module:factory; factory() returns the candidate module (factory(reference) if it "
        "takes one argument); the module must be importable (PYTHONPATH)",
    )
    compare.add_argument("--device", default=None, help="where to run (default: as for cb replay)")
    compare.add_argument(
        "--rtol", type=_tolerance, default=None, help="relative tolerance, a finite number >= 0 (default: by dtype)"
    )
    compare.add_argument(
        "--atol", type=_tolerance, default=None, help="absolute tolerance, a finite number >= 0 (default: by dtype)"
    )
    compare.add_argument("--no-backward", action="store_true", help="compare and time the forward only")
    _add_compile(compare, top=False)
    compare.add_argument(
        "--script", type=Path, default=None, help="the training script defining the model's class (as for cb replay)"
    )


def _tolerance(text: str) -> float:
    """A tolerance, a finite number >= 0, for argparse (``inf`` would call any candidate equivalent, a negative
    or NaN one none)."""
    import math

    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def _add_roofline(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``cb roofline``: draw a saved report's roofline and rank its components by headroom."""
    roofline = sub.add_parser(
        "roofline",
        help="draw a saved report's roofline (roofline.png) and rank its components by headroom",
        description="Draw a saved report's roofline: every measured component's forward and backward as points "
        "(x FLOP/byte, y TFLOP/s) under the device's FLOP/s and bandwidth ceilings, saying how many were left out "
        "and why; print where the PNG went and the components that would save the most time at their own roof "
        "(headroom_ms x calls). Exit status: 0 drawn, 1 the PNG could not be written, 2 no report, none of the "
        "capture step asked for, one that cannot be read, or an --out of no image format.",
    )
    roofline.add_argument("report", metavar="REPORT", help=_LOCATION_HELP.format(what="report", file=REPORT_FILE))
    roofline.add_argument("--step", type=_count, default=None, metavar="N", help=_STEP_HELP.format(what="report"))
    roofline.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="FILE",
        help="the PNG to write (default: roofline.png beside report.json; a directory: roofline.png in it; "
        "no extension: .png added; another extension matplotlib writes, .svg or .pdf, that format)",
    )
    roofline.add_argument(
        "--top", type=_count, default=10, metavar="K", help="components ranked by headroom (default 10)"
    )


def _add_compile(p: argparse.ArgumentParser, top: bool) -> None:
    """``--compile``, ``--compile-backend``, ``--compile-mode`` (and ``--compile-top``): the compile what-if."""
    p.add_argument("--compile", action="store_true", help="also time each component compiled alone (torch.compile)")
    p.add_argument("--compile-backend", default=None, help="torch.compile backend (default: torch's, inductor)")
    p.add_argument("--compile-mode", default=None, help="torch.compile mode (default, reduce-overhead, ...)")
    if top:
        p.add_argument("--compile-top", type=int, default=None, help="compile only the K most expensive components")


def _compile_options(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`BenchmarkConfig` options of the ``--compile*`` flags (none without ``--compile``)."""
    if not args.compile:
        return {}
    options = {k: v for k, v in (("backend", args.compile_backend), ("mode", args.compile_mode)) if v is not None}
    out: dict[str, Any] = {"compile": True, "compile_options": options or None}
    if getattr(args, "compile_top", None) is not None:
        out["compile_top"] = args.compile_top
    return out


def _add_selection(p: argparse.ArgumentParser, sorts: Sequence[str], default_sort: str | None) -> None:
    report = default_sort is None  # cb report: sorts by a column; cb diff: by its own keys
    p.add_argument(
        "--sort",
        default=default_sort,
        choices=sorts,
        metavar="COLUMN" if report else "KEY",
        help=(
            "list the components by this report column (numbers largest first, names A to Z, missing "
            "values last), shown as the last column when the summary has none for it; one of: " + ", ".join(sorts)
            if report
            else f"order of the component lines, one of: {', '.join(sorts)} (default {default_sort})"
        ),
    )
    p.add_argument(
        "--depth", type=_count, default=None, metavar="D", help="only components D deep or shallower (root 0)"
    )
    p.add_argument(
        "--filter",
        default=None,
        metavar="PATTERN",
        help="only components whose path or module type matches, case-insensitively: a substring (attn, "
        "Conv2d), or with * ? [ a glob that matches the whole path or the whole type (blocks.*.attn, Conv*)",
    )


def _add_snapshot(p: argparse.ArgumentParser) -> None:
    """``SNAPSHOT_DIR`` and ``--step``: a snapshot found as ``cb report`` finds reports."""
    p.add_argument("snapshot", metavar="SNAPSHOT_DIR", help=_LOCATION_HELP.format(what="snapshot", file="snapshot.pt"))
    p.add_argument("--step", type=_count, default=None, metavar="N", help=_STEP_HELP.format(what="snapshot"))


def _count(text: str) -> int:
    """An integer >= 0 (a depth, a count, a step), for argparse."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text}")
    return value


def _default_device(recorded: str | None) -> tuple[str, str | None]:
    """``(device, note)``: the recorded device if this machine has it, else ``cpu``."""
    import torch

    if recorded is None:
        return "cpu", None
    kind = torch.device(recorded).type
    if kind == "cuda" and not torch.cuda.is_available():
        return "cpu", f"the snapshot was captured on {recorded}; no CUDA device here, replaying on cpu"
    if kind not in ("cpu", "cuda"):
        return "cpu", f"the snapshot was captured on {recorded}; replaying on cpu"
    return recorded, None


def _location(text: str, step: int | None) -> tuple[Path, int | None] | None:
    """``(directory, step)`` of a location argument (``DIR@N`` split); ``None`` after one line on stderr.

    ``DIR@N`` and ``--step`` may both be given only when they agree.
    """
    path, at = split_location(text)
    if at is not None and step is not None and at != step:
        print(f"cb: error: {text} and --step {step} name different steps", file=sys.stderr)
        return None
    return path, (at if at is not None else step)


def _resolved(
    text: str, step: int | None, find: Callable[[str, int | None], Resolved], what: str, filename: str
) -> Resolved | None:
    """What a location names (saying on stderr which one, when searched); ``None``: there is none."""
    where = _location(text, step)
    if where is None:
        return None
    try:
        resolved = find(text, where[1])  # DIR@N parsed again there: the rules Report.load follows too
    except (FileNotFoundError, StepNotFoundError) as e:  # InvalidStepError (DIR@x) is a StepNotFoundError
        print(f"cb: error: {e}", file=sys.stderr)
        return None
    except OSError as e:
        print(f"cb: error: cannot read a {what} at {where[0]}: {e}", file=sys.stderr)
        return None
    line = describe(resolved, what, filename)
    if line is not None:
        print(line, file=sys.stderr)
    return resolved


def _snapshot_dir(args: argparse.Namespace) -> Path | None:
    """The snapshot ``replay`` / ``compare`` take: ``SNAPSHOT_DIR`` itself or the newest (of ``--step``) under it."""
    from cb_callback._whatif.snapshot import SNAPSHOT_FILE, resolve_snapshot_dir

    resolved = _resolved(args.snapshot, args.step, resolve_snapshot_dir, "snapshot", SNAPSHOT_FILE)
    return None if resolved is None else resolved.directory


def _device(args: argparse.Namespace, snapshot: Path) -> str | None:
    """Where ``replay`` / ``compare`` run (printing why when not the recorded device); ``None``: not here.

    ``None`` after one line on stderr saying why the device cannot be used
    (:func:`cb_callback._whatif.snapshot.device_problem`): CUDA missing from this
    torch build or finding no GPU, a ``cuda:N`` that does not exist ...
    """
    from cb_callback._whatif.snapshot import device_problem, read_description

    recorded = read_description(snapshot).get("metadata", {}).get("capture_device")
    device, note = (args.device, None) if args.device is not None else _default_device(recorded)
    if note is not None:
        print(f"cb: {note}")
    problem = device_problem(device)
    if problem is None:
        return device
    where = f"--device {device}" if args.device is not None else f"the capture device {device}"
    print(f"cb: error: {where}: {problem}; pass --device cpu (or a device this machine has)", file=sys.stderr)
    return None


def _open_snapshot(args: argparse.Namespace) -> tuple[Snapshot, Path, str] | None:
    """The snapshot ``replay`` / ``compare`` take, its directory and where it runs; ``None`` after a line on stderr.

    Finds the snapshot (:func:`_snapshot_dir`), picks the device (:func:`_device`),
    says on stdout that it loads it (and that snapshots are pickles), and loads it
    onto that device with ``--script``'s module for a class in ``__main__``.
    """
    from cb_callback._whatif.snapshot import SnapshotError, load_snapshot

    directory = _snapshot_dir(args)
    if directory is None:
        return None
    device = _device(args, directory)
    if device is None:
        return None
    print(f"cb: loading {directory} ({_TRUST.lower()})")
    try:
        snapshot = load_snapshot(directory, map_location=device, script=args.script)
    except (SnapshotError, ValueError) as e:
        print(f"cb: error: {e}", file=sys.stderr)
        return None
    return snapshot, directory, device


def _replay(args: argparse.Namespace) -> int:
    from cb_callback._whatif.snapshot import SnapshotError

    opened = _open_snapshot(args)
    if opened is None:
        return 2
    snapshot, directory, device = opened
    out = args.out if args.out is not None else directory / "replay"
    try:
        options = _compile_options(args) | ({"descend": args.descend} if args.descend else {})
        cfg = snapshot.benchmark_config(device=device, **options)  # an invalid option fails here, not mid-way
    except (SnapshotError, ValueError) as e:
        print(f"cb: error: {e}", file=sys.stderr)
        return 2
    problem = _unwritable_dir(out)
    if problem is not None:  # before the replay's minutes, not after them
        print(f"cb: error: --out: {problem}", file=sys.stderr)
        return 2
    from cb_callback._engine.run.schedule_count import ConsoleProgress
    from cb_callback._lightning.publish import error_line
    from cb_callback._report.context import ReportContext
    from cb_callback._report.files import FileReporter

    progress = ConsoleProgress.for_run(snapshot.model, snapshot.batches, cfg, sys.stderr)
    try:
        report = snapshot.profile(device=device, output_dir=out, progress=progress, **options)
    finally:
        progress.close()
    step = int(snapshot.metadata.get("capture_step", 0) or 0)
    try:
        written = FileReporter().write(report, ReportContext(output_dir=out, step=step))
    except OSError as e:
        print(report.summary(top=args.top))
        print(f"cb: error: could not write the report files to {out} ({error_line(e)})", file=sys.stderr)
        return 1
    print(report.summary(top=args.top))
    print(f"\ncb: report written to {out} ({', '.join(p.name for p in written)})")
    return 0


def _unwritable_dir(out: Path) -> str | None:
    """Why the report files cannot go to the directory ``out`` (a file there, one that cannot be made);
    ``None``: it is one now (created if missing)."""
    if out.exists() and not out.is_dir():
        return f"cannot write the report files to {out}: it is a file, not a directory"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return _cannot_write(out, e)
    return None


def _unreadable(where: Path, e: BaseException) -> str:
    """The one line for a report at ``where`` that :meth:`Report.load` could not read."""
    import json

    if isinstance(e, ValueError) and str(e).startswith("cannot read a report at "):
        return str(e)  # Report.load names the file and the reason itself
    if isinstance(e, json.JSONDecodeError):
        reason = f"not JSON ({e})"
    elif isinstance(e, KeyError):
        reason = f"not a report's schema: {e} missing"
    elif isinstance(e, (TypeError, AttributeError)):
        reason = f"not a report's schema ({type(e).__name__}: {e})"
    else:
        reason = str(e)
    return f"cannot read a report at {where}: {reason}"


def _load(location: str, step: int | None = None) -> tuple[Report, Path] | None:
    """The report ``location`` names and the file it was read from; ``None`` after one line on stderr saying why not."""
    resolved = _resolved(location, step, resolve_report_dir, "report", REPORT_FILE)
    if resolved is None:
        return None
    file = resolved.path(REPORT_FILE)  # a file named is that file (cb report notes.json reads notes.json)
    try:
        return Report.load(file), file
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        print(f"cb: error: {_unreadable(file, e)}", file=sys.stderr)
        return None


def _report(args: argparse.Namespace) -> int:
    loaded = _load(args.report, args.step)
    if loaded is None:
        return 2
    report, file = loaded
    directory = file.parent
    selecting = bool(args.sort or args.filter or args.depth is not None)
    try:
        # With a selection its listing replaces the hotspots: one component listing, the one asked for.
        summary = report.summary(top=0 if selecting else (10 if args.top is None else args.top))
        listing = (
            format_listing(report, sort=args.sort, depth=args.depth, pattern=args.filter, top=args.top)
            if selecting
            else []
        )
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # values of the wrong type in a row
        print(f"cb: error: {_unreadable(file, e)}", file=sys.stderr)
        return 2
    print(summary)
    if listing:
        print("\n" + "\n".join(listing))
    if args.html:
        from cb_callback._report.html import HTML_FILE, write_html

        try:
            written = write_html(report, directory)
        except OSError as e:
            print(f"cb: error: {_cannot_write(directory / HTML_FILE, e)}", file=sys.stderr)
            return 2
        print(f"cb: wrote {written}")
    return 0


def _cannot_write(target: Path, e: OSError, directory_hint: str = "") -> str:
    """The one line for a file ``cb`` could not write at ``target``: its errno's words when the error is about
    ``target`` itself (else the error, which names the file it is about); ``directory_hint`` follows "it is a
    directory"."""
    if (e.filename is not None and Path(e.filename) != target) or not e.strerror:
        return f"cannot write {target}: {e}"
    if isinstance(e, IsADirectoryError):
        return f"cannot write {target}: it is a directory{directory_hint}"
    return f"cannot write {target}: {e.strerror}"


def _roofline(args: argparse.Namespace) -> int:
    loaded = _load(args.report, args.step)
    if loaded is None:
        return 2
    report, file = loaded
    from cb_callback._report.roofline import headroom_lines, no_headroom_reason, roofline_data
    from cb_callback._report.roofline_chart import roofline_target, save_roofline

    try:
        target = roofline_target(args.out, file.parent)
    except ValueError as e:
        print(f"cb: error: --out: {e}", file=sys.stderr)
        return 2
    try:
        data = roofline_data(report)
        ranking = headroom_lines(report, args.top)
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # values of the wrong type in a row
        print(f"cb: error: {_unreadable(file, e)}", file=sys.stderr)
        return 2
    try:
        written = save_roofline(report, target.parent, target.name)
    except OSError as e:
        print(f"cb: error: cannot write {target}: {e}", file=sys.stderr)
        return 1
    print(f"cb: wrote {written} ({len(data.points)} points; {data.text()})")
    print("\n".join(ranking) if ranking else no_headroom_reason(report, args.top))
    return 0


def _diff(args: argparse.Namespace) -> int:
    if args.format != "text" and args.fail_over is None:
        print(
            f"cb: error: --format {args.format} is the regression gate's output: give --fail-over PCT", file=sys.stderr
        )
        return 2
    loaded_a, loaded_b = _load(args.a), _load(args.b)
    if loaded_a is None or loaded_b is None:
        return 2  # could not compare: as every command that could not do its work
    (a, _), (b, _) = loaded_a, loaded_b
    d = compare_reports(a, b, args.metric)
    keep = {
        r.path for r in [*select_rows(a.rows, args.depth, args.filter), *select_rows(b.rows, args.depth, args.filter)]
    }
    text = args.format == "text"
    if text:
        print(f"A: {args.a}  ({a.metadata.get('device_name', '?')}, {a.metadata.get('dtype', '?')})")
        print(f"B: {args.b}  ({b.metadata.get('device_name', '?')}, {b.metadata.get('dtype', '?')})")
        print("\n".join(format_diff(d, sort=args.sort, paths=keep)))
    status = 0 if args.fail_over is None else _gate(args, a, b, keep)
    if args.html is not None:
        from cb_callback._report.html import write_diff_html

        try:
            written = write_diff_html(a, b, d, args.html, labels=(args.a, args.b))
        except OSError as e:  # 2, could not do it: 1 would read as "the gate failed"
            hint = f" (--html takes a file: {args.html / 'diff.html'}, say)"
            print(f"cb: error: --html: {_cannot_write(args.html, e, hint)}", file=sys.stderr)
            return 2
        print(f"cb: wrote {written}", file=sys.stdout if text else sys.stderr)  # the machine formats keep stdout
    return status


def _gate(args: argparse.Namespace, a: Report, b: Report, keep: set[str]) -> int:
    """``cb diff --fail-over``: print the gate's verdict in ``--format``; 1 when it failed, 2 when it could not
    compare (:attr:`GateResult.inconclusive`), else 0."""
    import dataclasses

    from cb_callback._report.gate_format import format_gate_markdown, format_gate_text, gate_json

    if args.filter and not keep:
        print(f"cb: error: --filter {args.filter!r} matches no component of A or B: nothing to gate", file=sys.stderr)
        return 2
    result = gate_reports(
        a,
        b,
        args.fail_over,
        metric=args.metric,
        min_share=args.min_share,
        shift=not args.absolute,
        allow_mismatch=args.allow_mismatch,
    )
    result = dataclasses.replace(result, rows=[r for r in result.rows if r.path in keep])  # --depth, --filter
    labels = (args.a, args.b)
    if args.format == "json":
        print(gate_json(result, labels=labels))
    elif args.format == "markdown":
        print(format_gate_markdown(result, labels=labels), end="")
    else:
        print("\n" + "\n".join(format_gate_text(result)))
    if result.inconclusive and args.format != "text":
        print(f"cb: could not compare: {result.inconclusive}", file=sys.stderr)
    return {"passed": 0, "failed": 1, "inconclusive": 2}[result.outcome]


def _candidate_factory(spec: str) -> Callable[..., Any]:
    """The callable ``package.module:attr`` names (``attr`` may be dotted).

    Raises:
        ValueError: not of that form, or the module or attribute cannot be found.
    """
    import importlib

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--candidate {spec!r}: expected package.module:factory")
    try:
        obj: object = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"--candidate {spec!r}: cannot import {module_name!r} ({e}); is it on PYTHONPATH?") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"--candidate {spec!r}: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"--candidate {spec!r}: {attr!r} is not callable")
    return obj


def _takes_one_argument(fn: Callable[..., object]) -> bool:
    import inspect

    try:
        inspect.signature(fn).bind(None)
    except TypeError:
        return False
    except ValueError:  # no signature (a builtin): call it without arguments
        return False
    try:
        inspect.signature(fn).bind()
    except TypeError:
        return True
    return False


def _one_line(e: BaseException) -> str:
    """``Type: message (at FILE:LINE in FUNCTION)``, the innermost frame's place, one line of 300 characters at most."""
    from cb_callback._lightning.publish import error_line

    text = error_line(e)
    if len(text) > 300:
        text = text[:297] + "..."
    frames = traceback.extract_tb(e.__traceback__)
    return (
        text if not frames else f"{text} (at {Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name})"
    )


def _raising_side(e: BaseException, reference: object, candidate: object) -> str | None:
    """``"reference"`` or ``"candidate"``: whose code raised ``e`` (``None``: neither's).

    The outermost frame of the traceback that runs a method of a module (its
    ``self``) is the module the comparison called: the reference itself, or the
    candidate (which ``compare_components`` runs as a copy). A candidate of the
    reference's own class is told apart by identity only, so a copy of the
    reference (made when it must move to another device) reads as the candidate.
    """
    from torch import nn

    tb = e.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if isinstance(owner, nn.Module):
            if owner is reference or (type(owner) is type(reference) and type(reference) is not type(candidate)):
                return "reference"
            return "candidate" if isinstance(owner, type(candidate)) else None
        tb = tb.tb_next
    return None


def _compare_cmd(args: argparse.Namespace) -> int:
    import torch
    from torch import nn

    from cb_callback._whatif.compare import compare_components
    from cb_callback._whatif.snapshot import SnapshotError, precision_context

    opened = _open_snapshot(args)
    if opened is None:
        return 2
    snapshot, _, device = opened
    try:
        factory = _candidate_factory(args.candidate)
        cfg = snapshot.benchmark_config(device=device, output_dir=None, reporters=(), **_compile_options(args))
    except (SnapshotError, ValueError) as e:
        print(f"cb: error: {e}", file=sys.stderr)
        return 2
    if args.path not in snapshot.calls:
        known = ", ".join(repr(p) for p in sorted(snapshot.calls)) or "none"
        print(f"cb: error: the snapshot has no captured call of {args.path!r}; captured: {known}", file=sys.stderr)
        return 2
    reference = snapshot.model.get_submodule(args.path)
    name = f"{args.path or '(root)'} ({type(reference).__name__})"
    try:
        candidate = factory(reference) if _takes_one_argument(factory) else factory()
    except Exception as e:
        print(
            f"cb: error: could not compare: the candidate factory {args.candidate} raised {_one_line(e)}",
            file=sys.stderr,
        )
        return 2
    if not isinstance(candidate, nn.Module):
        print(f"cb: error: {args.candidate} returned {type(candidate).__name__}, not an nn.Module", file=sys.stderr)
        return 2
    try:
        comparison = compare_components(
            reference, candidate, snapshot.calls[args.path], rtol=args.rtol, atol=args.atol,
            backward=cfg.backward and not args.no_backward, config=cfg,
            forward_context=precision_context(snapshot.precision, torch.device(device).type),
        )  # fmt: skip
    except Exception as e:
        side = _raising_side(e, reference, candidate)
        who = {
            "reference": f"the reference {name}",
            "candidate": f"the candidate {args.candidate} ({type(candidate).__name__})",
        }.get(side or "", f"comparing {name} with {args.candidate}")
        print(f"cb: error: could not compare: {who} raised {_one_line(e)}", file=sys.stderr)
        return 2
    print(f"cb: {name} vs {args.candidate} ({type(candidate).__name__})")
    print(comparison.summary())
    return 0 if comparison.equivalent else 1


#: Size units ``--save`` / ``--budget`` accept (case-insensitive), in bytes.
_UNITS = {
    "": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}  # fmt: skip


def _size(text: str) -> int:
    """Bytes of a size such as ``1GiB``, ``512 MB``, ``1.5KiB`` or ``4096`` (for argparse)."""
    import re

    m = re.fullmatch(r"\s*(-?)\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*", text)
    unit = m.group(3).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"expected a size such as 1GiB, 512MB or 4096 (bytes; units KiB MiB GiB TiB, KB MB GB TB), got {text!r}"
        )
    if m.group(1):
        raise argparse.ArgumentTypeError(f"a size cannot be negative, got {text!r} (expected e.g. 1GiB, 512MB)")
    return round(float(m.group(2)) * _UNITS[unit])


def _add_checkpoint(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``cb checkpoint``: which components to recompute in backward, from a saved report."""
    import re

    p = sub.add_parser(
        "checkpoint",
        help="plan activation checkpointing from a saved report (memory saved vs time added)",
        description="Choose the components to recompute in backward (torch.utils.checkpoint, non-reentrant) at "
        "the least added time, from the report's measured activation_mb and fwd_ms. Exit status: 0 a plan "
        "printed, 1 no plan found that reaches the target (the closest is printed, the reason on stderr; a "
        "budget's search is not exhaustive), 2 no report, one that cannot be read, or one the target cannot be "
        "planned on (a --budget without the root's peak_mem_mb). Without --save or --budget the trade-off "
        "curve is printed.",
    )
    # "--save -1MiB": a value that looks negative is a value here (argparse would take it for an option and say
    # "expected one argument"), so _size says what is wrong with it; this parser has no option named like one
    p._negative_number_matcher = re.compile(r"^-\s*\.?\d")
    p.add_argument("report", metavar="REPORT", help=_LOCATION_HELP.format(what="report", file=REPORT_FILE))
    p.add_argument("--step", type=_count, default=None, metavar="N", help=_STEP_HELP.format(what="report"))
    p.add_argument(
        "--save", type=_size, default=None, metavar="SIZE", help="save at least SIZE of activations (e.g. 1GiB)"
    )
    p.add_argument(
        "--budget",
        type=_size,
        default=None,
        metavar="SIZE",
        help="bring the step's peak (the root's peak_mem_mb) to at most SIZE (e.g. 8GiB)",
    )


def _checkpoint_cmd(args: argparse.Namespace) -> int:
    from cb_callback._whatif.checkpoint import plan_checkpointing

    loaded = _load(args.report, args.step)
    if loaded is None:
        return 2
    report, _ = loaded
    try:
        plan = plan_checkpointing(report, save_bytes=args.save, memory_budget_bytes=args.budget)
    except ValueError as e:  # a target this report cannot be planned on: could not do it
        print(f"cb: error: could not plan: {e}", file=sys.stderr)
        return 2
    print(plan.table())
    if args.save is None and args.budget is None:
        print("\ntrade-off curve (saved MiB, added ms, modules):")
        for point in plan.curve:
            print(f"  {point.saved_bytes / 2**20:10.3f}  {point.extra_ms:10.3f}  {', '.join(point.modules) or '-'}")
    if not plan.reached:
        print(f"cb: error: {_not_reached(plan)}; see the refused modules above", file=sys.stderr)
        return 1
    return 0


def _not_reached(plan: CheckpointPlan) -> str:
    """Why ``plan`` misses its target, as true as the search allows (a budget's search is not exhaustive)."""
    most = max((p.saved_bytes for p in plan.curve), default=0) / 2**20
    shown = f"{plan.saved_bytes / 2**20:.3f} MiB saved, {plan.peak_saved_bytes / 2**20:.3f} MiB off the peak"
    if plan.memory_budget_bytes is None:
        return f"no plan reaches the target: the candidates save at most {most:.3f} MiB"
    return (
        f"no plan found that reaches the target (the search is not exhaustive; the candidates save at most "
        f"{most:.3f} MiB); the best found is printed ({shown})"
    )


# What a shell reports for a command killed by SIGPIPE (128 + 13): ``cb report | head`` ends as ``yes | head`` does.
_BROKEN_PIPE = 141


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``cb`` with ``argv`` (default: the command line); returns the exit status.

    A reader that stops early (``cb report DIR | head``) ends the command quietly with status 141, as a command
    killed by SIGPIPE: what was printed up to then stands, and no traceback follows it.
    """
    args = _parser().parse_args(argv)
    handlers = {"replay": _replay, "report": _report, "diff": _diff, "compare": _compare_cmd, "roofline": _roofline}
    handlers["checkpoint"] = _checkpoint_cmd
    try:
        status = handlers[args.command](args)
        sys.stdout.flush()  # a pipe closed after the last print fails here, not at exit
    except BrokenPipeError:
        _silence_stdout()
        return _BROKEN_PIPE
    return status


def _silence_stdout() -> None:
    """Point stdout's file descriptor at the null device, so the interpreter's flush at exit writes nothing into the
    closed pipe (it would print "Exception ignored ... BrokenPipeError")."""
    import os

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file: nothing is flushed at exit
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
