"""Markdown to Telegram HTML: always valid, escaped, and split into valid messages."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mnemo.adapters.splitting import utf16_len
from mnemo.adapters.telegram_format import markdown_to_html, render_chunks, to_plain_text
from mnemo.adapters.telegram_html import TELEGRAM_MESSAGE_LIMIT, html_to_plain, is_valid_telegram_html


def html(markdown: str) -> str:
    rendered = markdown_to_html(markdown)
    assert is_valid_telegram_html(rendered), rendered
    return rendered


@pytest.mark.parametrize(
    ("markdown", "expected"),
    [
        ("**bold** and __bold__", "<b>bold</b> and <b>bold</b>"),
        ("*it* and _it_", "<i>it</i> and <i>it</i>"),
        ("~~gone~~", "<s>gone</s>"),
        ("***both***", "<i><b>both</b></i>"),
        ("**bold with *italic* inside**", "<b>bold with <i>italic</i> inside</b>"),
        ("`a < b && c`", "<code>a &lt; b &amp;&amp; c</code>"),
        ("``code with ` tick``", "<code>code with ` tick</code>"),
        ("# Heading *x*", "<b>Heading <i>x</i></b>"),
        ("### Third level ###", "<b>Third level</b>"),
        ("- one\n* two\n  + nested", "• one\n• two\n  • nested"),
        ("1. first\n2) second", "1. first\n2) second"),
        ("> quoted **b**\n> more", "<blockquote>quoted <b>b</b>\nmore</blockquote>"),
        ("> outer\n> > inner", "<blockquote>outer\ninner</blockquote>"),  # no nesting in Telegram
        ("---", "─" * 12),
        ("a\nb\n\n\n\nc", "a\nb\n\nc"),
        ("\\*not italic\\*", "*not italic*"),
    ],
)
def test_markdown_constructs(markdown: str, expected: str) -> None:
    assert html(markdown) == expected


@pytest.mark.parametrize(
    ("markdown", "expected"),
    [
        ("<script>alert(1)</script> & <b>", "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &lt;b&gt;"),
        ("a * b * c", "a * b * c"),
        ("my_snake_case_name and __init__", "my_snake_case_name and <b>init</b>"),
        ("2*3*4 = 24", "2<i>3</i>4 = 24"),
        ("**never closed", "**never closed"),
        ("`never closed", "`never closed"),
        ("~~never closed", "~~never closed"),
        ("~5 minutes", "~5 minutes"),
        ("_a *b_ c*", "<i>a *b</i> c*"),
        ("[dangling](", "[dangling]("),
        ("see https://x.org/a_b_c_d*e* now", "see https://x.org/a_b_c_d*e* now"),
        ("&amp; stays literal", "&amp;amp; stays literal"),
    ],
)
def test_unbalanced_or_hostile_markdown_stays_valid(markdown: str, expected: str) -> None:
    assert html(markdown) == expected


def test_links_allow_only_safe_schemes_and_escape_the_href() -> None:
    assert html('[site](https://e.org/?a=1&b="2")') == (
        '<a href="https://e.org/?a=1&amp;b=&quot;2&quot;">site</a>'
    )
    assert html("[me](tg://user?id=42) [mail](mailto:a@b.c)").count("<a href=") == 2
    assert html("[x](javascript:alert(1))") == "x (javascript:alert(1))"
    assert html("[docs](/relative/path)") == "docs (/relative/path)"
    assert html("[**bold** `code`](https://e.org)") == '<a href="https://e.org"><b>bold</b> code</a>'
    assert html("[](https://e.org)") == '<a href="https://e.org">https://e.org</a>'


def test_fenced_code_keeps_indentation_and_language() -> None:
    rendered = html("```python\ndef f():\n    return 1 < 2\n```\nafter")
    assert rendered == (
        '<pre><code class="language-python">def f():\n    return 1 &lt; 2</code></pre>\n\nafter'
    )
    assert html("~~~\nplain <x>\n~~~") == "<pre>plain &lt;x&gt;</pre>"
    assert html('```weird"lang\nx\n```') == "<pre>x</pre>"  # unsafe class dropped
    assert html("```js\nnever closed") == '<pre><code class="language-js">never closed</code></pre>'


def test_tables_become_aligned_preformatted_text() -> None:
    rendered = html("| Name | Qty |\n|---|--:|\n| **Apple** | 3 |\n| 日本 | 12 |")
    assert rendered == ("<pre>Name  | Qty\n------+----\nApple | 3\n日本  | 12</pre>")


def test_plain_text_fallback_drops_markup_but_keeps_words() -> None:
    assert to_plain_text("# Title\n\n**b** [link](https://e.org) `x < y`") == "Title\n\nb link x < y"


def test_ten_thousand_characters_split_into_valid_messages() -> None:
    section = "## Part {i}\n\nSome **bold** text with `code` & <brackets>. " * 3
    code = "```python\n" + "\n".join(f"x_{j} = {j} < {j + 1}" for j in range(40)) + "\n```\n"
    markdown = "\n\n".join(section.format(i=i) + code for i in range(14))
    assert len(markdown) > 10_000
    chunks = render_chunks(markdown)
    assert len(chunks) >= 3
    for chunk in chunks:
        assert utf16_len(chunk.html) <= TELEGRAM_MESSAGE_LIMIT
        assert is_valid_telegram_html(chunk.html)
        assert chunk.plain == html_to_plain(chunk.html)
        assert chunk.html.count("<pre>") == chunk.html.count("</pre>")
    together = "".join("".join(c.plain.split()) for c in chunks)
    assert together == "".join(to_plain_text(markdown).split())


def test_blank_reply_renders_to_nothing() -> None:
    assert render_chunks("  \n\n ") == []


_markdown_alphabet = "ab _*~`#>-|[]()<>&\\.1\n é😀"
_markdownish = st.text(alphabet=_markdown_alphabet, max_size=300) | st.lists(
    st.sampled_from(
        ["**", "*", "_", "__", "~~", "`", "```", "```py\n", "\n```\n", "[t](https://x.org/_a_)", "# ",
         "- ", "> ", "| a | b |\n|---|---|\n", "\n\n", "\n", "word", " ", "<", "&", "snake_case"]
    ),
    max_size=60,
).map("".join)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(markdown=_markdownish)
def test_any_text_renders_to_valid_html(markdown: str) -> None:
    assert is_valid_telegram_html(markdown_to_html(markdown))


@settings(max_examples=200, deadline=None)
@given(markdown=_markdownish, limit=st.integers(min_value=128, max_value=1000))
def test_any_text_splits_into_valid_messages_within_the_limit(markdown: str, limit: int) -> None:
    chunks = render_chunks(markdown, limit)
    for chunk in chunks:
        assert utf16_len(chunk.html) <= limit
        assert utf16_len(chunk.plain) <= limit
        assert is_valid_telegram_html(chunk.html)
        assert chunk.plain.strip()
    together = "".join("".join(c.plain.split()) for c in chunks)
    assert together == "".join(to_plain_text(markdown).split())
