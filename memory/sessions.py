"""Layer 2: the session store — every message of every chat, with token use and cost.

A *session* is one conversation of one chat (session key, ``chat_key``) from its start
to ``/reset``, a compression rollover (a new session whose ``parent_session_id`` is the
old one) or another explicit end. Its system prompt is stored once and sent byte for
byte on every request of the session. Messages are append-only; each batch is one
transaction, so a turn is stored whole or not at all.

All SQL runs through ``memory.db.Database`` (writer thread / reader pool). Timestamps
are stored as UTC ISO-8601 text with microseconds (lexicographic order = time order);
a naive ``datetime`` handed in is taken to be UTC.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, get_args

from mnemo.memory import cjk
from mnemo.memory.db import Database
from mnemo.memory.errors import StoreError
from mnemo.memory.tokens import estimate_json_tokens, estimate_tokens
from mnemo.memory.usage import Usage

Role = Literal["user", "assistant", "tool"]
ROLES: tuple[str, ...] = get_args(Role)

Clock = Callable[[], datetime]

# Called inside the write that adds a request's usage to its session, with the person
# it is billed to (``PLATFORM:ID``, or None for background work of a shared room), so a
# spending counter kept beside the sessions is exact: it commits with them or not at all.
UsageRecorder = Callable[[sqlite3.Connection, "str | None", Usage], None]


def utc_now() -> datetime:
    return datetime.now(UTC)


def to_db_time(dt: datetime) -> str:
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.astimezone(UTC).isoformat(timespec="microseconds")


def from_db_time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    input: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "input": dict(self.input)}


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A message to append. ``content`` is the text FTS indexes."""

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    tool_name: str | None = None
    is_error: bool = False
    author_id: str | None = None
    author_name: str | None = None
    platform_message_id: str | None = None
    created_at: datetime | None = None  # None: the store's clock
    token_count: int | None = None  # None: estimated from content and tool calls
    finish_reason: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")
        if not isinstance(self.content, str):
            raise TypeError("content must be a str")
        object.__setattr__(self, "tool_calls", tuple(self.tool_calls))


@dataclass(frozen=True, slots=True)
class MessageRow:
    id: int
    session_id: str
    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...]
    tool_call_id: str | None
    tool_name: str | None
    is_error: bool
    author_id: str | None
    author_name: str | None
    platform_message_id: str | None
    created_at: datetime
    token_count: int
    finish_reason: str | None
    meta: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class SessionRow:
    id: str
    chat_key: str
    platform: str
    chat_id: str
    thread_id: str | None
    user_id: str | None
    agent_context: str
    source: str
    model: str
    system_prompt: str
    parent_session_id: str | None
    started_at: datetime
    ended_at: datetime | None
    end_reason: str | None
    message_count: int
    tool_call_count: int
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    estimated_cost_usd: float
    title: str | None

    @property
    def is_ended(self) -> bool:
        return self.ended_at is not None


_SESSION_COLUMNS = (
    "id, chat_key, platform, chat_id, thread_id, user_id, agent_context, source, model, system_prompt, "
    "parent_session_id, started_at, ended_at, end_reason, message_count, tool_call_count, input_tokens, "
    "output_tokens, cache_read_tokens, cache_write_tokens, estimated_cost_usd, title"
)
_MESSAGE_COLUMNS = (
    "id, session_id, role, content, tool_calls, tool_call_id, tool_name, is_error, author_id, author_name, "
    "platform_message_id, created_at, token_count, finish_reason, meta"
)


def session_from_row(r: sqlite3.Row) -> SessionRow:
    started = from_db_time(r["started_at"])
    assert started is not None
    return SessionRow(
        id=r["id"],
        chat_key=r["chat_key"],
        platform=r["platform"],
        chat_id=r["chat_id"],
        thread_id=r["thread_id"],
        user_id=r["user_id"],
        agent_context=r["agent_context"],
        source=r["source"],
        model=r["model"],
        system_prompt=r["system_prompt"],
        parent_session_id=r["parent_session_id"],
        started_at=started,
        ended_at=from_db_time(r["ended_at"]),
        end_reason=r["end_reason"],
        message_count=r["message_count"],
        tool_call_count=r["tool_call_count"],
        input_tokens=r["input_tokens"],
        output_tokens=r["output_tokens"],
        cache_read_tokens=r["cache_read_tokens"],
        cache_write_tokens=r["cache_write_tokens"],
        estimated_cost_usd=r["estimated_cost_usd"],
        title=r["title"],
    )


