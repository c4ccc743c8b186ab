"""Telegram's HTML dialect (``parse_mode=HTML``): parse and validate it, cut it into
messages that are each valid on their own, and strip it to plain text.

The parser follows what the Bot API server does (TDLib's ``parse_html``): tags are
``b strong i em u ins s strike del span tg-spoiler a code pre blockquote tg-emoji``;
``&lt; &gt; &amp; &quot;`` and numeric references are decoded; every start tag needs its
end tag (``</>`` closes the innermost one); errors carry TDLib's wording and the UTF-8
byte offset, which is what a bot sees after "Bad Request: can't parse entities: ".

``strict=True`` (the default) adds the rules mnemo's renderer promises on top, so tests
and the fake Bot API catch an escaping bug before a real server would silently show
garbage: every ``&`` starts a complete reference, no bare ``>`` in text, no unknown
attributes, links only to http/https/tg/mailto, and Telegram's entity nesting rules
(nothing inside ``code``; only ``code`` inside ``pre``; no blockquote in a blockquote,
no link in a link, no block inside an inline tag). The real server accepts some of these
and quietly drops or repairs entities instead.

Splitting measures the HTML source in UTF-16 units, which bounds what Telegram counts
(text after entity parsing) from above: no chunk is ever rejected as too long. Each
chunk closes the tags open at its cut and the next reopens them, attributes included.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass
from html import escape

from mnemo.adapters.splitting import Boundary, Layout, Length, pack, utf16_len

TELEGRAM_MESSAGE_LIMIT = 4096  # UTF-16 code units of text after entity parsing

_ENTITY_TYPES = {
    "b": "bold",
    "strong": "bold",
    "i": "italic",
    "em": "italic",
    "u": "underline",
    "ins": "underline",
    "s": "strikethrough",
    "strike": "strikethrough",
    "del": "strikethrough",
    "span": "spoiler",
    "tg-spoiler": "spoiler",
    "a": "text_link",
    "code": "code",
    "pre": "pre",
    "blockquote": "blockquote",
    "tg-emoji": "custom_emoji",
}
_ATTRIBUTES = {
    "a": {"href"},
    "code": {"class"},
    "span": {"class"},
    "tg-emoji": {"emoji-id"},
    "blockquote": {"expandable"},
}
_BLOCKS = frozenset({"pre", "blockquote"})
_CODE = frozenset({"pre", "code"})
_INLINE = frozenset(_ENTITY_TYPES) - _BLOCKS
_LINK_SCHEMES = ("http://", "https://", "tg://", "mailto:")
_NAMED = {"lt": "<", "gt": ">", "amp": "&", "quot": '"'}
_MARKUP = re.compile(r"[<&]")  # where a run of plain text ends
_REFERENCE = re.compile(r"&(?:#(?P<dec>[0-9]+)|#[xX](?P<hex>[0-9a-fA-F]+)|(?P<name>[a-zA-Z]+))(?P<semi>;?)")


class TelegramHtmlError(ValueError):
    """The text is not valid Telegram HTML; ``description`` reads like the server's."""

    def __init__(self, description: str) -> None:
        super().__init__(description)
        self.description = description


@dataclass(frozen=True, slots=True)
class Entity:
    """A Bot API MessageEntity; offsets and lengths in UTF-16 code units."""

    type: str
    offset: int
    length: int
    url: str | None = None
    language: str | None = None
    custom_emoji_id: str | None = None

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = {"type": self.type, "offset": self.offset, "length": self.length}
        for key in ("url", "language", "custom_emoji_id"):
            if (value := getattr(self, key)) is not None:
                data[key] = value
        return data


@dataclass(frozen=True, slots=True)
class ParsedHtml:
    text: str
    entities: tuple[Entity, ...]


