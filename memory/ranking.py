"""Retrievers: from a parsed query to ranked message ids inside a chat scope.

Both run synchronously on a reader connection (``Database.read``) and return
``(message_id, score)`` pairs, best first, higher is better.

``NaiveRetriever`` is the reference point the benchmark compares against: every raw
word of the query OR-ed, a default-unicode61 index, bm25. That index exists only in
benchmark profiles (``create_baseline_index``).

``FusionRetriever`` is what session_search ships. Measured on ``bench/data`` (see
``mnemo bench recall``), each step below earned its place:

1. **Analysis** (``memory/fts_query.py``): stopwords out, irregular forms in
   (``bought`` also searches ``buy``), quoted phrases kept.
2. **Lexical views fused**: the Porter-stemmed index ``messages_fts`` (``adopted`` ~
   ``adopting``) and, for CJK runs, ``messages_cjk`` (bigrams). Each view's bm25 is
   normalised by its best score and the views are summed with weights.
3. **Neighbour context**: a turn is scored together with the turns right before and
   after it in the same session. People state a fact in one turn and the reply restates
   it in other words ("I adopted a puppy" / "Congratulations on the new dog!"), so a
   question worded like the reply still finds the turn with the fact.
4. **Name feedback** (pseudo-relevance feedback): the proper nouns of the five best
   hits are searched in a second pass at a lower weight, which finds the other turns
   about the same person, place or thing — what multi-hop questions need.
5. **Distinct texts**: only the best-scored copy of a repeated line is kept (applied
   by session_search after scope, exclusion and cron demotion): chats repeat
   themselves ("Hi!", the same question every week) and ten copies of one line in
   the top ten hide everything else.

Everything is computed from FTS5 scores of a bounded candidate pool, so the cost
does not grow with the size of the chat beyond the FTS lookups themselves. Tried and
dropped: an extra unstemmed exact-word index (recall slightly worse, and every extra
FTS index halves the one-transaction-per-message write rate); word-prefix queries
(``allergy`` ~ ``allergic``: +0.01 recall@10, but p95 latency x2 at 1M messages);
boosting sessions from a month named in the question and a bonus for covering more
of the query's words (no gain).
"""

from __future__ import annotations

import re
import sqlite3
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from mnemo.memory.fts_query import (
    WORD,
    ParsedQuery,
    Scope,
    any_of,
    cjk_expression,
    naive_expression,
    scope_filter,
    term_expression,
)
from mnemo.memory.lexicon import STOPWORDS

Ranked = list[tuple[int, float]]
MAX_FEEDBACK_TERMS = 8


class Retriever(Protocol):
    """Ranks messages of the chats in ``scope`` for ``query``; called on a reader thread.

    ``distinct_texts``: whether session_search should keep only the best copy of a
    repeated text among the hits.
    """

    @property
    def name(self) -> str: ...

    @property
    def distinct_texts(self) -> bool: ...

    def retrieve(self, conn: sqlite3.Connection, query: ParsedQuery, scope: Scope, pool: int) -> Ranked: ...

    def vectors_pending(self, conn: sqlite3.Connection, cap: int) -> int | None:
        """Messages without a vector yet, counted up to ``cap``; None: no vectors used."""
        ...


class Lexical:
    """What every word-only retriever answers about vectors: it uses none."""

    __slots__ = ()

    def vectors_pending(self, conn: sqlite3.Connection, cap: int) -> int | None:
        return None


def fts_scores(conn: sqlite3.Connection, table: str, expr: str | None, scope: Scope, pool: int) -> Ranked:
    """Top ``pool`` rows of one FTS view by bm25 (column weights: text 1, scope 0)."""
    if expr is None or not scope.chat_nos:
        return []
    rows = conn.execute(
        f"SELECT rowid, -bm25({table}, 1.0, 0.0) AS s FROM {table} WHERE {table} MATCH ? ORDER BY s DESC LIMIT ?",
        (scope.match(expr), pool),
    ).fetchall()
    return [(int(r[0]), float(r[1])) for r in rows]


BASELINE_TABLE = "messages_plain"


