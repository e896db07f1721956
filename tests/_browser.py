"""A headless Chromium for the viewer tests (Debian's ``chromium`` driven by playwright).

``.ci/run`` installs both (``scripts/install_browser.sh``); where neither can be
installed the tests skip and say why.

One Chromium and one tab serve every viewer test of a test process (``browser``, session-scoped,
re-exported by ``tests/report/conftest.py``): each test still loads its page afresh (a new document,
a new log), but in the same renderer process, whose V8 keeps the scripts it compiled for a URL. A
report's page inlines plotly.js (~4.6 MB): compiling it is most of a first load (~2 s), and a second
load of the same URL skips it (~0.4 s). So a page that needs no particular place (it links no
artifact) is shown from one fixed file (``show``), and its tests pay that compile once per process.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
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


class Browser:
    """A headless Chromium and the one tab the tests share (made again if a test closed or crashed it)."""

    def __init__(self, chromium: Any, stage: Path) -> None:
        self.chromium = chromium
        self.stage = stage  # where ``show`` puts a page: always the same file, so the same URL
        self.log = PageLog()
        self._context: Any = None
        self._page: Any = None

    def tab(self) -> Any:
        if self._page is None or self._page.is_closed():
            self.close_tab()
            self._context = self.chromium.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
            page = self._context.new_page()
            # the listeners write to the current test's log (new_page replaces it)
            page.on("console", lambda m: self.log.errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: self.log.errors.append(str(e)))
            page.on("request", lambda r: self.log.requests.append(r.url))
            self._page = page
        return self._page

    def close_tab(self) -> None:
        if self._context is not None:
            with suppress(Exception):  # a crashed page's context may refuse; the next tab is new either way
                self._context.close()
        self._context = self._page = None


@pytest.fixture(scope="session")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    """One headless Chromium per test process (starting one takes seconds; so does a tab's first plotly)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    executable = chromium_path()
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        shared = Browser(b, tmp_path_factory.mktemp("browser-stage"))
        try:
            yield shared
        finally:
            shared.close_tab()
            b.close()


@contextmanager
def new_page(browser: Browser, width: int = 1400, height: int = 1000) -> Iterator[tuple[Any, PageLog]]:
    """The shared tab, blank, at this size, with the mouse at its corner, and a new log of what it does.

    Nothing of a previous test's page survives: the test navigates to its own page (a new document),
    the tab returns to ``about:blank`` afterwards, and a tab the test broke is replaced. What the tab
    keeps across tests is its context (no cookies, storage or HTTP cache the file pages use) and its
    renderer's compiled scripts.
    """
    page = browser.tab()
    page.set_viewport_size({"width": width, "height": height})
    page.mouse.move(0, 0)  # not over where the previous test left it
    browser.log = log = PageLog()
    ok = False
    try:
        yield page, log
        ok = True
    finally:
        try:
            if ok:
                page.goto("about:blank")
        except Exception:
            ok = False
        if not ok:  # a failed test may leave a dialog, a download or a dead renderer: start the next afresh
            browser.close_tab()


@contextmanager
def own_page(browser: Browser, width: int = 1400, height: int = 1000) -> Iterator[tuple[Any, PageLog]]:
    """A tab in a context of its own, closed afterwards: for an http site with storage of its own (TensorBoard),
    whose pages in the shared tab would also swap out the renderer that holds the file pages' compiled plotly."""
    context = browser.chromium.new_context(viewport={"width": width, "height": height}, accept_downloads=True)
    try:
        page = context.new_page()
        log = PageLog()
        page.on("console", lambda m: log.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: log.errors.append(str(e)))
        page.on("request", lambda r: log.requests.append(r.url))
        yield page, log
    finally:
        context.close()


def show(browser: Browser, page: Any, html: Path) -> Path:
    """Load a copy of the page file ``html`` from the stage (one URL for every such page: see the module's
    docstring) and return the copy's path. For a page whose relative links (artifacts) do not matter."""
    staged = browser.stage / "page.html"
    shutil.copyfile(html, staged)
    page.goto(staged.as_uri())
    return staged


def until(page: Any, js: str, timeout_s: float = 10.0) -> None:
    """Wait until the expression ``js`` is true in ``page``, polled from here every 20 ms.

    Not ``wait_for_function``: the viewer's CSP refuses the ``eval`` its polling needs, so it checks an
    expression once and raises (EvalError) where it is not yet true, instead of waiting.
    """
    deadline = time.monotonic() + timeout_s
    while not page.evaluate(js):
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout_s:g} s: {js}")
        page.wait_for_timeout(20)