@dataclass(frozen=True, slots=True, eq=False)
class _Open:
    """A start tag and, through ``parent``, every tag open around it: the stack of open
    tags as a linked list, so recording the stack after each tag costs O(1), however
    deep the nesting (a tuple per tag would make parsing quadratic in the depth)."""

    name: str
    raw: str  # the start tag as written, attributes included, to reopen it verbatim
    parent: _Open | None
    blocks: int  # how many of this chain are pre/blockquote
    in_code: bool  # this chain holds a pre or code

    @classmethod
    def push(cls, name: str, raw: str, parent: _Open | None) -> _Open:
        block = name in _BLOCKS
        if parent is None:
            return cls(name, raw, None, int(block), name in _CODE)
        return cls(name, raw, parent, parent.blocks + block, parent.in_code or name in _CODE)

    def chain(self) -> list[_Open]:
        """The open tags, innermost first."""
        out: list[_Open] = []
        node: _Open | None = self
        while node is not None:
            out.append(node)
            node = node.parent
        return out


@dataclass(frozen=True, slots=True)
class _Tag:
    start: int
    end: int  # source span of the tag itself
    name: str
    closing: bool
    stack_after: _Open | None  # the innermost tag still open once this tag is read


@dataclass(frozen=True, slots=True)
class _Reference:
    start: int
    end: int  # source span of a &...; reference
    char: str  # what it stands for


@dataclass(frozen=True, slots=True)
class _Scan:
    parsed: ParsedHtml
    tags: tuple[_Tag, ...]
    references: tuple[_Reference, ...]


def parse_telegram_html(html: str, *, strict: bool = True) -> ParsedHtml:
    """Text and entities of ``html``, or ``TelegramHtmlError`` where Telegram would fail."""
    return _scan(html, strict).parsed


def is_valid_telegram_html(html: str, *, strict: bool = True) -> bool:
    try:
        _scan(html, strict)
    except TelegramHtmlError:
        return False
    return True


def html_to_plain(html: str) -> str:
    """What the user would read, without formatting: the plain-text fallback. Lenient:
    text that is not valid HTML still loses its tags and keeps its words."""
    try:
        return _scan(html, strict=False).parsed.text
    except TelegramHtmlError:
        stripped = re.sub(r"<[^<>]*>", "", html)
        return _REFERENCE.sub(lambda m: _decode(m, strict=False) or m[0], stripped)


def _decode(match: re.Match[str], *, strict: bool) -> str | None:
    """The character a reference stands for, or None if Telegram keeps it as text."""
    if strict and not match["semi"]:
        return None
    if match["name"] is not None:
        return _NAMED.get(match["name"])
    digits = match["dec"] or match["hex"]
    if len(match[0]) - len(match["semi"]) >= 10:
        return None
    code = int(digits, 10 if match["dec"] else 16)
    if code == 0 or code >= 0x10FFFF:
        return None
    if 0xD800 <= code <= 0xDFFF:
        raise TelegramHtmlError(
            "Text contains invalid Unicode characters after decoding HTML entities, "
            "check for unmatched surrogate code units"
        )
    return chr(code)


