"""``mnemo migrate --to postgresql://…`` (issue 17, item 4), as a real process against the
throw-away PostgreSQL cluster: a profile made by the bot on SQLite is copied over, the bot
then started on PostgreSQL finds its old sessions by search; a second run copies nothing;
a run killed with SIGKILL in the middle of a batch is resumed by the next one without a
duplicate; and the source files are byte for byte what they were."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from mnemo.app import open_app
from mnemo.gateway.delivery.inbox import Inbox
from mnemo.gateway.emulator import Emulator, Reply, ToolUse
from mnemo.gateway.events import InboundMessage, to_payload
from mnemo.gateway.inbound.access import PairingStore
from mnemo.gateway.storage import state_database
from mnemo.gateway.storage_pg.schema import PG_MIGRATIONS
from mnemo.memory.curated import MemoryFiles
from mnemo.memory.pg.db import PgDatabase
from mnemo.memory.scope import UserRef
from mnemo.memory.sessions import NewMessage, SessionStore
from mnemo.profile_lock import hold
from tests.gateway.conftest import make_settings
from tests.gateway.test_cli_errors import MNEMO, _env, mnemo, one_clear_line
from tests.support.loopback import LoopbackAdapter
from tests.support.pgcluster import Cluster

INBOX_ROWS = 400
MEMORY_ENTRIES = ("The team stand-up is at 09:30.", "Deploys happen on Thursdays.")
USER_ENTRIES = ("Prefers short answers.",)


def tool_result_text(emulator: Emulator) -> str:
    blocks = emulator.requests[-1].body["messages"][-1]["content"]
    return " ".join(str(b.get("content")) for b in blocks if b.get("type") == "tool_result")


async def bot_profile(home: Path, emulator: Emulator) -> None:
    """A profile as the bot leaves it: one real conversation, then more history, pairings,
    inbox rows and curated memory written through mnemo's own stores."""
    emulator.script(Reply(text="Rex is a fine name."))
    adapter = LoopbackAdapter()
    async with open_app(
        make_settings(home),
        adapters=[adapter],
        llm_base_url=emulator.base_url,
        api_key="test-key",
        trial=False,
    ):
        await adapter.say("my dog is called Rex", user="u1")
        await adapter.wait_sent(1)
    db = state_database(home / "state.db")
    await db.open()
    try:
        store, inbox, pairings = SessionStore(db), Inbox(db), PairingStore(db)
        start = datetime(2025, 1, 1, tzinfo=UTC)
        parent, first = None, None
        for i in range(12):
            s = await store.create_session(
                chat_key=f"telegram:dm:{i % 4}",
                platform="telegram",
                chat_id=str(i % 4),
                thread_id=None,
                user_id=str(i % 4),
                agent_context="primary",
                source="chat",
                model="m",
                system_prompt=f"prompt {i}",
                parent_session_id=parent if i % 4 == 1 else None,
                started_at=start + timedelta(hours=i),
            )
            parent, first = s.id, first or s.id
            await store.append_messages(
                s.id,
                [
                    NewMessage(
                        role="user" if j % 2 == 0 else "assistant",
                        content=f"session {i} line {j} about topic{j % 7} 東京タワー\x00",
                        created_at=start + timedelta(hours=i, seconds=j),
                    )
                    for j in range(40)
                ],
            )
        # A parent newer than its child (as a re-parented session has): copied after it.
        last = parent
        await db.write(
            lambda c: c.execute("UPDATE sessions SET parent_session_id = ? WHERE id = ?", (last, first))
        )
        for k in range(INBOX_ROWS):  # answered long ago
            msg = InboundMessage(
                platform="telegram",
                chat_id=str(k % 9),
                user_id=str(k % 9),
                message_id=f"m{k}",
                text=f"inbound {k}",
            )
            row = await inbox.accept(msg.platform, msg.chat_id, msg.message_id, to_payload(msg))
            assert row is not None
            await inbox.mark_done(row.id)
        for k in range(3):
            await pairings.request(UserRef("telegram", f"9{k}"), f"Person {k}")
    finally:
        await db.close()
    files = MemoryFiles(home / "memories")
    for entry in MEMORY_ENTRIES:
        assert files.shared().add(entry).success
    for entry in USER_ENTRIES:
        assert files.own(UserRef("telegram", "1")).add(entry).success
    # The holographic provider's store (it has no PostgreSQL home yet).
    facts = home / "providers" / "holographic"
    facts.mkdir(parents=True)
    conn = sqlite3.connect(facts / "facts.db")
    conn.execute("CREATE TABLE facts (id INTEGER PRIMARY KEY, content TEXT)")
    conn.close()


