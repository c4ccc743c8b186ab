"""Erasure of the layers around the conversations: a person seeded in a DM, a group, a
shared room, a cron job, holographic facts, their own skills (and a skill's history),
a linked second account, a pending ``/link`` code and a picture they sent. After
``mnemo users erase`` none of their words is in the database files, the home folder,
an export (``mnemo export``) or the backup archive made before; the other person's rows, files and a picture
both sent stay byte for byte. With an external provider, its delete is queued durably
and sent once, after the provider comes back (``test_forget_user.py`` covers each
provider's delete call)."""

from __future__ import annotations

import json
import sqlite3
import tarfile
from datetime import UTC, datetime
from pathlib import Path

import pytest

from mnemo.archives.restore import verify_archive
from mnemo.backups import backup_now
from mnemo.cli.main import main
from mnemo.gateway.config import load_settings
from mnemo.gateway.emulator import Reply
from mnemo.memory.durable import forget_user
from mnemo.memory.scope import UserRef
from mnemo.memory.skills import SkillStore
from tests.gateway.test_erasure import ALICE_WORDS, QUIET, bob_snapshot, hits, seed, users
from tests.support.loopback import LoopbackAdapter

MORE_ALICE = ("gondolawalrus", "pistachiolynx", "origamiheron", "tangerinemoose", "lemonadebadger")
ALICE, ALICE2, BOB = UserRef("loop", "alice"), UserRef("loop", "alice2"), UserRef("loop", "bob")


async def say(app, adapter: LoopbackAdapter, text: str, **kw) -> str:
    """Send and wait for the answer itself (a command's reply is delivered by the
    delivery loop, not by the lane)."""
    n = len(adapter.sent)
    await adapter.say(text, **kw)
    await app.gateway.lanes.drain(30)
    return (await adapter.wait_sent(n + 1))[n].text


def skill_md(name: str, body: str) -> str:
    return f"---\nname: {name}\ndescription: A skill of {name}.\n---\n\n# {name}\n\n{body}\n"


def attach(home: Path, author: str, name: str, data: bytes) -> None:
    """A picture as the pipeline stores it: the file under media/, named in the meta of
    the author's first message."""
    media = home / "media"
    media.mkdir(exist_ok=True)
    (media / name).write_bytes(data)
    with sqlite3.connect(home / "state.db") as conn:
        mid = conn.execute(
            "SELECT MIN(id) FROM messages WHERE author_id = ? AND role = 'user'", (author,)
        ).fetchone()[0]
        ref = {"kind": "image", "file": name, "media_type": "image/png", "name": "p.png", "bytes": len(data)}
        conn.execute(
            "UPDATE messages SET meta = json_set(meta, '$.media', json(?)) WHERE id = ?",
            (json.dumps([ref]), mid),
        )
        conn.execute(  # counted against media.quota as the pipeline does
            "INSERT INTO media_usage (owner, kind, file, bytes, day, created_at) VALUES (?, 'stored', ?, ?, ?, ?)",
            (f"loop:{author}", name, len(data), "2026-01-01", 1.0),
        )