class _Parser:
    def __init__(self, html: str, strict: bool) -> None:
        self.html, self.strict, self.n = html, strict, len(html)
        self.text: list[str] = []
        self.utf16 = 0
        self.stack: list[tuple[_Open, int, dict[str, str | None]]] = []  # tag, text offset, attrs
        self.open_names: Counter[str] = Counter()  # of the stack, for the nesting rules in O(1)
        self.inline_open = 0
        self.entities: list[Entity] = []
        self.tags: list[_Tag] = []
        self.references: list[_Reference] = []

    def error(self, message: str, at: int | None = None) -> TelegramHtmlError:
        if at is not None:
            message += f" at byte offset {len(self.html[:at].encode('utf-8', 'surrogatepass'))}"
        return TelegramHtmlError(message)

    def emit(self, chunk: str) -> None:
        self.text.append(chunk)
        self.utf16 += utf16_len(chunk)

    def run(self) -> _Scan:
        html, i = self.html, 0
        while i < self.n:
            c = html[i]
            if c == "&":
                match = _REFERENCE.match(html, i)
                char = _decode(match, strict=self.strict) if match else None
                if char is None:
                    if self.strict:
                        raise self.error('Unescaped "&"', i)
                    self.emit("&")
                    i += 1
                else:
                    assert match is not None
                    self.references.append(_Reference(i, match.end(), char))
                    self.emit(char)
                    i = match.end()
            elif c == "<":
                i = self.end_tag(i) if html.startswith("</", i) else self.start_tag(i)
            else:
                markup = _MARKUP.search(html, i)
                j = markup.start() if markup is not None else self.n
                run = html[i:j]
                if self.strict and ">" in run:
                    raise self.error('Unescaped ">"', i + run.index(">"))
                self.emit(run)
                i = j
        if self.stack:
            raise self.error(f'Can\'t find end tag corresponding to start tag "{self.stack[-1][0].name}"')
        entities = sorted(self.entities, key=lambda e: (e.offset, -e.length))
        return _Scan(
            ParsedHtml("".join(self.text), tuple(entities)), tuple(self.tags), tuple(self.references)
        )

    def skip_spaces(self, i: int) -> int:
        while i < self.n and self.html[i].isspace():
            i += 1
        return i

    def start_tag(self, begin: int) -> int:
        html, i = self.html, begin + 1
        while i < self.n and not html[i].isspace() and html[i] != ">":
            i += 1
        if i >= self.n:
            raise self.error("Unclosed start tag", begin)
        name = html[begin + 1 : i].lower()
        if name not in _ENTITY_TYPES:
            raise self.error(f'Unsupported start tag "{name}"', begin)
        attrs: dict[str, str | None] = {}
        while True:
            i = self.skip_spaces(i)
            if i >= self.n:
                raise self.error(f'Unclosed start tag "{name}"', begin)
            if html[i] == ">":
                break
            attr_begin = i
            while i < self.n and not html[i].isspace() and html[i] not in "=>":
                i += 1
            attr = html[attr_begin:i].lower()
            if not attr:
                raise self.error(f'Empty attribute name in the tag "{name}"', begin)
            i = self.skip_spaces(i)
            if i < self.n and html[i] == "=":
                i = self.skip_spaces(i + 1)
                if i >= self.n:
                    raise self.error(f'Unclosed start tag "{name}"', begin)
                if html[i] in "'\"":
                    close = html.find(html[i], i + 1)
                    if close < 0:
                        raise self.error("Unclosed start tag", begin)
                    value = _REFERENCE.sub(lambda m: _decode(m, strict=False) or m[0], html[i + 1 : close])
                    i = close + 1
                else:
                    token_begin = i
                    while i < self.n and (html[i].isalnum() or html[i] in ".-"):
                        i += 1
                    if i >= self.n or not (html[i].isspace() or html[i] == ">"):
                        raise self.error("Unexpected end of name token", token_begin)
                    value = html[token_begin:i].lower()
                attrs[attr] = value
            else:
                attrs[attr] = None
        end = i + 1
        self.check_start(name, attrs, begin)
        node = _Open.push(name, html[begin:end], self.stack[-1][0] if self.stack else None)
        self.stack.append((node, self.utf16, attrs))
        self.open_names[name] += 1
        self.inline_open += name in _INLINE
        self.tags.append(_Tag(begin, end, name, False, node))
        return end

    def check_start(self, name: str, attrs: dict[str, str | None], begin: int) -> None:
        if name == "span" and attrs.get("class") != "tg-spoiler":
            raise self.error('Tag "span" must have class "tg-spoiler"', begin)
        if name == "tg-emoji" and not (attrs.get("emoji-id") or "").isdigit():
            raise self.error("Invalid custom emoji identifier specified", begin)
        if not self.strict:
            return
        unknown = sorted(set(attrs) - _ATTRIBUTES.get(name, set()))
        if unknown:
            raise self.error(f'Unsupported attribute "{unknown[0]}" in the tag "{name}"', begin)
        parent = self.stack[-1][0].name if self.stack else None
        if parent == "code" or (parent == "pre" and name != "code"):
            raise self.error(f'Tag "{name}" can\'t be nested in the tag "{parent}"', begin)
        if name == "code" and attrs.get("class") is not None and parent != "pre":
            raise self.error('Tag "code" can have a language class only inside "pre"', begin)
        if self.open_names[name] and name in ("a", "blockquote"):
            raise self.error(f'Tag "{name}" can\'t be nested in itself', begin)
        if name in _BLOCKS and self.inline_open:
            raise self.error(f'Block tag "{name}" can\'t be nested in an inline tag', begin)
        if name == "a" and not (attrs.get("href") or "").lower().startswith(_LINK_SCHEMES):
            raise self.error('Tag "a" needs an http, https, tg or mailto href', begin)

    def end_tag(self, begin: int) -> int:
        html = self.html
        if not self.stack:
            raise self.error("Unexpected end tag", begin)
        i = begin + 2
        while i < self.n and not html[i].isspace() and html[i] != ">":
            i += 1
        found = html[begin + 2 : i].lower()
        i = self.skip_spaces(i)
        if i >= self.n or html[i] != ">":
            raise self.error("Unclosed end tag", begin)
        tag, offset, attrs = self.stack[-1]
        if found and found != tag.name:
            raise self.error(
                f"Unmatched end tag at byte offset {len(html[:begin].encode('utf-8', 'surrogatepass'))}, "
                f'expected "</{tag.name}>", found "</{found}>"'
            )
        self.stack.pop()
        self.open_names[tag.name] -= 1
        self.inline_open -= tag.name in _INLINE
        self.add_entity(tag.name, attrs, offset)
        self.tags.append(_Tag(begin, i + 1, tag.name, True, self.stack[-1][0] if self.stack else None))
        return i + 1

    def add_entity(self, name: str, attrs: dict[str, str | None], offset: int) -> None:
        length = self.utf16 - offset
        if length == 0:
            return
        kind = _ENTITY_TYPES[name]
        if name == "a":
            self.entities.append(Entity(kind, offset, length, url=attrs.get("href") or None))
        elif name == "code" and self.stack and self.stack[-1][0].name == "pre":
            language = (attrs.get("class") or "").removeprefix("language-")
            if language:
                # <pre><code class="language-x"> is one entity: pre with a language.
                self.stack[-1][2]["language"] = language
        elif name == "pre":
            self.entities.append(Entity(kind, offset, length, language=attrs.get("language")))
        elif name == "blockquote" and "expandable" in attrs:
            self.entities.append(Entity("expandable_blockquote", offset, length))
        elif name == "tg-emoji":
            self.entities.append(Entity(kind, offset, length, custom_emoji_id=attrs.get("emoji-id")))
        else:
            self.entities.append(Entity(kind, offset, length))


