"""Erasure on every backend (issue 25 item 2): one person seeded through mnemo's own
paths in every layer — a DM, a per-member group session, a shared room, a cron job,
their profile, holographic facts, a linked second account with a pending ``/link``
code, a pairing request, a picture, their own skill, a provider write queued in their
scope, rate-limit hits, spend — then ``mnemo users erase``.

Afterwards none of their words (nor their ``PLATFORM:ID``) is in any row of any table
(PostgreSQL: every table of every mnemo schema, read back) or in any file under the
home (SQLite: ``state.db`` and its WAL included); the other person's rows and files are
as they were; the receipt names every layer, the same on both backends, and says which
layer a backend could not erase instead of counting it 0."""

from __future__ import annotations

import asyncio
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from mnemo.cli.main import main
from mnemo.gateway.config import load_settings
from mnemo.gateway.emulator import Emulator, Reply
from mnemo.gateway.events import ChatType
from mnemo.gateway.people.erasure import LAYERS
from mnemo.gateway.storage import open_backend
from mnemo.memory.scope import UserRef
from mnemo.memory.skills import SkillStore
from mnemo.providers.holographic.store import NewFact
from tests.conftest import BackendUnderTest
from tests.gateway.conftest import AppFactory
from tests.support.loopback import LoopbackAdapter

WORDS = (
    "zanzibarquokka",  # DM
    "xylophonewombat",  # per-member group session
    "quetzalnimbus",  # shared room
    "marzipanotter",  # profile
    "fjordpelican",  # holographic fact
    "gondolawalrus",  # the linked second account's DM
    "pistachiolynx",  # cron job
    "origamiheron",  # own skill
    "tangerinemoose",  # picture
    "lemonadebadger",  # a provider write in their scope
    "loop:alice",  # their accounts, as PLATFORM:ID (alice and alice2)
)
BOB_WORDS = ("bobsecretplum", "bobroomgrape", "bobfactkiwi", "bobprofileyam")
ALICE, ALICE2, BOB = UserRef("loop", "alice"), UserRef("loop", "alice2"), UserRef("loop", "bob")
CALM = {"access.rate_limit_per_minute": 100, "memory.nudge_interval": 0}


async def say(app: Any, adapter: LoopbackAdapter, text: str, **kw: Any) -> str:
    n = len(adapter.sent)
    await adapter.say(text, **kw)
    await app.gateway.lanes.drain(30)
    return (await adapter.wait_sent(n + 1))[n].text


def skill_md(name: str, body: str) -> str:
    return f"---\nname: {name}\ndescription: A skill of {name}.\n---\n\n# {name}\n\n{body}\n"


async def add_facts(home: Path, backend: BackendUnderTest) -> None:
    facts = [
        NewFact(owner=str(ALICE), content="Alice keeps a fjordpelican."),
        NewFact(owner=str(BOB), content="Bob grows bobfactkiwi."),
        NewFact(owner="shared", content="The office is in Lisbon."),
    ]
    if backend.url is None:
        from mnemo.providers.holographic.store import FactStore

        store = FactStore(home / "providers" / "holographic" / "facts.db")
    else:
        from mnemo.providers.holographic.pg_store import PgFactStore

        store = PgFactStore(backend.url)
    await asyncio.to_thread(store.open)
    for fact in facts:
        await asyncio.to_thread(store.add, fact)
    await asyncio.to_thread(store.close)


async def name_a_picture(app: Any, backend: BackendUnderTest, author: str, name: str, data: bytes) -> None:
    """A picture as the pipeline stores it: the file under media/, named in the meta of
    the author's first message."""
    media = app.settings.home / "media"
    media.mkdir(exist_ok=True)
    (media / name).write_bytes(data)
    ref = json.dumps({"media": [{"kind": "image", "file": name, "media_type": "image/png", "bytes": 9}]})
    if backend.url is None:
        await app.db.write(
            lambda c: c.execute(
                "UPDATE messages SET meta = ? WHERE id = (SELECT MIN(id) FROM messages WHERE author_id = ?)",
                (ref, author),
            )
        )
        return
    import psycopg

    with psycopg.connect(backend.url) as conn:
        conn.execute(
            "UPDATE messages SET meta = %s WHERE id = (SELECT min(id) FROM messages WHERE author_id = %s)",
            (ref, author),
        )


