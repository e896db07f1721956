"""The ``cb`` command: replay a snapshot, print a saved report, compare two reports."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from cb_callback._report import COLUMNS, Report

__all__ = ["main"]

_TRUST = "Snapshots are pickles: only replay snapshots you trust."
_DIFF_METRICS = tuple(c for c in COLUMNS if c.endswith(("_ms", "_mb", "flops", "bytes", "gbps", "mfu", "util")))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cb",
        description="cb_callback component benchmark: replay snapshots, print and compare reports.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    replay = sub.add_parser(
        "replay",
        help="profile a snapshot (written by ComponentBenchmark(mode='fork')) offline",
        description=f"Profile a snapshot offline, e.g. on another machine or GPU. {_TRUST}",
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
    replay.add_argument(
        "--script",
        type=Path,
        default=None,
        help="the training script that defines the model's class (for a class in `__main__`), "
        "when it is no longer where the snapshot recorded it; its `if __name__ == '__main__':` "
        "block does not run",
    )

    report = sub.add_parser("report", help="print a saved report's summary and hotspots")
    report.add_argument("report", metavar="DIR", type=Path, help="directory with report.json (or the file)")
    report.add_argument("--top", type=int, default=10, help="hotspots to print (default 10)")

    diff = sub.add_parser("diff", help="compare two saved reports component by component")
    diff.add_argument("a", metavar="A", type=Path, help="baseline report directory")
    diff.add_argument("b", metavar="B", type=Path, help="report directory to compare with A")
    diff.add_argument(
        "--metric", default="total_ms", choices=_DIFF_METRICS, help="column to compare (default total_ms)"
    )
    return parser


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


def _replay(args: argparse.Namespace) -> int:
    from cb_callback._snapshot import SnapshotError, load_snapshot, read_description

    description = read_description(args.snapshot)
    recorded = description.get("metadata", {}).get("capture_device")
    device, note = (args.device, None) if args.device is not None else _default_device(recorded)
    if note is not None:
        print(f"cb: {note}")
    out = args.out if args.out is not None else args.snapshot / "replay"
    print(f"cb: loading {args.snapshot} ({_TRUST.lower()})")
    try:
        snapshot = load_snapshot(args.snapshot, map_location=device, script=args.script)
    except SnapshotError as e:
        print(f"cb: error: {e}", file=sys.stderr)
        return 1
    from cb_callback._files import FileReporter
    from cb_callback._plugins import ReportContext

    report = snapshot.profile(device=device, output_dir=out, progress=_progress)
    print(file=sys.stderr)
    step = int(snapshot.metadata.get("capture_step", 0) or 0)
    written = FileReporter().write(report, ReportContext(output_dir=out, step=step))
    print(report.summary(top=args.top))
    print(f"\ncb: report written to {out} ({', '.join(p.name for p in written)})")
    return 0


def _progress(done: int, total: int, path: str) -> None:
    print(f"\rcb: profiled {done}/{total} components ({path or 'root'})\033[K", end="", file=sys.stderr)


def _load(path: Path) -> Report | None:
    try:
        return Report.load(path)
    except (OSError, ValueError, KeyError) as e:
        print(f"cb: error: cannot read a report at {path}: {e}", file=sys.stderr)
        return None


def _report(args: argparse.Namespace) -> int:
    report = _load(args.report)
    if report is None:
        return 1
    print(report.summary(top=args.top))
    return 0


def _fmt(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else "-"


def diff_lines(a: Report, b: Report, metric: str = "total_ms") -> list[str]:
    """Lines of a per-path comparison of ``metric``: A, B and the ratio B / A.

    Paths of A come first in A's order, then the paths only B has. A ratio is
    ``"-"`` when either side is missing, not finite, or A is 0.
    """
    rows_a = {r.path: r for r in a.rows}
    rows_b = {r.path: r for r in b.rows}
    paths = [r.path for r in a.rows] + [r.path for r in b.rows if r.path not in rows_a]
    table = [("path", "type", f"A {metric}", f"B {metric}", "B/A")]
    for path in paths:
        ra, rb = rows_a.get(path), rows_b.get(path)
        va = float(getattr(ra, metric)) if ra is not None else math.nan
        vb = float(getattr(rb, metric)) if rb is not None else math.nan
        ratio = vb / va if (math.isfinite(va) and math.isfinite(vb) and va != 0) else math.nan
        either = ra if ra is not None else rb
        kind = either.module_type if either is not None else ""
        table.append((path or "(root)", kind, _fmt(va), _fmt(vb), f"{ratio:.3f}" if math.isfinite(ratio) else "-"))
    widths = [max(len(row[i]) for row in table) for i in range(5)]
    lines = []
    for i, row in enumerate(table):
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])] + [c.rjust(w) for c, w in zip(row[2:], widths[2:], strict=True)]
        lines.append("  ".join(cells).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def _diff(args: argparse.Namespace) -> int:
    a, b = _load(args.a), _load(args.b)
    if a is None or b is None:
        return 1
    print(f"A: {args.a}  ({a.metadata.get('device_name', '?')}, {a.metadata.get('dtype', '?')})")
    print(f"B: {args.b}  ({b.metadata.get('device_name', '?')}, {b.metadata.get('dtype', '?')})")
    print("\n".join(diff_lines(a, b, args.metric)))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``cb`` with ``argv`` (default: the command line); returns the exit status."""
    args = _parser().parse_args(argv)
    handlers = {"replay": _replay, "report": _report, "diff": _diff}
    return handlers[args.command](args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
