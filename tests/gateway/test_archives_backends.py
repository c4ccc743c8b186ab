"""Archives on both backends and across them (issue 25 item 1, issue 26 item 1).

A profile seeded through mnemo's own paths — a DM whose frozen prompt carries the
person's profile, MEMORY.md, a cron job, holographic facts, a skill, a picture — is
exported on one backend and restored into the other (all four pairs): the rows, the
curated memory, the facts and the files arrive, ``mnemo sessions search`` finds what
was said, and the next turn goes on with the same frozen prompt. A backup taken while
the bot writes is one snapshot on either backend; no secret, wherever it was set,
reaches an export or a backup; an archive of 0.1's ``mnemo export`` restores into
either backend; a target that holds data is refused without ``--force`` and what it
held is kept aside with it.
"""

from __future__ import annotations

import asyncio
import io
import json
import sqlite3
import tarfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from mnemo.app import open_app
from mnemo.archives.export import file_sha256
from mnemo.archives.restore import verify_archive
from mnemo.backups import BackupScheduler, backup_now, list_backups
from mnemo.cli.main import main
from mnemo.gateway.config import load_settings
from mnemo.gateway.emulator import Emulator, Reply
from mnemo.gateway.storage import backend_for, open_backend
from mnemo.memory.scope import UserRef
from mnemo.memory.sessions import NewMessage
from mnemo.memory.skills import SkillStore
from tests.conftest import BackendUnderTest
from tests.gateway.conftest import AppFactory, make_settings
from tests.gateway.test_erasure_backends import CALM, add_facts, say, skill_md
from tests.support.loopback import LoopbackAdapter
from tests.support.pgcluster import Cluster

ALICE = UserRef("loop", "alice")
PAIRS = [
    ("sqlite", "sqlite"),
    ("sqlite", "postgresql"),
    ("postgresql", "sqlite"),
    ("postgresql", "postgresql"),
]


def configure(home: Path, kind: str, request: pytest.FixtureRequest) -> BackendUnderTest:
    """``home`` on ``kind``: nothing configured (state.db), or a fresh PostgreSQL database."""
    home.mkdir(parents=True, exist_ok=True)
    if kind == "sqlite":
        return BackendUnderTest("sqlite")
    cluster: Cluster = request.getfixturevalue("pg_cluster")
    url = cluster.fresh_database()
    (home / "config.yaml").write_text(f"database:\n  url: {url}\n", encoding="utf-8")
    return BackendUnderTest("postgresql", url)


def run(home: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["--home", str(home), *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]  # extractfile is None only for non-files


async def seed(app_factory: AppFactory, emulator: Emulator, home: Path, backend: BackendUnderTest) -> None:
    emulator.default = lambda req: Reply(text="noted")
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **CALM) as app:
        # The profile first: the DM's frozen system prompt carries it from the first turn.
        assert (await asyncio.to_thread(app.files.user(ALICE).add, "User keeps a marzipanotter.")).success
        assert (await asyncio.to_thread(app.files.shared().add, "Deploys run on Fridays.")).success
        await say(app, adapter, "my word is zanzibarquokka", user="alice")
        await say(app, adapter, "/cron add every 2h remind me about pistachiolynx", user="alice")
    await add_facts(home, backend)
    SkillStore(home / "skills").create(skill_md("alice-tricks", "Fold an origamiheron."), ALICE)
    (home / "media").mkdir(exist_ok=True)
    (home / "media" / "a1.png").write_bytes(b"\x89PNG tangerinemoose")


async def as_seen_by_mnemo(home: Path) -> dict[str, Any]:
    """The profile through the repositories, whichever backend keeps it."""
    storage = await open_backend(load_settings(home, environ={}))
    try:
        sessions = await storage.sessions.list_sessions(None, limit=100)
        return {
            "sessions": sorted(
                (s.id, s.chat_key, s.system_prompt, s.message_count, s.started_at) for s in sessions
            ),
            "messages": {
                s.id: [
                    (m.id, m.role, m.content, m.author_id, m.created_at)
                    for m in await storage.sessions.load_messages(s.id)
                ]
                for s in sessions
            },
            "profile": storage.files.user(ALICE).load().entries,
            "memory": storage.files.shared().load().entries,
            "people": await storage.directory.everyone(),
        }
    finally:
        await storage.close()


