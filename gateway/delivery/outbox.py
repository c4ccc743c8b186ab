"""The durable outbox (delivery ledger) and its delivery loop.

Every reply, command answer and cron result is written here before anything is sent:

    queued ──claim──▶ sending ──▶ sent
       ▲                 │
       └── retry later ◀─┴──▶ failed (Forbidden, or attempts exhausted)

* A row still ``queued`` after a restart was never handed to the platform: it is sent
  as normal.
* A row found in ``sending`` after a restart was in flight when the process died — it
  may have gone out — so it is re-sent labelled as a possible duplicate.
* Rate limits and outages put the row back to ``queued`` with ``not_before`` set
  (backoff, or the platform's ``retry_after``); an adapter that is not connected simply
  leaves its rows waiting.

The loop is woken on every enqueue and polls every ``poll_s`` for retries.

A reply that was shown while it was generated (``streams.py``) has its platform
message in the stream ledger, keyed by the inbox row it answers: delivery hands that id
to the adapter (``OutboundMessage.stream_message_id``), which edits the message into
the reply's first part and sends the rest, and forgets it once the row is sent or
failed. Everything else about the row — states, retries, labels — is as above.

Storage is behind two small ports: ``OutboxQueue`` (whoever queues a delivery) and
``OutboxDelivery`` (the delivery loop); ``OutboxRepository`` is both, and ``Outbox`` is
its SQLite implementation (table ``outbox``, schema in ``schema.py``). Every backend
passes ``tests/contract/test_outbox.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from mnemo.gateway.delivery.streams import StreamLedger
from mnemo.gateway.errors import Forbidden, PlatformError, PlatformRateLimited
from mnemo.gateway.events import ChatRef, OutboundMessage
from mnemo.gateway.logs import get_logger
from mnemo.gateway.ports import Adapter
from mnemo.memory.db import Database, inserted_id

log = get_logger(__name__)

MAX_UNEXPECTED_ATTEMPTS = 5
DUE_BATCH = 500  # rows fetched per delivery round
MAX_PARALLEL_CHATS = 32  # chats whose replies are being sent at the same time
MAX_BACKOFF_S = 300.0


@dataclass(frozen=True, slots=True)
class OutboxRow:
    id: int
    chat: ChatRef
    text: str
    kind: str
    reply_to: str | None
    mention_user_id: str | None
    session_id: str | None
    inbox_id: int | None
    state: str
    attempts: int
    possible_duplicate: bool
    not_before: float
    created_at: float
    error: str | None

    def to_message(self) -> OutboundMessage:
        return OutboundMessage(
            chat=self.chat,
            text=self.text,
            reply_to_message_id=self.reply_to,
            mention_user_id=self.mention_user_id,
            scheduled=self.kind == "cron",
            possible_duplicate=self.possible_duplicate,
            outbox_id=self.id,
        )


def _row(r: sqlite3.Row | Mapping[str, Any]) -> OutboxRow:  # a PostgreSQL row too (storage_pg)
    return OutboxRow(
        id=r["id"],
        chat=ChatRef(r["platform"], r["chat_id"], r["thread_id"]),
        text=r["text"],
        kind=r["kind"],
        reply_to=r["reply_to"],
        mention_user_id=r["mention_user_id"],
        session_id=r["session_id"],
        inbox_id=r["inbox_id"],
        state=r["state"],
        attempts=r["attempts"],
        possible_duplicate=bool(r["possible_duplicate"]),
        not_before=r["not_before"],
        created_at=r["created_at"],
        error=r["error"],
    )


class OutboxQueue(Protocol):
    """Queue a delivery. Called by the inbound pipeline and its commands (a reply, an
    answer, a notice) and by cron (a run's result, inside the run's own transaction).
    Raises ``StoreError`` (``StoreBusy``) when the store cannot be written."""

    async def enqueue(
        self,
        message: OutboundMessage,
        *,
        kind: str = "reply",
        session_id: str | None = None,
        inbox_id: int | None = None,
    ) -> int:
        """Queue ``message``; return its row id. Idempotent per ``inbox_id``: a second
        reply to the same inbox row returns the first one's id."""
        ...

    async def get(self, row_id: int) -> OutboxRow | None: ...

    async def counts(self) -> dict[str, int]:
        """Rows per state (for metrics and ``/status``)."""
        ...


