"""Searchable text for scripts written without spaces (Chinese, Japanese, Thai, ...).

FTS5's ``unicode61`` tokenizer splits on spaces and punctuation only, so a whole
Chinese sentence becomes one token and searching for one word inside it finds
nothing; the ``trigram`` tokenizer needs three characters, while most Chinese words
are one or two. So such runs are indexed as their single characters plus overlapping
pairs ("我养了狗" → "我 养 了 狗 我养 养了 了狗"): a one-character query matches a
unigram, a longer one is searched as the AND of its pairs. The text is computed once
at write time into ``messages.cjk`` (NULL for messages without such characters, so
Latin-only history costs nothing) and indexed by ``messages_cjk``.
"""

from __future__ import annotations

import re

# Han (+ extensions, compatibility), kana, Hangul, Thai, Lao, Myanmar, Khmer: scripts
# whose words are not separated by spaces (Hangul is, but particles stick to words).
_RUN = re.compile(
    "["
    "\u0e00-\u0eff"  # Thai, Lao
    "\u1000-\u109f"  # Myanmar
    "\u1780-\u17ff"  # Khmer
    "\u3040-\u30ff"  # Hiragana, Katakana
    "\u3400-\u4dbf"  # CJK extension A
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\uac00-\ud7af"  # Hangul syllables
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\U00020000-\U0003134f"  # CJK extensions B-G
    "]+"
)
# Thai/Lao/Myanmar/Khmer combining marks are not letters for unicode61: it would cut
# a run at each one, so they are dropped from the indexed text (and from queries).
_MARKS = re.compile(
    "[\u0e31\u0e34-\u0e3a\u0e47-\u0e4e\u0eb1\u0eb4-\u0ebc\u0ec8-\u0ecd\u102b-\u103e\u17b4-\u17d3]"
)


def runs(text: str) -> list[str]:
    """The maximal runs of unspaced-script characters in ``text``, marks removed."""
    out = []
    for m in _RUN.finditer(text):
        run = _MARKS.sub("", m.group())
        if run:
            out.append(run)
    return out


def grams(run: str) -> list[str]:
    """Unigrams then overlapping bigrams of one run."""
    chars = list(run)
    return chars + [a + b for a, b in zip(chars, chars[1:], strict=False)]


def index_text(text: str) -> str | None:
    """What ``messages.cjk`` stores for ``text``; None when it has no such characters."""
    found = runs(text)
    if not found:
        return None
    return " ".join(g for run in found for g in grams(run))


def query_grams(run: str) -> list[str]:
    """The terms a query run must match: the run's bigrams, or the single character."""
    if len(run) == 1:
        return [run]
    return [a + b for a, b in zip(run, run[1:], strict=False)]
