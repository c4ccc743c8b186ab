"""Deterministic entity extraction and the word lists retrieval shares.

No model and no randomness: the same text always yields the same entities.

* quoted terms — ``"Project Falcon"``, ``“Vim”``, ``'dark mode'`` (an apostrophe inside a
  word, as in ``Alice's``, never opens a quote);
* runs of capitalised words — ``Alice``, ``New York``, ``PostgreSQL``, ``iOS`` — minus a
  stop list of words that are capitalised only because they start a sentence
  (``The``, ``User``, ``Remember`` …); a trailing possessive ``'s`` is dropped;
* known entities — any 1-3 word n-gram of the text that already names an entity the
  caller can see (looked up by the store, see ``ngrams``), so ``alice`` written in
  lower case still links to ``Alice``.
"""

from __future__ import annotations

import re

MAX_ENTITY_LEN = 80
MAX_NGRAM = 3

# Capitalised only because they open a sentence, or too generic to be an entity.
_NOT_ENTITIES = frozenset(
    """a an the this that these those it its i i'm i've i'd we you he she they me my our your
    his her their them us user users bot assistant also and but or if when then so yes no
    please remember note notes today tomorrow yesterday always never is are was were has
    have had do does did don't in on at for from to with after before every each all some
    any there here what who where why how which ok okay hi hello thanks maybe however
    prefers likes dislikes wants uses lives works""".split()
)

STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for
    from further had has have having he her here hers herself him himself his how i if in
    into is it its itself just me more most my myself of off on once only or other our ours
    out over own same she should so some such than that the their theirs them then there
    these they this those through to too under until up very was we were what when where
    which while who whom why will with would you your yours s t d ll m re ve""".split()
)

NEGATIONS = frozenset(
    "not no never nobody nothing neither nor none cannot can't don't doesn't didn't isn't aren't"
    " wasn't weren't won't wouldn't shouldn't n't".split()
)

_WORD = re.compile(r"[^\W_][\w'’\-.]*[^\W_]|[^\W_]", re.UNICODE)
_QUOTED = re.compile(
    r"\"([^\"\n]{1,80})\"|“([^”\n]{1,80})”|«([^»\n]{1,80})»|(?<![\w'’])'([^'\n]{1,80})'(?![\w])"
)
_POSSESSIVE = re.compile(r"['’]s$", re.IGNORECASE)


def normalize(name: str) -> str:
    """Trim punctuation and whitespace; collapse inner whitespace."""
    name = " ".join(name.split())
    name = name.strip(" \t.,;:!?()[]{}<>\"'“”‘’«»*_`~")
    return _POSSESSIVE.sub("", name)[:MAX_ENTITY_LEN].strip()


def _is_capitalised(word: str) -> bool:
    # "Alice", "PostgreSQL", "iOS", "macOS"; not "k8s" or "hello".
    return word[0].isupper() or any(ch.isupper() for ch in word[1:])


def extract_entities(text: str) -> list[str]:
    """Quoted terms and capitalised runs, in order of first appearance, deduplicated
    case-insensitively."""
    found: list[str] = []
    seen: set[str] = set()

    def keep(candidate: str) -> None:
        name = normalize(candidate)
        key = name.lower()
        if len(name) < 2 or key in seen or key in _NOT_ENTITIES or not any(ch.isalnum() for ch in name):
            return
        seen.add(key)
        found.append(name)

    for m in _QUOTED.finditer(text):
        keep(next(g for g in m.groups() if g is not None))

    run: list[str] = []

    def flush() -> None:
        if run:
            keep(" ".join(run))
            run.clear()

    prev_end = -1
    for m in _WORD.finditer(text):
        raw = m.group(0)
        word = _POSSESSIVE.sub("", raw)
        if run and text[prev_end : m.start()] != " ":
            flush()  # a run is words separated by exactly one space
        if word and _is_capitalised(word) and word.lower() not in _NOT_ENTITIES:
            run.append(word)
            if word != raw:
                flush()  # "Alice's Vim": the possessive ends the name
        else:
            flush()
        prev_end = m.end()
    flush()
    return found


def words(text: str) -> list[str]:
    """Lower-cased words (possessives dropped) — the unit of overlap and n-grams."""
    # Hot path of ranking (run on every candidate): findall, and a suffix test instead
    # of a regex per word.
    return [w[:-2] if len(w) > 2 and w.endswith(("'s", "’s")) else w for w in _WORD.findall(text.lower())]


def ngrams(text: str, n: int = MAX_NGRAM) -> set[str]:
    """Every 1..n word sequence of ``text``, lower-cased: candidates for known entities."""
    ws = words(text)
    return {" ".join(ws[i : i + k]) for k in range(1, n + 1) for i in range(len(ws) - k + 1)}


def content_terms(text: str) -> list[str]:
    """Distinct non-stopword words, in order: the terms a query is matched on."""
    seen: set[str] = set()
    out: list[str] = []
    for w in words(text):
        if w in STOPWORDS or w in seen:
            continue
        seen.add(w)
        out.append(w)
    return out
