"""``SessionRepository`` on PostgreSQL: the same sessions and messages as
``memory/sessions.py``, with the same rules (a batch of messages is one transaction, the
first end reason wins, the frozen system prompt is stored once) and the extra methods the
agent, the lanes and the commands use (usage, rollover, titles, listing, chains).

Timestamps are ``timestamptz`` and come back as aware UTC datetimes; ids of messages are
an identity column, so they increase in insertion order like SQLite's rowids.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from mnemo.memory.errors import StoreError
from mnemo.memory.pg.db import Connection, PgDatabase
from mnemo.memory.sessions import (
    Clock,
    MessageRow,
    NewMessage,
    SessionRow,
    SessionStore,
    message_from_row,
    new_session_id,
    utc_now,
)
from mnemo.memory.usage import Usage

# ``(conn, payer, usage)``, awaited inside the usage transaction (the budget ledger).
PgUsageRecorder = Callable[[Connection, "str | None", Usage], Awaitable[None]]

SESSION_COLUMNS = (
    "id, chat_key, platform, chat_id, thread_id, user_id, agent_context, source, model, system_prompt, "
    "parent_session_id, started_at, ended_at, end_reason, message_count, tool_call_count, input_tokens, "
    "output_tokens, cache_read_tokens, cache_write_tokens, estimated_cost_usd, title"
)
MESSAGE_COLUMNS = (
    "id, session_id, role, content, tool_calls, tool_call_id, tool_name, is_error, author_id, author_name, "
    "platform_message_id, created_at, token_count, finish_reason, meta"
)


def no_nul(value: Any) -> Any:
    """PostgreSQL text cannot hold NUL: it is stored as U+FFFD (SQLite keeps it)."""
    return value.replace("\x00", "\ufffd") if isinstance(value, str) else value


def utc(dt: datetime | None) -> datetime | None:
    return None if dt is None else dt.astimezone(UTC)


def session_from_pg(r: Mapping[str, Any]) -> SessionRow:
    values = {k.strip(): r[k.strip()] for k in SESSION_COLUMNS.split(",")}
    values["started_at"] = utc(values["started_at"])
    values["ended_at"] = utc(values["ended_at"])
    return SessionRow(**values)


def message_from_pg(r: Mapping[str, Any]) -> MessageRow:
    return message_from_row(r, to_time=utc)


async def _one(conn: Connection, sql: str, args: Sequence[Any] = ()) -> dict[str, Any] | None:
    return await (await conn.execute(sql, args)).fetchone()


class PgSessionStore:
    """Sessions and messages on PostgreSQL. Cheap to construct; share the PgDatabase."""

    def __init__(self, db: PgDatabase, *, clock: Clock = utc_now) -> None:
        self._db = db
        self._clock = clock
        self._usage_recorder: PgUsageRecorder | None = None

    def record_usage_in(self, recorder: PgUsageRecorder) -> None:
        """Bind the spending ledger (``gateway/storage_pg/budgets.py``) once, before the
        first turn: ``add_usage`` calls it inside its own transaction."""
        self._usage_recorder = recorder

    # --- sessions -----------------------------------------------------------------
    async def create_session(
        self,
        *,
        chat_key: str,
        platform: str,
        chat_id: str,
        thread_id: str | None,
        user_id: str | None,
        agent_context: str,
        source: str,
        model: str,
        system_prompt: str,
        parent_session_id: str | None = None,
        title: str | None = None,
        started_at: datetime | None = None,
        session_id: str | None = None,
    ) -> SessionRow:
        """``session_id``: a stable id chosen by the caller (an importer derives it from
        the source's own id, so a second import finds the session); default: a new one."""
        started = started_at or self._clock()
        if started.tzinfo is None:
            started = started.replace(tzinfo=UTC)
        sid = session_id or new_session_id(started)

        async def tx(conn: Connection) -> SessionRow:
            await conn.execute(
                "INSERT INTO chats(chat_key) VALUES (%s) ON CONFLICT (chat_key) DO NOTHING", (chat_key,)
            )
            chat = await _one(conn, "SELECT id FROM chats WHERE chat_key = %s", (chat_key,))
            assert chat is not None
            if (
                parent_session_id is not None
                and await _one(conn, "SELECT 1 FROM sessions WHERE id = %s", (parent_session_id,)) is None
            ):
                raise StoreError(f"parent session {parent_session_id!r} does not exist")
            row = await _one(
                conn,
                "INSERT INTO sessions (id, chat_no, chat_key, platform, chat_id, thread_id, user_id, agent_context,"
                " source, model, system_prompt, parent_session_id, started_at, title)"
                f" VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING {SESSION_COLUMNS}",
                tuple(
                    no_nul(v)
                    for v in (
                        sid,
                        chat["id"],
                        chat_key,
                        platform,
                        chat_id,
                        thread_id,
                        user_id,
                        str(agent_context),
                        source,
                        model,
                        system_prompt,
                        parent_session_id,
                        started,
                        title,
                    )
                ),
            )
            assert row is not None
            return session_from_pg(row)

        return await self._db.write(tx)

    async def get_session(self, session_id: str) -> SessionRow | None:
        async def q(conn: Connection) -> SessionRow | None:
            r = await _one(conn, f"SELECT {SESSION_COLUMNS} FROM sessions WHERE id = %s", (session_id,))
            return None if r is None else session_from_pg(r)

        return await self._db.read(q)

    async def active_session(self, chat_key: str, source: str = "chat") -> SessionRow | None:
        async def q(conn: Connection) -> SessionRow | None:
            r = await _one(
                conn,
                f"SELECT {SESSION_COLUMNS} FROM sessions WHERE chat_key = %s AND source = %s AND ended_at IS NULL"
                " ORDER BY started_at DESC, seq DESC LIMIT 1",
                (chat_key, source),
            )
            return None if r is None else session_from_pg(r)

        return await self._db.read(q)

    async def end_session(self, session_id: str, reason: str) -> None:
        ended = self._clock()

        async def tx(conn: Connection) -> None:
            await conn.execute(
                "UPDATE sessions SET ended_at = %s, end_reason = %s WHERE id = %s AND ended_at IS NULL",
                (ended, reason, session_id),
            )

        await self._db.write(tx)

    async def switch_session(
        self, old_id: str, new_id: str, *, pending_source: str, reason: str = "compression"
    ) -> bool:
        """See ``SessionStore.switch_session``: the rollover's commit point."""
        now = self._clock()

        async def tx(conn: Connection) -> bool:
            ended = (
                await conn.execute(
                    "UPDATE sessions SET ended_at = %s, end_reason = %s WHERE id = %s AND ended_at IS NULL",
                    (now, reason, old_id),
                )
            ).rowcount
            if ended:
                await conn.execute("UPDATE sessions SET source = 'chat' WHERE id = %s", (new_id,))
            await conn.execute(
                "UPDATE sessions SET ended_at = %s, end_reason = 'abandoned'"
                " WHERE parent_session_id = %s AND source = %s AND ended_at IS NULL",
                (now, old_id, pending_source),
            )
            return bool(ended)

        return await self._db.write(tx)

    async def set_title(self, session_id: str, title: str | None) -> None:
        async def tx(conn: Connection) -> None:
            await conn.execute("UPDATE sessions SET title = %s WHERE id = %s", (title, session_id))

        await self._db.write(tx)

    async def list_sessions(self, chat_key: str | None, limit: int = 20) -> list[SessionRow]:
        async def q(conn: Connection) -> list[SessionRow]:
            rows = await (
                await conn.execute(
                    f"SELECT {SESSION_COLUMNS} FROM sessions WHERE %s::text IS NULL OR chat_key = %s"
                    " ORDER BY started_at DESC, seq DESC LIMIT %s",
                    (chat_key, chat_key, limit),
                )
            ).fetchall()
            return [session_from_pg(r) for r in rows]

        return await self._db.read(q)

    async def session_chain(self, session_id: str) -> list[SessionRow]:
        cols = ", ".join("s." + c.strip() for c in SESSION_COLUMNS.split(","))

        async def q(conn: Connection) -> list[SessionRow]:
            rows = await (
                await conn.execute(
                    "WITH RECURSIVE chain(id, depth) AS ("
                    " SELECT id, 0 FROM sessions WHERE id = %s"
                    " UNION ALL SELECT s.parent_session_id, chain.depth + 1 FROM sessions s JOIN"
                    " chain ON s.id = chain.id"
                    "  WHERE s.parent_session_id IS NOT NULL AND chain.depth < 10000)"
                    f" SELECT {cols} FROM chain JOIN sessions s ON s.id = chain.id ORDER BY chain.depth DESC",
                    (session_id,),
                )
            ).fetchall()
            return [session_from_pg(r) for r in rows]

        return await self._db.read(q)

    async def add_usage(self, session_id: str, usage: Usage, *, payer: str | None = None) -> None:
        """Add one request's usage to its session and, in the same transaction, to the
        ledger bound with ``record_usage_in`` (billed to ``payer``)."""

        async def tx(conn: Connection) -> None:
            await self._add_usage(conn, session_id, usage, payer)

        await self._db.write(tx)

    async def _add_usage(self, conn: Connection, session_id: str, usage: Usage, payer: str | None) -> None:
        await conn.execute(
            "UPDATE sessions SET input_tokens = input_tokens + %s, output_tokens = output_tokens + %s,"
            " cache_read_tokens = cache_read_tokens + %s, cache_write_tokens = cache_write_tokens + %s,"
            " estimated_cost_usd = estimated_cost_usd + %s WHERE id = %s",
            (
                usage.input_tokens,
                usage.output_tokens,
                usage.cache_read_tokens,
                usage.cache_write_tokens,
                usage.cost_usd,
                session_id,
            ),
        )
        if self._usage_recorder is not None:
            await self._usage_recorder(conn, payer, usage)

    # --- messages -----------------------------------------------------------------
    async def append_messages(
        self,
        session_id: str,
        messages: Sequence[NewMessage],
        *,
        usage: Usage | None = None,
        payer: str | None = None,
    ) -> list[int]:
        """All or nothing; the new message ids in order. With ``usage``, counted in the
        same transaction (``add_usage``)."""
        if not messages:
            return []
        now = self._clock()
        # The same values (token estimate, JSON, CJK text) as the SQLite store writes.
        rows = [tuple(no_nul(v) for v in SessionStore._message_values(m, now)) for m in messages]
        calls = sum(len(m.tool_calls) for m in messages)

        async def tx(conn: Connection) -> list[int]:
            if usage is not None:
                await self._add_usage(conn, session_id, usage, payer)
            session = await _one(conn, "SELECT chat_no FROM sessions WHERE id = %s FOR UPDATE", (session_id,))
            if session is None:
                raise StoreError(f"session {session_id!r} does not exist")
            ids = []
            for values in rows:
                r = await _one(
                    conn,
                    "INSERT INTO messages (session_id, chat_no, role, content, tool_calls, tool_call_id, tool_name,"
                    " is_error, author_id, author_name, platform_message_id, created_at, token_count, finish_reason,"
                    " meta, cjk) VALUES (%s, %s, %s, %s, %s, %s, %s, %s <> 0, %s, %s, %s,"
                    " %s::timestamptz, %s, %s, %s, %s)"
                    " RETURNING id",
                    (session_id, session["chat_no"], *values),
                )
                assert r is not None
                ids.append(int(r["id"]))
            await conn.execute(
                "UPDATE sessions SET message_count = message_count + %s, tool_call_count = tool_call_count + %s"
                " WHERE id = %s",
                (len(rows), calls, session_id),
            )
            return ids

        return await self._db.write(tx)

    async def load_messages(self, session_id: str) -> list[MessageRow]:
        async def q(conn: Connection) -> list[MessageRow]:
            rows = await (
                await conn.execute(
                    f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE session_id = %s ORDER BY id", (session_id,)
                )
            ).fetchall()
            return [message_from_pg(r) for r in rows]

        return await self._db.read(q)

    async def last_activity(self, session_id: str) -> datetime | None:
        async def q(conn: Connection) -> datetime | None:
            r = await _one(
                conn, "SELECT max(created_at) AS at FROM messages WHERE session_id = %s", (session_id,)
            )
            return None if r is None else utc(r["at"])

        return await self._db.read(q)

    async def get_messages(self, ids: Sequence[int]) -> list[MessageRow]:
        if not ids:
            return []

        async def q(conn: Connection) -> list[MessageRow]:
            rows = await (
                await conn.execute(f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE id = ANY(%s)", (list(ids),))
            ).fetchall()
            found = {r["id"]: message_from_pg(r) for r in rows}
            return [found[i] for i in ids if i in found]

        return await self._db.read(q)
