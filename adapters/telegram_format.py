"""The model's Markdown rendered as Telegram HTML (``parse_mode=HTML``).

Why HTML and not MarkdownV2: MarkdownV2 wants 18 characters escaped everywhere and
rejects the whole message over one stray ``_``; in HTML only ``& < >`` need escaping, and
the output is built as a tree here, so it is well-formed by construction whatever the
model wrote. Unbalanced Markdown (a lone ``*``, ``snake_case``, an unclosed backtick)
stays literal text instead of becoming a broken entity.

What becomes what:
- ``**b**`` / ``__b__`` bold, ``*i*`` / ``_i_`` italic, ``~~s~~`` strikethrough, ```x```
  inline code, fenced blocks ``<pre><code class="language-x">``;
- ``[text](url)`` a link when the URL is http, https, tg or mailto (otherwise the text
  followed by the URL in brackets); bare URLs are left for Telegram to link;
- headings bold, bullets "• ", numbered items as written, ``>`` quotes a blockquote,
  rules a line of "─", tables a ``<pre>`` block with aligned columns (pipes and dashes
  are unreadable on a phone), everything else text with its line breaks kept.

``render_chunks`` is what an adapter sends: the HTML split by ``split_html`` (each chunk
valid on its own, tags closed and reopened at a cut) with the same chunk as plain text
for the "can't parse entities" fallback. Splitting the HTML rather than the Markdown
keeps bold text bold across a cut and measures what Telegram counts.
"""

from __future__ import annotations

import re
import string
import unicodedata
from dataclasses import dataclass
from html import escape

from mnemo.adapters.splitting import find_fences
from mnemo.adapters.telegram_html import (
    TELEGRAM_MESSAGE_LIMIT,
    escape_text,
    html_to_plain,
    is_valid_telegram_html,
    split_html,
)

# The HTML-level pieces live in ``adapters.telegram_html``; they are re-exported so an
# adapter needs one import for everything about formatting a reply.
__all__ = [
    "TELEGRAM_MESSAGE_LIMIT",
    "TelegramChunk",
    "html_to_plain",
    "is_valid_telegram_html",
    "markdown_to_html",
    "render_chunks",
    "split_html",
    "to_plain_text",
]

_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
_RULE = re.compile(r"^ {0,3}(?:(?:\*[ \t]*){3,}|(?:-[ \t]*){3,}|(?:_[ \t]*){3,})$")
_BULLET = re.compile(r"^([ \t]*)[-*+][ \t]+(.*)$")
_NUMBERED = re.compile(r"^([ \t]*)(\d{1,9}[.)])[ \t]+(.*)$")
_QUOTE = re.compile(r"^ {0,3}>[ ]?(.*)$")
_TABLE_RULE = re.compile(r"^[ \t]*\|?[ \t]*:?-+:?[ \t]*(?:\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$")
_LANGUAGE = re.compile(r"[A-Za-z0-9_+#.-]{1,32}")


@dataclass(frozen=True, slots=True)
class TelegramChunk:
    """One message: the HTML to send, and the same text plain for the fallback."""

    html: str
    plain: str


def render_chunks(markdown: str, limit: int = TELEGRAM_MESSAGE_LIMIT) -> list[TelegramChunk]:
    """The reply as Telegram messages, each at most ``limit`` UTF-16 units; ``[]`` if blank."""
    return [TelegramChunk(c, html_to_plain(c)) for c in split_html(markdown_to_html(markdown), limit)]


def to_plain_text(markdown: str) -> str:
    """The reply as the user would read it, without any formatting."""
    return html_to_plain(markdown_to_html(markdown))


def markdown_to_html(markdown: str) -> str:
    text = markdown.replace("\r\n", "\n").replace("\r", "\n")
    return _render_blocks(text, in_quote=False)


def _render_blocks(text: str, *, in_quote: bool) -> str:
    """Paragraph groups joined by one blank line, fenced code as ``pre`` blocks."""
    parts: list[str] = []
    position = 0
    for fence in find_fences(text):
        parts.extend(_render_lines(text[position : fence.start], in_quote=in_quote))
        parts.append(_render_fence(text, fence.body_start, fence.close_start, fence.language, fence.indent))
        position = fence.end + 1
    parts.extend(_render_lines(text[position:], in_quote=in_quote))
    return "\n\n".join(p for p in parts if p)


def _render_fence(text: str, body_start: int, close_start: int, language: str, indent: str) -> str:
    lines = text[body_start:close_start].split("\n")
    if lines and lines[-1] == "" and close_start > body_start:
        lines.pop()  # the newline before the closing fence is not part of the code
    # An indented fence (inside a list item) indents its code by as much: remove it.
    width = len(indent)
    code = "\n".join(line[min(width, len(line) - len(line.lstrip(" \t"))) :] for line in lines)
    body = escape_text(code) or " "
    if _LANGUAGE.fullmatch(language):
        return f'<pre><code class="language-{language}">{body}</code></pre>'
    return f"<pre>{body}</pre>"


