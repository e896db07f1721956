"""The ``cb`` command: replay a snapshot, print a saved report, compare two reports or two components."""

from __future__ import annotations

import argparse
import fnmatch
import math
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cb_callback._report.diff import compare_reports, format_diff
from cb_callback._report.discover import resolve_report_dir
from cb_callback._report.model import COLUMNS, ComponentRow, Report
from cb_callback._report.table import format_rows

__all__ = ["main"]

_TRUST = "Snapshots are pickles: only replay snapshots you trust."
_DIFF_METRICS = tuple(c for c in COLUMNS if c.endswith(("_ms", "_mb", "flops", "bytes", "gbps", "mfu", "util")))
_DIFF_SORTS = ("change", "path", "a", "b", "ratio")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cb",
        description="cb_callback component benchmark: replay snapshots, print and compare reports.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    replay = sub.add_parser(
        "replay",
        help="profile a snapshot (written by ComponentBenchmark(mode='fork')) offline",
        description=f"Profile a snapshot offline, e.g. on another machine or GPU. Exit status: 0 profiled "
        "and written, 1 profiled but the report files could not be written, 2 could not replay (the "
        f"snapshot cannot be read, the device is not available, an invalid option). {_TRUST}",
    )
    replay.add_argument("snapshot", metavar="SNAPSHOT_DIR", type=Path, help="directory with snapshot.pt")
    replay.add_argument(
        "--device",
        default=None,
        help="where to replay (cpu, cuda, cuda:1 ...); default: the device the snapshot was "
        "captured on when this machine has it, else cpu",
    )
    replay.add_argument(
        "--out", type=Path, default=None, help="where the report files go; default: SNAPSHOT_DIR/replay"
    )
    replay.add_argument("--top", type=int, default=10, help="hotspots to print (default 10)")
    _add_compile(replay, top=True)
    replay.add_argument(
        "--script",
        type=Path,
        default=None,
        help="the training script that defines the model's class (for a class in `__main__`), "
        "when it is no longer where the snapshot recorded it; its `if __name__ == '__main__':` "
        "block does not run",
    )

    report = sub.add_parser(
        "report",
        help="print a saved report's summary and hotspots",
        description="Print a saved report's summary and hotspots. Exit status: 0 printed, 2 no report "
        "or one that cannot be read (not JSON, not a report's schema).",
    )
    report.add_argument(
        "report",
        metavar="DIR",
        type=Path,
        help="directory with report.json (or the file), or a directory above reports such as a "
        "Lightning log directory (the newest report under it is taken)",
    )
    report.add_argument("--top", type=int, default=10, help="hotspots to print (default 10)")
    report.add_argument("--html", action="store_true", help="(re)write report.html beside report.json")
    _add_selection(report, sorts=tuple(c for c in COLUMNS if c not in ("error", "note")), default_sort=None)

    diff = sub.add_parser("diff", help="compare two saved reports component by component")
    diff.add_argument("a", metavar="A", type=Path, help="baseline report (a directory as for cb report)")
    diff.add_argument("b", metavar="B", type=Path, help="report to compare with A")
    diff.add_argument(
        "--metric", default="total_ms", choices=_DIFF_METRICS, help="column to compare (default total_ms)"
    )
    diff.add_argument("--html", type=Path, default=None, metavar="FILE", help="also write a diff page")
    _add_selection(diff, sorts=_DIFF_SORTS, default_sort="change")

    compare = sub.add_parser(
        "compare",
        help="check a re-authored component against a snapshot's component (numerics and speed)",
        description="Run a snapshot's component and a candidate module on the component's captured inputs, "
        "compare outputs and gradients, and time both. Exit status: 0 equivalent, 1 not equivalent, "
        f"2 could not compare. {_TRUST}",
    )
    compare.add_argument("snapshot", metavar="SNAPSHOT_DIR", type=Path, help="directory with snapshot.pt")
    compare.add_argument("--path", required=True, help="the component's dotted path ('' for the root)")
    compare.add_argument(
        "--candidate",
        required=True,
        metavar="MODULE:FACTORY",
        help="package.module:factory; factory() returns the candidate module (factory(reference) if it "
        "takes one argument); the module must be importable (PYTHONPATH)",
    )
    compare.add_argument("--device", default=None, help="where to run (default: as for cb replay)")
    compare.add_argument("--rtol", type=float, default=None, help="relative tolerance (default: by dtype)")
    compare.add_argument("--atol", type=float, default=None, help="absolute tolerance (default: by dtype)")
    compare.add_argument("--no-backward", action="store_true", help="compare and time the forward only")
    _add_compile(compare, top=False)
    compare.add_argument(
        "--script", type=Path, default=None, help="the training script defining the model's class (as for cb replay)"
    )
    return parser


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
    p.add_argument(
        "--sort",
        default=default_sort,
        choices=sorts,
        help="order of the component lines" + (f" (default {default_sort})" if default_sort else ""),
    )
    p.add_argument("--depth", type=int, default=None, help="only components this deep or shallower (root 0)")
    p.add_argument(
        "--filter",
        default=None,
        metavar="PATTERN",
        help="only components whose path matches: a glob (blocks.*.attn) or a substring",
    )


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