def checksums(home: Path) -> dict[str, str]:
    """Every file of the profile but the lock file (which holds the holder's PID) and
    SQLite's side files: a reader in WAL mode creates the index (-shm) and an empty -wal
    next to the database, which hold no data (asserted in ``unchanged``)."""
    return {
        str(p.relative_to(home)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(home.rglob("*"))
        if p.is_file() and p.name != ".mnemo.lock" and not p.name.endswith(("-shm", "-wal"))
    }


def unchanged(home: Path, before: dict[str, str]) -> None:
    assert checksums(home) == before, "the SQLite profile was modified"
    wal = home / "state.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0, "something was written to state.db"


def sqlite_rows(home: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{home / 'state.db'}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def pg_rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql).fetchall()


def migrate(home: Path, url: str, *args: str) -> dict[str, Any]:
    out = mnemo(home, "migrate", "--to", url, "--json", *args)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def assert_same_data(home: Path, url: str) -> None:
    for table, key in (
        ("sessions", "id"),
        ("messages", "id"),
        ("inbox", "id"),
        ("pairings", "code"),
        ("chats", "id"),
    ):
        assert sqlite_rows(home, f"SELECT count(*) FROM {table}") == pg_rows(
            url, f"SELECT count(*) FROM {table}"
        )
        assert pg_rows(url, f"SELECT count(*) - count(DISTINCT {key}) FROM {table}") == [(0,)]
    src = sqlite_rows(home, "SELECT id, session_id, content, created_at FROM messages ORDER BY id")
    dst = pg_rows(url, "SELECT id, session_id, content, created_at FROM messages ORDER BY id")
    assert [(i, s, c.replace("\x00", "\ufffd"), datetime.fromisoformat(t)) for i, s, c, t in src] == [
        (i, s, c, t) for i, s, c, t in dst
    ]
    assert sqlite_rows(
        home, "SELECT id, parent_session_id, system_prompt FROM sessions ORDER BY id"
    ) == pg_rows(url, "SELECT id, parent_session_id, system_prompt FROM sessions ORDER BY id")
    assert sqlite_rows(
        home, "SELECT platform, chat_id, message_id, payload FROM inbox ORDER BY id"
    ) == pg_rows(url, "SELECT platform, chat_id, message_id, payload FROM inbox ORDER BY id")


async def test_round_trip_then_the_bot_on_postgresql_finds_the_old_sessions_by_search(
    home: Path, emulator: Emulator, pg_cluster: Cluster
) -> None:
    await bot_profile(home, emulator)
    before = checksums(home)
    url = pg_cluster.fresh_database()

    receipt = migrate(home, url)

    assert receipt["verified"] is True and receipt["already_complete"] is False
    tables = receipt["tables"]
    assert tables["messages"]["source"] == tables["messages"]["present"] == tables["messages"]["copied"] > 480
    assert tables["inbox"]["copied"] == INBOX_ROWS + 1 and tables["pairings"]["copied"] == 3
    assert receipt["memories"] == {"files": 2, "entries": 3, "copied": 3, "present": 0, "refused": []}
    assert "password" not in receipt["target"]
    left = {n["what"]: n["why"] for n in receipt["not_migrated"]}
    assert "provider data providers/holographic" in left, left
    assert "derived from the messages" in left["table chat_speakers (1 rows)"]
    assert_same_data(home, url)
    unchanged(home, before)

    # The bot on PostgreSQL: the old session is found by session_search, new rows get new ids.
    emulator.script(
        Reply(tool_uses=[ToolUse("session_search", {"query": "what is my dog called?"})]),
        Reply(text="Your dog is Rex."),
    )
    adapter = LoopbackAdapter()
    async with open_app(
        make_settings(home, **{"database.url": url}),
        adapters=[adapter],
        llm_base_url=emulator.base_url,
        api_key="test-key",
        trial=False,
    ):
        await adapter.say("/reset", user="u1")
        await adapter.wait_sent(1)
        await adapter.say("remind me about my dog", user="u1")
        sent = await adapter.wait_sent(2)
        assert sent[-1].text == "Your dog is Rex."
        assert "my dog is called Rex" in tool_result_text(emulator)
    rows = pg_rows(url, "SELECT target, owner, content FROM curated_memory ORDER BY target, owner")
    assert [(t, o) for t, o, _ in rows] == [("memory", ""), ("user", "telegram:1")]
    assert all(e in rows[0][2] for e in MEMORY_ENTRIES) and USER_ENTRIES[0] in rows[1][2]
    unchanged(home, before)
    # After the bot has run on PostgreSQL, another run copies nothing and still finds
    # every source row there.
    again = migrate(home, url)
    assert again["already_complete"] is True and again["copied"] == 0 and again["verified"] is True
    assert pg_rows(url, "SELECT count(*) FROM messages")[0][0] > tables["messages"]["source"]


async def test_a_second_run_copies_nothing_new(home: Path, emulator: Emulator, pg_cluster: Cluster) -> None:
    await bot_profile(home, emulator)
    url = pg_cluster.fresh_database()
    first = migrate(home, url, "--batch-size", "5")  # a parent session lands in a later batch
    assert_same_data(home, url)
    counts = pg_rows(
        url,
        "SELECT (SELECT count(*) FROM messages), (SELECT count(*) FROM inbox),"
        " (SELECT count(*) FROM sessions), (SELECT count(*) FROM curated_memory)",
    )
    second = migrate(home, url)
    assert first["copied"] > 0 and second["copied"] == 0
    assert second["verified"] is True and second["already_complete"] is True
    assert all(t["copied"] == 0 and t["verified"] for t in second["tables"].values())
    assert second["memories"]["copied"] == 0 and second["memories"]["present"] == 3
    assert (
        pg_rows(
            url,
            "SELECT (SELECT count(*) FROM messages), (SELECT count(*) FROM inbox),"
            " (SELECT count(*) FROM sessions), (SELECT count(*) FROM curated_memory)",
        )
        == counts
    )
    # A human reads the same receipt.
    out = mnemo(home, "migrate", "--to", url)
    assert out.returncode == 0 and "0 rows copied, verified" in out.stdout, out.stderr
    assert "messages" in out.stdout and "MISMATCH" not in out.stdout


def _waiting_on_a_lock(url: str) -> bool:
    """A session of this database waits for a lock (the migration, for the blocker's row)."""
    return bool(
        pg_rows(
            url,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock'",
        )[0][0]
    )


@pytest.mark.slow
async def test_kill_9_in_the_middle_then_a_rerun_completes_without_duplicates(
    home: Path, emulator: Emulator, pg_cluster: Cluster
) -> None:
    await bot_profile(home, emulator)
    before = checksums(home)
    url = pg_cluster.fresh_database()
    db = PgDatabase(url, migrations=PG_MIGRATIONS, max_size=1)
    await db.open()  # the schema, so the blocking row below has its table
    await db.close()
    ids = [r[0] for r in sqlite_rows(home, "SELECT id FROM inbox ORDER BY id")]
    blocked = ids[len(ids) // 2]
    # An uncommitted row with the id of an inbox row in the middle: the migration's batch
    # holding that id waits for this transaction, with every earlier batch committed.
    blocker = psycopg.connect(url)
    blocker.execute(
        "INSERT INTO inbox (id, platform, chat_id, message_id, payload, received_at, updated_at)"
        " OVERRIDING SYSTEM VALUE VALUES (%s, 'x', 'x', 'x', '{}', now(), now())",
        (blocked,),
    )
    proc = subprocess.Popen(
        [*MNEMO, "migrate", "--to", url, "--batch-size", "50"],
        env=_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while not _waiting_on_a_lock(url):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the migration never reached the blocked batch"
            time.sleep(0.05)
        copied_before_kill = pg_rows(url, "SELECT count(*) FROM inbox")[0][0]
        assert 0 < copied_before_kill < len(ids)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close() if proc.stdout else None
        proc.stderr.close() if proc.stderr else None
        blocker.rollback()
        blocker.close()
    assert pg_rows(url, "SELECT count(*) FROM inbox")[0][0] == copied_before_kill, (
        "the killed batch was rolled back"
    )
    assert pg_rows(url, "SELECT count(*) FROM curated_memory")[0][0] == 0

    receipt = migrate(home, url, "--batch-size", "50")

    assert receipt["verified"] is True and receipt["already_complete"] is False
    assert receipt["tables"]["inbox"]["copied"] == len(ids) - copied_before_kill
    assert receipt["tables"]["messages"]["copied"] == 0, "messages were all committed before the kill"
    assert receipt["memories"]["copied"] == 3
    assert_same_data(home, url)
    unchanged(home, before)
    # Identity sequences were moved past the copied ids: the next inbox row gets a new one.
    new_id = pg_rows(
        url,
        "INSERT INTO inbox (platform, chat_id, message_id, payload, received_at, updated_at)"
        " VALUES ('t', 'c', 'new', '{}', now(), now()) RETURNING id",
    )[0][0]
    assert new_id > max(ids)


async def test_refusals_are_one_clear_line(
    home: Path, emulator: Emulator, pg_cluster: Cluster, tmp_path: Path
) -> None:
    one_clear_line(mnemo(home, "migrate", "--to", "postgresql://x@/db"), 2, "no SQLite profile", "state.db")
    await bot_profile(home, emulator)
    url = pg_cluster.fresh_database()
    one_clear_line(mnemo(home, "migrate", "--to", "mysql://u@h/db"), 2, "postgresql://")
    one_clear_line(
        mnemo(home, "migrate", "--to", f"postgresql://mnemo@/x?host={tmp_path}&connect_timeout=1"),
        2,
        "cannot connect to PostgreSQL",
    )
    one_clear_line(mnemo(home, "migrate", "--to", pg_cluster.url("no_such_db")), 2, 'database "no_such_db"')
    # The extra is missing (psycopg cannot be imported in that process).
    code = (
        "import sys; sys.modules['psycopg_pool'] = None; from mnemo.cli.main import main; "
        f"sys.exit(main(['migrate', '--to', {url!r}]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(home), timeout=120
    )
    one_clear_line(out, 2, "pip install 'mnemo[postgres]'")
    # The bot runs on this profile.
    with hold(home):
        one_clear_line(mnemo(home, "migrate", "--to", url), 1, "in use by PID")
    # The target serves another bot already.
    other = pg_cluster.fresh_database()
    db = PgDatabase(other, migrations=PG_MIGRATIONS, max_size=1)
    await db.open()
    await db.close()
    with psycopg.connect(other, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO pairings (code, platform, user_id, created_at) VALUES ('C', 'telegram', '5', 0)"
        )
    one_clear_line(mnemo(home, "migrate", "--to", other), 1, "already holds data")
    assert pg_rows(
        other, "SELECT to_regclass('mnemo_profile_migration') IS NULL, count(*) FROM sessions"
    ) == [(True, 0)], "the refused run wrote nothing"
    assert pg_rows(url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == [(0,)], (
        "a run refused for the profile lock did not touch the target"
    )


@pytest.mark.parametrize("tty", [False, True])
def test_the_progress_bar_is_drawn_on_a_terminal_only(tty: bool) -> None:
    import io

    from mnemo.cli.terminal import ProgressBar

    class Stream(io.StringIO):
        def isatty(self) -> bool:
            return tty

    stream = Stream()
    bar = ProgressBar(stream, clock=iter(range(100)).__next__)
    for done in range(0, 101, 25):
        bar.update("messages", done, 100)
    bar.close()
    text = stream.getvalue()
    if not tty:
        assert text == ""
    else:
        assert "[" + "#" * ProgressBar.WIDTH + "] 100%  messages 100/100" in text
        assert "25%" in text and text.endswith("\r\x1b[K")
