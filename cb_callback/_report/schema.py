"""Names the results model and its renderers share (a leaf: imports nothing of the package)."""

from __future__ import annotations

__all__ = ["SCHEMA_VERSION", "STATUSES"]

#: The version of ``report.json``'s layout, written at its top level as ``"schema_version"``.
#: A file without it is version 1 (cb_callback before the key: the same rows and metadata).
SCHEMA_VERSION = 2

#: Every status a row can have. See docs/columns.md for their meaning.
STATUSES = ("ok", "estimated", "failed", "not_run", "skipped")
