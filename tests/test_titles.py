"""``engine.titles.cleanTitle``: whatever the model answers, a title is one plain,
short line with words, or nothing."""

from __future__ import annotations

import unicodedata

import pytest
from hermes_acp.engine.titles import INPUT_CHARS, TITLE_LENGTH, cleanTitle, titleRequest
from hypothesis import given
from hypothesis import strategies as st


@pytest.mark.parametrize(("raw", "title"), [
    ("Fix the Zed titles", "Fix the Zed titles"),
    ('"Fix the Zed titles."', "Fix the Zed titles"),
    ("**Title:** `Trip` planning\nmore", "Trip planning"),
    ("\n\n  ## 1. Hello   world  \n", "Hello world"),
    ("“Café\u202e notes”", "Café notes"),
    ("bell\x07and\x1bescape", "bell and escape"),
    ("- a list item", "a list item"),
    ("x" * 200, "x" * (TITLE_LENGTH - 1) + "…"),
])
def test_cleaned(raw: str, title: str) -> None:
    assert cleanTitle(raw) == title


@pytest.mark.parametrize("raw", ["", "   ", "```\n**\n> \n", '""', "...", "\x00\x01\n\t"])
def test_nothingUsable(raw: str) -> None:
    assert cleanTitle(raw) is None


@given(st.text())
def test_anyAnswerIsOnePlainLineOrNothing(raw: str) -> None:
    title = cleanTitle(raw)
    if title is not None:
        assert 0 < len(title) <= TITLE_LENGTH
        assert any(c.isalnum() for c in title)
        assert title == title.strip()
        assert not any(unicodedata.category(c)[0] == "C" for c in title)
        assert not any(c in title for c in '"`*\n\r')


def test_requestIsBounded() -> None:
    messages = titleRequest("p" * 10 * INPUT_CHARS, "a" * 10 * INPUT_CHARS)
    assert len(messages[1]["content"]) < 2 * INPUT_CHARS + 100
