"""Every relative link in README.md, CHANGELOG.md and docs/*.md resolves, and every docs page is linked.

A link is ``[text](target)`` or ``![alt](target)`` outside code (fenced blocks and
inline code spans are skipped). Web links (``http:``, ``https:``, ``mailto:``) are
not followed. A relative target must name an existing file or directory,
relative to the page that links it; a ``#anchor`` (alone, or after a ``.md``
file) must be one of that page's headings, slugged as GitHub does.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.MULTILINE)


def pages() -> list[Path]:
    """README.md, CHANGELOG.md and every page under docs/."""
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]


def _prose(text: str) -> str:
    """``text`` without fenced code blocks, HTML comments and inline code spans."""
    return _CODE_SPAN.sub("", _COMMENT.sub("", _FENCE.sub("", text)))


def links(text: str) -> list[str]:
    """The link targets of a markdown text, in order, code excluded."""
    return _LINK.findall(_prose(text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # \w keeps letters, digits and "_"
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a page's headings (a repeated one gets ``-1``, ``-2`` …)."""
    seen: dict[str, int] = {}
    out = set()
    for _, heading in _HEADING.findall(_FENCE.sub("", text)):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(page: Path) -> list[str]:
    """``"target: why"`` for every link of ``page`` that does not resolve."""
    text = page.read_text(encoding="utf-8")
    out = []
    for target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, https:, mailto: …
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            out.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text(encoding="utf-8")):
            out.append(f"{target}: no heading #{anchor} in {dest.name}")
    return out


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_every_docs_page_is_linked_from_the_readme() -> None:
    readme = ROOT / "README.md"
    linked = {(readme.parent / t.partition("#")[0]).resolve() for t in links(readme.read_text(encoding="utf-8"))}
    orphans = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert orphans == []


def test_the_checker_finds_a_broken_link_and_skips_code(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("# A title: `with code`\n\ntext\n")
    page = tmp_path / "page.md"
    page.write_text(
        "See [there](there.md), [its title](there.md#a-title-with-code), [gone](gone.md),\n"
        "[no such heading](there.md#nope), [here](#local), [web](https://example.com/x.md).\n"
        "`[in code](code.md)`\n\n```\n[in a block](block.md)\n```\n\n## Local\n"
    )
    # gone.md does not exist; there.md has one heading, "a-title-with-code"; #local is this
    # page's "## Local"; the two code links and the web link are not checked.
    assert broken_links(page) == [
        f"gone.md: no file {tmp_path / 'gone.md'}",
        "there.md#nope: no heading #nope in there.md",
    ]


def test_slugs_follow_githubs_rule() -> None:
    # ":" "/" "(" ")" "=" '"' are dropped, "_" kept, each space a hyphen (two spaces: two hyphens).
    assert slug("Numeric equivalence: `compare_components` / `cb compare`") == (
        "numeric-equivalence-compare_components--cb-compare"
    )
    assert slug('Budgets that scale: `descend="hotspots"`') == "budgets-that-scale-descendhotspots"
    assert slug("Many batches (dynamic shapes)") == "many-batches-dynamic-shapes"
    assert slug("`report.html`") == "reporthtml"