def _device(args: argparse.Namespace) -> str | None:
    """Where ``replay`` / ``compare`` run (printing why when not the recorded device); ``None``: not here.

    ``None`` after one line on stderr saying why the device cannot be used
    (:func:`cb_callback._whatif.snapshot.device_problem`): CUDA missing from this
    torch build or finding no GPU, a ``cuda:N`` that does not exist ...
    """
    from cb_callback._whatif.snapshot import device_problem, read_description

    recorded = read_description(args.snapshot).get("metadata", {}).get("capture_device")
    device, note = (args.device, None) if args.device is not None else _default_device(recorded)
    if note is not None:
        print(f"cb: {note}")
    problem = device_problem(device)
    if problem is None:
        return device
    where = f"--device {device}" if args.device is not None else f"the capture device {device}"
    print(f"cb: error: {where}: {problem}; pass --device cpu (or a device this machine has)", file=sys.stderr)
    return None


def _replay(args: argparse.Namespace) -> int:
    from cb_callback._whatif.snapshot import SnapshotError, load_snapshot

    device = _device(args)
    if device is None:
        return 2
    out = args.out if args.out is not None else args.snapshot / "replay"
    print(f"cb: loading {args.snapshot} ({_TRUST.lower()})")
    try:
        snapshot = load_snapshot(args.snapshot, map_location=device, script=args.script)
        options = _compile_options(args)
        snapshot.benchmark_config(device=device, **options)  # an invalid option fails here, not mid-way
    except (SnapshotError, ValueError) as e:
        print(f"cb: error: {e}", file=sys.stderr)
        return 2
    from cb_callback._lightning.publish import error_line
    from cb_callback._report.context import ReportContext
    from cb_callback._report.files import FileReporter

    report = snapshot.profile(device=device, output_dir=out, progress=_progress, **options)
    print(file=sys.stderr)
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


def _progress(done: int, total: int, path: str) -> None:
    print(f"\rcb: profiled {done}/{total} components ({path or 'root'})\033[K", end="", file=sys.stderr)


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


def _load(path: Path) -> Report | None:
    """The report at (or newest under) ``path``; ``None`` after one line on stderr saying why not."""
    try:
        directory, others = resolve_report_dir(path)
    except OSError as e:
        print(f"cb: error: cannot read a report at {path}: {e}", file=sys.stderr)
        return None
    try:
        report = Report.load(directory)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        print(f"cb: error: {_unreadable(directory / Report.REPORT_FILE, e)}", file=sys.stderr)
        return None
    if directory != path and directory != path.parent:
        more = f" ({len(others)} older report(s) under it too)" if others else ""
        print(f"cb: using {directory / 'report.json'}{more}", file=sys.stderr)
    report.metadata.setdefault("_directory", str(directory))
    return report


