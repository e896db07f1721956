"""Find component reports under a directory (a Lightning log directory, a TensorBoard logdir)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["REPORT_FILE", "find_reports", "resolve_report_dir"]

REPORT_FILE = "report.json"
_MAX_DIRS = 20_000  # directories walked at most


def _looks_like_report(path: Path) -> bool:
    """A ``report.json`` of ours: a JSON object naming ``metadata`` or ``rows`` early on."""
    try:
        with path.open("rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return head.lstrip().startswith(b"{") and (b'"rows"' in head or b'"metadata"' in head)


def find_reports(root: str | Path) -> list[Path]:
    """Directories under ``root`` (itself included) that hold a component report, sorted.

    Walks at most 20,000 directories; a ``report.json`` counts when it looks like
    one of ours (a JSON object with ``metadata`` / ``rows``).
    """
    found: list[Path] = []
    for seen, (dirpath, dirnames, filenames) in enumerate(os.walk(Path(root)), start=1):
        if seen > _MAX_DIRS:
            break
        dirnames.sort()
        if REPORT_FILE in filenames and _looks_like_report(Path(dirpath) / REPORT_FILE):
            found.append(Path(dirpath))
    return sorted(found)


def resolve_report_dir(path: str | Path) -> tuple[Path, list[Path]]:
    """The report a user means by ``path``: ``(directory, the other reports found)``.

    ``path`` may be a report directory, its ``report.json``, or any directory
    above reports (``lightning_logs/``, ``lightning_logs/version_0``): then the
    most recently written report under it is taken.

    Raises:
        FileNotFoundError: when there is no report at or under ``path``.
    """
    p = Path(path)
    if p.is_file():
        return p.parent, []
    if (p / REPORT_FILE).is_file():
        return p, []
    found = find_reports(p) if p.is_dir() else []
    if not found:
        raise FileNotFoundError(f"no {REPORT_FILE} at or under {p}")
    newest = max(found, key=lambda d: (d / REPORT_FILE).stat().st_mtime)
    return newest, [d for d in found if d != newest]
