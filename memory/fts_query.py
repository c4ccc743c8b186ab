"""Turning any user or model text into a safe FTS5 query.

Natural language passed to ``MATCH`` fails in many ways (``?``, ``'``, ``.``, a bare
``free:`` read as a column filter, ``NEAR``/``NOT`` read as operators, a stray ``"``),
and an all-terms AND of a sentence returns nothing. So mnemo never passes user text
to FTS5. The text is cut into words (letters and digits; everything else separates,
as FTS5's unicode61 tokenizer does) and every word is emitted as a double-quoted
FTS5 string, which FTS5 treats as plain text whatever it contains. Operators, column
names and punctuation therefore lose their meaning and the query can never be a
syntax error — ``tests/memory/test_search_fuzz.py`` holds that with hypothesis.

Balanced double quotes in the query are kept as phrases (searched in addition to the
words). Words from scripts without spaces (Chinese, Japanese, Thai) are searched in
the ``messages_cjk`` view as their character bigrams (see ``memory/cjk.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mnemo.memory import cjk
from mnemo.memory.lexicon import STOPWORDS, forms

MAX_QUERY_CHARS = 4096  # a 10 KB paste is searched by its beginning
MAX_TERMS = 32  # more OR-ed terms only add noise and latency
MAX_PHRASES = 4
MAX_CJK_RUN = 16  # characters of one run searched (its first 15 bigrams)

# Letters, digits and private-use characters are token characters, like unicode61.
WORD = re.compile(r"[^\W_]+|[\ue000-\uf8ff]+")
_PHRASE = re.compile(r'"([^"]*)"')


def fts_string(text: str) -> str:
    """``text`` as an FTS5 string literal: always a plain term or phrase, never syntax."""
    return '"' + text.replace('"', '""') + '"'


def words(text: str) -> list[str]:
    """Lower-cased words of ``text`` outside unspaced scripts (those go to ``cjk``)."""
    out = []
    for w in WORD.findall(text):
        # Split mixed tokens like "我的dog" so the Latin part is searched as a word.
        for part in re.split(
            r"[\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u3400-\u4dbf"
            r"\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\U00020000-\U0003134f]+",
            w,
        ):
            if part:
                out.append(part.lower())
    return out


@dataclass(frozen=True, slots=True)
class ParsedQuery:
    """What a search query asks for, after analysis."""

    raw_words: tuple[str, ...]  # every word, in order (the naive baseline uses these)
    terms: tuple[tuple[str, ...], ...]  # content words, each with its irregular forms
    phrases: tuple[tuple[str, ...], ...]  # quoted phrases of two or more words
    cjk_runs: tuple[str, ...]  # runs of unspaced-script characters

    @property
    def is_empty(self) -> bool:
        return not (self.raw_words or self.cjk_runs)


def parse(query: str) -> ParsedQuery:
    text = query[:MAX_QUERY_CHARS]
    raw = words(text)
    phrases = []
    if text.count('"') >= 2:
        for inner in _PHRASE.findall(text):
            ws = words(inner)
            if len(ws) >= 2:
                phrases.append(tuple(ws))
    terms: list[tuple[str, ...]] = []
    seen: set[str] = set()
    for w in raw:
        if w in seen or w in STOPWORDS or (len(w) == 1 and w.isascii()):
            continue
        seen.add(w)
        terms.append(forms(w))
    if not terms:
        # A query made only of common words ("what did I say?") still searches them.
        terms = [(w,) for w in dict.fromkeys(raw)]
    return ParsedQuery(
        raw_words=tuple(raw),
        terms=tuple(terms[:MAX_TERMS]),
        phrases=tuple(phrases[:MAX_PHRASES]),
        cjk_runs=tuple(dict.fromkeys(cjk.runs(text)))[:MAX_TERMS],
    )


def scope_filter(chat_nos: Sequence[int]) -> str:
    """The FTS5 filter on the ``scope`` column for these chats."""
    return "scope : (" + " OR ".join(fts_string(f"c{n}") for n in chat_nos) + ")"


def any_of(column: str, alternatives: Iterable[str]) -> str | None:
    """``column : ("a" OR "b" ...)``, or None when there is nothing to search."""
    alts = [fts_string(a) for a in dict.fromkeys(alternatives) if a]
    if not alts:
        return None
    return f"{column} : (" + " OR ".join(alts) + ")"


@dataclass(frozen=True, slots=True)
class Scope:
    """The chats a search may see (``chats.id`` numbers).

    ``whole_store``: they are every chat in the store, so the scope filter is left out
    of the FTS query — it costs a pass over the chats' whole doclist, which dominates
    when one chat holds most of a large store (a personal bot). Rows are still checked
    against the chat keys afterwards.
    """

    chat_nos: tuple[int, ...]
    whole_store: bool = False

    def match(self, expr: str) -> str:
        if self.whole_store:
            return expr
        return f"{scope_filter(self.chat_nos)} AND ({expr})"


def naive_expression(q: ParsedQuery) -> str | None:
    """The baseline: every raw word, OR-ed, unstemmed."""
    return any_of("content", q.raw_words[:MAX_TERMS])


def term_expression(q: ParsedQuery) -> str | None:
    """Content words (with irregular forms) and quoted phrases, OR-ed."""
    alts = [w for family in q.terms for w in family]
    alts += [" ".join(p) for p in q.phrases]
    return any_of("content", alts)


def cjk_expression(q: ParsedQuery) -> str | None:
    """Each CJK run as the AND of its bigrams; runs OR-ed."""
    parts = []
    for run in q.cjk_runs:
        grams = cjk.query_grams(run[:MAX_CJK_RUN])
        parts.append("(" + " AND ".join(fts_string(g) for g in grams) + ")")
    if not parts:
        return None
    return "cjk : (" + " OR ".join(parts) + ")"