class OutboxDelivery(Protocol):
    """The delivery loop's side of the ledger (``DeliveryLoop``, one per process).
    ``claim`` is the only guard against two senders: it succeeds for one of them."""

    async def recover_in_flight(self) -> int: ...

    async def due(self, platforms: set[str], limit: int = 50) -> list[OutboxRow]:
        """Queued rows of ``platforms`` whose ``not_before`` has passed, oldest first."""
        ...

    async def claim(self, row_id: int) -> bool:
        """queued → sending (one more attempt); False when it was not queued."""
        ...

    async def mark_sent(self, row_id: int, platform_ids: list[str]) -> None: ...

    async def mark_retry(self, row_id: int, delay_s: float, error: str) -> None: ...

    async def mark_failed(self, row_id: int, error: str) -> None: ...

    async def release(self, chat: ChatRef) -> int:
        """Make the chat's backed-off rows due now; return how many."""
        ...


class OutboxRepository(OutboxQueue, OutboxDelivery, Protocol):
    """The whole outbox, as a storage backend implements it."""


class OutboxWithin(Protocol):
    """Queueing inside another repository's open ``state.db`` transaction (cron closing
    a run with its delivery). Backend-specific, so not part of ``OutboxRepository``:
    PostgreSQL's twin (``PgOutbox.enqueue_within``) awaits on its own connection type."""

    def enqueue_within(
        self,
        tx: sqlite3.Connection,
        message: OutboundMessage,
        *,
        kind: str = "reply",
        session_id: str | None = None,
        inbox_id: int | None = None,
        now: float,
    ) -> int:
        """``enqueue`` inside the caller's open write transaction ``tx`` (what the same
        backend's ``write`` handed it), so the delivery commits or rolls back with the
        caller's own rows. Runs on the writer; errors propagate and abort ``tx``."""
        ...


def _enqueue(
    conn: sqlite3.Connection,
    message: OutboundMessage,
    *,
    kind: str,
    session_id: str | None,
    inbox_id: int | None,
    now: float,
) -> int:
    if inbox_id is not None:
        existing = conn.execute("SELECT id FROM outbox WHERE inbox_id = ?", (inbox_id,)).fetchone()
        if existing is not None:
            return int(existing[0])
    cur = conn.execute(
        "INSERT INTO outbox(platform, chat_id, thread_id, text, kind, reply_to, mention_user_id,"
        " session_id, inbox_id, created_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
        (
            message.chat.platform,
            message.chat.chat_id,
            message.chat.thread_id,
            message.text,
            kind,
            message.reply_to_message_id,
            message.mention_user_id,
            session_id,
            inbox_id,
            now,
        ),
    )
    return inserted_id(cur)


