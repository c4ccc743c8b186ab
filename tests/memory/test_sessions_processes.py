"""Four real processes append 2,000 messages each to one state.db at the same time:
every row arrives, the FTS index agrees with the table, nobody sees "database is locked"."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mnemo.gateway.storage import state_database

WRITERS = 4
PER_WRITER = 2000

WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from mnemo.gateway.storage import state_database
    from mnemo.memory.sessions import NewMessage, SessionStore

    async def main(path, n, w):
        db = state_database(path)
        await db.open()
        store = SessionStore(db)
        s = await store.create_session(
            chat_key=f"test:dm:{w}", platform="test", chat_id=str(w), thread_id=None, user_id=str(w),
            agent_context="primary", source="chat", model="m", system_prompt="p")
        for i in range(n):
            # One transaction per message, like the gateway persisting a turn.
            await store.append_messages(s.id, [NewMessage("user", f"marker writer{w} number{i} hello")])
        await db.close()
        print("retries", db.busy_retries)

    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
    """
)


@pytest.mark.slow
async def test_four_processes_writing_concurrently_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    db = state_database(path)
    await db.open()  # schema first, so the writers race on data, not on migrations
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), str(PER_WRITER), str(w)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(WRITERS)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
        assert "locked" not in err.lower() and "busy" not in err.lower()

    def check(c):
        total = c.execute("SELECT count(*) FROM messages").fetchone()[0]
        per_session = c.execute(
            "SELECT count(*), message_count FROM messages m JOIN sessions s ON s.id = m.session_id"
            " GROUP BY m.session_id"
        ).fetchall()
        indexed = c.execute(
            "SELECT count(*) FROM messages_ctx WHERE messages_ctx MATCH 'content : marker'"
        ).fetchone()[0]
        distinct = c.execute("SELECT count(DISTINCT content) FROM messages").fetchone()[0]
        return total, [tuple(r) for r in per_session], indexed, distinct

    total, per_session, indexed, distinct = await db.read(check)
    await db.write(lambda c: c.execute("INSERT INTO messages_ctx(messages_ctx) VALUES ('integrity-check')"))
    await db.close()
    assert total == distinct == WRITERS * PER_WRITER
    assert per_session == [(PER_WRITER, PER_WRITER)] * WRITERS
    assert indexed == WRITERS * PER_WRITER
