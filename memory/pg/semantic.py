"""The semantic retriever on PostgreSQL: message vectors in ``message_vectors``, fused with
the lexical ranking the same way as on SQLite (``memory/semantic.py``).

Vectors are written by ``embed_pending`` (one replica at a time: a transaction-level
advisory lock, so two replicas never embed the same rows twice), in id order, outside
the message write path. Each row keeps its float32 vector as bytes (``vec``); when the
``pgvector`` extension could be created at migration time the row also carries it as
``embedding vector(384)`` and a query ranks a chat's vectors in the database
(``<#>``, the negative inner product: the vectors are normalised). Without pgvector
(Debian does not package it everywhere; ``CREATE EXTENSION`` may fail) the bytes are
read into one numpy matrix per chat, cached and extended as new vectors arrive, as on
SQLite. Either way only the scope's chats are read, and a vector row goes with its
message (``ON DELETE CASCADE``: erasure leaves no vector behind).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mnemo.memory.pg.db import Connection, PgDatabase
from mnemo.memory.semantic import Embedder

ADVISORY_KEY = 0x6D6E656D6F5F7665  # "mnemo_ve": one embedder at a time among replicas


async def has_pgvector(conn: Connection) -> bool:
    row = await (
        await conn.execute(
            "SELECT 1 AS x FROM information_schema.columns"
            " WHERE table_name = 'message_vectors' AND column_name = 'embedding'"
        )
    ).fetchone()
    return row is not None


async def pending_vectors_readonly(conn: Any, model: str, cap: int = 10_001) -> int | None:
    """Messages not embedded yet (up to ``cap``) on a plain connection (``mnemo doctor``:
    nothing is migrated); None when the schema has no vectors yet."""
    cur = await conn.execute("SELECT to_regclass('message_vectors') IS NOT NULL")
    row = await cur.fetchone()
    if row is None or not row[0]:
        return None
    cur = await conn.execute(
        "SELECT count(*) FROM (SELECT 1 FROM messages WHERE id > coalesce((SELECT max(id) FROM message_vectors"
        " WHERE model = %s), 0) AND role <> 'tool' LIMIT %s) x",
        (model, cap),
    )
    got = await cur.fetchone()
    return int(got[0]) if got else 0


async def count_unembedded(conn: Connection, model: str, cap: int) -> int:
    row = await (
        await conn.execute(
            "SELECT count(*) AS n FROM (SELECT 1 FROM messages WHERE id > coalesce((SELECT max(id)"
            " FROM message_vectors WHERE model = %s), 0) AND role <> 'tool' LIMIT %s) x",
            (model, cap),
        )
    ).fetchone()
    return int(row["n"]) if row else 0


async def embed_pending(db: PgDatabase, embedder: Embedder, *, batch: int = 256) -> int:
    """Embed every message without a vector yet (in batches); returns how many. Another
    replica embedding at the same time makes this one return at once."""
    done = 0
    while True:

        async def step(conn: Connection) -> int:
            got = await (
                await conn.execute("SELECT pg_try_advisory_xact_lock(%s) AS ok", (ADVISORY_KEY,))
            ).fetchone()
            if not got or not got["ok"]:
                return 0
            rows = await (
                await conn.execute(
                    "SELECT id, chat_no, content FROM messages WHERE id > coalesce((SELECT max(id)"
                    " FROM message_vectors WHERE model = %s), 0) AND role <> 'tool' ORDER BY id LIMIT %s",
                    (embedder.name, batch),
                )
            ).fetchall()
            if not rows:
                return 0
            # Off the event loop: a batch takes a second or more of CPU.
            vecs = await asyncio.to_thread(embedder.embed, [str(r["content"])[:2000] for r in rows])
            pgv = await has_pgvector(conn)
            sql = (
                "INSERT INTO message_vectors(id, chat_no, model, vec, embedding) VALUES (%s, %s, %s, %s, %s::vector)"
                if pgv
                else "INSERT INTO message_vectors(id, chat_no, model, vec) VALUES (%s, %s, %s, %s)"
            )
            params = []
            for r, v in zip(rows, vecs, strict=True):
                blob = v.astype(np.float32).tobytes()
                base = (r["id"], r["chat_no"], embedder.name, blob)
                params.append((*base, "[" + ",".join(f"{x:.7g}" for x in v) + "]") if pgv else base)
            async with conn.cursor() as cur:
                await cur.executemany(sql + " ON CONFLICT (id) DO NOTHING", params)
            return len(rows)

        n = await db.write(step)
        if not n:
            return done
        done += n


@dataclass
class _ChatMatrix:
    upto: int = 0
    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    mat: np.ndarray | None = None


class PgVectors:
    """A chat scope's vector ranking: pgvector in the database when it is there, else
    numpy over the bytes (a matrix per chat, cached in this process)."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self._chats: dict[int, _ChatMatrix] = {}

    async def _matrix(self, conn: Connection, chat_no: int) -> _ChatMatrix:
        cm = self._chats.setdefault(chat_no, _ChatMatrix())
        rows = await (
            await conn.execute(
                "SELECT id, vec FROM message_vectors WHERE chat_no = %s AND model = %s AND id > %s ORDER BY id",
                (chat_no, self.embedder.name, cm.upto),
            )
        ).fetchall()
        if rows:
            ids = np.fromiter((r["id"] for r in rows), dtype=np.int64, count=len(rows))
            new = np.frombuffer(b"".join(bytes(r["vec"]) for r in rows), dtype=np.float32).reshape(
                len(rows), -1
            )
            cm.ids = np.concatenate([cm.ids, ids])
            cm.mat = new if cm.mat is None else np.vstack([cm.mat, new])
            cm.upto = int(ids[-1])
        return cm

    async def ranking(
        self, conn: Connection, text: str, chat_nos: Sequence[int], n: int
    ) -> list[tuple[int, float]]:
        if not text:
            return []
        qv = self.embedder.embed([text])[0]
        if await has_pgvector(conn):
            rows = await (
                await conn.execute(
                    "SELECT id, -(embedding <#> %s::vector) AS s FROM message_vectors"
                    " WHERE chat_no = ANY(%s::bigint[]) AND model = %s ORDER BY embedding <#> %s::vector LIMIT %s",
                    (vector_text(qv), list(chat_nos), self.embedder.name, vector_text(qv), n),
                )
            ).fetchall()
            return [(int(r["id"]), float(r["s"])) for r in rows]
        ids_parts, score_parts = [], []
        for chat_no in chat_nos:
            cm = await self._matrix(conn, chat_no)
            if cm.mat is not None and len(cm.ids):
                ids_parts.append(cm.ids)
                score_parts.append(cm.mat @ qv)
        if not ids_parts:
            return []
        ids = np.concatenate(ids_parts)
        scores = np.concatenate(score_parts)
        k = min(n, len(ids))
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        return [(int(ids[i]), float(scores[i])) for i in top]


def vector_text(v: np.ndarray) -> str:
    return "[" + ",".join(f"{x:.7g}" for x in v) + "]"


class PgSearchMaintenance:
    """Embeds new messages every ``every`` seconds while this replica serves the bot
    (``search.semantic`` on PostgreSQL). Failures are logged; searches never wait."""

    def __init__(self, db: PgDatabase, embedder: Embedder, *, every: float = 5.0) -> None:
        self._db = db
        self._embedder = embedder
        self._every = every
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="search-maintenance")

    async def _run(self) -> None:
        import structlog

        log = structlog.get_logger(__name__)
        while True:
            try:
                n = await embed_pending(self._db, self._embedder)
                if n:
                    log.info("search.embedded", messages=n)
            except Exception as e:  # loop boundary: log, wait, try again
                log.error("search.embed_failed", error=repr(e))
            await asyncio.sleep(self._every)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
