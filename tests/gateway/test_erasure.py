"""Erasure end to end: a person seeded in a DM, a per-member group session, a shared
room, their profile and holographic facts; ``mnemo users erase`` (and ``/forget me``)
then leave none of their words in state.db, its WAL, facts.db or the home folder,
and the other person's rows and files byte for byte as they were."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from mnemo.cli.main import main
from mnemo.gateway.emulator import Reply
from mnemo.gateway.events import ChatType
from mnemo.providers.holographic.store import FactStore, NewFact
from tests.support.loopback import LoopbackAdapter

ALICE_WORDS = ("zanzibarquokka", "xylophonewombat", "quetzalnimbus", "fjordpelican", "marzipanotter")
BOB_WORDS = ("bobsecretplum", "bobroomgrape", "bobfactkiwi")
QUIET = {"access.rate_limit_per_minute": 0, "memory.nudge_interval": 0}


async def say(app, adapter: LoopbackAdapter, text: str, **kw) -> None:
    await adapter.say(text, **kw)
    await app.gateway.lanes.drain(30)
    await app.gateway.delivery.deliver_due()


async def seed(app_factory, emulator, home: Path) -> None:
    emulator.default = lambda req: Reply(text="ok")
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **QUIET) as app:
        await say(app, adapter, "my word is zanzibarquokka", user="alice")
        await say(app, adapter, "mine is bobsecretplum", user="bob")
        await say(
            app, adapter, "group word xylophonewombat", user="alice", chat="g1", chat_type=ChatType.GROUP
        )
        await say(app, adapter, "/usage", user="alice")
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **QUIET, **{"sessions.group_sessions_per_user": False}) as app:
        await say(
            app, adapter, "room word quetzalnimbus", user="alice", chat="room", chat_type=ChatType.GROUP
        )
        await say(app, adapter, "room word bobroomgrape", user="bob", chat="room", chat_type=ChatType.GROUP)
    for user, text in (("alice", "User likes marzipanotter."), ("bob", "User is Bob.")):
        folder = home / "memories" / "users" / "loop" / user
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "USER.md").write_text(text)
        (folder / "USER.md.lock").write_text("")
    store = FactStore(home / "providers" / "holographic" / "facts.db")
    store.open()
    store.add(NewFact(owner="loop:alice", content="Alice keeps a fjordpelican."))
    store.add(NewFact(owner="loop:bob", content="Bob grows bobfactkiwi."))
    store.add(NewFact(owner="shared", content="The office is in Lisbon."))
    store.close()


def hits(home: Path, words: tuple[str, ...]) -> list[str]:
    found = []
    for path in home.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            found += [f"{path.relative_to(home)}: {w}" for w in words if w.encode() in data]
    return found


def bob_snapshot(home: Path) -> dict[str, object]:
    import sqlite3

    conn = sqlite3.connect(home / "state.db")
    try:
        messages = conn.execute(
            "SELECT m.id, m.session_id, m.role, m.content, m.author_id, m.created_at FROM messages m"
            " JOIN sessions s ON s.id = m.session_id WHERE m.author_id = 'bob' OR s.user_id = 'bob' ORDER BY m.id"
        ).fetchall()
        sessions = conn.execute(
            "SELECT id, chat_key, system_prompt, estimated_cost_usd FROM sessions WHERE user_id = 'bob' ORDER BY id"
        ).fetchall()
        found = conn.execute(
            "SELECT rowid FROM messages_ctx WHERE messages_ctx MATCH 'bobsecretplum OR bobroomgrape'"
        ).fetchall()
    finally:
        conn.close()
    facts = sqlite3.connect(home / "providers" / "holographic" / "facts.db")
    try:
        bob_facts = facts.execute(
            "SELECT id, content, vector FROM facts WHERE owner != 'loop:alice'"
        ).fetchall()
    finally:
        facts.close()
    profile = (home / "memories" / "users" / "loop" / "bob" / "USER.md").read_bytes()
    return {
        "messages": messages,
        "sessions": sessions,
        "search": found,
        "facts": bob_facts,
        "profile": profile,
    }


async def users(home: Path, *argv: str) -> int:
    """The CLI, as from a shell (its own event loop, in a thread)."""
    return await asyncio.to_thread(main, ["--home", str(home), "users", *argv])


async def test_erase_leaves_none_of_their_words_anywhere_and_the_others_untouched(
    app_factory, emulator, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await seed(app_factory, emulator, home)
    assert len(hits(home, ALICE_WORDS)) >= 4, "the seed reached the files"
    before = bob_snapshot(home)
    capsys.readouterr()  # the seeding app's log lines

    assert await users(home, "erase", "loop:alice", "--dry-run", "--json") == 0
    dry = json.loads(capsys.readouterr().out)
    assert dry["dry_run"] and dry["removed"]["sessions"] == 2 and dry["removed"]["shared_messages"] == 1
    assert dry["removed"]["facts"] == 1 and dry["removed"]["profile"] == 2
    assert hits(home, ALICE_WORDS), "a dry run deletes nothing"

    assert await users(home, "erase", "loop:alice", "--yes", "--json") == 0
    receipt = json.loads(capsys.readouterr().out)["removed"]
    assert receipt == {**dry["removed"]}
    assert (
        receipt["messages"] >= 4
        and receipt["inbox"] >= 4
        and receipt["outbox"] >= 3
        and receipt["usage"] >= 1
    )
    assert hits(home, ALICE_WORDS) == []
    assert (home / "state.db-wal").stat().st_size == 0 if (home / "state.db-wal").exists() else True
    assert bob_snapshot(home) == before
    assert not (home / "memories" / "users" / "loop" / "alice").exists()

    assert await users(home, "show", "loop:alice") == 1  # mnemo knows nothing of them
    capsys.readouterr()


async def test_forget_me_asks_for_a_code_then_erases(app_factory, emulator, home: Path) -> None:
    emulator.default = lambda req: Reply(text="ok")
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **QUIET) as app:
        await say(app, adapter, "remember zanzibarquokka", user="alice")
        await say(app, adapter, "/forget me", user="alice")
        ask = adapter.texts()[-1]
        code = ask.split("/forget me ", 1)[1].split()[0]
        assert "erase" in ask.lower() and len(code) >= 6
        await say(app, adapter, "/forget me WRONG", user="alice")
        assert "code" in adapter.texts()[-1].lower()
        assert hits(home, ("zanzibarquokka",)), "a wrong code erases nothing"
        await say(app, adapter, "/forget me WRONG", user="bob")
        await say(app, adapter, f"/forget me {code}", user="bob")
        assert hits(home, ("zanzibarquokka",)), "a code works only for whoever asked for it"
        await say(app, adapter, f"/forget me {code}", user="alice")
        done = adapter.texts()[-1]
        assert done.startswith("Erased") and "sessions: 1" in done
        # While the gateway still runs: its WAL was checkpointed and truncated too.
        assert hits(home, ("zanzibarquokka",)) == []
        await say(app, adapter, "hello again", user="alice")
        assert len(emulator.requests) == 2 and "zanzibarquokka" not in json.dumps(emulator.requests[-1].body)
    assert hits(home, ("zanzibarquokka",)) == []