async def seed(app_factory: AppFactory, emulator: Emulator, home: Path, backend: BackendUnderTest) -> None:
    emulator.default = lambda req: Reply(text="ok")
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **CALM) as app:
        await say(app, adapter, "my word is zanzibarquokka", user="alice")
        await say(app, adapter, "mine is bobsecretplum", user="bob")
        await say(
            app, adapter, "group word xylophonewombat", user="alice", chat="g1", chat_type=ChatType.GROUP
        )
        await say(app, adapter, "second account says gondolawalrus", user="alice2")
        await say(app, adapter, "/cron add every 2h remind me about pistachiolynx", user="alice")
        await say(app, adapter, "/link", user="alice2")  # a pending code of the second account
        assert app.links is not None
        await app.links.link(ALICE, ALICE2)
        for user, text in ((ALICE, "User likes marzipanotter."), (BOB, "User likes bobprofileyam.")):
            assert (await asyncio.to_thread(app.files.user(user).add, text)).success
        await name_a_picture(app, backend, "alice", "a1.png", b"\x89PNG tangerinemoose")
        await name_a_picture(app, backend, "bob", "b1.png", b"\x89PNG bob picture")
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **CALM, **{"sessions.group_sessions_per_user": False}) as app:
        await say(
            app, adapter, "room word quetzalnimbus", user="alice", chat="room", chat_type=ChatType.GROUP
        )
        await say(app, adapter, "room word bobroomgrape", user="bob", chat="room", chat_type=ChatType.GROUP)
    await add_facts(home, backend)
    skills = SkillStore(home / "skills")
    skills.create(skill_md("alice-tricks", "Fold an origamiheron."), ALICE)
    skills.create(skill_md("bob-tricks", "Bob's own trick."), BOB)
    aside = home / ".replaced-20260101-000000" / "memories" / "users" / "loop"  # left by an import
    (aside / "alice").mkdir(parents=True)
    (aside / "alice" / "USER.md").write_text("Old copy: marzipanotter.")
    settings = load_settings(home, environ={})
    storage = await open_backend(settings)
    try:
        await storage.pairings.request(UserRef("loop", "alice"), "Alice")
        turn = {
            "op": "turn",
            "key": "turn-1",
            "scope": {"user_id": str(ALICE), "session_id": "s", "agent_id": "a"},
        }
        await storage.jobs.add(
            "provider_write",
            "mem0:turn-1",
            {"provider": "mem0", "payload": {**turn, "messages": [{"content": "alice: lemonadebadger"}]}},
            cooldown_s=0,
            now=1.0,
        )
    finally:
        await storage.close()


def rows_holding(url: str, words: tuple[str, ...]) -> list[str]:
    """Every row of every table of the database (``public`` and ``holographic``) that
    holds one of ``words``, as ``schema.table: word``."""
    import psycopg
    from psycopg import sql

    found = []
    with psycopg.connect(url) as conn:
        tables = conn.execute(
            "SELECT table_schema, table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE'"
            " AND table_schema NOT IN ('pg_catalog', 'information_schema') ORDER BY 1, 2"
        ).fetchall()
        assert {t for _, t in tables} >= {"messages", "sessions", "inbox", "outbox", "jobs", "curated_memory"}
        for schema, table in tables:
            query = sql.SQL("SELECT t::text FROM {}.{} t").format(
                sql.Identifier(schema), sql.Identifier(table)
            )
            for (text,) in conn.execute(query):
                found += [f"{schema}.{table}: {w}" for w in words if w in text]
    return found


def files_holding(home: Path, words: tuple[str, ...]) -> list[str]:
    found = []
    for path in home.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            found += [f"{path.relative_to(home)}: {w}" for w in words if w.encode() in data]
    return found


def archives_holding(home: Path, words: tuple[str, ...]) -> list[str]:
    """Every member of every backup archive (decompressed) that holds one of ``words``."""
    found = []
    for archive in sorted((home / "backups").glob("*.tar.gz")):
        with tarfile.open(archive) as tar:
            for m in tar.getmembers():
                f = tar.extractfile(m)
                data = f.read() if f is not None else b""
                found += [f"{archive.name}/{m.name}: {w}" for w in words if w.encode() in data]
    return found


def everywhere(home: Path, backend: BackendUnderTest, words: tuple[str, ...]) -> list[str]:
    return (
        files_holding(home, words)
        + archives_holding(home, words)
        + (rows_holding(backend.url, words) if backend.url else [])
    )


async def bob_as_seen_by_mnemo(home: Path) -> dict[str, Any]:
    """Bob through the repositories: his conversations, profile, spend, facts and files."""
    storage = await open_backend(load_settings(home, environ={}))
    try:
        sessions = [s for s in await storage.sessions.list_sessions(None, limit=500) if s.user_id == "bob"]
        messages = {
            s.id: [(m.role, m.content, m.author_id) for m in await storage.sessions.load_messages(s.id)]
            for s in sessions
        }
        room = [
            s for s in await storage.sessions.list_sessions("loop:group:room", limit=10)
        ]  # the shared room stays, with Bob's words
        room_words = [m.content for s in room for m in await storage.sessions.load_messages(s.id)]
        return {
            "sessions": sorted((s.id, s.chat_key, s.system_prompt) for s in sessions),
            "messages": messages,
            "room": [w for w in room_words if "bob" in w],
            "profile": storage.files.own(BOB).load().entries,
            "spend": await storage.budgets.spend(str(BOB)),
            "facts": await storage.directory.facts(BOB),
            "skill": (home / "skills" / "users" / "loop" / "bob" / "bob-tricks" / "SKILL.md").read_text(),
            "picture": (home / "media" / "b1.png").read_bytes(),
        }
    finally:
        await storage.close()


