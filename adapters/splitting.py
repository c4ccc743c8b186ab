"""Split a long reply into chunks that fit a platform's message limit.

A reply is cut at the most natural boundary that keeps the chunk under the limit, in this
order of preference: a paragraph break, a line break, a line break *inside* a code block
(the block is closed at the end of the chunk and reopened, same fence and language, at
the start of the next), a sentence end, a space, and only then anywhere.

Two rules keep the choice sensible:

- A boundary is only "good" if it lies in the second half of the window that would fit;
  otherwise a weaker boundary further on wins. Cutting at the one paragraph break found
  after 100 characters would send a tiny message and leave everything else for later.
- A code block that fits in a chunk of its own is never cut: if the window ends inside
  such a block, the chunk ends just before it, however short that leaves the chunk.

The planner (``pack``) works on a ``Layout``: the text, its candidate cut positions by
kind, the spans best kept whole, and what a cut costs at a position (text to append to
close what is open, text to prepend to reopen it). ``split_message`` builds the layout
of Markdown (fences); ``adapters.telegram_html`` builds one of Telegram HTML (open tags),
so both platforms share one splitting policy.

Lengths: ``length`` measures a string the way the platform counts. Python's ``len``
counts code points (Discord's 2,000 is in code points); Telegram counts UTF-16 code units,
so an emoji outside the Basic Multilingual Plane counts twice: pass ``length=utf16_len``.
``length`` must be additive (the length of a concatenation is the sum of the lengths),
which both are; the planner relies on it to measure prefixes in O(1).

Cost: one pass over the text to measure it, then per chunk a bisection into the sorted
cut positions and a look at the candidates near the window's end, so splitting is linear
in the reply's length. ``Layout``'s callbacks must keep it so: each answers in about
O(1) (or the length of the range it is asked about), never by re-reading the whole text.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from itertools import accumulate

Length = Callable[[str], int]

# Below this a chunk cannot carry a reopened fence plus some text; a caller asking for
# less has a bug, not a short platform.
MIN_LIMIT = 16


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units: how Telegram counts message length and offsets."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


class Boundary(IntEnum):
    """Kinds of cut position, best first."""

    PARAGRAPH = 0  # between paragraphs (after a blank line)
    LINE = 1  # at a line start outside any block
    BLOCK_LINE = 2  # at a line start inside a block that must be closed and reopened
    SENTENCE = 3  # after a sentence end
    WORD = 4  # after a run of spaces


@dataclass(frozen=True, slots=True)
class Layout:
    """What the planner needs to know about one text.

    ``boundaries`` holds sorted cut positions (a cut at ``p`` ends a chunk before
    ``text[p]``). ``blocks`` are sorted ``(start, end)`` spans that should stay whole when
    they can. ``closing(p)`` is appended to a chunk ending at ``p`` and ``reopening(p)``
    prepended to the chunk starting at ``p`` (both empty outside blocks). ``can_cut(p)``
    says whether a cut at an arbitrary ``p`` is allowed at all (e.g. not inside a tag).
    ``is_blank(start, end)`` decides that ``text[start:end]`` carries nothing worth
    sending (it is asked about the rest of the text before each chunk: it must not cost
    more than finding the first visible character).
    """

    text: str
    boundaries: Mapping[Boundary, Sequence[int]]
    blocks: Sequence[tuple[int, int]]
    closing: Callable[[int], str]
    reopening: Callable[[int], str]
    can_cut: Callable[[int], bool]
    is_blank: Callable[[int, int], bool]


def pack(layout: Layout, limit: int, *, length: Length = len) -> list[str]:
    """Cut ``layout.text`` into chunks of at most ``limit`` (as measured by ``length``)."""
    if limit < MIN_LIMIT:
        raise ValueError(f"limit must be at least {MIN_LIMIT}, got {limit}")
    return _Planner(layout, limit, length).run()


class _Planner:
    def __init__(self, layout: Layout, limit: int, length: Length) -> None:
        self.layout = layout
        self.text = layout.text
        self.limit = limit
        self.length = length
        # cum[i] = length(text[:i]); valid because ``length`` is additive. Measured once
        # per distinct character: a reply has a few hundred, and a call per character
        # would cost more than the rest of the split.
        widths = {ch: length(ch) for ch in set(self.text)}
        self.cum = list(accumulate(map(widths.__getitem__, self.text), initial=0))
        self.block_starts = [start for start, _ in layout.blocks]

    def run(self) -> list[str]:
        chunks: list[str] = []
        pos, n = 0, len(self.text)
        while pos < n and not self.layout.is_blank(pos, n):
            end = n if self._fits(pos, n) else self._choose_cut(pos)
            chunk = self._assemble(pos, end)
            if chunk is not None:
                chunks.append(chunk)
            pos = end
        return chunks

    # -- measuring -------------------------------------------------------------------

    def _fits(self, pos: int, end: int) -> bool:
        cost = self.length(self.layout.reopening(pos)) + self.length(self.layout.closing(end))
        return cost + self.cum[end] - self.cum[pos] <= self.limit

    def _reach(self, pos: int) -> int:
        """The furthest end whose raw text fits once the reopening prefix is paid for."""
        budget = self.limit - self.length(self.layout.reopening(pos))
        return bisect_right(self.cum, self.cum[pos] + budget) - 1

    def _assemble(self, pos: int, end: int) -> str | None:
        if self.layout.is_blank(pos, end):
            return None
        prefix = self.layout.reopening(pos)
        body = self.text[pos:end]
        if not prefix:
            body = body.lstrip("\n")
        return prefix + body.rstrip() + self.layout.closing(end)

    # -- choosing --------------------------------------------------------------------

    def _last(self, kind: Boundary, pos: int, low: int, high: int) -> int | None:
        """The last fitting candidate of ``kind`` in ``[low, high]``, beyond ``pos``."""
        candidates = self.layout.boundaries.get(kind, ())
        i = bisect_right(candidates, high) - 1
        while i >= 0 and candidates[i] >= low:
            cut = candidates[i]
            if cut <= pos:
                return None
            if self._fits(pos, cut):
                return cut
            i -= 1
        return None

    def _block_at(self, position: int) -> tuple[int, int] | None:
        i = bisect_left(self.block_starts, position) - 1
        if i >= 0:
            start, end = self.layout.blocks[i]
            if start < position < end:
                return start, end
        return None

    def _choose_cut(self, pos: int) -> int:
        reach = self._reach(pos)
        half = pos + max(1, (reach - pos) // 2)
        outside = (Boundary.PARAGRAPH, Boundary.LINE)

        for kind in outside:
            cut = self._last(kind, pos, half, reach)
            if cut is not None:
                return cut
        block = self._block_at(reach)
        if block is not None and block[0] > pos and self._fits(block[0], block[1]):
            # The window ends inside a block that would fit whole in the next chunk.
            cuts = [c for k in outside if (c := self._last(k, pos, pos + 1, block[0])) is not None]
            if cuts:
                return max(cuts)
        for kind, low in (
            (Boundary.BLOCK_LINE, half),
            (Boundary.SENTENCE, half),
            (Boundary.WORD, half),
        ):
            cut = self._last(kind, pos, low, reach)
            if cut is not None:
                return cut
        cuts = [c for k in outside if (c := self._last(k, pos, pos + 1, reach)) is not None]
        if cuts:
            return max(cuts)
        for kind in (Boundary.BLOCK_LINE, Boundary.SENTENCE, Boundary.WORD):
            cut = self._last(kind, pos, pos + 1, reach)
            if cut is not None:
                return cut
        return self._hard_cut(pos, reach)

    def _hard_cut(self, pos: int, reach: int) -> int:
        for cut in range(min(reach, len(self.text)), pos, -1):
            if self.layout.can_cut(cut) and self._fits(pos, cut):
                return cut
        raise ValueError(f"no way to cut the text after position {pos} within {self.limit}")


# -- Markdown ------------------------------------------------------------------------

_FENCE_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<marker>`{3,}|~{3,})(?P<info>.*)$")
_SENTENCE_END = re.compile(r"[.!?…。！？][\"')\]»”’]*[ \t]+")
_SPACES = re.compile(r"[ \t]+")
_INK = re.compile(r"\S")  # a character that shows: not blank (what ``str.strip`` keeps)


@dataclass(frozen=True, slots=True)
class Fence:
    """A fenced code block: ``text[start:end]`` from the opening line to the closing one.

    ``body_start`` is where the first code line starts and ``close_start`` where the
    closing line starts (``len(text)`` when the block is never closed).
    """

    start: int
    body_start: int
    close_start: int
    end: int
    marker: str  # the opening run of backticks or tildes, e.g. "```"
    info: str  # everything after the marker on the opening line, stripped
    indent: str
    closed: bool

    @property
    def language(self) -> str:
        return self.info.split()[0] if self.info else ""

    @property
    def reopen_line(self) -> str:
        # "~~~" + "~x" would read as a longer marker; a space keeps them apart.
        separator = " " if self.language.startswith(self.marker[0]) else ""
        return self.marker + separator + self.language


def find_fences(text: str) -> list[Fence]:
    """Fenced code blocks of ``text`` (``\\n`` line ends), in order.

    Like CommonMark, except that an opening fence may be indented by any amount: models
    indent fences inside list items, and indented code blocks are rare in their output.
    A backtick fence's info string cannot contain a backtick (that is inline code).
    """
    fences: list[Fence] = []
    offset, lines = 0, text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        match = _FENCE_OPEN.match(line)
        if match is None or (match["marker"][0] == "`" and "`" in match["info"]):
            offset += len(line) + 1
            i += 1
            continue
        marker, start = match["marker"], offset
        body_start = offset = min(offset + len(line) + 1, len(text))
        closer = re.compile(rf"^[ \t]*{re.escape(marker[0])}{{{len(marker)},}}[ \t]*$")
        i += 1
        while i < len(lines) and closer.match(lines[i]) is None:
            offset += len(lines[i]) + 1
            i += 1
        info, indent = match["info"].strip(), match["indent"]
        if i < len(lines):
            close_start, end = offset, offset + len(lines[i])
            fences.append(Fence(start, body_start, close_start, end, marker, info, indent, True))
            offset = end + 1
            i += 1
        else:
            fences.append(Fence(start, body_start, len(text), len(text), marker, info, indent, False))
    return fences


def split_message(text: str, limit: int, *, length: Length = len) -> list[str]:
    """Split a Markdown reply into chunks of at most ``limit`` (measured by ``length``).

    Never returns an empty chunk; returns ``[]`` for blank text. Every chunk has balanced
    code fences: a block cut in two is closed and reopened with the same fence and
    language, and a block the model never closed is closed at the end of the reply.
    Line ends are normalised to ``\\n``; whitespace at the cut points is dropped.
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return pack(_markdown_layout(text, limit, length), limit, length=length)