async def seed_more(app_factory, emulator, home: Path) -> None:
    await seed(app_factory, emulator, home)
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **QUIET) as app:
        await say(app, adapter, "second account says gondolawalrus", user="alice2")
        await say(app, adapter, "/cron add every 2h remind me about pistachiolynx", user="alice")
        await say(app, adapter, "/link", user="alice2")
        assert app.links is not None
        await app.links.link(ALICE, ALICE2)
    store = SkillStore(home / "skills")
    store.create(skill_md("alice-tricks", "Fold an origamiheron."), ALICE)
    store.edit(
        "alice-tricks", skill_md("alice-tricks", "Fold an origamiheron twice."), ALICE
    )  # a version in history
    store.create(skill_md("bob-tricks", "Bob's own trick."), BOB)
    aside = home / ".replaced-20260101-000000" / "memories" / "users" / "loop"  # left by an earlier import
    for user, text in (("alice", "Old copy: lemonadebadger."), ("bob", "Old copy of Bob.")):
        (aside / user).mkdir(parents=True)
        (aside / user / "USER.md").write_text(text)
    attach(home, "alice", "a1.png", b"\x89PNG tangerinemoose")
    attach(home, "bob", "b1.png", b"\x89PNG bob picture")
    with sqlite3.connect(home / "state.db") as conn:  # both sent the same picture once
        mid = conn.execute(
            "SELECT MAX(id) FROM messages WHERE author_id = 'alice' AND role = 'user'"
        ).fetchone()[0]
        ref = {"kind": "image", "file": "b1.png", "media_type": "image/png", "name": "p.png", "bytes": 16}
        conn.execute(
            "UPDATE messages SET meta = json_set(meta, '$.media', json(?)) WHERE id = ?",
            (json.dumps([ref]), mid),
        )


def unpacked(archive: Path) -> str:
    """Every file of an archive, decompressed, as one text."""
    with tarfile.open(archive) as tar:
        return b"".join(tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()).decode(  # type: ignore[union-attr]  # extractfile is None only for non-files
            "utf-8", "replace"
        )


def export(home: Path, dest: Path) -> str:
    """What ``mnemo export`` writes."""
    assert main(["--home", str(home), "export", str(dest), "--force"]) == 0
    return unpacked(dest)