def _render_lines(text: str, *, in_quote: bool) -> list[str]:
    """Blocks of a fence-free stretch: each group of non-blank lines becomes one block."""
    groups: list[str] = []
    for group in re.split(r"\n[ \t]*\n", text.strip("\n")):
        if group.strip():
            groups.append(_render_group(group.split("\n"), in_quote=in_quote))
    return groups


def _render_group(lines: list[str], *, in_quote: bool) -> str:
    out: list[str] = []
    paragraph: list[str] = []

    def flush() -> None:
        if paragraph:
            out.append(render_inline("\n".join(paragraph)))
            paragraph.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        if _QUOTE.match(line):
            flush()
            quoted = []
            while i < len(lines) and (m := _QUOTE.match(lines[i])):
                quoted.append(m[1])
                i += 1
            inner = "\n".join(quoted)
            if in_quote:  # Telegram cannot nest quotes: a quote inside one is its text
                out.append(render_inline(inner))
            else:
                out.append(f"<blockquote>{_render_blocks(inner, in_quote=True)}</blockquote>")
            continue
        if i + 1 < len(lines) and "|" in line and _TABLE_RULE.match(lines[i + 1]) and "-" in lines[i + 1]:
            flush()
            rows = [line]
            i += 2
            while i < len(lines) and "|" in lines[i] and lines[i].strip():
                rows.append(lines[i])
                i += 1
            out.append(_render_table(rows))
            continue
        if heading := _HEADING.match(line):
            flush()
            out.append(f"<b>{render_inline(heading[1])}</b>" if heading[1] else "")
        elif _RULE.match(line):
            flush()
            out.append("─" * 12)
        elif bullet := _BULLET.match(line):
            flush()
            out.append(f"{escape_text(bullet[1])}• {render_inline(bullet[2])}")
        elif numbered := _NUMBERED.match(line):
            flush()
            out.append(f"{escape_text(numbered[1])}{numbered[2]} {render_inline(numbered[3])}")
        else:
            paragraph.append(line)
        i += 1
    flush()
    return "\n".join(out)


def _render_table(rows: list[str]) -> str:
    cells = [_table_cells(row) for row in rows]
    columns = max(len(row) for row in cells)
    cells = [row + [""] * (columns - len(row)) for row in cells]
    widths = [max(_width(row[c]) for row in cells) for c in range(columns)]

    def line(row: list[str]) -> str:
        return " | ".join(cell + " " * (widths[c] - _width(cell)) for c, cell in enumerate(row)).rstrip()

    table = [line(cells[0]), "-+-".join("-" * w for w in widths), *(line(row) for row in cells[1:])]
    return f"<pre>{escape_text(chr(10).join(table))}</pre>"


def _table_cells(row: str) -> list[str]:
    stripped = row.strip()
    stripped = stripped[1:] if stripped.startswith("|") else stripped
    stripped = stripped[:-1] if stripped.endswith("|") and not stripped.endswith("\\|") else stripped
    cells = re.split(r"(?<!\\)\|", stripped)
    # A cell's Markdown would show as symbols inside <pre>: keep only its text.
    return [html_to_plain(render_inline(cell.strip().replace("\\|", "|"))) for cell in cells]


