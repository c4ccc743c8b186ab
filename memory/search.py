"""session_search: recall what was said in earlier sessions of the same chat.

Scope is a privacy boundary. A search names the chats (session keys) it may see;
the retriever is restricted to their scope tokens inside the FTS index, and every hit
is checked again against ``sessions.chat_key`` before it is returned, so a query from
chat X never returns anything from chat Y even if an index were wrong.

Ranking comes from a ``Retriever`` (``memory/ranking.py``); this module adds what is
the same for every retriever: the scope check, excluding the caller's current session
(its messages are already in the model's context; earlier sessions of its compression
chain are searched, since their detail was summarised away), demoting ``cron``
sessions (a job that runs daily would otherwise crowd out real conversations),
keeping one copy of repeated texts when the retriever asks for it, snippets, and
grouping the hits by session, and the turns around each hit (``around``). What the
model is shown is built from this result by ``memory/search_view.py``; the tool itself
is ``memory/search_tool.py``.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol

from mnemo.memory.db import Database
from mnemo.memory.errors import InvalidSearchQuery
from mnemo.memory.fts_query import ParsedQuery, Scope, parse
from mnemo.memory.ranking import ContextRetriever, Retriever
from mnemo.memory.sessions import from_db_time

MAX_LIMIT = 100
CRON_WEIGHT = 0.5  # a cron session's hit counts half
SNIPPET_CHARS = 240


@dataclass(frozen=True, slots=True)
class ContextTurn:
    message_id: int
    speaker: str
    created_at: datetime
    text: str  # the whole message, spacing collapsed

    def cut(self, width: int = SNIPPET_CHARS) -> str:
        return self.text if len(self.text) <= width else self.text[:width].rstrip() + "…"


@dataclass(frozen=True, slots=True)
class SearchHit:
    message_id: int
    session_id: str
    role: str
    author_id: str | None
    author_name: str | None
    created_at: datetime
    snippet: str
    score: float
    # The turns right before and after it in its session (the ±1 window people see).
    before: ContextTurn | None = None
    after: ContextTurn | None = None
    content: str = ""  # the whole message
    # The window asked for with ``around`` (nearest last / first), tool turns left out;
    # ``more_before``/``more_after``: whether the session has more turns beyond it.
    turns_before: tuple[ContextTurn, ...] = ()
    turns_after: tuple[ContextTurn, ...] = ()
    more_before: bool = False
    more_after: bool = False

    @property
    def speaker(self) -> str:
        """Who said it, as shown to people and to the model: the name, else the id,
        else the role."""
        return self.author_name or self.author_id or self.role


@dataclass(frozen=True, slots=True)
class SessionHits:
    session_id: str
    chat_key: str
    source: str
    title: str | None
    started_at: datetime
    score: float  # the best hit's score
    hits: tuple[SearchHit, ...]  # best first


@dataclass(frozen=True, slots=True)
class SearchResult:
    query: str
    hits: tuple[SearchHit, ...]  # every hit, best first
    sessions: tuple[SessionHits, ...]  # the same hits grouped, best session first

    @property
    def message_ids(self) -> tuple[int, ...]:
        return tuple(h.message_id for h in self.hits)


@dataclass(frozen=True, slots=True)
class IndexStatus:
    """How complete session_search's indexes are (the tool result, ``mnemo doctor`` and
    ``/healthz`` say it): the word index while older rows are re-indexed
    (``memory/reindex.py``), and, with the semantic retriever, the messages not embedded
    yet (counted up to ``VECTORS_COUNTED``; more shows as "more than")."""

    text_done: int = 0  # rows of the re-indexing done (by id range)
    text_total: int = 0  # rows to re-index; 0: nothing to do
    semantic: bool = False  # the semantic retriever is on
    vectors_pending: int = 0

    @property
    def text_complete(self) -> bool:
        return self.text_total == 0 or self.text_done >= self.text_total

    @property
    def text_percent(self) -> float:
        return 100.0 if self.text_complete else 100.0 * self.text_done / self.text_total

    @property
    def vectors_pending_text(self) -> str:
        if self.vectors_pending > VECTORS_COUNTED:
            return f"more than {VECTORS_COUNTED:,}"
        return f"{self.vectors_pending:,}"

    @property
    def complete(self) -> bool:
        return self.text_complete and not self.vectors_pending

    def describe(self) -> str:
        """One line for people (``mnemo doctor``)."""
        parts = []
        if self.text_complete:
            parts.append("word index complete")
        else:
            parts.append(f"word index being rebuilt: {self.text_percent:.0f}% done")
        if self.semantic:
            parts.append(
                f"{self.vectors_pending_text} messages waiting to be embedded"
                if self.vectors_pending
                else "every message embedded"
            )
        return "; ".join(parts)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"complete": self.complete, "text_percent": round(self.text_percent, 1)}
        if self.semantic:
            out["vectors_pending"] = self.vectors_pending
        return out


VECTORS_COUNTED = 10_000
# The semantic extra's model (memory/semantic.py); here so that naming it imports no numpy.
VECTORS_MODEL = "all-MiniLM-L6-v2"


class SearchDigest(Protocol):
    """Summarises search hits for the model (an auxiliary LLM; wired in gateway/).

    Called by ``memory.search_tool.run_session_search_tool`` after a search with at least one hit. May
    raise anything: the handler logs it and returns the plain hits instead.
    """

    async def summarize(self, query: str, result: SearchResult) -> str: ...


def make_snippet(content: str, query: ParsedQuery, width: int = SNIPPET_CHARS) -> str:
    """A window of ``content`` around the first query word (matched by prefix)."""
    text = " ".join(content.split())
    if len(text) <= width:
        return text
    stems = [w[: max(4, len(w) - 3)] for family in query.terms for w in family] + list(query.cjk_runs)
    lower = text.lower()
    at = -1
    for s in stems:
        m = re.search(r"(?<![^\W_])" + re.escape(s), lower) if s.isascii() else None
        pos = m.start() if m else lower.find(s)
        if pos >= 0 and (at < 0 or pos < at):
            at = pos
    start = max(0, at - width // 3) if at >= 0 else 0
    end = min(len(text), start + width)
    start = max(0, end - width)
    return ("…" if start > 0 else "") + text[start:end].strip() + ("…" if end < len(text) else "")


class SessionSearch:
    """``vectors_model``: the embedding model whose vectors ``index_status`` counts when
    the retriever itself uses none (``mnemo doctor`` with ``search.semantic`` on, which
    must not load the model)."""

    def __init__(
        self, db: Database, *, retriever: Retriever | None = None, vectors_model: str | None = None
    ) -> None:
        self._db = db
        self.retriever: Retriever = retriever or ContextRetriever()
        self.vectors_model = vectors_model

    async def search(
        self,
        query: str,
        *,
        chat_keys: Sequence[str],
        limit: int,
        exclude_session_ids: Collection[str] = (),
        around: tuple[int, int] = (1, 1),
    ) -> SearchResult:
        """Up to ``limit`` messages of the chats ``chat_keys`` best matching ``query``,
        each with ``around`` = (before, after) turns of its session.

        Raises ``InvalidSearchQuery`` for an empty query; any other text is valid.
        """
        if not isinstance(query, str) or not query.strip():
            raise InvalidSearchQuery("the search query is empty: give a few words to look for")
        parsed = parse(query)
        limit = max(1, min(int(limit), MAX_LIMIT))
        keys = tuple(dict.fromkeys(chat_keys))
        excluded = frozenset(exclude_session_ids)
        if parsed.is_empty or not keys:
            return SearchResult(query, (), ())
        window = (max(0, around[0]), max(0, around[1]))
        return await self._db.read(
            lambda conn: self._search(conn, query, parsed, keys, limit, excluded, window)
        )

    async def index_status(self) -> IndexStatus:
        """How complete the indexes are (cheap: a few rows, counts bounded)."""
        return await self._db.read(self._index_status)

    def _index_status(self, conn: sqlite3.Connection) -> IndexStatus:
        from mnemo.memory.reindex import progress  # reindex imports migrations; keep search light

        text = progress(conn)
        pending = self.retriever.vectors_pending(conn, VECTORS_COUNTED + 1)
        if pending is None and self.vectors_model is not None:
            from mnemo.memory.semantic import count_unembedded  # numpy: only when asked for

            pending = count_unembedded(conn, self.vectors_model, VECTORS_COUNTED + 1)
        return IndexStatus(
            text_done=text.done,
            text_total=0 if text.finished else text.total,
            semantic=pending is not None,
            vectors_pending=pending or 0,
        )

    def _search(
        self,
        conn: sqlite3.Connection,
        query: str,
        parsed: ParsedQuery,
        keys: tuple[str, ...],
        limit: int,
        excluded: frozenset[str],
        around: tuple[int, int],
    ) -> SearchResult:
        marks = ",".join("?" * len(keys))
        chat_nos = tuple(
            r[0] for r in conn.execute(f"SELECT id FROM chats WHERE chat_key IN ({marks})", keys)
        )
        if not chat_nos:
            return SearchResult(query, (), ())
        every = conn.execute("SELECT count(*) FROM chats").fetchone()[0] == len(chat_nos)
        scope = Scope(chat_nos, whole_store=every)
        # A larger pool than asked for: exclusion, cron demotion and dropping repeated
        # texts reorder and thin it.
        pool = min(limit * 5 + 20, 500)
        ranked = self.retriever.retrieve(conn, parsed, scope, pool)
        if not ranked:
            return SearchResult(query, (), ())
        scores = dict(ranked)
        ids = list(scores)
        rows = conn.execute(
            "SELECT m.id, m.session_id, m.role, m.author_id, m.author_name, m.created_at, m.content,"
            " s.chat_key, s.source, s.title, s.started_at"
            # CROSS JOIN pins the loop order: the few candidate ids first. Left to the
            # planner, a chat with many sessions was scanned session by session (300 ms).
            f" FROM messages m CROSS JOIN sessions s ON s.id = m.session_id"
            f" WHERE m.id IN ({','.join('?' * len(ids))}) AND s.chat_key IN ({marks})",
            (*ids, *keys),
        ).fetchall()
        hits: list[tuple[SearchHit, sqlite3.Row]] = []
        for r in rows:
            if r["session_id"] in excluded:
                continue
            score = scores[r["id"]] * (CRON_WEIGHT if r["source"] == "cron" else 1.0)
            created = from_db_time(r["created_at"])
            assert created is not None
            hit = SearchHit(
                message_id=r["id"],
                session_id=r["session_id"],
                role=r["role"],
                author_id=r["author_id"],
                author_name=r["author_name"],
                created_at=created,
                snippet=make_snippet(r["content"], parsed),
                score=round(score, 6),
                content=r["content"],
            )
            hits.append((hit, r))
        hits.sort(key=lambda hr: (-hr[0].score, hr[0].message_id))
        if self.retriever.distinct_texts:
            hits = _distinct(hits)
        hits = _with_window(conn, hits[:limit], around)
        return SearchResult(query, tuple(h for h, _ in hits), _group(hits))


# The turns around a hit, nearest first: same session (so same chat), no tool results.
WINDOW_BEFORE = (
    "SELECT id, role, author_id, author_name, created_at, content FROM messages"
    " WHERE session_id = ? AND id < ? AND role != 'tool' AND content != '' ORDER BY id DESC LIMIT ?"
)
WINDOW_AFTER = (
    "SELECT id, role, author_id, author_name, created_at, content FROM messages"
    " WHERE session_id = ? AND id > ? AND role != 'tool' AND content != '' ORDER BY id LIMIT ?"
)


def context_turn(row: Mapping[str, Any], created: datetime) -> ContextTurn:
    speaker = row["author_name"] or row["author_id"] or row["role"]
    return ContextTurn(int(row["id"]), str(speaker), created, " ".join(str(row["content"]).split()))


def with_window(
    hit: SearchHit, earlier: Sequence[ContextTurn], later: Sequence[ContextTurn], around: tuple[int, int]
) -> SearchHit:
    """``hit`` with its window: ``earlier``/``later`` are up to ``around`` + 1 turns,
    nearest first (the extra one only tells whether the session goes on)."""
    before, after = around
    turns_before = tuple(reversed(earlier[:before]))
    turns_after = tuple(later[:after])
    return replace(
        hit,
        before=turns_before[-1] if turns_before else None,
        after=turns_after[0] if turns_after else None,
        turns_before=turns_before,
        turns_after=turns_after,
        more_before=len(earlier) > before,
        more_after=len(later) > after,
    )


def _with_window(
    conn: sqlite3.Connection, hits: list[tuple[SearchHit, sqlite3.Row]], around: tuple[int, int]
) -> list[tuple[SearchHit, sqlite3.Row]]:
    """Attach the turns before and after each hit in its session."""
    out = []
    for hit, row in hits:
        sides = []
        for sql, n in ((WINDOW_BEFORE, around[0]), (WINDOW_AFTER, around[1])):
            turns = []
            for r in conn.execute(sql, (hit.session_id, hit.message_id, n + 1)):
                created = from_db_time(r["created_at"])
                assert created is not None
                turns.append(context_turn(r, created))
            sides.append(turns)
        out.append((with_window(hit, sides[0], sides[1], around), row))
    return out


def _distinct(hits: list[tuple[SearchHit, sqlite3.Row]]) -> list[tuple[SearchHit, sqlite3.Row]]:
    """The best-scored hit of each distinct text (case and spacing ignored)."""
    seen: set[str] = set()
    out = []
    for hit, row in hits:
        key = " ".join(row["content"].lower().split())
        if key not in seen:
            seen.add(key)
            out.append((hit, row))
    return out


def _group(hits: Sequence[tuple[SearchHit, sqlite3.Row]]) -> tuple[SessionHits, ...]:
    order: list[str] = []
    members: dict[str, list[SearchHit]] = {}
    info: dict[str, sqlite3.Row] = {}
    for hit, row in hits:
        if hit.session_id not in members:
            order.append(hit.session_id)
            members[hit.session_id] = []
            info[hit.session_id] = row
        members[hit.session_id].append(hit)
    out = []
    for sid in order:
        r = info[sid]
        started = from_db_time(r["started_at"])
        assert started is not None
        group = members[sid]
        out.append(
            SessionHits(sid, r["chat_key"], r["source"], r["title"], started, group[0].score, tuple(group))
        )
    return tuple(out)


def result_to_json(result: SearchResult, *, with_snippets: bool = True) -> list[dict[str, Any]]:
    out = []
    for s in result.sessions:
        matches = []
        for h in s.hits:
            m: dict[str, Any] = {
                "message_id": h.message_id,
                "role": h.role,
                "who": h.speaker,
                "date": h.created_at.isoformat(timespec="seconds"),
            }
            if with_snippets:
                m["text"] = h.snippet
                for key, turn in (("before", h.before), ("after", h.after)):
                    if turn is not None:
                        m[key] = {
                            "who": turn.speaker,
                            "date": turn.created_at.isoformat(timespec="seconds"),
                            "text": turn.cut(),
                        }
            matches.append(m)
        item: dict[str, Any] = {
            "session_id": s.session_id,
            "started_at": s.started_at.isoformat(timespec="seconds"),
            "score": s.score,
            "matches": matches,
        }
        if s.title:
            item["title"] = s.title
        if s.source == "cron":
            item["source"] = "cron"
        out.append(item)
    return out