async def test_erase_reaches_skills_links_media_and_cron_and_leaves_the_others(
    app_factory, emulator, home: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    await seed_more(app_factory, emulator, home)
    words = ALICE_WORDS + MORE_ALICE
    assert {w for w in words for h in hits(home, (w,))} >= {"origamiheron", "tangerinemoose", "gondolawalrus"}
    before = bob_snapshot(home)
    bob_files = {
        p: p.read_bytes()
        for p in [
            home / "media" / "b1.png",
            home / ".replaced-20260101-000000" / "memories" / "users" / "loop" / "bob" / "USER.md",
            *(home / "skills" / "users" / "loop" / "bob").rglob("*"),
        ]
        if p.is_file()
    }
    assert any(w in export(home, tmp_path / "before.tar.gz") for w in words)
    backup = backup_now(load_settings(home, environ={}), datetime(2026, 1, 2, tzinfo=UTC)).path
    assert any(w in unpacked(backup) for w in words)
    capsys.readouterr()

    assert await users(home, "erase", "loop:alice", "--dry-run", "--json") == 0
    dry = json.loads(capsys.readouterr().out)["removed"]
    assert dry["skills"] == 1 and dry["media"] == 1 and dry["links"] == 3 and dry["cron_jobs"] == 1
    assert dry["copies"] == 1, "the profile copy in .replaced-*"
    assert dry["backups"] == 1
    assert dry["provider"] == 0, "no external provider configured"
    assert await users(home, "erase", "loop:alice", "--yes", "--json") == 0
    assert json.loads(capsys.readouterr().out)["removed"] == dry

    assert hits(home, words) == []
    assert not any(w in export(home, tmp_path / "after.tar.gz") for w in words)
    scrubbed = unpacked(backup)
    assert not any(w in scrubbed for w in words), "the backup was erased too"
    assert "bobsecretplum" in scrubbed and "bobfactkiwi" in scrubbed
    assert verify_archive(backup).rows > 0 and backup.stat().st_mode & 0o777 == 0o600
    assert bob_snapshot(home) == before
    assert {p: p.read_bytes() for p in bob_files} == bob_files, "bob's skill and the picture both sent stay"
    assert not (home / "media" / "a1.png").exists()
    assert not (home / "skills" / "users" / "loop" / "alice").exists()
    assert not list((home / "skills" / ".history").rglob("*alice*"))
    with sqlite3.connect(home / "state.db") as conn:
        assert conn.execute("SELECT COUNT(*) FROM identity_links").fetchone()[0] == 0
        assert conn.execute("SELECT COUNT(*) FROM link_codes").fetchone()[0] == 0
        assert conn.execute("SELECT owner FROM media_usage").fetchall() == [("loop:bob",)]
        assert (
            conn.execute("SELECT COUNT(*) FROM sessions WHERE user_id IN ('alice', 'alice2')").fetchone()[0]
            == 0
        )


async def test_an_external_providers_delete_is_queued_while_it_is_down_and_sent_once(
    app_factory, emulator, home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import mnemo.gateway.jobs.provider_writes as provider_writes
    from mnemo.providers.mem0 import Mem0Provider
    from tests.fakes.mem0_api import FakeMem0

    # no retry until the test says so
    monkeypatch.setattr(provider_writes, "PROVIDER_WRITE_BACKOFF", (3600.0,))
    fake = FakeMem0("m0-test")
    await fake.start()
    try:
        Mem0Provider().save_config({"api_key": "m0-test", "base_url": fake.base_url, "timeout_s": 2.0}, home)
        emulator.default = lambda req: Reply(text="ok")
        adapter = LoopbackAdapter()
        settings = {**QUIET, "memory.provider": "mem0"}
        async with app_factory(adapter, **settings) as app:
            await say(app, adapter, "alice says walrusglacier", user="alice")
            await say(app, adapter, "bob says bobpretzel", user="bob")
            await app.providers.pending()
            await app.jobs.wait_idle()
            assert set(fake.memories) == {"loop:alice", "loop:bob"}
            fake.down = True
            ask = await say(app, adapter, "/forget me", user="alice")
            code = ask.split("/forget me ", 1)[1].split()[0]
            assert "provider: 1" in await say(app, adapter, f"/forget me {code}", user="alice")
            await app.jobs.wait_idle()
            [job] = [
                j
                for j in await app.jobs.jobs(kind="provider_write")
                if j.payload["payload"]["op"] == "forget_user"
            ]
            assert job.state == "queued" and job.attempts == 1, "tried while down, kept for later"
            assert job.payload == {"provider": "mem0", "payload": forget_user("loop:alice")}
        assert "loop:alice" in fake.memories, "nothing deleted while down"

        fake.down = False  # back up; a new process delivers the queued delete
        with sqlite3.connect(home / "state.db") as conn:
            conn.execute("UPDATE jobs SET not_before = 0 WHERE kind = 'provider_write'")
        async with app_factory(LoopbackAdapter(), **settings) as app:
            app.jobs.wake()
            await app.jobs.wait_idle()
            await app.jobs.wait_idle()
            [job] = [
                j
                for j in await app.jobs.jobs(kind="provider_write")
                if j.payload["payload"]["op"] == "forget_user"
            ]
            assert job.state == "done"
        # Tried once while down (answered 503), delivered once after: never again.
        assert [(r.path, r.query) for r in fake.deletes()] == [
            ("/v1/memories/", {"user_id": "loop:alice"})
        ] * 2
        assert set(fake.memories) == {"loop:bob"}
    finally:
        await fake.stop()


async def test_a_dm_whose_chat_is_not_the_user_id_is_erased_too(
    app_factory, emulator, home: Path, capsys
) -> None:
    """Discord's DMs are channels with their own id: the DM session is still theirs."""
    emulator.default = lambda req: Reply(text="ok")
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **QUIET) as app:
        await say(app, adapter, "in my dm channel: hazelnutgecko", user="alice", chat="dmchan7")
        await say(app, adapter, "bob in his: bobcrumpet", user="bob", chat="dmchan8")
    assert await users(home, "erase", "loop:alice", "--yes", "--json") == 0
    assert json.loads(capsys.readouterr().out)["removed"]["sessions"] == 1
    assert hits(home, ("hazelnutgecko",)) == [] and hits(home, ("bobcrumpet",))
