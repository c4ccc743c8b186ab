"""Durable inbox: rows a crashed process left behind are found as unfinished on the
next start. (Dedup and the state moves are in tests/contract/test_inbox.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from mnemo.gateway.delivery.inbox import Inbox, InboxState
from mnemo.gateway.storage import state_database

CRASHER = textwrap.dedent(
    """
    import asyncio, sys, time
    from mnemo.memory.db import Database
    from mnemo.gateway.storage import state_database
    from mnemo.gateway.delivery.inbox import Inbox

    async def main(path):
        db = state_database(path)
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

    db = state_database(path)
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