@pytest.mark.parametrize(("source", "target"), PAIRS, ids=[f"{s}-to-{t}" for s, t in PAIRS])
async def test_an_archive_restores_across_backends_and_the_conversation_goes_on(
    app_factory: AppFactory,
    emulator: Emulator,
    home: Path,
    tmp_path: Path,
    source: str,
    target: str,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src = configure(home, source, request)
    await seed(app_factory, emulator, home, src)
    before = await as_seen_by_mnemo(home)
    archive = tmp_path / "profile.tar.gz"
    code, out, err = await asyncio.to_thread(run, home, capsys, "export", str(archive))
    assert code == 0, err
    assert f"from {source}" in out
    assert json.loads(members(archive)["mnemo-export.json"])["source"]["backend"] == source

    moved = tmp_path / "moved"
    configure(moved, target, request)
    code, out, err = await asyncio.to_thread(run, moved, capsys, "import", str(archive))
    assert code == 0, err
    assert f"taken from {source}" in out
    after = await as_seen_by_mnemo(moved)
    assert after == before
    assert "marzipanotter" in after["profile"][0]
    # Files, facts, cron and search arrive as they were.
    assert (moved / "media" / "a1.png").read_bytes() == b"\x89PNG tangerinemoose"
    assert (
        "origamiheron"
        in (moved / "skills" / "users" / "loop" / "alice" / "alice-tricks" / "SKILL.md").read_text()
    )
    code, out, _ = await asyncio.to_thread(
        run, moved, capsys, "facts", "search", "fjordpelican", "--user", "loop:alice"
    )
    assert code == 0 and "fjordpelican" in out
    code, out, _ = await asyncio.to_thread(run, moved, capsys, "cron", "list")
    assert code == 0 and "pistachiolynx" in out
    code, out, _ = await asyncio.to_thread(run, moved, capsys, "sessions", "search", "zanzibarquokka")
    assert code == 0 and "my word is zanzibarquokka" in out
    # The conversation goes on with its memory: the same session, its frozen prompt.
    adapter = LoopbackAdapter()
    settings = make_settings(moved, **CALM)
    async with open_app(
        settings, adapters=[adapter], llm_base_url=emulator.base_url, api_key="test-key", trial=False
    ) as app:
        await say(app, adapter, "what is my word?", user="alice")
    request_body = emulator.requests[-1].body
    assert "marzipanotter" in json.dumps(request_body["system"])
    assert "my word is zanzibarquokka" in json.dumps(request_body["messages"])


async def test_a_backup_taken_while_the_bot_writes_is_one_snapshot(
    home: Path, backend: BackendUnderTest, tmp_path: Path
) -> None:
    settings = load_settings(home, environ={})
    storage = await open_backend(settings)
    stop = asyncio.Event()
    batches = 0
    try:
        session = await storage.sessions.create_session(
            chat_key="loop:dm:1",
            platform="loop",
            chat_id="1",
            thread_id=None,
            user_id="1",
            agent_context="primary",
            source="chat",
            model="m",
            system_prompt="",
        )

        async def writer() -> None:
            nonlocal batches
            while not stop.is_set() or batches < 5:
                # Every write is one transaction of a question and its answer.
                await storage.sessions.append_messages(
                    session.id, [NewMessage("user", f"q{batches}"), NewMessage("assistant", f"a{batches}")]
                )
                batches += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(writer())
        while batches < 3:
            await asyncio.sleep(0.01)
        archive = (await asyncio.to_thread(backup_now, settings, datetime.now(UTC))).path
        stop.set()
        await task
    finally:
        stop.set()
        await storage.close()
    files = members(archive)
    texts = [json.loads(line)["content"] for line in files["data/state/messages.jsonl"].decode().splitlines()]
    assert len(texts) >= 6 and len(texts) % 2 == 0, "never half of a transaction"
    assert texts == [x for i in range(len(texts) // 2) for x in (f"q{i}", f"a{i}")]
    [row] = [json.loads(line) for line in files["data/state/sessions.jsonl"].decode().splitlines()]
    assert row["message_count"] == len(texts), "the session row and its messages from one instant"
    assert verify_archive(archive).source.backend == backend.name


async def test_the_schedule_backs_up_the_configured_backend_once_per_slot(
    home: Path, backend: BackendUnderTest
) -> None:
    """Two processes serving the profile (replicas on PostgreSQL share the schedule's
    lock; on SQLite there is one) write each slot once, from the configured backend."""
    settings = load_settings(home, environ={}, overrides={"gateway.timezone": "UTC", "backup.keep": 5})
    start = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
    end = start + timedelta(days=2)
    storage = await open_backend(settings)
    done = asyncio.Event()

    class Time:
        now = start

        def clock(self) -> datetime:
            return self.now

        async def sleep(self, seconds: float) -> None:
            self.now += timedelta(seconds=seconds)
            if self.now > end:
                done.set()
                await asyncio.Event().wait()
            await asyncio.sleep(0)

    clocks = [Time(), Time()] if storage.shared_lock is not None else [Time()]
    schedulers = [
        BackupScheduler(settings, lock=storage.shared_lock, clock=t.clock, sleep=t.sleep) for t in clocks
    ]
    try:
        for s in schedulers:
            await s.start()
        await asyncio.wait_for(done.wait(), 60)
        await asyncio.sleep(0.5)  # the other replica's slot, under the lock
    finally:
        for s in schedulers:
            await s.stop()
        await storage.close()
    backups = list_backups(home / "backups")
    assert [b.created for b in backups] == [
        datetime(2026, 1, 11, 4, tzinfo=UTC),
        datetime(2026, 1, 12, 4, tzinfo=UTC),
    ]
    assert {verify_archive(b.path).source.backend for b in backups} == {backend.name}
    assert all(s.last_error is None for s in schedulers)


SECRETS = {
    "config llm.api_key": "sk-ant-config-aaaaaaaa1111",
    "config telegram.bot_token": "111111:TELEGRAMCONFIGTOKENaaaaaaaaaaaa",
    "config telegram.webhook_secret": "webhooksecret-cfg-123",
    "config discord.bot_token": "DISCORDCONFIGTOKEN.aaaa.bbbbbbbb",
    "config web.access_token": "webaccesstoken-cfg-1",
    "config web.admin_token": "admintoken-cfg-12345",
    "config transcription.api_key": "sttkey-config-999999",
    "env ANTHROPIC_API_KEY": "sk-ant-env-bbbbbbbb2222",
    "env MNEMO_WEB_TOKEN": "webtoken-env-33333",
    "env TELEGRAM_WEBHOOK_SECRET": "whsecret-env-4444",
    "admin_token file": "admintoken-file-67890",
    "provider secrets.json": "m0-secret-55555555",
    "provider config.json (older file)": "m0-legacy-66666666",
    "database.url password": "pgpass-secret-777",
}


async def test_no_secret_reaches_an_export_or_a_backup(
    home: Path, backend: BackendUnderTest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = SECRETS
    url = backend.url.replace("mnemo@", f"mnemo:{s['database.url password']}@") if backend.url else None
    config = (
        f"llm:\n  api_key: {s['config llm.api_key']}\n"
        f"telegram:\n  bot_token: '{s['config telegram.bot_token']}'\n"
        f"  webhook_secret: {s['config telegram.webhook_secret']}\n"
        f"discord:\n  bot_token: {s['config discord.bot_token']}\n"
        f"web:\n  access_token: {s['config web.access_token']}\n  admin_token: {s['config web.admin_token']}\n"
        f"transcription:\n  api_key: {s['config transcription.api_key']}\n"
        "gateway:\n  timezone: Europe/Lisbon\n" + (f"database:\n  url: {url}\n" if url else "")
    )
    (home / "config.yaml").write_text(config, encoding="utf-8")
    (home / ".env").write_text(
        f'ANTHROPIC_API_KEY="{s["env ANTHROPIC_API_KEY"]}"\nMNEMO_WEB_TOKEN={s["env MNEMO_WEB_TOKEN"]}\n'
        f"TELEGRAM_WEBHOOK_SECRET={s['env TELEGRAM_WEBHOOK_SECRET']}\nMNEMO_LOG_LEVEL=info\n",
        encoding="utf-8",
    )
    (home / "admin_token").write_text(s["admin_token file"], encoding="utf-8")
    from mnemo.providers.mem0 import Mem0Provider

    Mem0Provider().save_config(
        {"api_key": s["provider secrets.json"], "base_url": "http://127.0.0.1:9"}, home
    )
    legacy = home / "providers" / "mem0" / "config.json"
    legacy.write_text(
        json.dumps({**json.loads(legacy.read_text()), "api_key": s["provider config.json (older file)"]})
    )
    # Someone pasted a key into a chat: the row keeps the message, not the key.
    settings = load_settings(home, environ={})
    storage = await open_backend(settings)
    try:
        session = await storage.sessions.create_session(
            chat_key="loop:dm:1", platform="loop", chat_id="1", thread_id=None, user_id="1",
            agent_context="primary", source="chat", model="m", system_prompt="",
        )  # fmt: skip
        await storage.sessions.append_messages(
            session.id, [NewMessage("user", f"my key is {s['env ANTHROPIC_API_KEY']} ok")]
        )
    finally:
        await storage.close()

    export = tmp_path / "profile.tar.gz"
    code, out, err = await asyncio.to_thread(run, home, capsys, "export", str(export))
    assert code == 0, err
    for said in (
        ".env",
        "admin_token",
        "providers/mem0/secrets.json",
        "providers/mem0/config.json: api_key",
        "config.yaml: llm.api_key",
        "config.yaml: web.admin_token",
        "config.yaml: telegram.webhook_secret",
        "1 occurrence of a configured secret in data/state/messages.jsonl",
        *(["config.yaml: database.url"] if url else []),
    ):
        assert said in out, (said, out)
    code, _, err = await asyncio.to_thread(run, home, capsys, "backup", "now")
    assert code == 0, err
    [backup] = list_backups(home / "backups")
    for archive in (export, backup.path):
        files = members(archive)
        assert "config.yaml" in files and "data/state/messages.jsonl" in files
        leaks = [
            (name, what)
            for name, data in files.items()
            for what, value in s.items()
            if value.encode() in data
        ]
        assert leaks == [], archive.name
        assert b"my key is [secret left out by mnemo export] ok" in files["data/state/messages.jsonl"]
        assert b"Europe/Lisbon" in files["config.yaml"], "the settings that are no secrets stay"
    # Restored elsewhere: the markers are gone, the target keeps its own secrets and database.
    moved = tmp_path / "moved"
    moved.mkdir()
    (moved / "config.yaml").write_text("web:\n  access_token: the-new-machines-token\n")
    code, out, err = await asyncio.to_thread(run, moved, capsys, "import", str(export))
    assert code == 0, err
    restored = (moved / "config.yaml").read_text()
    assert "secret left out" not in restored and "the-new-machines-token" in restored
    assert "database" not in restored and "Europe/Lisbon" in restored
    assert load_settings(moved, environ={}).telegram.bot_token is None


def v1_archive(source: Path, dest: Path) -> Path:
    """An archive as 0.1's ``mnemo export`` wrote it: ``state.db`` and ``facts.db``
    copied with SQLite's backup API, the files as they are, a version-1 manifest."""
    files: dict[str, bytes] = {}
    for rel in ("state.db", "providers/holographic/facts.db"):
        copy = dest.with_suffix(".db")
        src, dst = sqlite3.connect(source / rel), sqlite3.connect(copy)
        src.backup(dst)
        dst.execute("PRAGMA journal_mode=DELETE")
        src.close()
        dst.close()
        files[rel] = copy.read_bytes()
        copy.unlink()
    for path in sorted(source.rglob("*")):
        rel = path.relative_to(source).as_posix()
        if path.is_file() and rel.startswith(("memories/", "skills/")) and not rel.endswith(".lock"):
            files[rel] = path.read_bytes()
    files["config.yaml"] = b"gateway:\n  timezone: Europe/Berlin\n"
    files["SOUL.md"] = b"You are calm."
    manifest = {"format": "mnemo-profile", "version": 1, "created_at": time.time(), "files": sorted(files)}
    staged = dest.parent / "v1-files"
    for name, data in files.items():
        (staged / name).parent.mkdir(parents=True, exist_ok=True)
        (staged / name).write_bytes(data)
    manifest["sha256"] = {name: file_sha256(staged / name) for name in files}
    with tarfile.open(dest, "w:gz") as tar:
        for name, data in [("mnemo-export.json", json.dumps(manifest).encode()), *sorted(files.items())]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return dest


def test_an_archive_of_0_1_restores_into_either_backend(
    home: Path, backend: BackendUnderTest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mnemo.memory.curated import MemoryFiles

    old = tmp_path / "old"
    old.mkdir()

    assert main(["--home", str(old), "facts", "add", "Ann keeps a fjordpelican.", "--user", "cli:ann"]) == 0
    MemoryFiles(old / "memories", 2200, 1375).shared().add("Deploys run on Fridays.")
    MemoryFiles(old / "memories", 2200, 1375).user(UserRef("cli", "ann")).add("Ann likes marzipanotter.")

    async def talk() -> None:
        storage = await open_backend(load_settings(old, environ={}))
        try:
            session = await storage.sessions.create_session(
                chat_key="cli:dm:ann", platform="cli", chat_id="ann", thread_id=None, user_id="ann",
                agent_context="primary", source="chat", model="m", system_prompt="frozen",
            )  # fmt: skip
            await storage.sessions.append_messages(
                session.id, [NewMessage("user", "my word is zanzibarquokka")]
            )
        finally:
            await storage.close()

    asyncio.run(talk())
    archive = v1_archive(old, tmp_path / "old-export.tar.gz")
    code, out, err = run(home, capsys, "backup", "verify", str(archive))
    assert code == 0 and "format version 1" in out, err
    code, out, err = run(home, capsys, "import", str(archive))
    assert code == 0, err
    code, out, _ = run(home, capsys, "sessions", "search", "zanzibarquokka")
    assert code == 0 and "my word is zanzibarquokka" in out
    code, out, _ = run(home, capsys, "memory", "show", "--user", "cli:ann")
    assert "marzipanotter" in out and "Deploys run on Fridays." in out
    code, out, _ = run(home, capsys, "facts", "search", "fjordpelican", "--user", "cli:ann")
    assert code == 0 and "fjordpelican" in out
    assert (home / "SOUL.md").read_text() == "You are calm."
    assert not (home / "state.db").exists() or backend.url is None, "on PostgreSQL nothing goes to state.db"


def test_a_target_that_holds_data_is_refused_unless_force_and_what_it_held_is_kept(
    home: Path, backend: BackendUnderTest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def say_word(where: Path, word: str) -> None:
        storage = await open_backend(load_settings(where, environ={}))
        try:
            session = await storage.sessions.create_session(
                chat_key="cli:dm:ann", platform="cli", chat_id="ann", thread_id=None, user_id="ann",
                agent_context="primary", source="chat", model="m", system_prompt="",
            )  # fmt: skip
            await storage.sessions.append_messages(session.id, [NewMessage("user", f"word {word}")])
        finally:
            await storage.close()

    other = tmp_path / "other"
    other.mkdir()
    asyncio.run(say_word(other, "fromthearchive"))
    archive = tmp_path / "other.tar.gz"
    assert run(other, capsys, "export", str(archive))[0] == 0
    asyncio.run(say_word(home, "alreadyhere"))
    code, _, err = run(home, capsys, "import", str(archive))
    assert code == 1 and "already holds data (1 chats, 1 sessions, 1 messages" in err and "--force" in err
    code, _, err = run(home, capsys, "backup", "restore", str(archive))
    assert code == 1 and "already holds data" in err
    code, out, _ = run(home, capsys, "sessions", "search", "alreadyhere")
    assert "word alreadyhere" in out, "nothing changed"
    code, out, err = run(home, capsys, "backup", "restore", str(archive), "--force")
    assert code == 0, err
    [aside] = home.glob(".replaced-*")
    assert f"moved to {aside}" in out
    kept = b"".join(p.read_bytes() for p in aside.rglob("*") if p.is_file())
    assert b"word alreadyhere" in kept, "what the target held is kept aside"
    code, out, _ = run(home, capsys, "sessions", "search", "fromthearchive")
    assert "word fromthearchive" in out
    code, out, _ = run(home, capsys, "sessions", "search", "alreadyhere")
    assert "word alreadyhere" not in out


def test_every_table_and_column_of_both_backends_is_archived_or_named_local(
    home: Path, backend: BackendUnderTest
) -> None:
    """The archive form keeps up with the schema: a table or column added to either
    backend must be added to ``gateway/archive/format.py`` or to its ``LOCAL`` list."""
    from mnemo.gateway.archive.format import LOCAL, TABLES

    settings = load_settings(home, environ={})

    async def open_and_close() -> None:
        storage = await open_backend(settings)
        await storage.close()

    asyncio.run(open_and_close())
    main(["--home", str(home), "facts", "add", "A fact.", "--user", "loop:x"])
    columns: dict[str, set[str]] = {}
    if backend.url is None:
        for path, group in ((home / "state.db", ""), (home / "providers" / "holographic" / "facts.db", "")):
            conn = sqlite3.connect(path)
            names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
            virtual = [
                r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE sql LIKE 'CREATE VIRTUAL%'")
            ]
            for name in names:
                if (
                    name in virtual
                    or any(name.startswith(f"{v}_") for v in virtual)
                    or name == "sqlite_sequence"
                ):
                    continue
                columns[group + name] = {r[1] for r in conn.execute(f'PRAGMA table_info("{name}")')}
            conn.close()
    else:
        import psycopg

        with psycopg.connect(backend.url) as conn:
            rows = conn.execute(
                "SELECT table_name, column_name FROM information_schema.columns"
                " WHERE table_schema IN ('public', 'holographic')"
            ).fetchall()
        for table, column in rows:
            columns.setdefault(table, set()).add(column)
    archived = {t.name: set(t.names) for t in TABLES}
    renamed = {("link_codes", "usr"): "user"}
    missing = sorted(
        f"{table}.{column}"
        for table, cols in columns.items()
        if table not in LOCAL
        for column in cols
        if renamed.get((table, column), column) not in archived.get(table, set())
        and f"{table}.{column}" not in LOCAL
    )
    assert missing == [], "archive these columns (gateway/archive/format.py) or name them in LOCAL"
    assert backend_for(settings).archive().contents().rows["holographic/facts"] == 1


async def test_the_dashboard_says_when_the_newest_backup_predates_a_move_to_postgresql(
    home: Path, pg_cluster: Cluster
) -> None:
    from mnemo.dashboard import ProfileStats

    before = load_settings(home, environ={})
    await asyncio.to_thread(backup_now, before, datetime(2026, 1, 1, tzinfo=UTC))
    (home / "config.yaml").write_text(f"database:\n  url: {pg_cluster.fresh_database()}\n")
    moved = load_settings(home, environ={})
    storage = await open_backend(moved)
    try:
        stats = ProfileStats(moved, storage.directory, storage.budgets)
        status = await stats.last_backup()
        assert status is not None and not status.verified
        assert "taken from sqlite, but this profile now runs on postgresql" in status.detail
        await asyncio.to_thread(backup_now, moved, datetime(2026, 1, 2, tzinfo=UTC))
        status = await stats.last_backup()
        assert status is not None and status.verified and "(postgresql)" in status.detail
    finally:
        await storage.close()