def create_baseline_index(conn: sqlite3.Connection) -> None:
    """Build the naive baseline's unstemmed index (benchmarks only; inside a write).

    Production keeps one FTS index on the write path; the baseline's default-unicode61
    index exists only in the throw-away profile of ``mnemo bench recall``.
    """
    conn.execute(
        f"CREATE VIRTUAL TABLE IF NOT EXISTS {BASELINE_TABLE} USING fts5("
        "content, scope, content='messages_fts_docs', content_rowid='id')"
    )
    conn.execute(f"INSERT INTO {BASELINE_TABLE}({BASELINE_TABLE}) VALUES ('rebuild')")
    _keep_current(conn, BASELINE_TABLE)


def _keep_current(conn: sqlite3.Connection, table: str) -> None:
    """Index rows added later too (the benchmark stores sessions between questions)."""
    conn.execute(
        f"CREATE TRIGGER IF NOT EXISTS {table}_bench_ai AFTER INSERT ON messages BEGIN"
        f" INSERT INTO {table}(rowid, content, scope) VALUES (new.id, new.content, 'c' || new.chat_no); END"
    )


@dataclass(frozen=True, slots=True)
class NaiveRetriever(Lexical):
    """Raw words OR-ed, default unicode61, bm25. Needs ``create_baseline_index`` first."""

    name: str = "baseline"
    distinct_texts: bool = False

    def retrieve(self, conn: sqlite3.Connection, query: ParsedQuery, scope: Scope, pool: int) -> Ranked:
        return fts_scores(conn, BASELINE_TABLE, naive_expression(query), scope, pool)


def _normalised(ranked: Ranked) -> dict[int, float]:
    if not ranked:
        return {}
    top = max(s for _, s in ranked)
    if top <= 0:
        return {i: 1.0 for i, _ in ranked}
    return {i: s / top for i, s in ranked}


def neighbours(conn: sqlite3.Connection, ids: Sequence[int]) -> dict[int, tuple[int | None, int | None]]:
    """For each message id: the previous and next message ids of the same session."""
    if not ids:
        return {}
    marks = ",".join("?" * len(ids))
    rows = conn.execute(
        "SELECT m.id,"
        " (SELECT p.id FROM messages p WHERE p.session_id = m.session_id AND p.id < m.id ORDER BY p.id DESC LIMIT 1),"
        " (SELECT n.id FROM messages n WHERE n.session_id = m.session_id AND n.id > m.id ORDER BY n.id LIMIT 1)"
        f" FROM messages m WHERE m.id IN ({marks})",
        tuple(ids),
    ).fetchall()
    return {int(r[0]): (r[1], r[2]) for r in rows}


_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def proper_nouns(text: str) -> list[str]:
    """Capitalised words not at the start of a sentence (names, places, brands), lower-cased."""
    out = []
    for sentence in _SENTENCE.split(text):
        for w in WORD.findall(sentence)[1:]:
            if w[0].isupper() and w.lower() not in STOPWORDS:
                out.append(w.lower())
    return out