async def users(home: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    """``mnemo users …--json`` as from a shell (its own event loop, in a thread)."""
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["--home", str(home), "users", *argv, "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


async def test_erase_removes_the_person_from_every_table_and_file_on_both_backends(
    app_factory: AppFactory,
    emulator: Emulator,
    home: Path,
    backend: BackendUnderTest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await seed(app_factory, emulator, home, backend)
    seeded = {w.split(": ")[-1] for w in everywhere(home, backend, WORDS)}
    assert seeded == set(WORDS), "every word reached the store before the erasure"
    assert await asyncio.to_thread(main, ["--home", str(home), "backup", "now"]) == 0
    in_backup = {w.split(": ")[-1] for w in archives_holding(home, WORDS)}
    assert in_backup == set(WORDS), "the backup holds every word before the erasure"
    before = await bob_as_seen_by_mnemo(home)

    dry = await users(home, capsys, "erase", "loop:alice", "--dry-run")
    removed = dry["removed"]
    assert set(removed) == set(LAYERS), "one receipt, every layer, on every backend"
    assert {k: removed[k] for k in ("sessions", "shared_messages", "cron_jobs", "links", "pairing")} == {
        "sessions": 3,  # alice's DM and group session, alice2's DM
        "shared_messages": 1,
        "cron_jobs": 1,
        "links": 3,  # two identity links and alice2's pending code
        "pairing": 1,
    }
    assert {k: removed[k] for k in ("facts", "skills", "media", "copies", "provider")} == {
        "facts": 1,
        "skills": 1,
        "media": 1,
        "copies": 1,
        "provider": 0,  # no external provider configured
    }
    assert removed["messages"] >= 6 and removed["inbox"] >= 5 and removed["outbox"] >= 4
    assert removed["jobs"] >= 1 and removed["usage"] >= 1 and removed["profile"] >= 1
    assert removed["rate_limits"] == (2 if backend.url else 0), "a shared window is rows; a local one is not"
    assert removed["backups"] == 1 and dry["not_erased"] == {}, "every backup is scrubbed, on both backends"
    assert everywhere(home, backend, WORDS), "a dry run deletes nothing"

    done = await users(home, capsys, "erase", "loop:alice", "--yes")
    assert done["removed"] == removed and done["not_erased"] == dry["not_erased"]
    assert everywhere(home, backend, WORDS) == []
    assert sorted({w.split(": ")[-1] for w in everywhere(home, backend, BOB_WORDS)}) == sorted(BOB_WORDS)
    assert {w.split(": ")[-1] for w in archives_holding(home, BOB_WORDS)} == set(BOB_WORDS), "Bob stays"
    [archive] = (home / "backups").glob("*.tar.gz")
    assert await asyncio.to_thread(main, ["--home", str(home), "backup", "verify", str(archive)]) == 0
    assert await bob_as_seen_by_mnemo(home) == before
    shown = await asyncio.to_thread(main, ["--home", str(home), "users", "show", "loop:alice"])
    assert shown == 1, "mnemo knows nothing of them"


async def test_forget_me_erases_on_both_backends(
    app_factory: AppFactory, emulator: Emulator, home: Path, backend: BackendUnderTest
) -> None:
    emulator.default = lambda req: Reply(text="ok")
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **CALM) as app:
        await say(app, adapter, "remember zanzibarquokka", user="alice")
        await say(app, adapter, "bob says bobsecretplum", user="bob")
        ask = await say(app, adapter, "/forget me", user="alice")
        code = ask.split("/forget me ", 1)[1].split()[0]
        assert "wrong" in (await say(app, adapter, f"/forget me {code}", user="bob")).lower()
        done = await say(app, adapter, f"/forget me {code}", user="alice")
        assert done.startswith("Erased") and "  sessions: 1" in done
        assert "not erased" not in done
        # While the gateway still runs, and the next turn starts afresh.
        assert everywhere(home, backend, ("zanzibarquokka",)) == []
        await say(app, adapter, "hello again", user="alice")
        assert "zanzibarquokka" not in json.dumps(emulator.requests[-1].body)
    assert everywhere(home, backend, ("bobsecretplum",))