def _scan(html: str, strict: bool) -> _Scan:
    return _Parser(html, strict).run()


# -- splitting ------------------------------------------------------------------------

_SENTENCE_END = re.compile(r"[.!?…][\"')\]»”’]*[ \t]+")
_SPACES = re.compile(r"[ \t]+")
_NEWLINES = re.compile(r"\n+")
_INK = re.compile(r"\S")


def split_html(html: str, limit: int = TELEGRAM_MESSAGE_LIMIT, *, length: Length = utf16_len) -> list[str]:
    """Cut valid Telegram HTML into chunks of at most ``limit`` that are each valid.

    Prefers paragraph breaks, then line breaks, then line breaks inside a ``pre`` or
    ``blockquote`` (closed and reopened), then sentence ends and spaces; a block that
    fits in a message of its own is not cut. Raises ``TelegramHtmlError`` for invalid
    input.

    A chunk must hold the tags it reopens, the longest tag and the closing tags. When
    the tags open at some point cost too much for that (absurdly deep nesting, a huge
    link next to a small limit), the formatting is dropped and the plain text is split.

    Linear in the length of ``html``: it is parsed once, and every question the planner
    asks (which tags are open at a cut, is a position inside markup, is a range blank)
    is a bisection into what that parse recorded.
    """
    scan = _scan(html, strict=False)
    if 3 * _heaviest(scan.tags, length) + 16 > limit:
        scan = _scan(html := escape_text(scan.parsed.text), strict=False)
    return pack(_html_layout(html, scan), limit, length=length)