def _selected(report: Report, depth: int | None, pattern: str | None) -> list[ComponentRow]:
    rows = [r for r in report.rows if depth is None or r.depth <= depth]
    if pattern:
        if any(ch in pattern for ch in "*?["):
            rows = [r for r in rows if fnmatch.fnmatchcase(r.path or "(root)", pattern)]
        else:
            rows = [r for r in rows if pattern.lower() in (r.path or "(root)").lower()]
    return rows


def _report(args: argparse.Namespace) -> int:
    report = _load(args.report)
    if report is None:
        return 2
    directory = Path(report.metadata.pop("_directory"))
    try:
        summary = report.summary(top=args.top)
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # values of the wrong type in a row
        print(f"cb: error: {_unreadable(directory / Report.REPORT_FILE, e)}", file=sys.stderr)
        return 2
    print(summary)
    if args.sort or args.depth is not None or args.filter:
        rows = _selected(report, args.depth, args.filter)
        if args.sort:
            key = args.sort

            def value(r: ComponentRow) -> Any:
                v = getattr(r, key)
                return (0, -v) if isinstance(v, (int, float)) and math.isfinite(v) else (1, str(v))

            rows = sorted(
                rows,
                key=value
                if key not in ("path", "module_type", "status", "parent", "bound")
                else (lambda r: str(getattr(r, key))),
            )
        print(f"\ncomponents ({len(rows)} of {len(report.rows)}):")
        print(format_rows(rows))
    if args.html:
        from cb_callback._report.html import write_html

        print(f"cb: wrote {write_html(report, directory)}")
    return 0


def _fmt(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else "-"


def _diff(args: argparse.Namespace) -> int:
    a, b = _load(args.a), _load(args.b)
    if a is None or b is None:
        return 2  # could not compare: as every command that could not do its work
    a.metadata.pop("_directory", None)
    b.metadata.pop("_directory", None)
    print(f"A: {args.a}  ({a.metadata.get('device_name', '?')}, {a.metadata.get('dtype', '?')})")
    print(f"B: {args.b}  ({b.metadata.get('device_name', '?')}, {b.metadata.get('dtype', '?')})")
    d = compare_reports(a, b, args.metric)
    keep = {r.path for r in _selected(b, args.depth, args.filter)} | {
        r.path for r in _selected(a, args.depth, args.filter)
    }
    print("\n".join(format_diff(d, sort=args.sort, paths=keep)))
    if args.html is not None:
        from cb_callback._report.html import write_diff_html

        print(f"cb: wrote {write_diff_html(a, b, d, args.html)}")
    return 0


def _candidate_factory(spec: str) -> Any:
    """The callable ``package.module:attr`` names (``attr`` may be dotted).

    Raises:
        ValueError: not of that form, or the module or attribute cannot be found.
    """
    import importlib

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--candidate {spec!r}: expected package.module:factory")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"--candidate {spec!r}: cannot import {module_name!r} ({e}); is it on PYTHONPATH?") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"--candidate {spec!r}: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"--candidate {spec!r}: {attr!r} is not callable")
    return obj


def _takes_one_argument(fn: Any) -> bool:
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


def _raising_side(e: BaseException, reference: Any, candidate: Any) -> str | None:
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
    from cb_callback._whatif.snapshot import SnapshotError, load_snapshot, precision_context

    device = _device(args)
    if device is None:
        return 2
    print(f"cb: loading {args.snapshot} ({_TRUST.lower()})")
    try:
        snapshot = load_snapshot(args.snapshot, map_location=device, script=args.script)
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


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``cb`` with ``argv`` (default: the command line); returns the exit status."""
    args = _parser().parse_args(argv)
    handlers = {"replay": _replay, "report": _report, "diff": _diff, "compare": _compare_cmd}
    return handlers[args.command](args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