class Outbox:
    """``OutboxRepository`` on ``state.db``."""

    def __init__(self, db: Database, *, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self._clock = clock

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
            lambda c: _enqueue(c, message, kind=kind, session_id=session_id, inbox_id=inbox_id, now=now)
        )

    def enqueue_within(
        self,
        tx: sqlite3.Connection,
        message: OutboundMessage,
        *,
        kind: str = "reply",
        session_id: str | None = None,
        inbox_id: int | None = None,
        now: float,
    ) -> int:
        return _enqueue(tx, message, kind=kind, session_id=session_id, inbox_id=inbox_id, now=now)

    async def get(self, row_id: int) -> OutboxRow | None:
        r = await self.db.read(lambda c: c.execute("SELECT * FROM outbox WHERE id = ?", (row_id,)).fetchone())
        return _row(r) if r is not None else None

    async def due(self, platforms: set[str], limit: int = 50) -> list[OutboxRow]:
        if not platforms:
            return []
        now = self._clock()
        marks = ",".join("?" * len(platforms))
        rows = await self.db.read(
            lambda c: c.execute(
                f"SELECT * FROM outbox WHERE state = 'queued' AND not_before <= ? AND platform IN ({marks})"
                " ORDER BY id LIMIT ?",
                (now, *sorted(platforms), limit),
            ).fetchall()
        )
        return [_row(r) for r in rows]

    async def recover_in_flight(self) -> int:
        """At start-up: rows left in 'sending' may have gone out; re-queue them labelled."""
        return await self.db.write(
            lambda c: (
                c.execute(
                    "UPDATE outbox SET state = 'queued', possible_duplicate = 1 WHERE state = 'sending'"
                ).rowcount
            )
        )

    async def claim(self, row_id: int) -> bool:
        return bool(
            await self.db.write(
                lambda c: (
                    c.execute(
                        "UPDATE outbox SET state = 'sending', attempts = attempts + 1 WHERE id = ?"
                        " AND state = 'queued'",
                        (row_id,),
                    ).rowcount
                )
            )
        )

    async def mark_sent(self, row_id: int, platform_ids: list[str]) -> None:
        now = self._clock()
        await self.db.write(
            lambda c: c.execute(
                "UPDATE outbox SET state = 'sent', sent_at = ?, platform_ids = ?, error = NULL WHERE id = ?",
                (now, json.dumps(platform_ids), row_id),
            )
        )

    async def mark_retry(self, row_id: int, delay_s: float, error: str) -> None:
        not_before = self._clock() + delay_s
        await self.db.write(
            lambda c: c.execute(
                "UPDATE outbox SET state = 'queued', not_before = ?, error = ? WHERE id = ?",
                (not_before, error, row_id),
            )
        )

    async def mark_failed(self, row_id: int, error: str) -> None:
        await self.db.write(
            lambda c: c.execute("UPDATE outbox SET state = 'failed', error = ? WHERE id = ?", (error, row_id))
        )

    async def release(self, chat: ChatRef) -> int:
        """Make the chat's waiting rows due now (the chat became reachable again)."""
        now = self._clock()
        return await self.db.write(
            lambda c: (
                c.execute(
                    "UPDATE outbox SET not_before = ? WHERE state = 'queued' AND platform = ? AND chat_id = ?"
                    " AND not_before > ?",
                    (now, chat.platform, chat.chat_id, now),
                ).rowcount
            )
        )

    async def counts(self) -> dict[str, int]:
        rows = await self.db.read(
            lambda c: c.execute("SELECT state, COUNT(*) FROM outbox GROUP BY state").fetchall()
        )
        return {r[0]: r[1] for r in rows}