def _heaviest(tags: tuple[_Tag, ...], length: Length) -> int:
    """The most the tags open at any one point cost to reopen, in one pass: each start
    tag's chain costs its parent's plus its own."""
    cost: dict[int, int] = {}
    heaviest = 0
    for tag in tags:
        node = tag.stack_after
        if tag.closing or node is None:
            continue
        below = cost[id(node.parent)] if node.parent is not None else 0
        cost[id(node)] = chain = below + length(node.raw)
        heaviest = max(heaviest, chain)
    return heaviest


def _html_layout(html: str, scan: _Scan) -> Layout:
    tags, references = scan.tags, scan.references
    tag_starts = [t.start for t in tags]
    reference_starts = [r.start for r in references]

    def stack_at(position: int) -> _Open | None:
        """The innermost tag open at a cut just before ``html[position]``."""
        i = bisect_right(tag_starts, position - 1) - 1  # the last tag starting before it
        return tags[i].stack_after if i >= 0 else None

    def tag_at(position: int) -> _Tag | None:
        """The tag whose source holds ``html[position]``."""
        i = bisect_right(tag_starts, position) - 1
        return tags[i] if i >= 0 and position < tags[i].end else None

    def reference_at(position: int) -> _Reference | None:
        i = bisect_right(reference_starts, position) - 1
        return references[i] if i >= 0 and position < references[i].end else None

    def in_markup(position: int) -> bool:
        """Inside a tag or a character reference, where nothing may be cut."""
        tag, ref = tag_at(position), reference_at(position)
        return (tag is not None and tag.start < position) or (ref is not None and ref.start < position)

    def is_blank(start: int, end: int) -> bool:
        """No visible character in ``html[start:end]``: skips tags, and references that
        stand for spaces, until the first character that shows."""
        position = start
        while (match := _INK.search(html, position, end)) is not None:
            position = match.start()
            tag = tag_at(position)
            if tag is not None:
                position = tag.end
                continue
            ref = reference_at(position)
            if ref is None or not ref.char.isspace():
                return False
            position = ref.end
        return True

    closings: dict[int, str] = {}
    reopenings: dict[int, str] = {}

    def closing(position: int) -> str:
        node = stack_at(position)
        if node is None:
            return ""
        if id(node) not in closings:
            closings[id(node)] = "".join(f"</{o.name}>" for o in node.chain())
        return closings[id(node)]

    def reopening(position: int) -> str:
        node = stack_at(position)
        if node is None:
            return ""
        if id(node) not in reopenings:
            reopenings[id(node)] = "".join(o.raw for o in reversed(node.chain()))
        return reopenings[id(node)]

    boundaries: dict[Boundary, list[int]] = {kind: [] for kind in Boundary}
    for match in _NEWLINES.finditer(html):
        cut = match.end()
        if in_markup(match.start()):
            continue
        node = stack_at(cut)
        if node is not None and node.blocks:
            boundaries[Boundary.BLOCK_LINE].append(cut)
        else:
            boundaries[Boundary.PARAGRAPH if len(match[0]) > 1 else Boundary.LINE].append(cut)
    for kind, pattern in ((Boundary.SENTENCE, _SENTENCE_END), (Boundary.WORD, _SPACES)):
        for match in pattern.finditer(html):
            cut = match.end()
            if in_markup(match.start()):
                continue
            if kind is Boundary.SENTENCE and (node := stack_at(cut)) is not None and node.in_code:
                continue
            boundaries[kind].append(cut)

    # Outermost pre/blockquote spans: kept whole when they fit in a message.
    blocks: list[tuple[int, int]] = []
    block_start = 0
    for tag in tags:
        if tag.name not in _BLOCKS:
            continue
        depth = tag.stack_after.blocks if tag.stack_after is not None else 0
        if not tag.closing and depth == 1:
            block_start = tag.start
        elif tag.closing and depth == 0:
            blocks.append((block_start, tag.end))

    return Layout(
        text=html,
        boundaries={kind: sorted(set(cuts)) for kind, cuts in boundaries.items()},
        blocks=blocks,
        closing=closing,
        reopening=reopening,
        can_cut=lambda p: not in_markup(p),
        is_blank=is_blank,
    )


def escape_text(text: str) -> str:
    """Escape text for Telegram HTML (``& < >``; quotes need no escaping outside tags)."""
    return escape(text, quote=False)