def _width(text: str) -> int:
    """Monospace columns: wide (CJK, emoji) characters take two."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


# -- inline ---------------------------------------------------------------------------

_LINK = re.compile(
    r"\[(?P<text>[^\[\]\n]*)\]\(\s*<?(?P<url>[^\s()<>]*(?:\([^\s()<>]*\)[^\s()<>]*)*)>?"
    r"(?:\s+\"[^\"\n]*\")?\s*\)"
)
_BARE_URL = re.compile(r"(?:https?|tg)://[^\s<>()\[\]]*[^\s<>()\[\].,;:!?'\"*_~]")
_LINK_SCHEMES = ("http://", "https://", "tg://", "mailto:")
_MAX_HREF = 1024  # a chunk repeats an open link's href; keep that cost bounded
_EMPHASIS_TAGS = {("*", 1): "i", ("_", 1): "i", ("*", 2): "b", ("_", 2): "b", ("~", 2): "s"}


@dataclass(frozen=True, slots=True)
class _Html:
    """Already-rendered markup (a code span, a link, a matched emphasis)."""

    html: str


@dataclass(slots=True)
class _Delimiter:
    """A run of ``*``, ``_`` or ``~~`` that may open or close emphasis; mutable while
    matching consumes it, and what is left over renders as the literal characters."""

    char: str
    count: int
    can_open: bool
    can_close: bool


_Piece = str | _Html | _Delimiter


def render_inline(text: str, *, in_link: bool = False) -> str:
    """Inline Markdown of one paragraph as Telegram HTML; always well-formed."""
    return _join(_match_emphasis(_tokenize(text, in_link=in_link)))


def _tokenize(text: str, *, in_link: bool) -> list[_Piece]:
    pieces: list[_Piece] = []
    literal: list[str] = []

    def push(piece: _Piece) -> None:
        if literal:
            pieces.append("".join(literal))
            literal.clear()
        pieces.append(piece)

    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n and text[i + 1] in string.punctuation:
            literal.append(text[i + 1])
            i += 2
        elif c == "`":
            run = _run_length(text, i, "`")
            close = re.compile(rf"(?<!`)`{{{run}}}(?!`)").search(text, i + run)
            code = text[i + run : close.start()] if close else ""
            if close is None or not code.strip():
                literal.append("`" * run)
                i += run
                continue
            code = code.replace("\n", " ")
            if code.startswith(" ") and code.endswith(" "):
                code = code[1:-1]
            push(_Html(escape_text(code) if in_link else f"<code>{escape_text(code)}</code>"))
            i = close.end()
        elif c == "[" and not in_link and (link := _LINK.match(text, i)):
            push(_Html(_render_link(link["text"], link["url"])))
            i = link.end()
        elif c in "ht" and (url := _BARE_URL.match(text, i)) and (i == 0 or not text[i - 1].isalnum()):
            literal.append(url[0])  # literal: no emphasis inside a URL; Telegram links it
            i = url.end()
        elif c in "*_~":
            run = _run_length(text, i, c)
            if c == "~" and run != 2:
                literal.append(c * run)
            else:
                push(_delimiter(text, i, run))
            i += run
        else:
            literal.append(c)
            i += 1
    if literal:
        pieces.append("".join(literal))
    return pieces


def _run_length(text: str, i: int, char: str) -> int:
    j = i
    while j < len(text) and text[j] == char:
        j += 1
    return j - i


def _delimiter(text: str, i: int, run: int) -> _Delimiter:
    """CommonMark's flanking rules: ``_`` inside a word (snake_case) neither opens nor
    closes, so identifiers stay intact."""
    before = text[i - 1] if i > 0 else " "
    after = text[i + run] if i + run < len(text) else " "
    before_space, after_space = before.isspace(), after.isspace()
    before_punct, after_punct = _is_punctuation(before), _is_punctuation(after)
    left = not after_space and (not after_punct or before_space or before_punct)
    right = not before_space and (not before_punct or after_space or after_punct)
    char = text[i]
    if char == "_":
        return _Delimiter(
            char, run, left and (not right or before_punct), right and (not left or after_punct)
        )
    return _Delimiter(char, run, left, right)


def _is_punctuation(ch: str) -> bool:
    return unicodedata.category(ch)[0] in "PS"


def _match_emphasis(pieces: list[_Piece]) -> list[_Piece]:
    """Pair delimiters innermost-first with a stack; what is inside a matched pair is
    rendered at once, so the output is a tree and its tags always balance."""
    out: list[_Piece] = []
    openers: list[int] = []  # indices into ``out`` of delimiters that may open

    def nearest(char: str) -> int:
        for k in range(len(openers) - 1, -1, -1):
            opener = out[openers[k]]
            if isinstance(opener, _Delimiter) and opener.char == char:  # openers index delimiters only
                return k
        return -1

    for piece in pieces:
        if not isinstance(piece, _Delimiter):
            out.append(piece)
            continue
        k = nearest(piece.char) if piece.can_close else -1
        while piece.count > 0 and k >= 0:
            at = openers[k]
            opener = out[at]
            assert isinstance(opener, _Delimiter)
            use = 2 if opener.count >= 2 and piece.count >= 2 else 1
            if piece.char == "~" and use != 2:
                break
            inner = _join(out[at + 1 :])
            del out[at + 1 :]
            del openers[k + 1 :]  # delimiters inside the pair stay literal
            opener.count -= use
            piece.count -= use
            if opener.count == 0:
                out.pop()
                openers.pop()
            tag = _EMPHASIS_TAGS[(piece.char, use)]
            out.append(_Html(f"<{tag}>{inner}</{tag}>"))
            k = nearest(piece.char)
        if piece.count > 0:
            out.append(piece)
            if piece.can_open:
                openers.append(len(out) - 1)
    return out


def _join(pieces: list[_Piece]) -> str:
    parts = []
    for piece in pieces:
        if isinstance(piece, _Html):
            parts.append(piece.html)
        elif isinstance(piece, _Delimiter):
            parts.append(escape_text(piece.char * piece.count))
        else:
            parts.append(escape_text(piece))
    return "".join(parts)


def _render_link(text: str, url: str) -> str:
    label = render_inline(text, in_link=True) if text.strip() else escape_text(url)
    if url.lower().startswith(_LINK_SCHEMES) and len(url) <= _MAX_HREF:
        return f'<a href="{escape(url, quote=True)}">{label}</a>'
    if not url or label == escape_text(url):
        return label
    return f"{label} ({escape_text(url)})"