@dataclass(frozen=True, slots=True)
class FusionRetriever(Lexical):
    name: str = "shipped"
    distinct_texts: bool = True
    stem_weight: float = 1.0
    cjk_weight: float = 1.0
    neighbour_weight: float = 0.4
    feedback_docs: int = 5
    feedback_weight: float = 0.8
    candidates: int = 100

    def _views(self, conn: sqlite3.Connection, query: ParsedQuery, scope: Scope, n: int) -> dict[int, float]:
        base: dict[int, float] = defaultdict(float)
        views = (
            (self.stem_weight, "messages_fts", term_expression(query)),
            (self.cjk_weight, "messages_cjk", cjk_expression(query)),
        )
        for weight, table, expr in views:
            if weight > 0:
                for i, s in _normalised(fts_scores(conn, table, expr, scope, n)).items():
                    base[i] += weight * s
        return base

    def _with_neighbours(self, conn: sqlite3.Connection, base: Mapping[int, float]) -> dict[int, float]:
        if self.neighbour_weight <= 0:
            return dict(base)
        final: dict[int, float] = defaultdict(float)
        for i, (prev, nxt) in neighbours(conn, list(base)).items():
            final[i] += base[i]
            for j in (prev, nxt):
                if j is not None:
                    # The neighbour inherits part of this turn's score (and gives part of
                    # its own back when it is a candidate too).
                    final[j] += self.neighbour_weight * base[i]
        return final

    def _feedback_terms(self, conn: sqlite3.Connection, query: ParsedQuery, top: Sequence[int]) -> list[str]:
        if not top:
            return []
        asked = {w for family in query.terms for w in family}
        marks = ",".join("?" * len(top))
        terms: list[str] = []
        for (content,) in conn.execute(f"SELECT content FROM messages WHERE id IN ({marks})", tuple(top)):
            terms += [w for w in proper_nouns(content) if w not in asked]
        return list(dict.fromkeys(terms))[:MAX_FEEDBACK_TERMS]

    def retrieve(self, conn: sqlite3.Connection, query: ParsedQuery, scope: Scope, pool: int) -> Ranked:
        n = max(pool, self.candidates)
        base = self._views(conn, query, scope, n)
        if not base:
            return []
        final = self._with_neighbours(conn, base)
        if self.feedback_docs > 0 and self.feedback_weight > 0:
            top = [i for i, _ in sorted(final.items(), key=lambda kv: (-kv[1], kv[0]))[: self.feedback_docs]]
            extra = self._feedback_terms(conn, query, top)
            if extra:
                # Second pass: the names found in the best hits lead to the other turns
                # about the same person or thing ("my sister Clara" -> "Clara is a lawyer").
                found = fts_scores(conn, "messages_fts", any_of("content", extra), scope, n)
                for i, s in _normalised(found).items():
                    base[i] = base.get(i, 0.0) + self.feedback_weight * s
                final = self._with_neighbours(conn, base)
        ranked = sorted(final.items(), key=lambda kv: (-kv[1], kv[0]))
        return ranked[:pool]


# --- the contextual retriever (the default) ------------------------------------------------

CTX_TABLE = "messages_ctx"
MONTH_NUMBERS = {
    name: n
    for n, names in enumerate(
        (
            ("january", "jan"),
            ("february", "feb"),
            ("march",),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ),
        1,
    )
    for name in names
}
LEGACY_TABLE = "messages_fts"


def create_legacy_index(conn: sqlite3.Connection) -> None:
    """Re-create the pre-0008 index ``messages_fts`` (benchmarks only; inside a write),
    so ``FusionRetriever`` can be measured next to the contextual one."""
    conn.execute(
        f"CREATE VIRTUAL TABLE IF NOT EXISTS {LEGACY_TABLE} USING fts5("
        "content, scope, content='messages_fts_docs', content_rowid='id',"
        " tokenize='porter unicode61 remove_diacritics 2')"
    )
    conn.execute(f"INSERT INTO {LEGACY_TABLE}({LEGACY_TABLE}) VALUES ('rebuild')")
    _keep_current(conn, LEGACY_TABLE)


_BEFORE_MONTH = frozenset(
    {"in", "during", "of", "since", "before", "after", "until", "by", "early", "late", "mid"}
)


def named_months(raw: Sequence[str]) -> set[int]:
    """Months a question names as dates ("in January", "may 2023"; not "I may")."""
    out = set()
    for i, w in enumerate(raw):
        if w in MONTH_NUMBERS:
            after = raw[i + 1] if i + 1 < len(raw) else ""
            if (i > 0 and raw[i - 1] in _BEFORE_MONTH) or after.isdigit():
                out.add(MONTH_NUMBERS[w])
    return out


def participant_words(conn: sqlite3.Connection, scope: Scope) -> frozenset[str]:
    """The lower-cased words of the names of everyone who spoke in the scope's chats."""
    marks = ",".join("?" * len(scope.chat_nos))
    out: set[str] = set()
    for (name,) in conn.execute(f"SELECT name FROM chat_speakers WHERE chat_no IN ({marks})", scope.chat_nos):
        out.update(w.lower() for w in WORD.findall(name))
    return frozenset(out)


