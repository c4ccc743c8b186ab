"""Reply splitting: limits, boundary preference, and code fences across chunks."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mnemo.adapters.splitting import find_fences, split_message, utf16_len

# -- an independent reading of the rules, so the properties do not trust the code ------

_FENCE_LINE = re.compile(r"^[ \t]*(?:`{3,} ?[^\s`]*|~{3,} ?\S*)[ \t]*$")
_OPENER = re.compile(r"^[ \t]*(`{3,}|~{3,})(.*)$")


def content(text: str) -> str:
    """Non-whitespace content with whole fence-marker lines removed (the splitter adds
    such lines when it closes and reopens a block)."""
    kept = [line for line in text.replace("\r", "\n").split("\n") if not _FENCE_LINE.match(line)]
    return "".join("".join(kept).split())


def open_fence_at_end(chunk: str) -> str | None:
    """The marker of a fence still open at the end of ``chunk``, if any."""
    marker: str | None = None
    for line in chunk.split("\n"):
        if marker is None:
            m = _OPENER.match(line)
            if m and not (m[1][0] == "`" and "`" in m[2]):
                marker = m[1]
        elif re.fullmatch(rf"[ \t]*{re.escape(marker[0])}{{{len(marker)},}}[ \t]*", line):
            marker = None
    return marker


# -- strategies ------------------------------------------------------------------------

_word = st.text(alphabet="abcXYZé日😀_*`~.!?,-", min_size=1, max_size=12)
_sentence = st.lists(_word, min_size=1, max_size=25).map(" ".join)
_paragraph = st.lists(_sentence, min_size=1, max_size=4).map(lambda s: "\n".join(s))
_code_line = st.text(alphabet="ab(){}=; \t<>&😀", max_size=40)


@st.composite
def _fence(draw: st.DrawFn) -> str:
    marker = draw(st.sampled_from(["```", "~~~", "````", "`````"]))
    lang = draw(st.sampled_from(["", "py", "js", "c++", "bash"]))
    indent = draw(st.sampled_from(["", "  ", "   "]))
    body = draw(st.lists(_code_line, max_size=30))
    closed = draw(st.booleans())
    lines = [indent + marker + lang, *body] + ([indent + marker] if closed else [])
    return "\n".join(lines)


_markdown = st.lists(st.one_of(_paragraph, _paragraph, _fence()), min_size=1, max_size=12).map("\n\n".join)
_noise = st.text(alphabet="ab `~\n\t.😀", max_size=600)


def _carried(text: str, limit: int) -> bool:
    """Whether every fence is small enough next to the limit to be carried across
    chunks (a fence with a huge marker line is split like plain text instead)."""
    marker_lines = [line for line in text.split("\n") if line.lstrip(" \t")[:3] in ("```", "~~~")]
    return all(6 * len(line) + 9 <= limit for line in marker_lines)


def _check(text: str, limit: int, length=len) -> list[str]:
    chunks = split_message(text, limit, length=length)
    for chunk in chunks:
        assert length(chunk) <= limit, (length(chunk), chunk)
        assert chunk.strip(), "empty chunk"
        if _carried(text, limit):
            assert open_fence_at_end(chunk) is None, f"unbalanced fence in {chunk!r}"
    assert content("\n".join(chunks)) == content(text)
    return chunks


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_markdown, limit=st.integers(min_value=64, max_value=700))
def test_markdown_chunks_fit_keep_content_and_balance_fences(text: str, limit: int) -> None:
    _check(text, limit)


@settings(max_examples=200, deadline=None)
@given(text=_markdown, limit=st.integers(min_value=64, max_value=700))
def test_utf16_length_is_respected(text: str, limit: int) -> None:
    _check(text, limit, length=utf16_len)


@settings(max_examples=300, deadline=None)
@given(text=_noise, limit=st.integers(min_value=16, max_value=200))
def test_arbitrary_text_with_stray_markers(text: str, limit: int) -> None:
    # Stray backticks and tildes make fences out of nowhere; the limit stays tiny.
    _check(text, limit)


# -- behaviour, by example ---------------------------------------------------------------


def test_short_text_is_one_chunk_and_blank_text_none() -> None:
    assert split_message("hello\n\nworld", 100) == ["hello\n\nworld"]
    assert split_message(" \n\n\t ", 100) == []


def test_paragraph_break_preferred_over_line_break() -> None:
    para1 = "\n".join(["one line of the first paragraph"] * 3)
    para2 = "\n".join(["a line of the second paragraph"] * 3)
    chunks = split_message(f"{para1}\n\n{para2}", 140)
    assert chunks == [para1, para2]


def test_tiny_paragraph_break_loses_to_a_later_line_break() -> None:
    text = "Hi.\n\n" + "\n".join(f"line number {i:02d} of a long paragraph" for i in range(10))
    first = split_message(text, 200)[0]
    assert first.startswith("Hi.\n\nline number 00")  # no 3-character message


def test_sentence_then_word_boundaries_inside_a_long_line() -> None:
    text = "First sentence here. " * 10 + "tail"
    chunks = split_message(text, 64)
    assert all(c.endswith(".") for c in chunks[:-1])
    words = split_message("word " * 40, 30)
    assert all(set(c.split()) == {"word"} for c in words)


def test_unbroken_text_is_cut_hard() -> None:
    assert split_message("x" * 70, 32) == ["x" * 32, "x" * 32, "x" * 6]


def test_code_block_that_fits_alone_moves_whole_to_next_chunk() -> None:
    code = "```python\n" + "\n".join(f"print({i})" for i in range(8)) + "\n```"
    text = "Some intro text.\n" + code + "\nAfter."
    chunks = split_message(text, len(code) + 5)
    assert chunks[0] == "Some intro text."
    assert chunks[1].startswith(code)


def test_long_code_block_is_closed_and_reopened_with_its_language() -> None:
    body = "\n".join(f"value_{i} = compute({i})" for i in range(300))
    text = f"Here:\n\n~~~~rust extra info\n{body}\n~~~~\n\nDone."
    chunks = split_message(text, 500)
    assert len(chunks) > 3
    assert chunks[0].startswith("Here:\n\n~~~~rust extra info\n")
    for chunk in chunks[1:-1]:
        assert chunk.startswith("~~~~rust\n") and chunk.endswith("\n~~~~")
    assert chunks[-1].endswith("~~~~\n\nDone.")
    rebuilt = [line for c in chunks for line in c.split("\n") if not line.startswith("~~~~")]
    assert [line for line in rebuilt if line.startswith("value_")] == body.split("\n")


def test_unclosed_fence_is_closed_at_the_end() -> None:
    assert split_message("Look:\n```js\nlet a = 1;", 100) == ["Look:\n```js\nlet a = 1;\n```"]


def test_inline_triple_backticks_are_not_a_fence() -> None:
    text = "Use ```inline``` code " * 20
    chunks = split_message(text, 64)
    assert all("\n```" not in c for c in chunks)
    assert content("".join(chunks)) == content(text)


def test_telegram_counts_utf16_units() -> None:
    text = "😀" * 3000  # 3,000 code points, 6,000 UTF-16 units
    assert split_message(text, 4096) == [text]
    chunks = split_message(text, 4096, length=utf16_len)
    assert [utf16_len(c) for c in chunks] == [4096, 6000 - 4096]


def test_ten_thousand_characters_at_the_telegram_limit() -> None:
    paragraphs = [f"Paragraph {i}." + " Lorem ipsum dolor sit amet." * 12 for i in range(30)]
    text = "\n\n".join(paragraphs)
    assert len(text) > 10_000
    chunks = split_message(text, 4096, length=utf16_len)
    assert len(chunks) == 3
    assert all(c.startswith("Paragraph ") and c.endswith(".") for c in chunks)
    assert "\n\n".join(chunks) == text


def test_limit_below_minimum_is_refused() -> None:
    with pytest.raises(ValueError):
        split_message("anything", 8)


def test_find_fences_reports_language_and_closure() -> None:
    text = "a\n  ```py title\nx\n  ```\n~~~\nopen"
    first, second = find_fences(text)
    assert (first.language, first.closed, text[first.start : first.end]) == (
        "py",
        True,
        "  ```py title\nx\n  ```",
    )
    assert (second.marker, second.closed, second.end) == ("~~~", False, len(text))
