"""``OutboxRepository`` on PostgreSQL (see ``gateway/delivery/outbox.py`` for the rules).

Several replicas run a delivery loop on the same rows: ``claim`` is an
``UPDATE … WHERE state = 'queued'`` (the row lock makes the second claimant see the new
state and get nothing), and records the ``sender`` and ``claimed_at``. Start-up recovery
(``recover_in_flight``) re-queues, labelled as possible duplicates, only this replica's
own in-flight rows and those whose claim is older than ``lease_s`` (a dead replica's),
never a live replica's send in progress. While replicas run, ``requeue_orphans`` (the
periodic sweep, ``gateway/replicas.py``) does the same for the sends of replicas that
are not alive (``storage_pg/heartbeats.py``), without waiting for a start or the lease.

``enqueue_within`` takes the caller's open transaction like the SQLite one, but is a
coroutine here (an async connection): ``PgCronStore`` awaits it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from mnemo.gateway.delivery.outbox import OutboxRow, _row
from mnemo.gateway.events import ChatRef, OutboundMessage
from mnemo.gateway.storage_pg.heartbeats import dead_owner
from mnemo.memory.pg.db import Connection, PgDatabase
from mnemo.memory.pg.sessions import no_nul

SEND_LEASE_S = 300.0  # a send claimed longer ago than this belongs to a dead replica


class PgOutbox:
    """``OutboxRepository`` on PostgreSQL."""

    def __init__(
        self,
        db: PgDatabase,
        *,
        clock: Callable[[], float] = time.time,
        owner: str = "mnemo",
        lease_s: float = SEND_LEASE_S,
    ) -> None:
        self.db = db
        self._clock = clock
        self.owner = owner
        self.lease_s = lease_s

    async def enqueue(
        self,
        message: OutboundMessage,
        *,
        kind: str = "reply",
        session_id: str | None = None,
        inbox_id: int | None = None,
    ) -> int:
        now = self._clock()
        return await self.db.write(
            lambda c: self.enqueue_within(
                c, message, kind=kind, session_id=session_id, inbox_id=inbox_id, now=now
            )
        )

    async def enqueue_within(
        self,
        tx: Connection,
        message: OutboundMessage,
        *,
        kind: str = "reply",
        session_id: str | None = None,
        inbox_id: int | None = None,
        now: float,
    ) -> int:
        chat = message.chat
        r = await (
            await tx.execute(
                "INSERT INTO outbox(platform, chat_id, thread_id, text, kind, reply_to, mention_user_id,"
                " session_id, inbox_id, created_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (inbox_id) WHERE inbox_id IS NOT NULL DO NOTHING RETURNING id",
                (
                    chat.platform,
                    chat.chat_id,
                    chat.thread_id,
                    no_nul(message.text),
                    kind,
                    message.reply_to_message_id,
                    message.mention_user_id,
                    session_id,
                    inbox_id,
                    now,
                ),
            )
        ).fetchone()
        if r is None:  # a reply to this inbox row exists already (from any replica)
            r = await (await tx.execute("SELECT id FROM outbox WHERE inbox_id = %s", (inbox_id,))).fetchone()
            assert r is not None
        return int(r["id"])

    async def get(self, row_id: int) -> OutboxRow | None:
        async def q(c: Connection) -> OutboxRow | None:
            r = await (await c.execute("SELECT * FROM outbox WHERE id = %s", (row_id,))).fetchone()
            return None if r is None else _row(r)

        return await self.db.read(q)

    async def due(self, platforms: set[str], limit: int = 50) -> list[OutboxRow]:
        if not platforms:
            return []
        now = self._clock()

        async def q(c: Connection) -> list[OutboxRow]:
            cur = await c.execute(
                "SELECT * FROM outbox WHERE state = 'queued' AND not_before <= %s AND platform = ANY(%s::text[])"
                " ORDER BY id LIMIT %s",
                (now, sorted(platforms), limit),
            )
            return [_row(r) for r in await cur.fetchall()]

        return await self.db.read(q)

    async def recover_in_flight(self) -> int:
        stale = self._clock() - self.lease_s

        async def tx(c: Connection) -> int:
            cur = await c.execute(
                "UPDATE outbox SET state = 'queued', possible_duplicate = true, sender = NULL"
                " WHERE state = 'sending' AND (sender = %s OR sender IS NULL OR claimed_at < %s)",
                (self.owner, stale),
            )
            return cur.rowcount

        return await self.db.write(tx)

    async def requeue_orphans(self) -> int:
        """Re-queue, labelled as possible duplicates, the sends in flight of replicas that
        are not alive."""

        async def tx(c: Connection) -> int:
            cur = await c.execute(
                "UPDATE outbox SET state = 'queued', possible_duplicate = true, sender = NULL"
                f" WHERE state = 'sending' AND sender IS DISTINCT FROM %s AND {dead_owner('sender')}",
                (self.owner,),
            )
            return cur.rowcount

        return await self.db.write(tx)

    async def claim(self, row_id: int) -> bool:
        """Claim a queued row — unless another sender is still sending an earlier row of
        the same chat: then the chat's order belongs to that sender (its delivery loop
        sends the chat's rows one after another), and this one tries again next round.
        Claims of one chat are serialised by a transaction lock, so two replicas cannot
        each see the other's earlier row still queued."""
        now = self._clock()

        async def tx(c: Connection) -> bool:
            row = await (
                await c.execute("SELECT platform, chat_id FROM outbox WHERE id = %s", (row_id,))
            ).fetchone()
            if row is None:
                return False
            await c.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 2))",
                (f"outbox:{row['platform']}:{row['chat_id']}",),
            )
            cur = await c.execute(
                "UPDATE outbox SET state = 'sending', attempts = attempts + 1, sender = %(me)s, claimed_at = %(now)s"
                " WHERE id = %(id)s AND state = 'queued' AND NOT EXISTS (SELECT 1 FROM outbox e"
                " WHERE e.platform = outbox.platform AND e.chat_id = outbox.chat_id AND e.id < outbox.id"
                " AND e.state = 'sending' AND e.sender IS DISTINCT FROM %(me)s)",
                {"me": self.owner, "now": now, "id": row_id},
            )
            return cur.rowcount == 1

        return await self.db.write(tx)

    async def _update(self, sql: str, args: tuple[object, ...]) -> int:
        async def tx(c: Connection) -> int:
            return (await c.execute(sql, args)).rowcount

        return await self.db.write(tx)

    async def mark_sent(self, row_id: int, platform_ids: list[str]) -> None:
        await self._update(
            "UPDATE outbox SET state = 'sent', sent_at = %s, platform_ids = %s, error = NULL WHERE id = %s",
            (self._clock(), json.dumps(platform_ids), row_id),
        )

    async def mark_retry(self, row_id: int, delay_s: float, error: str) -> None:
        await self._update(
            "UPDATE outbox SET state = 'queued', not_before = %s, error = %s WHERE id = %s",
            (self._clock() + delay_s, error, row_id),
        )

    async def mark_failed(self, row_id: int, error: str) -> None:
        await self._update("UPDATE outbox SET state = 'failed', error = %s WHERE id = %s", (error, row_id))

    async def release(self, chat: ChatRef) -> int:
        now = self._clock()
        return await self._update(
            "UPDATE outbox SET not_before = %s WHERE state = 'queued' AND platform = %s AND chat_id = %s"
            " AND not_before > %s",
            (now, chat.platform, chat.chat_id, now),
        )

    async def counts(self) -> dict[str, int]:
        async def q(c: Connection) -> dict[str, int]:
            rows = await (
                await c.execute("SELECT state, count(*) AS n FROM outbox GROUP BY state")
            ).fetchall()
            return {r["state"]: int(r["n"]) for r in rows}

        return await self.db.read(q)
