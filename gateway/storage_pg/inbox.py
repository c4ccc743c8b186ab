"""``InboxRepository`` on PostgreSQL (see ``gateway/delivery/inbox.py`` for the rules).
Insert-or-ignore on (platform, chat_id, message_id) is ``ON CONFLICT DO NOTHING``, so a
redelivered update accepted by any replica (a webhook behind a load balancer) is one row."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC
from typing import Any

from mnemo.gateway.delivery.inbox import InboxRow, InboxState
from mnemo.memory.errors import StoreError
from mnemo.memory.pg.db import Connection, PgDatabase
from mnemo.memory.sessions import Clock, utc_now

_COLUMNS = "id, platform, chat_id, message_id, payload, state, attempts, error, received_at, updated_at"


def _row(r: Mapping[str, Any]) -> InboxRow:
    return InboxRow(
        id=r["id"],
        platform=r["platform"],
        chat_id=r["chat_id"],
        message_id=r["message_id"],
        payload=json.loads(r["payload"]),
        state=InboxState(r["state"]),
        attempts=r["attempts"],
        error=r["error"],
        received_at=r["received_at"].astimezone(UTC),
        updated_at=r["updated_at"].astimezone(UTC),
    )


class PgInbox:
    """``InboxRepository`` on PostgreSQL."""

    def __init__(self, db: PgDatabase, *, clock: Clock = utc_now) -> None:
        self._db = db
        self._clock = clock

    async def accept(
        self, platform: str, chat_id: str, message_id: str, payload: Mapping[str, Any]
    ) -> InboxRow | None:
        body = json.dumps(dict(payload), ensure_ascii=False)
        now = self._clock()

        async def tx(conn: Connection) -> InboxRow | None:
            cur = await conn.execute(
                "INSERT INTO inbox (platform, chat_id, message_id, payload, received_at, updated_at)"
                " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (platform, chat_id, message_id) DO NOTHING"
                f" RETURNING {_COLUMNS}",
                (platform, chat_id, message_id, body, now, now),
            )
            r = await cur.fetchone()
            return None if r is None else _row(r)

        return await self._db.write(tx)

    async def mark_processing(self, inbox_id: int) -> None:
        await self._move(inbox_id, InboxState.PROCESSING, None, ", attempts = attempts + 1")

    async def mark_done(self, inbox_id: int) -> None:
        await self._move(inbox_id, InboxState.DONE, None)

    async def mark_failed(self, inbox_id: int, error: str) -> None:
        await self._move(inbox_id, InboxState.FAILED, error)

    async def _move(self, inbox_id: int, state: InboxState, error: str | None, extra: str = "") -> None:
        now = self._clock()

        async def tx(conn: Connection) -> None:
            cur = await conn.execute(
                f"UPDATE inbox SET state = %s, error = %s, updated_at = %s{extra} WHERE id = %s",
                (state.value, error, now, inbox_id),
            )
            if cur.rowcount == 0:
                raise StoreError(f"inbox row {inbox_id} does not exist")

        await self._db.write(tx)

    async def unfinished(self) -> list[InboxRow]:
        async def q(conn: Connection) -> list[InboxRow]:
            cur = await conn.execute(
                f"SELECT {_COLUMNS} FROM inbox WHERE state IN ('received', 'processing') ORDER BY id"
            )
            return [_row(r) for r in await cur.fetchall()]

        return await self._db.read(q)

    async def get(self, inbox_id: int) -> InboxRow | None:
        async def q(conn: Connection) -> InboxRow | None:
            r = await (await conn.execute(f"SELECT {_COLUMNS} FROM inbox WHERE id = %s", (inbox_id,))).fetchone()
            return None if r is None else _row(r)

        return await self._db.read(q)
