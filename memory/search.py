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
grouping the hits by session for the tool result. An optional ``SearchDigest`` (an auxiliary
LLM) may summarise the hits for the model; when it fails, the plain hits are returned.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from mnemo.memory.db import Database
from mnemo.memory.errors import InvalidSearchQuery
from mnemo.memory.fts_query import ParsedQuery, Scope, parse
from mnemo.memory.ranking import ContextRetriever, Retriever, neighbours
from mnemo.memory.sessions import from_db_time

if TYPE_CHECKING:  # memory/ports.py imports this module
    from mnemo.memory.ports import SearchRepository

log = structlog.get_logger(__name__)

MAX_LIMIT = 100
CRON_WEIGHT = 0.5  # a cron session's hit counts half
SNIPPET_CHARS = 240


@dataclass(frozen=True, slots=True)
class ContextTurn:
    message_id: int
    speaker: str
    created_at: datetime
    text: str  # cut to SNIPPET_CHARS


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
    # The turns right before and after it in its session (the ±1 window the model sees).
    before: ContextTurn | None = None
    after: ContextTurn | None = None

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


class SearchDigest(Protocol):
    """Summarises search hits for the model (an auxiliary LLM; wired in gateway/).

    Called by ``run_session_search_tool`` after a search with at least one hit. May
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
    def __init__(self, db: Database, *, retriever: Retriever | None = None) -> None:
        self._db = db
        self.retriever: Retriever = retriever or ContextRetriever()

    async def search(
        self,
        query: str,
        *,
        chat_keys: Sequence[str],
        limit: int,
        exclude_session_ids: Collection[str] = (),
    ) -> SearchResult:
        """Up to ``limit`` messages of the chats ``chat_keys`` best matching ``query``.

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
        return await self._db.read(lambda conn: self._search(conn, query, parsed, keys, limit, excluded))

    def _search(
        self,
        conn: sqlite3.Connection,
        query: str,
        parsed: ParsedQuery,
        keys: tuple[str, ...],
        limit: int,
        excluded: frozenset[str],
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
            )
            hits.append((hit, r))
        hits.sort(key=lambda hr: (-hr[0].score, hr[0].message_id))
        if self.retriever.distinct_texts:
            hits = _distinct(hits)
        hits = _with_window(conn, hits[:limit])
        return SearchResult(query, tuple(h for h, _ in hits), _group(hits))


def _with_window(
    conn: sqlite3.Connection, hits: list[tuple[SearchHit, sqlite3.Row]]
) -> list[tuple[SearchHit, sqlite3.Row]]:
    """Attach the previous and next turn of each hit's session (same session, so same chat)."""
    if not hits:
        return hits
    around = neighbours(conn, [h.message_id for h, _ in hits])
    want = {j for pair in around.values() for j in pair if j is not None}
    turns: dict[int, ContextTurn] = {}
    if want:
        marks = ",".join("?" * len(want))
        for r in conn.execute(
            f"SELECT id, role, author_id, author_name, created_at, content FROM messages WHERE id IN ({marks})",
            tuple(want),
        ):
            created = from_db_time(r["created_at"])
            assert created is not None
            text = " ".join(r["content"].split())
            if len(text) > SNIPPET_CHARS:
                text = text[:SNIPPET_CHARS].rstrip() + "…"
            turns[r["id"]] = ContextTurn(
                r["id"], r["author_name"] or r["author_id"] or r["role"], created, text
            )
    out = []
    for hit, row in hits:
        prev, nxt = around.get(hit.message_id, (None, None))
        hit = replace(hit, before=turns.get(prev) if prev else None, after=turns.get(nxt) if nxt else None)
        out.append((hit, row))
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


# --- the model's tool ----------------------------------------------------------------------

SESSION_SEARCH_TOOL_SCHEMA: dict[str, Any] = {
    "name": "session_search",
    "description": (
        "Search the earlier conversations of this chat (previous sessions, including ones "
        "that were compressed or reset). Use it when the user refers to something said before "
        "that is not in the current context, or asks what they told you in the past. Give a few "
        "distinctive words (names, places, things), not a whole sentence; quotes search an exact "
        "phrase. Returns matching messages grouped by session, with dates and who said them."
    ),
    "input_schema": {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "Words to look for, e.g. 'dog vet appointment'."},
            "limit": {
                "type": "integer",
                "minimum": 1,
                "description": "Maximum number of messages to return.",
            },
        },
        "required": ["query"],
    },
}


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
                            "text": turn.text,
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


async def run_session_search_tool(
    search: SearchRepository,
    args: Mapping[str, Any],
    *,
    chat_key: str,
    current_session_id: str | None,
    default_limit: int,
    max_limit: int,
    digest: SearchDigest | None = None,
    also_chat_keys: Sequence[str] = (),
) -> dict[str, Any]:
    """Handle one ``session_search`` tool call; the result is JSON-serialisable.
    ``also_chat_keys``: other chats the caller may see (their DMs on linked accounts).

    Never raises for bad input: an empty or missing query, or a malformed limit, comes
    back as ``{"error": ...}`` the model can read and correct.
    """
    query = args.get("query") if isinstance(args, Mapping) else None
    if not isinstance(query, str) or not query.strip():
        return {"error": "session_search needs a non-empty 'query': a few words to look for."}
    raw_limit = args.get("limit", default_limit)
    if isinstance(raw_limit, bool) or not isinstance(raw_limit, int | float | str):
        return {"error": f"'limit' must be a whole number between 1 and {max_limit}."}
    try:
        limit = int(raw_limit)
    except ValueError:
        return {"error": f"'limit' must be a whole number between 1 and {max_limit}."}
    limit = max(1, min(limit, max_limit))
    excluded = (current_session_id,) if current_session_id else ()
    keys = (chat_key, *also_chat_keys)
    result = await search.search(query, chat_keys=keys, limit=limit, exclude_session_ids=excluded)
    payload: dict[str, Any] = {"query": query, "count": len(result.hits)}
    if not result.hits:
        payload["results"] = []
        payload["note"] = "No earlier messages matched. Try other or fewer words."
        return payload
    if digest is not None:
        try:
            summary = await digest.summarize(query, result)
        except Exception as e:
            log.warning("session_search.digest_failed", error=repr(e))
        else:
            payload["summary"] = summary
            payload["results"] = result_to_json(result, with_snippets=False)
            return payload
    payload["results"] = result_to_json(result)
    return payload
