"""Names the results model and its renderers share (a leaf: imports nothing of the package)."""

from __future__ import annotations

__all__ = ["STATUSES"]

#: Every status a row can have. See docs/columns.md for their meaning.
STATUSES = ("ok", "estimated", "failed", "not_run", "skipped")
