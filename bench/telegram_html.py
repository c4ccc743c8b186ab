"""Splitting a long reply into Telegram messages: ``split_html`` before and after it was
made linear, in the same run on the same input.

    python bench/telegram_html.py [--sizes 5000,12000,24000,50000] [--repeat 7]

Each input is a model-like Markdown reply of about N characters (paragraphs, lists,
code blocks, bold, italic, inline code, links, an emoji now and then) rendered to
Telegram HTML by ``markdown_to_html``, then split at 4,096 UTF-16 units.

* **before** — the planner as it was (``_old_pack`` below): before every chunk it asked
  whether the rest of the reply was blank by stripping the whole rest to plain text,
  i.e. one full HTML parse per chunk (``html_to_plain``), so the time grew with the
  square of the length; the open-tag stacks were tuples copied at every tag.
* **after** — ``adapters.telegram_html.split_html``: one parse, every later question a
  bisection into what it recorded.

"before" parses with the old parser's text loop (``_OldParser``: a character at a time,
where today's jumps to the next ``<`` or ``&``). Prints the best of ``--repeat`` runs in ms
per size, the ratio, and whether both gave the very same chunks.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mnemo.adapters.splitting import Boundary, Length, utf16_len
from mnemo.adapters.telegram_format import markdown_to_html
from mnemo.adapters.telegram_html import (
    _BLOCKS,
    _REFERENCE,
    TELEGRAM_MESSAGE_LIMIT,
    ParsedHtml,
    _decode,
    _Open,
    _Parser,
    _Reference,
    _Scan,
    escape_text,
    split_html,
)

WORDS = (
    "the quick brown fox jumps over **the lazy** dog _and_ `runs` [away](https://example.org/a?b=1&c=2) "
    "to café 😀"
).split()


def reply(size: int, seed: int) -> str:
    rng = random.Random(seed)
    parts: list[str] = []
    total = 0
    while total < size:
        roll = rng.random()
        if roll < 0.12:
            lines = "\n".join(f"value_{i} = compute({i}) + 1  # step {i}" for i in range(rng.randint(3, 30)))
            part = f"```python\n{lines}\n```\n\n"
        elif roll < 0.3:
            part = (
                "".join(f"- {' '.join(rng.choices(WORDS, k=10))}\n" for _ in range(rng.randint(2, 6))) + "\n"
            )
        else:
            part = " ".join(rng.choices(WORDS, k=rng.randint(20, 90))) + ".\n\n"
        parts.append(part)
        total += len(part)
    return "".join(parts)[:size]


# -- before: the planner and split_html as they were ----------------------------------


class _OldParser(_Parser):
    def run(self) -> _Scan:
        html, i = self.html, 0
        while i < self.n:
            c = html[i]
            if c == "&":
                match = _REFERENCE.match(html, i)
                char = _decode(match, strict=self.strict) if match else None
                if char is None:
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
                j = i
                while j < self.n and html[j] not in "<&":
                    j += 1
                self.emit(html[i:j])
                i = j
        entities = sorted(self.entities, key=lambda e: (e.offset, -e.length))
        return _Scan(
            ParsedHtml("".join(self.text), tuple(entities)), tuple(self.tags), tuple(self.references)
        )


def _old_scan(html: str) -> _Scan:
    return _OldParser(html, strict=False).run()


def _old_plain(html: str) -> str:
    try:
        return _old_scan(html).parsed.text
    except ValueError:
        stripped = re.sub(r"<[^<>]*>", "", html)
        return _REFERENCE.sub(lambda m: _decode(m, strict=False) or m[0], stripped)


@dataclass(frozen=True, slots=True)
class _OldLayout:
    text: str
    boundaries: Mapping[Boundary, Sequence[int]]
    blocks: Sequence[tuple[int, int]]
    closing: Callable[[int], str]
    reopening: Callable[[int], str]
    can_cut: Callable[[int], bool]
    is_blank: Callable[[str], bool]


class _OldPlanner:
    def __init__(self, layout: _OldLayout, limit: int, length: Length) -> None:
        self.layout, self.text, self.limit, self.length = layout, layout.text, limit, length
        self.cum = list(accumulate((length(ch) for ch in self.text), initial=0))
        self.block_starts = [start for start, _ in layout.blocks]

    def run(self) -> list[str]:
        chunks: list[str] = []
        pos, n = 0, len(self.text)
        while pos < n and not self.layout.is_blank(self.text[pos:]):  # a full parse per chunk
            end = n if self._fits(pos, n) else self._choose_cut(pos)
            chunk = self._assemble(pos, end)
            if chunk is not None:
                chunks.append(chunk)
            pos = end
        return chunks

    def _fits(self, pos: int, end: int) -> bool:
        cost = self.length(self.layout.reopening(pos)) + self.length(self.layout.closing(end))
        return cost + self.cum[end] - self.cum[pos] <= self.limit

    def _reach(self, pos: int) -> int:
        budget = self.limit - self.length(self.layout.reopening(pos))
        return bisect_right(self.cum, self.cum[pos] + budget) - 1

    def _assemble(self, pos: int, end: int) -> str | None:
        prefix = self.layout.reopening(pos)
        body = self.text[pos:end]
        if not prefix:
            body = body.lstrip("\n")
        body = body.rstrip()
        if self.layout.is_blank(body):
            return None
        return prefix + body + self.layout.closing(end)

    def _last(self, kind: Boundary, pos: int, low: int, high: int) -> int | None:
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
            cuts = [c for k in outside if (c := self._last(k, pos, pos + 1, block[0])) is not None]
            if cuts:
                return max(cuts)
        for kind in (Boundary.BLOCK_LINE, Boundary.SENTENCE, Boundary.WORD):
            cut = self._last(kind, pos, half, reach)
            if cut is not None:
                return cut
        cuts = [c for k in outside if (c := self._last(k, pos, pos + 1, reach)) is not None]
        if cuts:
            return max(cuts)
        for kind in (Boundary.BLOCK_LINE, Boundary.SENTENCE, Boundary.WORD):
            cut = self._last(kind, pos, pos + 1, reach)
            if cut is not None:
                return cut
        for cut in range(min(reach, len(self.text)), pos, -1):
            if self.layout.can_cut(cut) and self._fits(pos, cut):
                return cut
        raise ValueError(f"no way to cut the text after position {pos} within {self.limit}")


_SENTENCE_END = re.compile(r"[.!?…][\"')\]»”’]*[ \t]+")
_SPACES = re.compile(r"[ \t]+")
_NEWLINES = re.compile(r"\n+")


def _old_stacks(node: _Open | None) -> tuple[_Open, ...]:
    """The open tags outermost first, copied as the old parser did at every tag."""
    return tuple(reversed(node.chain())) if node is not None else ()


def old_split_html(
    html: str, limit: int = TELEGRAM_MESSAGE_LIMIT, *, length: Length = utf16_len
) -> list[str]:
    scan = _old_scan(html)
    stacks = [_old_stacks(t.stack_after) for t in scan.tags]
    tags = scan.tags
    heaviest = max((length("".join(o.raw for o in s)) for s in stacks), default=0)
    if 3 * heaviest + 16 > limit:
        scan = _old_scan(html := escape_text(scan.parsed.text))
        tags, stacks = (), []
    tag_starts = [t.start for t in tags]
    references = [(r.start, r.end) for r in scan.references]
    reference_starts = [start for start, _ in references]

    def stack_at(position: int) -> tuple[_Open, ...]:
        i = bisect_right(tag_starts, position - 1) - 1
        return stacks[i] if i >= 0 else ()

    def in_markup(position: int) -> bool:
        i = bisect_right(tag_starts, position) - 1
        if i >= 0 and tags[i].start < position < tags[i].end:
            return True
        j = bisect_right(reference_starts, position) - 1
        return j >= 0 and references[j][0] < position < references[j][1]

    def inside(stack: tuple[_Open, ...], names: frozenset[str]) -> bool:
        return any(o.name in names for o in stack)

    boundaries: dict[Boundary, list[int]] = {kind: [] for kind in Boundary}
    for match in _NEWLINES.finditer(html):
        cut = match.end()
        if in_markup(match.start()):
            continue
        if inside(stack_at(cut), _BLOCKS):
            boundaries[Boundary.BLOCK_LINE].append(cut)
        else:
            boundaries[Boundary.PARAGRAPH if len(match[0]) > 1 else Boundary.LINE].append(cut)
    code = frozenset({"pre", "code"})
    for kind, pattern in ((Boundary.SENTENCE, _SENTENCE_END), (Boundary.WORD, _SPACES)):
        for match in pattern.finditer(html):
            cut = match.end()
            if in_markup(match.start()) or (kind is Boundary.SENTENCE and inside(stack_at(cut), code)):
                continue
            boundaries[kind].append(cut)
    blocks: list[tuple[int, int]] = []
    block_start = 0
    for tag, stack in zip(tags, stacks, strict=True):
        if tag.name not in _BLOCKS:
            continue
        depth = sum(o.name in _BLOCKS for o in stack)
        if not tag.closing and depth == 1:
            block_start = tag.start
        elif tag.closing and depth == 0:
            blocks.append((block_start, tag.end))
    layout = _OldLayout(
        text=html,
        boundaries={kind: sorted(set(cuts)) for kind, cuts in boundaries.items()},
        blocks=blocks,
        closing=lambda p: "".join(f"</{o.name}>" for o in reversed(stack_at(p))),
        reopening=lambda p: "".join(o.raw for o in stack_at(p)),
        can_cut=lambda p: not in_markup(p),
        is_blank=lambda body: not _old_plain(body).strip(),
    )
    return _OldPlanner(layout, limit, length).run()


# -- the run ---------------------------------------------------------------------------


def best_ms(split: Callable[[str], list[str]], html: str, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        split(html)
        best = min(best, time.perf_counter() - started)
    return best * 1000


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="5000,12000,24000,50000")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    print(
        f"{'chars':>7} {'html':>7} {'chunks':>6} {'before ms':>10} {'after ms':>9} {'ratio':>7}  same chunks"
    )
    same_everywhere = True
    for size in (int(s) for s in args.sizes.split(",")):
        html = markdown_to_html(reply(size, seed=size))
        new, old = split_html(html), old_split_html(html)
        same = new == old
        same_everywhere &= same
        before, after = best_ms(old_split_html, html, args.repeat), best_ms(split_html, html, args.repeat)
        print(
            f"{size:>7} {len(html):>7} {len(new):>6} {before:>10.1f} {after:>9.1f} {before / after:>6.1f}x"
            f"  {'yes' if same else 'NO'}"
        )
    return 0 if same_everywhere else 1


if __name__ == "__main__":
    raise SystemExit(main())
