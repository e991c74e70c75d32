"""``web_extract``'s extraction on the real fixture pages (``tests/data/web``): the measure the
library was chosen by (docs/architecture.md, "The web") — each page's main content kept, its
boilerplate left out — and the cut of a long page with its whole text saved."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hermes_acp.engine.tools.registry import ToolError
from hermes_acp.engine.tools.webextract import cut, extract, savedFolder
from hermes_acp.engine.webfetch import Page

DATA = Path(__file__).parent / "data" / "web"
#: Per page: phrases of its main content, and phrases of its boilerplate.
PAGES = {
    "webstruct-tutorial.html": (
        ["This tutorial assumes you are familiar with machine learning", "eli5.explain_weights", "Get annotated data"],
        ["Free document hosting provided by Read the Docs", "Edit on GitHub", "Downloads", "Project Home"]),
    "iana-reserved-domains.html": (
        ["Certain domains are set aside", "RFC 2606", "XN--KGBECHTV", "Special-Use Domain Names"],
        ["Root KSK Ceremonies", "Privacy Policy", "Time Zone Database"]),
    "books-to-scrape.html": (
        ["now-classic collection of poetry", "UPC", "£51.77"], ["Travel", "Historical Fiction", "Sequential Art"]),
    "mozilla-firefox-developer.html": (
        ["Firefox Developer Edition", "Valence", "WebIDE"], ["Portions of this content are", "Privacy Policy"]),
}


def page(name: str, contentType: str = "text/html", charset: str | None = None, truncated: bool = False) -> Page:
    return Page(f"https://example.org/{name}", contentType, charset, (DATA / name).read_bytes(), truncated)


@pytest.mark.parametrize("name", sorted(PAGES))
def test_theMainContentIsKeptAndTheBoilerplateLeftOut(name: str) -> None:
    keep, drop = PAGES[name]
    title, content = extract(page(name, charset="utf-8"))
    assert title
    assert [phrase for phrase in keep if phrase not in content] == []
    assert [phrase for phrase in drop if phrase in content] == []


def test_markdownWithoutACharsetDetectsTheEncoding() -> None:
    title, content = extract(page("webstruct-tutorial.html"))
    assert title == "Tutorial — Webstruct 0.6 documentation"
    assert "# Tutorial" in content and "## Get annotated data" in content
    assert "[WebAnnotator](https://github.com/xtannier/WebAnnotator)" in content  # links kept


def test_aPDFIsText() -> None:
    title, content = extract(page("crazyones.pdf", "application/pdf"))
    assert content.startswith("<!-- page 1 -->\nThe Crazy Ones") and "misfits" in content.replace("ﬁ", "fi")


def test_whatIsNotAPageIsRefusedInWords() -> None:
    with pytest.raises(ToolError, match="cut PDF"):
        extract(page("crazyones.pdf", "application/pdf", truncated=True))
    with pytest.raises(ToolError, match="could not be read"):
        extract(Page("https://e.example/x.pdf", "application/pdf", None, b"%PDF-1.4 not really", False))
    with pytest.raises(ToolError, match="image/png"):
        extract(Page("https://e.example/x.png", "image/png", None, b"\x89PNG\r\n", False))
    assert extract(Page("https://e.example/a.json", "application/json", None, b'{"a": 1}', False)) == ("", '{"a": 1}')


def test_aLongPageKeepsHeadAndTailAndSavesTheWhole() -> None:
    text = "".join(f"line {n}\n" for n in range(10_000))
    shown = cut("https://example.org/long", text, 2_000)
    assert shown.startswith("line 0\n") and "line 9999" in shown and "line 5000\n" not in shown
    assert "characters cut from the middle" in shown
    path = shown.rsplit(" is saved in ", 1)[1].split(" (", 1)[0]
    assert Path(path).read_text() == text and Path(path).parent == Path(savedFolder())
    assert os.stat(path).st_mode & 0o777 == 0o600 and os.stat(savedFolder()).st_mode & 0o777 == 0o700
    assert cut("https://example.org/short", "short", 2_000) == "short"
