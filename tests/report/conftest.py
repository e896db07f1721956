"""The viewer tests' headless Chromium: one per test process, shared by every file here (tests/_browser.py)."""

from tests._browser import browser

__all__ = ["browser"]  # the fixture
