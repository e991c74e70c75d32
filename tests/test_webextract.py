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


def _flateBomb(inflated: int) -> bytes:
    """A one-page PDF whose content stream is ``inflated`` bytes of spaces, deflated to a few
    hundred kilobytes: a decompression bomb."""
    import zlib

    chunk, packer = b" " * (1 << 20), zlib.compressobj(9)
    first = packer.compress(chunk) + packer.flush(zlib.Z_FULL_FLUSH)
    again = packer.compress(chunk) + packer.flush(zlib.Z_FULL_FLUSH)  # a full flush resets the window: repeatable
    count, checksum = inflated // len(chunk), 1
    for _ in range(count):
        checksum = zlib.adler32(chunk, checksum)
    data = first + again * (count - 1) + b"\x03\x00" + checksum.to_bytes(4, "big")  # an empty last block
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
               b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << >> /Contents 4 0 R >>",
               b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(data) + data + b"\nendstream"]
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def test_aPDFDecompressionBombIsNotInflated() -> None:
    """A 256 MiB content stream in a PDF of 260 KB: pypdf's own bounds on what a stream may
    inflate to (pypdf 6.1.3 and later, the version pyproject.toml asks for) stop it at once;
    pypdf 5.9 inflated it whole (measured: 56 s and 567 MB of memory for one page from the web;
    a 1 GiB stream in a 1 MB PDF took gigabytes)."""
    import resource
    import zlib

    bomb = _flateBomb(256 << 20)
    assert len(bomb) < 8 * 1024 * 1024  # fits HERMES_ACP_WEB_MAX_BYTES
    stream = bomb[bomb.index(b"stream\n") + 7:bomb.rindex(b"\nendstream")]
    assert len(zlib.decompressobj().decompress(stream, 4096)) == 4096  # a real deflate stream
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        title, text = extract(Page("https://example.org/bomb.pdf", "application/pdf", None, bomb, False))
    except ToolError as e:
        assert "the PDF could not be read" in str(e)
    else:
        assert text.strip() == ""
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024  # KiB; measured: 0 with pypdf 7
