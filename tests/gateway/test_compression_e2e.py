"""Compression end to end: the reply never waits for it, messages sent while it runs
land in the new session exactly once and in order, summaries are updated iteratively,
a request that would not fit is trimmed and compressed after, and a gateway process
killed with -9 in the middle of a compression finishes it once after a restart."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from mnemo.gateway.emulator import Emulator, Fault, RecordedRequest, Reply
from mnemo.memory.compressor import TRIM_KEY, is_summary
from tests.gateway.test_housekeeping import SMALL, World, chain, converse, filler, last_text, settle
from tests.support.loopback import LoopbackAdapter

MNEMO = [sys.executable, "-m", "mnemo"]


async def until(predicate, timeout: float = 30.0, what: str = "condition") -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def test_the_reply_is_sent_before_the_compression_job_runs(app_factory, emulator):
    world = World()
    release = asyncio.Event()

    async def hold_flush(req: RecordedRequest) -> None:
        await release.wait()

    world.hooks["memory"] = hold_flush
    emulator.default = world
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **SMALL) as app:
        # Every reply arrives although the job's first request is held the whole time.
        n = await converse(adapter, filler(13))
        await until(lambda: bool(world.seen["memory"]), what="the flush request")
        (job,) = await app.jobs.jobs(kind="compress")
        assert job.state == "running" and len(adapter.sent) == n
        rows = await app.db.read(lambda c: c.execute("SELECT created_at FROM outbox ORDER BY id").fetchall())
        assert [r for r in rows if r["created_at"] <= job.created_at], (
            "the triggering reply was queued before the job"
        )
        assert len(await chain(app)) == 1
        release.set()
        await settle(app)
        assert len(await chain(app)) == 2


async def test_messages_sent_during_a_held_compression_land_in_the_new_session_once_in_order(
    app_factory, emulator
):
    world = World()
    release = asyncio.Event()

    async def hold_summary(req: RecordedRequest) -> None:
        await release.wait()

    world.hooks["summary"] = hold_summary
    emulator.default = world
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **SMALL) as app:
        n = await converse(adapter, filler(13))
        await until(lambda: bool(world.seen["summary"]), what="the summary request")
        during = ["during one", "during two", "during three"]
        n = await converse(adapter, during, already=n)  # answered while the job is held
        (old,) = await chain(app)
        assert old.ended_at is None
        release.set()
        await settle(app)
        old, new = await chain(app)
        old_rows = await app.store.load_messages(old.id)
        new_rows = await app.store.load_messages(new.id)
        new_users = [r.content for r in new_rows if r.role == "user" and not is_summary(r)]
        for text in during:
            assert new_users.count(text) == 1, "once, not lost, not doubled"
        assert new_users[-3:] == during, "in order, at the end of the carried tail"
        carried = [r for r in new_rows if "carried_from" in r.meta][3:]
        assert [r.content for r in carried] == [r.content for r in old_rows[-len(carried) :]]
        assert carried[-1].content == old_rows[-1].content, "nothing after the cut was dropped"

        await converse(adapter, ["after the switch"], already=n)
        after = [r.content for r in await app.store.load_messages(new.id) if r.role == "user"]
        assert after[-1] == "after the switch" and after.count("during three") == 1
        assert world.seen["chat"][-1].system_text == new.system_prompt


async def test_each_compression_updates_the_previous_summary(app_factory, emulator):
    world = World()
    made: list[str] = []

    def summarise(req: RecordedRequest) -> Reply:
        made.append(f"## Goal\nSUMMARY-{len(made) + 1}: the user explores the harbour.")
        return Reply(text=made[-1])

    world.hooks["summary"] = summarise
    emulator.default = world
    adapter = LoopbackAdapter()
    async with app_factory(adapter, **SMALL) as app:
        n = 0
        while len(await chain(app)) < 3:
            n = await converse(adapter, filler(1, start=n), already=n)
            await settle(app)
            assert n < 60
        sessions = await chain(app)
        requests = world.seen["summary"]
        prompts = [last_text(r) for r in requests]
        assert "PRESERVE all existing information" not in prompts[0]
        for k in range(1, len(prompts)):
            # The summary is asked after the conversation, which starts with the earlier one.
            assert f"SUMMARY-{k}: the user" in str(requests[k].messages[:-1]), "the earlier summary is in it"
            assert "PRESERVE all existing information" in prompts[k]
        rows = await app.store.load_messages(sessions[-1].id)
        (summary,) = [r for r in rows if is_summary(r)]
        assert made[-1] in summary.content and made[0] not in summary.content
        assert [s.parent_session_id for s in sessions] == [None, *(s.id for s in sessions[:-1])]


async def test_a_request_that_would_not_fit_is_trimmed_and_compressed_after(app_factory, emulator):
    world = World()
    emulator.default = world
    adapter = LoopbackAdapter()
    # Threshold 90% of 8k: above what fits once 2k are reserved for the answer, so only
    # the preflight can notice that the conversation has outgrown the window.
    settings = {**SMALL, "llm.max_tokens": 2048, "compression.threshold": 0.9}
    async with app_factory(adapter, **settings) as app:
        trimmed_seen = asyncio.Event()

        async def listener(ctx, result):
            if result.context_trimmed:
                trimmed_seen.set()

        app.gateway.turn_listeners.append(listener)
        n = 0
        while not trimmed_seen.is_set():
            n = await converse(adapter, filler(1, start=n), already=n)
            assert n < 40
        trimmed = world.seen["chat"][-1]
        assert "earlier messages are left out of this request" in str(trimmed.body["messages"])
        assert (
            trimmed.usage["input_tokens"]
            + trimmed.usage["cache_read_input_tokens"]
            + trimmed.usage["cache_creation_input_tokens"]
            <= 8192 - 2048
        )
        await settle(app)
        old, new = (await chain(app))[:2]
        assert old.end_reason == "compression" and new.parent_session_id == old.id
        stored = [r for s in await chain(app) for r in await app.store.load_messages(s.id)]
        assert not any(r.meta.get(TRIM_KEY) for r in stored), "the trim note is never stored"


async def test_prompt_too_long_from_the_api_is_retried_trimmed_then_compressed(app_factory, emulator):
    world = World()
    refuse = {"next": False}

    def chat(req: RecordedRequest) -> Fault | None:
        if refuse["next"]:
            refuse["next"] = False
            return Fault(400, body="prompt is too long: 9000 tokens > 8192 maximum")
        return None

    world.hooks["chat"] = chat
    emulator.default = world
    adapter = LoopbackAdapter()
    # Seven turns fit by our estimate (and stay under the threshold), yet the API refuses.
    async with app_factory(adapter, **{**SMALL, "llm.max_tokens": 2048}) as app:
        n = await converse(adapter, filler(7))
        await settle(app)
        assert len(await chain(app)) == 1
        refuse["next"] = True
        await converse(adapter, ["one more question"], already=n)
        assert adapter.texts()[-1].startswith("reply to 'one more question'")
        refused, retried = world.seen["chat"][-2:]
        assert refused.response_status == 400 and retried.response_status == 200
        assert "left out of this request" in str(retried.body["messages"])
        assert "left out of this request" not in str(refused.body["messages"])
        await settle(app)
        old, new = (await chain(app))[:2]
        assert old.end_reason == "compression" and new.parent_session_id == old.id


# --- a real process killed with -9 while it compresses ---------------------------------


def _env(home: Path, base_url: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ANTHROPIC_", "TELEGRAM_", "DISCORD_", "MNEMO_"))
    }
    env.update(
        MNEMO_HOME=str(home),
        ANTHROPIC_BASE_URL=base_url,
        ANTHROPIC_API_KEY="test-key",
        MNEMO_LOG_LEVEL="warning",
        MNEMO_CONTEXT_WINDOW="8192",
    )
    return env


def _query(home: Path, sql: str, args: tuple = ()) -> list[tuple]:
    conn = sqlite3.connect(home / "state.db", timeout=5)
    try:
        return conn.execute(sql, args).fetchall()
    except sqlite3.OperationalError:
        return []  # the database is not created yet
    finally:
        conn.close()


async def _wait_db(home: Path, sql: str, args: tuple = (), *, what: str, timeout: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not _query(home, sql, args):
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


@pytest.mark.slow
async def test_kill_9_during_compression_then_restart_completes_it_once(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("llm:\n  max_tokens: 1024\nmemory:\n  nudge_interval: 0\n")
    world = World()
    hold = asyncio.Event()

    async def hold_summary(req: RecordedRequest) -> None:
        await hold.wait()  # the first process dies while this request is in flight

    world.hooks["summary"] = hold_summary
    first_lines = filler(13)
    during = ["sent during the compression", "also during it"]
    async with Emulator(responder=world) as emu:
        out1 = (tmp_path / "out1.txt").open("wb")
        first = await asyncio.create_subprocess_exec(
            *MNEMO,
            "chat",
            "--user",
            "bob",
            stdin=subprocess.PIPE,
            stdout=out1,
            stderr=subprocess.STDOUT,
            env=_env(home, emu.base_url),
        )
        assert first.stdin is not None
        first.stdin.write("".join(f"{t}\n" for t in first_lines).encode())
        await first.stdin.drain()
        await until(lambda: bool(world.seen["summary"]), timeout=90, what="the summary request")
        first.stdin.write("".join(f"{t}\n" for t in during).encode())
        await first.stdin.drain()
        await _wait_db(
            home,
            "SELECT 1 FROM messages WHERE role='assistant' AND content LIKE ?",
            ("reply to 'also during it'%",),
            what="the reply to the last message",
        )
        assert _query(home, "SELECT state, attempts FROM jobs WHERE kind='compress'") == [("running", 1)]
        first.send_signal(signal.SIGKILL)
        await first.wait()
        out1.close()

        hold.set()
        out2 = (tmp_path / "out2.txt").open("wb")
        second = await asyncio.create_subprocess_exec(
            *MNEMO,
            "chat",
            "--user",
            "bob",
            stdin=subprocess.PIPE,
            stdout=out2,
            stderr=subprocess.STDOUT,
            env=_env(home, emu.base_url),
        )
        assert second.stdin is not None
        await _wait_db(
            home, "SELECT 1 FROM jobs WHERE kind='compress' AND state='done'", what="the resumed job"
        )
        second.stdin.write(b"after the restart\n")
        await second.stdin.drain()
        await _wait_db(
            home,
            "SELECT 1 FROM messages WHERE role='assistant' AND content LIKE ?",
            ("reply to 'after the restart'%",),
            what="the reply after the restart",
        )
        second.stdin.close()
        assert await asyncio.wait_for(second.wait(), 60) == 0, (tmp_path / "out2.txt").read_text()
        out2.close()

    assert _query(home, "SELECT state, attempts FROM jobs WHERE kind='compress'") == [("done", 2)]
    assert len(world.seen["memory"]) == 1, "the flush recorded before the kill is not run again"
    assert len(world.seen["summary"]) == 2
    sessions = _query(
        home,
        "SELECT id, parent_session_id, end_reason, source FROM sessions WHERE chat_key='cli:dm:bob' ORDER BY rowid",
    )
    assert [(s[2], s[3]) for s in sessions] == [("compression", "chat"), (None, "chat")]
    old_id, new_id = sessions[0][0], sessions[1][0]
    assert sessions[1][1] == old_id

    def users(session_id: str) -> list[str]:
        rows = _query(
            home,
            "SELECT content, meta FROM messages WHERE session_id=? AND role='user' ORDER BY id",
            (session_id,),
        )
        return [c for c, meta in rows if '"compression_summary": true' not in meta]

    sent = [t.strip() for t in (*first_lines, *during)]  # the console strips each line
    assert users(old_id) == sent, "every message of the first process is stored once, in order"
    new_users = users(new_id)
    assert new_users[-1] == "after the restart"
    carried = new_users[:-1]
    assert carried[:2] == sent[:2], "the head (first three messages) is kept"
    tail = carried[2:]
    assert tail == sent[len(sent) - len(tail) :] and tail[-2:] == during, (
        "the tail is the newest messages, once"
    )
    assert _query(home, "SELECT COUNT(*) FROM inbox WHERE state != 'done'") == [(0,)]
    replies = _query(home, "SELECT inbox_id, COUNT(*) FROM outbox GROUP BY inbox_id HAVING COUNT(*) > 1")
    assert replies == [], "no message answered twice"
    assert _query(home, "SELECT COUNT(*) FROM outbox") == [(len(sent) + 1,)]
