"""The durable inbox: an accepted platform message is on disk before it is acknowledged.

``accept`` is insert-or-ignore on (platform, chat_id, message_id), so a platform that
redelivers an update (Telegram after a restart, a webhook retry) produces no second
row and no second answer. A row moves ``received → processing → done | failed``.
On start-up the gateway re-queues ``unfinished()`` rows: ``received`` ones were never
started, ``processing`` ones were interrupted by a crash. ``attempts`` counts how often
processing *started* (it is bumped by ``mark_processing``), so a message that crashes
the process every time can be recognised and failed instead of looping forever.
``failed`` is terminal.

``InboxRepository`` is the port; ``Inbox`` its SQLite implementation (table ``inbox``,
schema in ``schema.py``). Every backend passes ``tests/contract/test_inbox.py``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol

from mnemo.memory.db import Database
from mnemo.memory.errors import StoreError
from mnemo.memory.sessions import Clock, from_db_time, to_db_time, utc_now


class InboxState(StrEnum):
    RECEIVED = "received"
    PROCESSING = "processing"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class InboxRow:
    id: int
    platform: str
    chat_id: str
    message_id: str
    payload: Mapping[str, Any]
    state: InboxState
    attempts: int
    error: str | None
    received_at: datetime
    updated_at: datetime


_COLUMNS = "id, platform, chat_id, message_id, payload, state, attempts, error, received_at, updated_at"


def _row(r: sqlite3.Row) -> InboxRow:
    received, updated = from_db_time(r["received_at"]), from_db_time(r["updated_at"])
    assert received is not None and updated is not None
    return InboxRow(
        id=r["id"],
        platform=r["platform"],
        chat_id=r["chat_id"],
        message_id=r["message_id"],
        payload=json.loads(r["payload"]),
        state=InboxState(r["state"]),
        attempts=r["attempts"],
        error=r["error"],
        received_at=received,
        updated_at=updated,
    )


class InboxRepository(Protocol):
    """The durable inbox. Called by ``Gateway.submit`` (``accept``), the chat lanes (the
    ``mark_*`` moves) and start-up recovery (``unfinished``). Raises ``StoreError``:
    ``StoreBusy`` when locked too long, plain ``StoreError`` for a row that does not
    exist."""

    async def accept(
        self, platform: str, chat_id: str, message_id: str, payload: Mapping[str, Any]
    ) -> InboxRow | None:
        """Store a new message, state ``received``; None when (platform, chat_id,
        message_id) was already accepted."""
        ...

    async def mark_processing(self, inbox_id: int) -> None:
        """→ processing, one more attempt."""
        ...

    async def mark_done(self, inbox_id: int) -> None: ...

    async def mark_failed(self, inbox_id: int, error: str) -> None: ...

    async def unfinished(self) -> list[InboxRow]:
        """Rows received or processing, oldest first."""
        ...

    async def get(self, inbox_id: int) -> InboxRow | None: ...


class Inbox:
    """``InboxRepository`` on ``state.db``."""

    def __init__(self, db: Database, *, clock: Clock = utc_now) -> None:
        self._db = db
        self._clock = clock

    async def accept(
        self, platform: str, chat_id: str, message_id: str, payload: Mapping[str, Any]
    ) -> InboxRow | None:
        """Store a new inbound message; None when it was already accepted (a duplicate)."""
        body = json.dumps(dict(payload), ensure_ascii=False)
        now = to_db_time(self._clock())

        def tx(conn: sqlite3.Connection) -> InboxRow | None:
            cur = conn.execute(
                "INSERT INTO inbox (platform, chat_id, message_id, payload, received_at, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (platform, chat_id, message_id) DO NOTHING",
                (platform, chat_id, message_id, body, now, now),
            )
            if cur.rowcount == 0:
                return None
            return _row(
                conn.execute(f"SELECT {_COLUMNS} FROM inbox WHERE id = ?", (cur.lastrowid,)).fetchone()
            )

        return await self._db.write(tx)

    async def mark_processing(self, inbox_id: int) -> None:
        await self._move(inbox_id, InboxState.PROCESSING, None, "attempts = attempts + 1")

    async def mark_done(self, inbox_id: int) -> None:
        await self._move(inbox_id, InboxState.DONE, None)

    async def mark_failed(self, inbox_id: int, error: str) -> None:
        await self._move(inbox_id, InboxState.FAILED, error)

    async def _move(self, inbox_id: int, state: InboxState, error: str | None, extra: str = "") -> None:
        now = to_db_time(self._clock())
        sets = "state = ?, error = ?, updated_at = ?" + (f", {extra}" if extra else "")

        def tx(conn: sqlite3.Connection) -> None:
            cur = conn.execute(f"UPDATE inbox SET {sets} WHERE id = ?", (state.value, error, now, inbox_id))
            if cur.rowcount == 0:
                raise StoreError(f"inbox row {inbox_id} does not exist")

        await self._db.write(tx)

    async def unfinished(self) -> list[InboxRow]:
        """Rows received or processing, oldest first: what to re-run after a restart."""

        def q(conn: sqlite3.Connection) -> list[InboxRow]:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM inbox WHERE state IN ('received', 'processing') ORDER BY id"
            )
            return [_row(r) for r in rows]

        return await self._db.read(q)

    async def get(self, inbox_id: int) -> InboxRow | None:
        def q(conn: sqlite3.Connection) -> InboxRow | None:
            r = conn.execute(f"SELECT {_COLUMNS} FROM inbox WHERE id = ?", (inbox_id,)).fetchone()
            return None if r is None else _row(r)

        return await self._db.read(q)