class DeliveryLoop:
    """Sends due outbox rows through their adapters. One task, owned here."""

    def __init__(
        self,
        outbox: OutboxDelivery,
        adapters: Mapping[str, Adapter],
        *,
        poll_s: float = 1.0,
        on_sent: Callable[[OutboxRow], None] | None = None,
        streams: StreamLedger | None = None,
    ) -> None:
        self.outbox = outbox
        self.streams = streams
        self.adapters = adapters
        self.poll_s = poll_s
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._on_sent = on_sent
        # One round at a time: a caller's deliver_due() waits for the loop's round in
        # progress, so when it returns everything due at the call has been attempted
        # (a row the loop had claimed is no longer "sending" behind the caller's back).
        self._round = asyncio.Lock()

    def wake(self) -> None:
        self._wake.set()

    async def chat_reachable(self, chat: ChatRef) -> None:
        """A chat that could not be reached is back: its backed-off replies go out now."""
        await self.outbox.release(chat)
        self.wake()

    async def start(self) -> None:
        if self._task is None:
            await self.outbox.recover_in_flight()
            if self.streams is not None:
                await self.streams.purge_delivered()
            self._task = asyncio.create_task(self._run(), name="outbox-delivery")

    async def stop(self, grace_s: float = 30.0) -> None:
        """Let a round in progress finish — a reply handed to the platform must be
        marked sent, or the next start re-sends it as a possible duplicate — then end
        the loop; cancel only a round still running after ``grace_s``."""
        task, self._task = self._task, None
        if task is None:
            return
        self._stopping = True
        self._wake.set()
        try:
            async with asyncio.timeout(grace_s):
                await asyncio.shield(task)
        except TimeoutError:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        finally:
            self._stopping = False

    async def _run(self) -> None:
        while not self._stopping:
            # Cleared before looking, so a reply queued while a round runs is seen next.
            self._wake.clear()
            sent = 0
            try:
                sent = await self.deliver_due()
            except Exception:  # loop boundary: keep delivering
                log.exception("outbox_loop_error")
            if self._stopping:
                return
            if sent:
                continue  # a full round may have left more behind
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancel
            # that arrives as the event is set (a reply queued during shutdown), and
            # stop() then waits for this task forever.
            try:
                async with asyncio.timeout(self.poll_s):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def deliver_due(self) -> int:
        """Send what is due: in order within a chat, chats side by side (bounded), so a
        slow platform or a busy chat never holds up the others."""
        async with self._round:
            return await self._deliver_round()

    async def _deliver_round(self) -> int:
        ready = {name for name, a in self.adapters.items() if a.connected}
        by_chat: dict[ChatRef, list[OutboxRow]] = {}
        for row in await self.outbox.due(ready, limit=DUE_BATCH):
            by_chat.setdefault(row.chat, []).append(row)
        gate = asyncio.Semaphore(MAX_PARALLEL_CHATS)

        async def run(rows: list[OutboxRow]) -> int:
            async with gate:
                sent = 0
                for row in rows:
                    if not await self.deliver(row):
                        break  # keep this chat's order: the rest waits for the next round
                    sent += 1
                return sent

        counts = await asyncio.gather(*(run(rows) for rows in by_chat.values()))
        return sum(counts)

    async def deliver(self, row: OutboxRow) -> bool:
        adapter = self.adapters.get(row.chat.platform)
        if adapter is None or not adapter.connected:
            return False
        if not await self.outbox.claim(row.id):
            return False  # another delivery took it
        message = row.to_message()
        streams, stream = self.streams, None
        if streams is not None and row.inbox_id is not None:
            stream = await streams.get(row.inbox_id)
            if stream is not None and stream.chat == row.chat:
                message = dataclasses.replace(message, stream_message_id=stream.message_id)
        try:
            ids = await adapter.send(message)
        except PlatformRateLimited as e:
            await self.outbox.mark_retry(row.id, e.retry_after, f"rate limited: {e}")
            return False
        except Forbidden as e:
            log.warning("outbox_forbidden", outbox_id=row.id, platform=row.chat.platform, error=str(e))
            await self.outbox.mark_failed(row.id, f"forbidden: {e}")
            if streams is not None and stream is not None:
                await streams.forget(stream.inbox_id)
            return False
        except PlatformError as e:
            # The platform is down or flaky: the reply waits, however long that takes.
            attempts = row.attempts + 1
            log.warning(
                "outbox_send_failed", outbox_id=row.id, attempts=attempts, error=f"{type(e).__name__}: {e}"
            )
            await self.outbox.mark_retry(
                row.id, min(MAX_BACKOFF_S, 0.5 * 2**attempts), f"{type(e).__name__}: {e}"
            )
            return False
        except Exception as e:  # loop boundary: a bug in an adapter; retry a few times, then give up loudly
            attempts = row.attempts + 1
            log.exception("outbox_send_error", outbox_id=row.id, attempts=attempts)
            if attempts >= MAX_UNEXPECTED_ATTEMPTS:
                await self.outbox.mark_failed(row.id, f"{type(e).__name__}: {e}")
            else:
                await self.outbox.mark_retry(
                    row.id, min(MAX_BACKOFF_S, 0.5 * 2**attempts), f"{type(e).__name__}: {e}"
                )
            return False
        await self.outbox.mark_sent(row.id, ids)
        if streams is not None and stream is not None:
            await streams.forget(stream.inbox_id)
        if self._on_sent is not None:
            self._on_sent(row)
        return True