def without_names(query: ParsedQuery, names: frozenset[str]) -> ParsedQuery:
    """``query`` without the participants' own names (when something else is left)."""
    if not names:
        return query
    terms = tuple(f for f in query.terms if f[0] not in names)
    if not terms:
        return query
    return ParsedQuery(query.raw_words, terms, query.phrases, query.cjk_runs)


@dataclass(frozen=True, slots=True)
class ContextRetriever(Lexical):
    """Contextual index + participant-aware query + neighbours + name feedback.

    Each message is matched on its own text (weight 1) and on its context — speaker,
    date in words, previous turn — at ``context_weight``; the names of the chat's own
    participants are dropped from the query (their turns all carry the name). While
    old rows are still being re-indexed (``memory/reindex.py``) it answers with
    ``FusionRetriever`` on the old index.
    """

    name: str = "contextual"
    distinct_texts: bool = True
    context_weight: float = 0.15
    cjk_weight: float = 1.0
    neighbour_weight: float = 0.2
    feedback_docs: int = 5
    feedback_weight: float = 0.5
    candidates: int = 100
    drop_names: bool = True
    speaker_boost: float = 1.0
    date_boost: float = 1.0
    # Large scopes: only the newest ``scored_docs`` messages matching the query are
    # scored (as PostgreSQL's SCORED_ROWS), and in a scope of more than ``common_docs``
    # messages a word found in more than that many is not scored when rarer ones are
    # there (``_base``); 0 turns each off.
    common_docs: int = 5000
    scored_docs: int = 1000

    def _scores(
        self, conn: sqlite3.Connection, expr: str | None, scope: Scope, n: int, capped: bool = False
    ) -> Ranked:
        if expr is None or not scope.chat_nos:
            return []
        match, after = scope.match(expr), 0
        if capped and self.scored_docs:
            # bm25 costs a few microseconds a row: score the newest ``scored_docs`` only
            # (finding where they start walks the ids alone, far cheaper).
            row = conn.execute(
                f"SELECT rowid FROM {CTX_TABLE} WHERE {CTX_TABLE} MATCH ? ORDER BY rowid DESC LIMIT 1 OFFSET ?",
                (match, self.scored_docs),
            ).fetchone()
            after = int(row[0]) if row else 0
        rows = conn.execute(
            f"SELECT rowid, -bm25({CTX_TABLE}, 1.0, ?, 0.0) AS s FROM {CTX_TABLE} WHERE {CTX_TABLE} MATCH ?"
            " AND rowid > ? ORDER BY s DESC LIMIT ?",
            (self.context_weight, match, after, n),
        ).fetchall()
        return [(int(r[0]), float(r[1])) for r in rows]

    def _split(
        self, conn: sqlite3.Connection, cols: str, alts: Sequence[str], scope: Scope
    ) -> tuple[list[str], list[str]]:
        """``alts`` as (found in 1..``common_docs`` messages of the scope, in more); the
        words found nowhere are left out. A capped count: FTS5 stops reading there."""
        rare, common = [], []
        for w in alts:
            row = conn.execute(
                f"SELECT count(*) FROM (SELECT rowid FROM {CTX_TABLE} WHERE {CTX_TABLE} MATCH ? LIMIT ?)",
                (scope.match(any_of(cols, [w]) or ""), self.common_docs + 1),
            ).fetchone()
            if row[0] > self.common_docs:
                common.append(w)
            elif row[0]:
                rare.append(w)
        return rare, common

    def _scope_rows(self, conn: sqlite3.Connection, scope: Scope) -> int:
        """Messages in the scope, counted up to the larger cap + 1 (a bounded read of
        the scope's own list in the index)."""
        cap = max(self.common_docs, self.scored_docs) + 1
        if scope.whole_store:
            row = conn.execute("SELECT count(*) FROM (SELECT 1 FROM messages LIMIT ?)", (cap,)).fetchone()
        else:
            row = conn.execute(
                f"SELECT count(*) FROM (SELECT rowid FROM {CTX_TABLE} WHERE {CTX_TABLE} MATCH ? LIMIT ?)",
                (scope_filter(scope.chat_nos), cap),
            ).fetchone()
        return int(row[0])

    def _base(
        self,
        conn: sqlite3.Connection,
        alts: Sequence[str],
        scope: Scope,
        n: int,
        cols: str = "{content context}",
        rows: int = 0,
    ) -> dict[int, float]:
        """bm25 over the words ``alts``, normalised. FTS5's bm25 reads the whole list of
        every word it scores (to count the messages holding it), so in a large chat the
        words found in more than ``common_docs`` messages of the scope are left out
        when rarer ones are there (bm25 gives such words little weight anyway; checking
        them on the candidates cost as much as scoring them). When every word is that
        common, they are scored on the newest ``scored_docs`` messages holding them."""
        capped = rows > self.scored_docs
        if not self.common_docs or rows <= self.common_docs:
            return _normalised(self._scores(conn, any_of(cols, alts), scope, n, capped))
        rare, common = self._split(conn, cols, alts, scope)
        # Every word common: bm25 over the newest ``scored_docs`` messages holding them
        # (their lists are read once for the weights: a few milliseconds).
        return _normalised(self._scores(conn, any_of(cols, rare or common), scope, n, capped))

    def _with_neighbours(self, conn: sqlite3.Connection, base: Mapping[int, float]) -> dict[int, float]:
        if self.neighbour_weight <= 0:
            return dict(base)
        final: dict[int, float] = defaultdict(float)
        for i, (prev, nxt) in neighbours(conn, list(base)).items():
            final[i] += base[i]
            for j in (prev, nxt):
                if j is not None:
                    final[j] += self.neighbour_weight * base[i]
        return final

    def retrieve(self, conn: sqlite3.Connection, query: ParsedQuery, scope: Scope, pool: int) -> Ranked:
        from mnemo.memory.reindex import pending  # reindex imports migrations, not ranking

        if pending(conn):
            return FusionRetriever(name=self.name).retrieve(conn, query, scope, pool)
        n = max(pool, self.candidates)
        names = participant_words(conn, scope) if self.drop_names else frozenset()
        q = without_names(query, names)
        alts = [w for family in q.terms for w in family] + [" ".join(p) for p in q.phrases]
        size = self._scope_rows(conn, scope) if self.common_docs or self.scored_docs else 0
        base: dict[int, float] = defaultdict(float, self._base(conn, alts, scope, n, rows=size))
        if self.cjk_weight > 0:
            for i, s in _normalised(fts_scores(conn, "messages_cjk", cjk_expression(q), scope, n)).items():
                base[i] += self.cjk_weight * s
        if not base:
            return []
        final = self._with_neighbours(conn, base)
        if self.feedback_docs > 0 and self.feedback_weight > 0:
            top = [i for i, _ in sorted(final.items(), key=lambda kv: (-kv[1], kv[0]))[: self.feedback_docs]]
            asked = {w for family in q.terms for w in family} | names
            marks = ",".join("?" * len(top))
            extra: list[str] = []
            for (content,) in conn.execute(f"SELECT content FROM messages WHERE id IN ({marks})", tuple(top)):
                extra += [w for w in proper_nouns(content) if w not in asked]
            extra = list(dict.fromkeys(extra))[:MAX_FEEDBACK_TERMS]
            if extra:
                for i, s in self._base(conn, extra, scope, n, cols="content", rows=size).items():
                    base[i] = base.get(i, 0.0) + self.feedback_weight * s
                final = self._with_neighbours(conn, base)
        named = {w for w in query.raw_words if w in names} if self.speaker_boost > 0 else set()
        months = named_months(query.raw_words) if self.date_boost > 0 else set()
        if (named or months) and final:
            # The question names a participant: their own turns are likelier evidence.
            # It names a month ("in January"): turns of that month are (stored dates).
            marks = ",".join("?" * len(final))
            rows = conn.execute(
                f"SELECT id, author_name, created_at FROM messages WHERE id IN ({marks})", tuple(final)
            )
            for i, who, created in rows:
                if named and who and any(w.lower() in named for w in WORD.findall(who)):
                    final[i] *= 1.0 + self.speaker_boost
                if months and created[5:7].isdigit() and int(created[5:7]) in months:
                    final[i] *= 1.0 + self.date_boost
        ranked = sorted(final.items(), key=lambda kv: (-kv[1], kv[0]))
        return ranked[:pool]
