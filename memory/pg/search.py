"""``SearchRepository`` on PostgreSQL full-text search.

The same contract as ``memory/search.py``: a query only sees the chats it names (the chat
numbers are part of the GIN index condition, and every hit is checked again against
``sessions.chat_key``), the caller's excluded sessions are dropped, cron sessions count
half, repeated texts are kept once, hits come grouped by session.

Any text is a valid query: it is analysed by ``memory/fts_query.parse`` (words, their
irregular forms, quoted phrases, CJK runs) and every word reaches PostgreSQL only as a
bound parameter of ``plainto_tsquery`` / ``phraseto_tsquery``, which never raise a syntax
error, whatever the text. Words are OR-ed (an all-words AND of a sentence finds nothing)
and ranked with ``ts_rank_cd``, so messages matching more of them come first.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from mnemo.memory import cjk
from mnemo.memory.errors import InvalidSearchQuery
from mnemo.memory.fts_query import MAX_CJK_RUN, ParsedQuery, parse
from mnemo.memory.pg.db import Connection, PgDatabase
from mnemo.memory.pg.sessions import utc
from mnemo.memory.search import (
    CRON_WEIGHT,
    MAX_LIMIT,
    VECTORS_COUNTED,
    WINDOW_AFTER,
    WINDOW_BEFORE,
    ContextTurn,
    IndexStatus,
    SearchHit,
    SearchResult,
    SessionHits,
    context_turn,
    make_snippet,
    with_window,
)

if TYPE_CHECKING:  # numpy and the model only with search.semantic
    from mnemo.memory.pg.semantic import PgVectors


def tsquery(parsed: ParsedQuery) -> tuple[str | None, list[str], str | None, list[str]]:
    """(SQL, parameters) of the English query and of the CJK query; None when empty."""
    words = [w for family in parsed.terms for w in family]
    parts = ["plainto_tsquery('english', %s)"] * len(words) + ["phraseto_tsquery('english', %s)"] * len(
        parsed.phrases
    )
    args = words + [" ".join(p) for p in parsed.phrases]
    text_sql = " || ".join(parts) if parts else None
    cjk_parts, cjk_args = [], []
    for run in parsed.cjk_runs:
        grams = cjk.query_grams(run[:MAX_CJK_RUN])
        cjk_parts.append("(" + " && ".join(["plainto_tsquery('simple', %s)"] * len(grams)) + ")")
        cjk_args += grams
    cjk_sql = " || ".join(cjk_parts) if cjk_parts else None
    return text_sql, args, cjk_sql, cjk_args


PER_CHAT_BRANCHES = 16  # up to this many chats, one index-scoped branch each
SCORED_ROWS = 1000  # ts_rank_cd ranks the newest this many matches of each branch's scope


def candidates(parsed: ParsedQuery, chat_nos: Sequence[int], pool: int) -> tuple[str, list[Any]] | None:
    """The SQL (and parameters) of the best ``pool`` (id, rank) candidates per chat.

    btree_gin serves ``chat_no = x`` (not ``= ANY``) from the GIN index, so each chat is
    its own branch with the scope and the text match in one index condition; a search
    over more than ``PER_CHAT_BRANCHES`` chats (an operator's ``sessions search``) filters
    the scope instead."""
    text_sql, text_args, cjk_sql, cjk_args = tsquery(parsed)
    branches: list[str] = []
    args: list[Any] = []
    for column, sql, params in (("tsv", text_sql, text_args), ("cjk_tsv", cjk_sql, cjk_args)):
        if sql is None:
            continue
        # The newest SCORED_ROWS matches are ranked, as ContextRetriever.scored_docs.
        newest = (
            f"SELECT id, {column} AS v FROM messages, (SELECT {sql} AS q) query WHERE {{scope}}"
            f" AND {column} @@ q ORDER BY id DESC LIMIT {SCORED_ROWS}"
        )
        head = f"SELECT id, ts_rank_cd(v, q) AS rank FROM ({newest}) w, (SELECT {sql} AS q) query"
        if len(chat_nos) <= PER_CHAT_BRANCHES:
            for chat_no in chat_nos:
                branches.append(
                    f"({head.format(scope='chat_no = %s::bigint')} ORDER BY rank DESC, id LIMIT %s)"
                )
                args += [*params, chat_no, *params, pool]
        else:
            branches.append(
                f"({head.format(scope='chat_no = ANY(%s::bigint[])')} ORDER BY rank DESC, id LIMIT %s)"
            )
            args += [*params, list(chat_nos), *params, pool]
    if not branches:
        return None
    return " UNION ALL ".join(branches), args


NEIGHBOUR_WEIGHT = 0.2  # as ContextRetriever: a turn passes part of its score to the turns around it
PREVIOUS_WEIGHT = 0.15  # and the next turn gets more (SQLite indexes the previous turn as context)
RRF_K = 2.0  # reciprocal-rank fusion with the vector ranking, as SemanticRetriever
SEMANTIC_WEIGHT = 0.5  # and the vector ranking's weight in it


def query_text(query: ParsedQuery) -> str:
    """What the vector ranking embeds: the question's words (as ``SemanticRetriever``)."""
    return (" ".join(query.raw_words) + " " + " ".join(query.cjk_runs)).strip()


def _normalised(ranked: dict[int, float]) -> dict[int, float]:
    top = max(ranked.values(), default=0.0)
    return {i: (s / top if top > 0 else 1.0) for i, s in ranked.items()}


class PgSessionSearch:
    """``vectors``: the semantic ranking (``memory/pg/semantic.py``) to fuse in, when
    ``search.semantic`` is on and the extra is installed; ``vectors_model`` counts the
    messages not embedded yet for ``index_status`` without one (``mnemo doctor``)."""

    def __init__(
        self, db: PgDatabase, *, vectors: PgVectors | None = None, vectors_model: str | None = None
    ) -> None:
        self._db = db
        self.vectors = vectors
        self.vectors_model = vectors.embedder.name if vectors is not None else vectors_model

    async def index_status(self) -> IndexStatus:
        """PostgreSQL indexes each row's words as it is written (a generated column):
        only vectors can be missing."""
        model = self.vectors_model
        if model is None:
            return IndexStatus()
        from mnemo.memory.pg.semantic import count_unembedded

        pending = await self._db.read(lambda conn: count_unembedded(conn, model, VECTORS_COUNTED + 1))
        return IndexStatus(semantic=True, vectors_pending=pending)

    async def search(
        self,
        query: str,
        *,
        chat_keys: Sequence[str],
        limit: int,
        exclude_session_ids: Collection[str] = (),
        around: tuple[int, int] = (1, 1),
    ) -> SearchResult:
        if not isinstance(query, str) or not query.strip():
            raise InvalidSearchQuery("the search query is empty: give a few words to look for")
        parsed = parse(query)
        limit = max(1, min(int(limit), MAX_LIMIT))
        keys = list(dict.fromkeys(chat_keys))
        if parsed.is_empty or not keys:
            return SearchResult(query, (), ())
        excluded = list(frozenset(exclude_session_ids))
        window = (max(0, around[0]), max(0, around[1]))
        return await self._db.read(
            lambda conn: self._search(conn, query, parsed, keys, limit, excluded, window)
        )

    async def _lexical(
        self, conn: Connection, parsed: ParsedQuery, chat_nos: list[int], pool: int
    ) -> list[int]:
        """Ids best first: the full-text rank, each turn also credited with part of its
        neighbours' (as ContextRetriever on SQLite)."""
        found = candidates(parsed, chat_nos, pool)
        if found is None:
            return []
        union, args = found
        rows = await (
            await conn.execute("SELECT id, max(rank) AS rank FROM (" + union + ") b GROUP BY id", args)
        ).fetchall()
        base = _normalised({int(r["id"]): float(r["rank"]) for r in rows})
        if not base:
            return []
        around = await (
            await conn.execute(
                "SELECT m.id,"
                " (SELECT p.id FROM messages p WHERE p.session_id = m.session_id AND p.id < m.id"
                "  ORDER BY p.id DESC LIMIT 1) AS prev,"
                " (SELECT n.id FROM messages n WHERE n.session_id = m.session_id AND n.id > m.id"
                "  ORDER BY n.id LIMIT 1) AS next"
                " FROM messages m WHERE m.id = ANY(%s::bigint[])",
                (list(base),),
            )
        ).fetchall()
        final: dict[int, float] = dict.fromkeys(base, 0.0)
        for r in around:
            i = int(r["id"])
            final[i] = final.get(i, 0.0) + base[i]
            if r["prev"] is not None:
                final[r["prev"]] = final.get(r["prev"], 0.0) + NEIGHBOUR_WEIGHT * base[i]
            if r["next"] is not None:
                final[r["next"]] = final.get(r["next"], 0.0) + (NEIGHBOUR_WEIGHT + PREVIOUS_WEIGHT) * base[i]
        return [i for i, _ in sorted(final.items(), key=lambda kv: (-kv[1], kv[0]))]

    async def _search(
        self,
        conn: Connection,
        query: str,
        parsed: ParsedQuery,
        keys: list[str],
        limit: int,
        excluded: list[str],
        around: tuple[int, int],
    ) -> SearchResult:
        chats = await (
            await conn.execute("SELECT id FROM chats WHERE chat_key = ANY(%s::text[])", (keys,))
        ).fetchall()
        chat_nos = [r["id"] for r in chats]
        if not chat_nos:
            return SearchResult(query, (), ())
        pool = min(limit * 5 + 20, 500)
        ranked = await self._lexical(conn, parsed, chat_nos, pool)
        scores = {i: 1.0 / (n + 1) for n, i in enumerate(ranked)}
        if self.vectors is not None:
            vectors = await self.vectors.ranking(conn, query_text(parsed), chat_nos, max(pool, 100))
            fused: dict[int, float] = {}
            for weight, order in ((1.0, ranked), (SEMANTIC_WEIGHT, [i for i, _ in vectors])):
                for n, i in enumerate(order):
                    fused[i] = fused.get(i, 0.0) + weight / (RRF_K + n + 1)
            scores = fused
        top = sorted(scores, key=lambda i: (-scores[i], i))[: pool * 2]
        if not top:
            return SearchResult(query, (), ())
        rows = await (
            await conn.execute(
                "SELECT m.id, m.session_id, m.role, m.author_id, m.author_name, m.created_at, m.content,"
                " s.chat_key, s.source, s.title, s.started_at"
                " FROM messages m JOIN sessions s ON s.id = m.session_id"
                " WHERE m.id = ANY(%s::bigint[]) AND s.chat_key = ANY(%s::text[])"
                " AND NOT (m.session_id = ANY(%s::text[]))",
                (top, keys, excluded),
            )
        ).fetchall()
        hits: list[tuple[SearchHit, dict[str, Any]]] = []
        for r in rows:
            score = scores[r["id"]] * (CRON_WEIGHT if r["source"] == "cron" else 1.0)
            created = utc(r["created_at"])
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
        seen: set[str] = set()
        distinct = []
        for hit, r in hits:
            text = " ".join(r["content"].lower().split())
            if text not in seen:
                seen.add(text)
                distinct.append((hit, r))
        top_hits = [(await _with_window(conn, hit, around), r) for hit, r in distinct[:limit]]
        return SearchResult(query, tuple(h for h, _ in top_hits), _group(top_hits))


async def _with_window(conn: Connection, hit: SearchHit, around: tuple[int, int]) -> SearchHit:
    """``hit`` with the turns before and after it in its session (same chat)."""
    sides: list[list[ContextTurn]] = []
    for sql, n in ((WINDOW_BEFORE, around[0]), (WINDOW_AFTER, around[1])):
        rows = await (
            await conn.execute(sql.replace("?", "%s"), (hit.session_id, hit.message_id, n + 1))
        ).fetchall()
        turns = []
        for r in rows:
            created = utc(r["created_at"])
            assert created is not None
            turns.append(context_turn(r, created))
        sides.append(turns)
    return with_window(hit, sides[0], sides[1], around)


def _group(hits: Sequence[tuple[SearchHit, dict[str, Any]]]) -> tuple[SessionHits, ...]:
    members: dict[str, list[SearchHit]] = {}
    info: dict[str, dict[str, Any]] = {}
    for hit, row in hits:
        members.setdefault(hit.session_id, []).append(hit)
        info.setdefault(hit.session_id, row)
    out = []
    for sid, group in members.items():
        r = info[sid]
        started = utc(r["started_at"])
        assert started is not None
        out.append(
            SessionHits(sid, r["chat_key"], r["source"], r["title"], started, group[0].score, tuple(group))
        )
    return tuple(out)