def message_from_row(
    r: Mapping[str, Any], to_time: Callable[[Any], datetime | None] = from_db_time
) -> MessageRow:
    """A stored message row (SQLite's, or another backend's with its own ``to_time``)."""
    calls = json.loads(r["tool_calls"]) if r["tool_calls"] else []
    created = to_time(r["created_at"])
    assert created is not None
    return MessageRow(
        id=r["id"],
        session_id=r["session_id"],
        role=r["role"],
        content=r["content"],
        tool_calls=tuple(ToolCall(c["id"], c["name"], c["input"]) for c in calls),
        tool_call_id=r["tool_call_id"],
        tool_name=r["tool_name"],
        is_error=bool(r["is_error"]),
        author_id=r["author_id"],
        author_name=r["author_name"],
        platform_message_id=r["platform_message_id"],
        created_at=created,
        token_count=r["token_count"],
        finish_reason=r["finish_reason"],
        meta=json.loads(r["meta"]),
    )


def message_tokens(m: NewMessage, calls: list[dict[str, Any]]) -> int:
    """The ``token_count`` stored for ``m`` (``calls``: its tool calls as JSON)."""
    if m.token_count is not None:
        return m.token_count
    # Same figure as estimate_tokens; the ASCII shortcut avoids a per-char loop.
    text_tokens = (len(m.content) + 3) // 4 if m.content.isascii() else estimate_tokens(m.content)
    return text_tokens + (estimate_json_tokens(calls) if calls else 0)


def stored_row(session_id: str, row_id: int, m: NewMessage, now: datetime) -> MessageRow:
    """The row ``append_messages`` stored for ``m`` under ``row_id``, as ``load_messages``
    reads it back (same token count, JSON-normalised calls and meta), without the read: a
    turn appends to the history it loaded. ``created_at`` is ``m``'s or ``now`` — the
    caller's clock, within moments of the store's."""
    as_json = [c.to_json() for c in m.tool_calls]
    calls = json.loads(json.dumps(as_json, ensure_ascii=False)) if as_json else []
    return MessageRow(
        id=row_id,
        session_id=session_id,
        role=m.role,
        content=m.content,
        tool_calls=tuple(ToolCall(c["id"], c["name"], c["input"]) for c in calls),
        tool_call_id=m.tool_call_id,
        tool_name=m.tool_name,
        is_error=m.is_error,
        author_id=m.author_id,
        author_name=m.author_name,
        platform_message_id=m.platform_message_id,
        created_at=m.created_at or now,
        token_count=message_tokens(m, as_json),
        finish_reason=m.finish_reason,
        meta=json.loads(json.dumps(dict(m.meta), ensure_ascii=False)) if m.meta else {},
    )


def new_session_id(started: datetime) -> str:
    # Time-ordered and readable in logs; 32 random bits make same-second ids unique.
    return f"{started.astimezone(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(4)}"


