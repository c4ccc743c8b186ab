"""Telegram HTML: the validator reads like the Bot API server, splitting keeps every
chunk valid on its own."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from types import FrameType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mnemo.adapters.splitting import utf16_len
from mnemo.adapters.telegram_html import (
    Entity,
    TelegramHtmlError,
    _Parser,
    html_to_plain,
    is_valid_telegram_html,
    parse_telegram_html,
    split_html,
)


def error_of(html: str, *, strict: bool = True) -> str:
    with pytest.raises(TelegramHtmlError) as caught:
        parse_telegram_html(html, strict=strict)
    return caught.value.description


# -- parsing ---------------------------------------------------------------------------


def test_every_supported_tag_parses_to_its_entity() -> None:
    html = (
        "<b>b</b><strong>b</strong><i>i</i><em>i</em><u>u</u><ins>u</ins><s>s</s>"
        '<strike>s</strike><del>s</del><span class="tg-spoiler">p</span><tg-spoiler>p</tg-spoiler>'
        '<a href="https://example.org/?q=1&amp;r=2">a</a><code>c</code><pre>p</pre>'
        "<blockquote>q</blockquote><blockquote expandable>e</blockquote>"
        '<tg-emoji emoji-id="5368324170671202286">👍</tg-emoji>'
    )
    parsed = parse_telegram_html(html)
    assert [e.type for e in parsed.entities] == [
        "bold", "bold", "italic", "italic", "underline", "underline", "strikethrough",
        "strikethrough", "strikethrough", "spoiler", "spoiler", "text_link", "code", "pre",
        "blockquote", "expandable_blockquote", "custom_emoji",
    ]  # fmt: skip
    assert parsed.entities[11].url == "https://example.org/?q=1&r=2"


def test_offsets_are_utf16_and_pre_code_language_is_one_entity() -> None:
    parsed = parse_telegram_html('😀 <b>x</b> <pre><code class="language-python">a &lt; b</code></pre>')
    assert parsed.text == "😀 x a < b"
    assert parsed.entities == (
        Entity("bold", 3, 1),
        Entity("pre", 5, 5, language="python"),
    )
    assert parsed.entities[1].to_json() == {"type": "pre", "offset": 5, "length": 5, "language": "python"}


def test_references_and_the_short_end_tag() -> None:
    assert parse_telegram_html("&lt;&gt;&amp;&quot;&#65;&#x42;").text == '<>&"AB'
    assert parse_telegram_html("<b>x<i>y</></b>").entities == (Entity("bold", 0, 2), Entity("italic", 1, 1))
    assert parse_telegram_html("<b></b>x").entities == ()  # empty entities vanish


@pytest.mark.parametrize(
    ("html", "description"),
    [
        ("a <p>x</p>", 'Unsupported start tag "p" at byte offset 2'),
        ("é<abc", "Unclosed start tag at byte offset 2"),
        ("a < b", 'Unsupported start tag "" at byte offset 2'),
        ("x</b>", "Unexpected end tag at byte offset 1"),
        ("<i>a</i   ", "Unclosed end tag at byte offset 4"),
        ("<i>a</em>", 'Unmatched end tag at byte offset 4, expected "</i>", found "</em>"'),
        ("<b>never closed", 'Can\'t find end tag corresponding to start tag "b"'),
        ("<i =x>a</i>", 'Empty attribute name in the tag "i" at byte offset 0'),
        ("<i a=1,>a</i>", "Unexpected end of name token at byte offset 5"),
        ('<a href="x>a</a>', "Unclosed start tag at byte offset 0"),
        ("<span>x</span>", 'Tag "span" must have class "tg-spoiler" at byte offset 0'),
        ("&#xD800;", "Text contains invalid Unicode characters after decoding HTML entities, "
                     "check for unmatched surrogate code units"),
    ],
)  # fmt: skip
def test_errors_read_like_the_bot_api(html: str, description: str) -> None:
    assert error_of(html, strict=False) == description


def test_lenient_mode_accepts_what_the_server_accepts() -> None:
    assert parse_telegram_html("a & b &Or; &lt", strict=False).text == "a & b &Or; <"
    assert parse_telegram_html('<b unknown="1">x</b> > y', strict=False).text == "x > y"
    assert is_valid_telegram_html("<code><b>x</b></code>", strict=False)


@pytest.mark.parametrize(
    "html",
    [
        "a & b",
        "&Or;",
        "&lt without semicolon",
        "x > y",
        '<b class="x">y</b>',
        "<code><b>x</b></code>",
        "<pre><b>x</b></pre>",
        '<code class="language-py">x</code>',
        "<blockquote><blockquote>x</blockquote></blockquote>",
        '<a href="https://a.org"><a href="https://b.org">x</a></a>',
        "<b><pre>x</pre></b>",
        '<a href="javascript:alert(1)">x</a>',
        "<a>x</a>",
    ],
)
def test_strict_mode_refuses_what_our_renderer_never_produces(html: str) -> None:
    assert not is_valid_telegram_html(html)
    assert is_valid_telegram_html(html, strict=False)  # the real server would take it


def test_plain_text_fallback_is_lenient() -> None:
    assert html_to_plain("<b>bold</b> &amp; <i>it</i>") == "bold & it"
    assert html_to_plain("<b>broken <i>nesting</b> &amp;") == "broken nesting &"


# -- splitting -------------------------------------------------------------------------


def test_bold_across_a_cut_is_closed_and_reopened() -> None:
    html = "<b>" + " ".join(f"w{i}" for i in range(200)) + "</b>"
    chunks = split_html(html, 200)
    assert len(chunks) > 3
    for chunk in chunks:
        assert chunk.startswith("<b>") and chunk.endswith("</b>")
        assert parse_telegram_html(chunk).entities[0].type == "bold"


def test_pre_with_language_is_reopened_verbatim() -> None:
    html = '<pre><code class="language-go">' + "x := 1 &lt; 2\n" * 100 + "</code></pre>"
    chunks = split_html(html, 400)
    for chunk in chunks:
        assert chunk.startswith('<pre><code class="language-go">x := 1')
        assert chunk.endswith("</code></pre>")
        assert parse_telegram_html(chunk).entities[0].language == "go"


def test_paragraphs_first_and_a_fitting_block_moves_whole() -> None:
    pre = "<pre>" + "code line\n" * 15 + "</pre>"
    html = "First paragraph.\n\n" + pre + "\n\nLast."
    chunks = split_html(html, len(pre) + 10)
    assert chunks[0] == "First paragraph."
    assert chunks[1].startswith(pre)


def test_no_cut_inside_a_reference() -> None:
    html = "&amp;" * 100
    chunks = split_html(html, 64)
    assert all(is_valid_telegram_html(c) and c.count("&amp;") * 5 == len(c) for c in chunks)
    assert sum(c.count("&amp;") for c in chunks) == 100


def test_tags_too_costly_to_repeat_are_dropped_rather_than_failing() -> None:
    link = '<a href="https://example.org/' + "p" * 200 + '">' + "word " * 100 + "&lt;3</a>"
    chunks = split_html(link, 256)
    assert len(chunks) > 1 and all(c.startswith("word") and "<" not in c for c in chunks)
    assert "".join(chunks).replace(" ", "") == "word" * 100 + "&lt;3"
    assert split_html(link, 1024)[0].startswith('<a href="https://example.org/ppp')


def test_invalid_html_and_tiny_limits_are_refused() -> None:
    with pytest.raises(TelegramHtmlError):
        split_html("<b>unclosed", 100)
    with pytest.raises(ValueError):
        split_html("text " * 10, 8)


_text = st.text(alphabet="ab é😀.!\n\n  <&>", max_size=40).map(
    lambda s: s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
)


_styles = st.sampled_from(["b", "i", "u", "s", "tg-spoiler", "em"])


def _styled(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(_styles, st.lists(children, max_size=4)).map(lambda t: f"<{t[0]}>{''.join(t[1])}</{t[0]}>"),
        _text.map(lambda t: f"<code>{t}</code>"),
    )


_link_free = st.recursive(_text, _styled, max_leaves=10)
_link = st.lists(_link_free, max_size=3).map(
    lambda c: f'<a href="https://x.org/?a=1&amp;b=2">{"".join(c)}</a>'
)
_inline_html = st.recursive(st.one_of(_text, _link), _styled, max_leaves=20)
_block_html = st.one_of(
    _inline_html,
    _text.map(lambda t: f'<pre><code class="language-py">{t}</code></pre>'),
    st.lists(_inline_html, max_size=4).map(lambda c: f"<blockquote>{''.join(c)}</blockquote>"),
)
_document = st.lists(_block_html, min_size=1, max_size=8).map("\n\n".join)


def _open_chain_cost(html: str) -> int:
    """The most the start tags open at one point cost to repeat (a chunk reopens them)."""
    stack: list[str] = []
    worst = 0
    for match in re.finditer(r"<(/?)[^<>]*>", html):
        if match[1]:
            stack.pop()
        else:
            stack.append(match[0])
            worst = max(worst, utf16_len("".join(stack)))
    return worst


@settings(max_examples=300, deadline=None)
@given(html=_document, extra=st.integers(min_value=0, max_value=400))
def test_any_valid_html_splits_into_valid_chunks(html: str, extra: int) -> None:
    assert is_valid_telegram_html(html)
    limit = 3 * _open_chain_cost(html) + 16 + extra
    chunks = split_html(html, limit)
    for chunk in chunks:
        assert utf16_len(chunk) <= limit
        assert is_valid_telegram_html(chunk), chunk
        assert html_to_plain(chunk).strip()
    words = "".join(html_to_plain(html).split())
    assert "".join("".join(html_to_plain(c).split()) for c in chunks) == words


def _formatting(html: str) -> list[tuple[str, frozenset[tuple[str, str | None, str | None]]]]:
    """Each visible character of ``html`` with the entities covering it (type, url,
    language), in order; whitespace is left out (a cut may drop it)."""
    parsed = parse_telegram_html(html)
    units: list[int] = []  # the UTF-16 offset of each character
    offset = 0
    for ch in parsed.text:
        units.append(offset)
        offset += utf16_len(ch)
    out = []
    for ch, at in zip(parsed.text, units, strict=True):
        if ch.isspace():
            continue
        covering = frozenset(
            (e.type, e.url, e.language) for e in parsed.entities if e.offset <= at < e.offset + e.length
        )
        out.append((ch, covering))
    return out


@settings(max_examples=300, deadline=None)
@given(html=_document, extra=st.integers(min_value=0, max_value=400))
def test_a_split_keeps_every_characters_formatting_and_telegrams_count(html: str, extra: int) -> None:
    limit = 3 * _open_chain_cost(html) + 16 + extra
    chunks = split_html(html, limit)
    for chunk in chunks:
        # What Telegram counts (the text once entities are parsed) is within the limit too.
        assert utf16_len(parse_telegram_html(chunk).text) <= utf16_len(chunk) <= limit
    assert [f for c in chunks for f in _formatting(c)] == _formatting(html)


@settings(max_examples=200, deadline=None)
@given(
    html=_document,
    link=st.integers(min_value=40, max_value=300),
    limit=st.integers(min_value=16, max_value=200),
)
def test_when_the_tags_cost_too_much_the_plain_text_is_split_whole(html: str, link: int, limit: int) -> None:
    html = f'<a href="https://x.org/{"p" * link}">{html}</a>'
    chunks = split_html(html, limit)
    for chunk in chunks:
        assert utf16_len(chunk) <= limit
        assert is_valid_telegram_html(chunk), chunk
    words = "".join(html_to_plain(html).split())
    assert "".join("".join(html_to_plain(c).split()) for c in chunks) == words


def _parses_while(split: Callable[[], object]) -> int:
    """How many times the HTML parser runs on this thread while ``split`` runs."""
    parser_run = _Parser.run.__code__
    runs = 0

    def probe(frame: FrameType, event: str, arg: object) -> None:
        nonlocal runs
        if event == "call" and frame.f_code is parser_run:
            runs += 1

    previous = sys.getprofile()
    sys.setprofile(probe)
    try:
        split()
    finally:
        sys.setprofile(previous)
    return runs


def test_a_long_reply_is_parsed_once_not_once_per_chunk() -> None:
    # The split used to strip the whole rest of the reply to plain text before each
    # chunk: one parse per chunk, so time grew with the square of the length.
    paragraph = "<b>Step</b> one: set <code>x</code> &amp; check <i>the docs</i> again. " * 8
    html = "\n\n".join(paragraph for _ in range(80))
    chunks = split_html(html)
    assert len(chunks) >= 10
    assert _parses_while(lambda: split_html(html)) == 1
