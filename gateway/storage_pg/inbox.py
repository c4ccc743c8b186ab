"""``InboxRepository`` on PostgreSQL (see ``gateway/delivery/inbox.py`` for the rules).
Insert-or-ignore on (platform, chat_id, message_id) is ``ON CONFLICT DO NOTHING``, so a
redelivered update accepted by any replica (a webhook behind a load balancer) is one row.

Each row records the replica that accepted it (``owner``): that replica answers it.
``unfinished`` (start-up recovery) claims this replica's own unfinished rows and those
of replicas that are not alive; ``orphaned`` (the periodic sweep, ``gateway/replicas.py``)
claims only the dead ones', never the rows a live replica has in its lanes.

Per-chat order across replicas (a webhook behind a round-robin proxy spreads one chat's
messages over several): a turn holds the session's advisory lock only when no older
unfinished row of its chat waits (``earlier_unfinished``, asked by ``Gateway``), so the
chat's messages are answered in the order they were accepted."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC
from typing import Any

from mnemo.gateway.delivery.inbox import InboxRow, InboxState
from mnemo.gateway.storage_pg.heartbeats import dead_owner
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

    def __init__(self, db: PgDatabase, *, clock: Clock = utc_now, owner: str = "mnemo") -> None:
        self._db = db
        self._clock = clock
        self.owner = owner

    async def accept(
        self, platform: str, chat_id: str, message_id: str, payload: Mapping[str, Any]
    ) -> InboxRow | None:
        body = json.dumps(dict(payload), ensure_ascii=False)
        now = self._clock()

        async def tx(conn: Connection) -> InboxRow | None:
            cur = await conn.execute(
                "INSERT INTO inbox (platform, chat_id, message_id, payload, received_at, updated_at, owner)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (platform, chat_id, message_id) DO NOTHING"
                f" RETURNING {_COLUMNS}",
                (platform, chat_id, message_id, body, now, now, self.owner),
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
        """This replica's own unfinished rows and every dead replica's, now this one's."""
        return await self._adopt(own=True)

    async def orphaned(self) -> list[InboxRow]:
        """The unfinished rows of replicas that are not alive, now this replica's."""
        return await self._adopt(own=False)

    async def _adopt(self, *, own: bool) -> list[InboxRow]:
        async def tx(conn: Connection) -> list[InboxRow]:
            # A row another replica adopts at the same moment is locked by its UPDATE;
            # this one re-checks it afterwards, finds a live owner and leaves it.
            cur = await conn.execute(
                f"UPDATE inbox SET owner = %(me)s WHERE state IN ('received', 'processing')"
                f" AND ((%(own)s AND owner = %(me)s) OR (owner IS DISTINCT FROM %(me)s AND {dead_owner('owner')}))"
                f" RETURNING {_COLUMNS}",
                {"me": self.owner, "own": own},
            )
            return sorted((_row(r) for r in await cur.fetchall()), key=lambda r: r.id)

        return await self._db.write(tx)

    async def earlier_unfinished(self, inbox_id: int, batch: Sequence[int]) -> str | None:
        """Whether an unfinished row of the same chat older than ``inbox_id`` (and not in
        ``batch``) waits: ``"other"`` — on another replica (or a dead one's, until it is
        adopted), so this turn waits; ``"own"`` — in this replica's lanes behind this turn
        (adopted from a dead replica after newer messages came), so this turn gives way;
        None — nothing older waits."""

        async def q(conn: Connection) -> str | None:
            r = await (
                await conn.execute(
                    "SELECT bool_or(e.owner IS DISTINCT FROM %(me)s) AS other, bool_or(e.owner = %(me)s) AS own"
                    " FROM inbox e JOIN inbox me ON me.id = %(id)s"
                    " WHERE e.platform = me.platform AND e.chat_id = me.chat_id AND e.id < me.id"
                    " AND e.state IN ('received', 'processing') AND NOT e.id = ANY(%(batch)s::bigint[])",
                    {"me": self.owner, "id": inbox_id, "batch": list(batch)},
                )
            ).fetchone()
            if r is None:
                return None
            return "other" if r["other"] else "own" if r["own"] else None

        return await self._db.read(q)

    async def get(self, inbox_id: int) -> InboxRow | None:
        async def q(conn: Connection) -> InboxRow | None:
            r = await (
                await conn.execute(f"SELECT {_COLUMNS} FROM inbox WHERE id = %s", (inbox_id,))
            ).fetchone()
            return None if r is None else _row(r)

        return await self._db.read(q)