def _markdown_layout(text: str, limit: int, length: Length) -> Layout:
    # A fence whose reopen + close overhead, or whose own opening or closing line, would
    # eat most of a chunk (a huge marker or info string) cannot be carried across
    # chunks; it is split like plain text.
    def carriable(f: Fence) -> bool:
        overhead = length(f.reopen_line) + length(f.marker) + 2
        edges = max(length(text[f.start : f.body_start]), length(text[f.close_start : f.end]))
        return 3 * overhead <= limit and 2 * (edges + overhead) <= limit

    fences = [f for f in find_fences(text) if carriable(f)]
    fence_starts = [f.start for f in fences]

    def fence_of(position: int) -> Fence | None:
        """The fence whose span ``[start, end]`` holds ``position``."""
        i = bisect_right(fence_starts, position) - 1
        if i >= 0 and position <= fences[i].end:
            return fences[i]
        return None

    boundaries: dict[Boundary, list[int]] = {kind: [] for kind in Boundary}
    previous_blank = False
    start = 0
    while start <= len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        line = text[start:end]
        fence = fence_of(start)
        if fence is not None and start in (fence.start, fence.close_start) and start < len(text):
            # An opening or closing line: cut before an opener (the block moves whole
            # to the next chunk), never before a closer (it would open a block there).
            if start == fence.start and start > 0:
                boundaries[Boundary.PARAGRAPH if previous_blank else Boundary.LINE].append(start)
            previous_blank = False
        elif fence is not None and fence.body_start <= start < fence.close_start:
            # Not at the first code line: that would leave an empty block behind.
            if start > fence.body_start:
                boundaries[Boundary.BLOCK_LINE].append(start)
            _add_inline_cuts(boundaries, start, line, sentences=False)
            previous_blank = False
        else:
            if start > 0:
                kind = Boundary.PARAGRAPH if previous_blank and line.strip() else Boundary.LINE
                boundaries[kind].append(start)
            _add_inline_cuts(boundaries, start, line, sentences=True)
            previous_blank = not line.strip()
        start = end + 1

    def inside(position: int) -> Fence | None:
        """The fence a cut at ``position`` would leave open."""
        fence = fence_of(position)
        if fence is not None and (
            fence.body_start < position <= fence.close_start
            or (not fence.closed and position == len(text))  # never closed by the model
        ):
            return fence
        return None

    def closing(position: int) -> str:
        fence = inside(position)
        return "" if fence is None else "\n" + fence.marker

    def reopening(position: int) -> str:
        fence = inside(position)
        return "" if fence is None else fence.reopen_line + "\n"

    def can_cut(position: int) -> bool:
        fence = fence_of(position)
        if fence is not None and (
            fence.start < position <= fence.body_start
            or (fence.closed and fence.close_start < position <= fence.end)
        ):
            return False  # inside an opening or closing line
        line_start = text.rfind("\n", 0, position) + 1
        line_end = text.find("\n", position)
        rest = text[position : len(text) if line_end < 0 else line_end]
        return line_start == position or not _looks_like_fence(rest)

    return Layout(
        text=text,
        boundaries=boundaries,
        blocks=[(f.start, f.end) for f in fences],
        closing=closing,
        reopening=reopening,
        can_cut=can_cut,
        is_blank=lambda start, end: _INK.search(text, start, end) is None,
    )


def _add_inline_cuts(
    boundaries: dict[Boundary, list[int]], start: int, line: str, *, sentences: bool
) -> None:
    sentence_cuts = [m.end() for m in _SENTENCE_END.finditer(line)] if sentences else []
    word_cuts = [m.end() for m in _SPACES.finditer(line)]
    for kind, cuts in ((Boundary.SENTENCE, sentence_cuts), (Boundary.WORD, word_cuts)):
        for cut in cuts:
            # A cut that would start the next chunk with ``` would open a code block.
            if 0 < cut < len(line) and not _looks_like_fence(line[cut:]):
                boundaries[kind].append(start + cut)


def _looks_like_fence(rest_of_line: str) -> bool:
    """Would this text, moved to the start of a chunk, read as a code fence?"""
    stripped = rest_of_line.lstrip(" \t")
    return stripped.startswith("```") or stripped.startswith("~~~")
