"""Which platform message is showing a reply while it is generated (table ``streams``).

A streamed reply is one platform message edited as the model writes. The outbox stays
the source of truth for what is sent: the final reply is queued there as always, keyed
by the inbox row it answers. This ledger only remembers, durably and as soon as the
platform gave it an id, the message that shows that reply, so that

* delivery turns that message into the final reply (an edit, then the remaining split
  parts as new messages) instead of sending a second copy, and
* after a crash mid-stream the re-run turn reuses the half-written message — it is
  first edited to ``INTERRUPTED`` — and delivery completes it: never a half-written
  message left as the answer.

A row is forgotten once its reply was delivered (or given up); ``purge_delivered``
clears rows whose forgetting a crash interrupted.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from mnemo.gateway.events import ChatRef
from mnemo.memory.db import Database

INTERRUPTED = "(interrupted — the full answer follows)"


@dataclass(frozen=True, slots=True)
class StreamRecord:
    inbox_id: int
    chat: ChatRef
    message_id: str
    created_at: float


class StreamLedger(Protocol):
    async def record(self, inbox_id: int, chat: ChatRef, message_id: str) -> None:
        """Remember the message showing the reply to ``inbox_id`` (replaces an older one)."""
        ...

    async def get(self, inbox_id: int) -> StreamRecord | None: ...

    async def forget(self, inbox_id: int) -> None: ...

    async def purge_delivered(self) -> int:
        """Drop rows whose reply the outbox has sent or given up on; return how many."""
        ...


def _record(r: sqlite3.Row) -> StreamRecord:
    return StreamRecord(
        r["inbox_id"], ChatRef(r["platform"], r["chat_id"], r["thread_id"]), r["message_id"], r["created_at"]
    )


class StreamRecords:
    """``StreamLedger`` on ``state.db``."""

    def __init__(self, db: Database, *, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self._clock = clock

    async def record(self, inbox_id: int, chat: ChatRef, message_id: str) -> None:
        now = self._clock()
        await self.db.write(
            lambda c: c.execute(
                "INSERT INTO streams(inbox_id, platform, chat_id, thread_id, message_id, created_at)"
                " VALUES (?,?,?,?,?,?) ON CONFLICT(inbox_id) DO UPDATE SET platform = excluded.platform,"
                " chat_id = excluded.chat_id, thread_id = excluded.thread_id, message_id = excluded.message_id",
                (inbox_id, chat.platform, chat.chat_id, chat.thread_id, message_id, now),
            )
        )

    async def get(self, inbox_id: int) -> StreamRecord | None:
        r = await self.db.read(
            lambda c: c.execute("SELECT * FROM streams WHERE inbox_id = ?", (inbox_id,)).fetchone()
        )
        return _record(r) if r is not None else None

    async def forget(self, inbox_id: int) -> None:
        await self.db.write(lambda c: c.execute("DELETE FROM streams WHERE inbox_id = ?", (inbox_id,)))

    async def purge_delivered(self) -> int:
        return await self.db.write(
            lambda c: (
                c.execute(
                    "DELETE FROM streams WHERE inbox_id IN"
                    " (SELECT inbox_id FROM outbox WHERE inbox_id IS NOT NULL AND state IN ('sent', 'failed'))"
                ).rowcount
            )
        )