class SessionStore:
    """Async CRUD for sessions and messages. Cheap to construct; share the Database."""

    def __init__(self, db: Database, *, clock: Clock = utc_now) -> None:
        self._db = db
        self._clock = clock
        self._usage_recorder: UsageRecorder | None = None

    def record_usage_in(self, recorder: UsageRecorder) -> None:
        """Bind the spending ledger (``gateway/budgets``) once, before the first turn."""
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
        sid = session_id or new_session_id(started)

        def tx(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO chats(chat_key) VALUES (?) ON CONFLICT(chat_key) DO NOTHING", (chat_key,)
            )
            chat_no = conn.execute("SELECT id FROM chats WHERE chat_key = ?", (chat_key,)).fetchone()[0]
            if (
                parent_session_id is not None
                and not conn.execute("SELECT 1 FROM sessions WHERE id = ?", (parent_session_id,)).fetchone()
            ):
                raise StoreError(f"parent session {parent_session_id!r} does not exist")
            conn.execute(
                "INSERT INTO sessions (id, chat_no, chat_key, platform, chat_id, thread_id, user_id, agent_context,"
                " source, model, system_prompt, parent_session_id, started_at, title)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    sid,
                    chat_no,
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
                    to_db_time(started),
                    title,
                ),
            )

        await self._db.write(tx)
        row = await self.get_session(sid)
        assert row is not None
        return row

    async def get_session(self, session_id: str) -> SessionRow | None:
        def q(conn: sqlite3.Connection) -> SessionRow | None:
            r = conn.execute(
                f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = ?", (session_id,)
            ).fetchone()
            return None if r is None else session_from_row(r)

        return await self._db.read(q)

    async def active_session(self, chat_key: str, source: str = "chat") -> SessionRow | None:
        """The latest session of ``chat_key`` and ``source`` that has not ended."""

        def q(conn: sqlite3.Connection) -> SessionRow | None:
            r = conn.execute(
                f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE chat_key = ? AND source = ? AND ended_at IS NULL"
                " ORDER BY started_at DESC, rowid DESC LIMIT 1",
                (chat_key, source),
            ).fetchone()
            return None if r is None else session_from_row(r)

        return await self._db.read(q)

    async def end_session(self, session_id: str, reason: str) -> None:
        """Mark the session ended; the first reason wins (later calls change nothing)."""
        ended = to_db_time(self._clock())
        await self._db.write(
            lambda conn: conn.execute(
                "UPDATE sessions SET ended_at = ?, end_reason = ? WHERE id = ? AND ended_at IS NULL",
                (ended, reason, session_id),
            )
        )

    async def switch_session(
        self, old_id: str, new_id: str, *, pending_source: str, reason: str = "compression"
    ) -> bool:
        """A rollover's commit point, in one transaction: end ``old_id`` and publish
        ``new_id`` (assembled under ``pending_source``, so never the chat's active
        session before this) as a ``chat`` session; end any leftover of an earlier
        attempt that died before this point. False (and the new session abandoned) when
        the old session was ended meanwhile, e.g. by ``/reset``."""
        now = to_db_time(self._clock())

        def tx(conn: sqlite3.Connection) -> bool:
            ended = conn.execute(
                "UPDATE sessions SET ended_at = ?, end_reason = ? WHERE id = ? AND ended_at IS NULL",
                (now, reason, old_id),
            ).rowcount
            if ended:
                conn.execute("UPDATE sessions SET source = 'chat' WHERE id = ?", (new_id,))
            conn.execute(
                "UPDATE sessions SET ended_at = ?, end_reason = 'abandoned'"
                " WHERE parent_session_id = ? AND source = ? AND ended_at IS NULL",
                (now, old_id, pending_source),
            )
            return bool(ended)

        return await self._db.write(tx)

    async def set_title(self, session_id: str, title: str | None) -> None:
        await self._db.write(
            lambda c: c.execute("UPDATE sessions SET title = ? WHERE id = ?", (title, session_id))
        )

    async def list_sessions(self, chat_key: str | None, limit: int = 20) -> list[SessionRow]:
        """Newest first; ``chat_key=None`` lists every chat's sessions."""

        def q(conn: sqlite3.Connection) -> list[SessionRow]:
            if chat_key is None:
                rows = conn.execute(
                    f"SELECT {_SESSION_COLUMNS} FROM sessions ORDER BY started_at DESC, rowid DESC LIMIT ?",
                    (limit,),
                )
            else:
                rows = conn.execute(
                    f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE chat_key = ?"
                    " ORDER BY started_at DESC, rowid DESC LIMIT ?",
                    (chat_key, limit),
                )
            return [session_from_row(r) for r in rows]

        return await self._db.read(q)

    async def session_chain(self, session_id: str) -> list[SessionRow]:
        """The compression lineage of ``session_id``, root first, ending with it."""

        def q(conn: sqlite3.Connection) -> list[SessionRow]:
            rows = conn.execute(
                "WITH RECURSIVE chain(id, depth) AS ("
                " SELECT id, 0 FROM sessions WHERE id = ?"
                " UNION ALL SELECT s.parent_session_id, chain.depth + 1 FROM sessions s JOIN chain ON s.id = chain.id"
                "  WHERE s.parent_session_id IS NOT NULL AND chain.depth < 10000)"
                f" SELECT {', '.join('s.' + c.strip() for c in _SESSION_COLUMNS.split(','))}"
                " FROM chain JOIN sessions s ON s.id = chain.id ORDER BY chain.depth DESC",
                (session_id,),
            )
            return [session_from_row(r) for r in rows]

        return await self._db.read(q)

    async def add_usage(self, session_id: str, usage: Usage, *, payer: str | None = None) -> None:
        """Add one request's usage to its session and, in the same transaction, to the
        ledger bound with ``record_usage_in`` (billed to ``payer``)."""
        await self._db.write(lambda conn: self._add_usage(conn, session_id, usage, payer))

    def _add_usage(self, conn: sqlite3.Connection, session_id: str, usage: Usage, payer: str | None) -> None:
        conn.execute(
            "UPDATE sessions SET input_tokens = input_tokens + ?, output_tokens = output_tokens + ?,"
            " cache_read_tokens = cache_read_tokens + ?, cache_write_tokens = cache_write_tokens + ?,"
            " estimated_cost_usd = estimated_cost_usd + ? WHERE id = ?",
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
            self._usage_recorder(conn, payer, usage)

    # --- messages -----------------------------------------------------------------
    async def append_messages(
        self,
        session_id: str,
        messages: Sequence[NewMessage],
        *,
        usage: Usage | None = None,
        payer: str | None = None,
    ) -> list[int]:
        """Append ``messages`` in one transaction; return their ids in order. With
        ``usage``, the request that produced them is counted in the same transaction
        (``add_usage``): one round trip for a model's answer and its cost."""
        if not messages:
            return []
        now = self._clock()
        rows = [self._message_values(m, now) for m in messages]

        def tx(conn: sqlite3.Connection) -> list[int]:
            if usage is not None:
                self._add_usage(conn, session_id, usage, payer)
            return insert_messages(conn, session_id, rows)

        return await self._db.write(tx)

    @staticmethod
    def _message_values(m: NewMessage, now: datetime) -> tuple[Any, ...]:
        calls = [c.to_json() for c in m.tool_calls]
        tokens = message_tokens(m, calls)
        return (
            m.role,
            m.content,
            json.dumps(calls, ensure_ascii=False) if calls else None,
            m.tool_call_id,
            m.tool_name,
            int(m.is_error),
            m.author_id,
            m.author_name,
            m.platform_message_id,
            to_db_time(m.created_at or now),
            tokens,
            m.finish_reason,
            json.dumps(dict(m.meta), ensure_ascii=False),
            cjk.index_text(m.content),
        )

    async def load_messages(self, session_id: str) -> list[MessageRow]:
        def q(conn: sqlite3.Connection) -> list[MessageRow]:
            rows = conn.execute(
                f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE session_id = ? ORDER BY id", (session_id,)
            )
            return [message_from_row(r) for r in rows]

        return await self._db.read(q)

    async def last_activity(self, session_id: str) -> datetime | None:
        """When the session's newest message was stored; None for a session without
        messages (the idle/daily reset policy then counts from its start)."""

        def q(conn: sqlite3.Connection) -> datetime | None:
            row = conn.execute(
                "SELECT MAX(created_at) FROM messages WHERE session_id = ?", (session_id,)
            ).fetchone()
            return from_db_time(row[0]) if row and row[0] is not None else None

        return await self._db.read(q)

    async def get_messages(self, ids: Sequence[int]) -> list[MessageRow]:
        """Messages by id, in the order of ``ids`` (unknown ids are skipped)."""

        def q(conn: sqlite3.Connection) -> list[MessageRow]:
            marks = ",".join("?" * len(ids))
            found = {
                r["id"]: message_from_row(r)
                for r in conn.execute(
                    f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE id IN ({marks})", tuple(ids)
                )
            }
            return [found[i] for i in ids if i in found]

        return await self._db.read(q) if ids else []


def insert_messages(conn: sqlite3.Connection, session_id: str, rows: Sequence[tuple[Any, ...]]) -> list[int]:
    """The write path of ``append_messages`` (inside the caller's transaction).

    One statement per message: the chat number comes from the session row in the same
    INSERT, and a trigger bumps the session's counters.
    """
    ids = []
    for values in rows:
        cur = conn.execute(
            "INSERT INTO messages (session_id, chat_no, role, content, tool_calls, tool_call_id, tool_name, is_error,"
            " author_id, author_name, platform_message_id, created_at, token_count, finish_reason, meta, cjk)"
            " SELECT id, chat_no, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ? FROM sessions WHERE id = ?",
            (*values, session_id),
        )
        if cur.rowcount != 1:
            raise StoreError(f"session {session_id!r} does not exist")
        ids.append(int(cur.lastrowid or 0))
    return ids
