"""Durable inbox: duplicates are no-ops, states move forward, and rows a crashed process
left behind are found as unfinished on the next start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path

import pytest

from mnemo.memory.db import Database
from mnemo.memory.errors import StoreError
from mnemo.gateway.delivery.inbox import Inbox, InboxState


@pytest.fixture
async def db(tmp_path: Path):
    d = Database(tmp_path / "state.db")
    await d.open()
    yield d
    await d.close()


async def test_accept_stores_the_payload_and_a_redelivery_is_a_no_op(db: Database) -> None:
    inbox = Inbox(db)
    first = await inbox.accept("telegram", "100", "7", {"text": "hi", "user": {"id": "5"}})
    again = await inbox.accept("telegram", "100", "7", {"text": "changed"})
    assert first is not None and again is None
    assert first.state is InboxState.RECEIVED and first.attempts == 0
    stored = await inbox.get(first.id)
    assert stored is not None and stored.payload == {"text": "hi", "user": {"id": "5"}}
    # Same message id in another chat or on another platform is a different message.
    assert await inbox.accept("telegram", "101", "7", {}) is not None
    assert await inbox.accept("discord", "100", "7", {}) is not None


async def test_states_move_forward_and_attempts_count_processing_starts(db: Database) -> None:
    inbox = Inbox(db, clock=lambda: datetime(2025, 1, 1, tzinfo=UTC))
    row = await inbox.accept("web", "c", "1", {"text": "x"})
    assert row is not None
    await inbox.mark_processing(row.id)
    await inbox.mark_processing(row.id)  # e.g. re-run after a crash
    await inbox.mark_failed(row.id, "LLM unavailable")
    failed = await inbox.get(row.id)
    assert failed is not None
    assert (failed.state, failed.attempts, failed.error) == (InboxState.FAILED, 2, "LLM unavailable")
    other = await inbox.accept("web", "c", "2", {})
    assert other is not None
    await inbox.mark_processing(other.id)
    await inbox.mark_done(other.id)
    done = await inbox.get(other.id)
    assert done is not None and done.state is InboxState.DONE and done.error is None
    assert await inbox.unfinished() == []


async def test_marking_an_unknown_row_is_an_error(db: Database) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        await Inbox(db).mark_done(12345)
    assert await Inbox(db).get(12345) is None


CRASHER = textwrap.dedent(
    """
    import asyncio, sys, time
    from mnemo.memory.db import Database
    from mnemo.gateway.delivery.inbox import Inbox

    async def main(path):
        db = Database(path)
        await db.open()
        inbox = Inbox(db)
        a = await inbox.accept("telegram", "1", "10", {"text": "never started"})
        b = await inbox.accept("telegram", "1", "11", {"text": "interrupted"})
        c = await inbox.accept("telegram", "1", "12", {"text": "answered"})
        await inbox.mark_processing(b.id)
        await inbox.mark_processing(c.id)
        await inbox.mark_done(c.id)
        print("ready", flush=True)
        time.sleep(60)  # killed here with SIGKILL: no close, no checkpoint

    asyncio.run(main(sys.argv[1]))
    """
)


async def test_unfinished_rows_survive_a_kill_9(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    proc = subprocess.Popen([sys.executable, "-c", CRASHER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    assert proc.returncode == -signal.SIGKILL

    db = Database(path)
    await db.open()
    inbox = Inbox(db)
    rows = await inbox.unfinished()
    assert [(r.message_id, r.state, r.attempts) for r in rows] == [
        ("10", InboxState.RECEIVED, 0),
        ("11", InboxState.PROCESSING, 1),
    ]
    assert rows[1].payload == {"text": "interrupted"}
    # The redelivered update after the restart is still recognised as a duplicate.
    assert await inbox.accept("telegram", "1", "11", {"text": "interrupted"}) is None
    await db.close()
