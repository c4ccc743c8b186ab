"""``StreamLedger`` on PostgreSQL (see ``gateway/delivery/streams.py`` for the rules)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from mnemo.gateway.delivery.streams import StreamRecord
from mnemo.gateway.events import ChatRef
from mnemo.memory.pg.db import Connection, PgDatabase


def _record(r: Any) -> StreamRecord:
    return StreamRecord(
        int(r["inbox_id"]),
        ChatRef(r["platform"], r["chat_id"], r["thread_id"]),
        r["message_id"],
        r["created_at"],
    )


class PgStreamRecords:
    """``StreamLedger`` on PostgreSQL."""

    def __init__(self, db: PgDatabase, *, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self._clock = clock

    async def _update(self, sql: str, args: tuple[object, ...]) -> int:
        async def tx(c: Connection) -> int:
            return (await c.execute(sql, args)).rowcount

        return await self.db.write(tx)

    async def record(self, inbox_id: int, chat: ChatRef, message_id: str) -> None:
        await self._update(
            "INSERT INTO streams(inbox_id, platform, chat_id, thread_id, message_id, created_at)"
            " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (inbox_id) DO UPDATE SET platform = EXCLUDED.platform,"
            " chat_id = EXCLUDED.chat_id, thread_id = EXCLUDED.thread_id, message_id = EXCLUDED.message_id",
            (inbox_id, chat.platform, chat.chat_id, chat.thread_id, message_id, self._clock()),
        )

    async def get(self, inbox_id: int) -> StreamRecord | None:
        async def q(c: Connection) -> StreamRecord | None:
            r = await (await c.execute("SELECT * FROM streams WHERE inbox_id = %s", (inbox_id,))).fetchone()
            return None if r is None else _record(r)

        return await self.db.read(q)

    async def forget(self, inbox_id: int) -> None:
        await self._update("DELETE FROM streams WHERE inbox_id = %s", (inbox_id,))

    async def purge_delivered(self) -> int:
        return await self._update(
            "DELETE FROM streams WHERE inbox_id IN"
            " (SELECT inbox_id FROM outbox WHERE inbox_id IS NOT NULL AND state IN ('sent', 'failed'))",
            (),
        )
