"""A headless Chromium for the viewer tests (Debian's ``chromium`` driven by playwright).

``.ci/run`` installs both (``scripts/install_browser.sh``); where neither can be
installed the tests skip and say why.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest


def chromium_path() -> str:
    """The system browser, or a skip that says how to get one."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("no chromium: apt-get install -y chromium (scripts/install_browser.sh)")
    return path


@dataclass
class PageLog:
    """What a page did: console errors, page errors, every request it made."""

    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium per test module (starting one takes seconds)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    executable = chromium_path()
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


@contextmanager
def new_page(browser: Any, width: int = 1400, height: int = 1000) -> Iterator[tuple[Any, PageLog]]:
    """A fresh page (its own context: no cache, no downloads shared) and the log of what it does."""
    context = browser.new_context(viewport={"width": width, "height": height}, accept_downloads=True)
    try:
        page = context.new_page()
        log = PageLog()
        page.on("console", lambda m: log.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: log.errors.append(str(e)))
        page.on("request", lambda r: log.requests.append(r.url))
        yield page, log
    finally:
        context.close()
