"""Queued provider writes survive a kill -9 of ``mnemo run`` and arrive exactly once.

For each external provider: a real ``mnemo run`` process (web chat, trial-mode replies)
with the provider's fake API answering 503 to everything; two users chat through the web
chat's websocket and every message is answered; each turn's write is tried, fails and
waits in the job table; the process is killed with SIGKILL; the fake comes back; a new
``mnemo run`` sends every queued write — each turn's write reaches the fake exactly once,
in the speaker's scope.
"""

from __future__ import annotations

import asyncio
import re
import signal
import sqlite3
from pathlib import Path

import aiohttp
import pytest

from tests.adapters.telegram_harness import wait_until
from tests.gateway.test_cli_run import clean_env, read_until, start
from tests.providers.external import EXTERNAL, External, request_text, scopes_in
from tests.support.webchat import ChatClient

pytestmark = pytest.mark.slow  # real processes: started first, with the longer timeout

TIMEOUT = 60.0
WEB = re.compile(r"web chat: (http://\S+)/")
USERS = {"alice": "web:kill9-alice-0001", "bob": "web:kill9-bob-00002"}
TURNS = [
    ("alice", "alice-turn-1 I paddle a green kayak"),
    ("bob", "bob-turn-1 I collect old sea charts"),
    ("alice", "alice-turn-2 my kayak is named Heron"),
    ("bob", "bob-turn-2 my oldest chart is from 1790"),
]


def marker(text: str) -> str:
    return text.split()[0]


def provider_jobs(db_path: Path) -> list[tuple[str, int, str]]:
    """(state, attempts, op) of every provider_write job, read as another process would."""
    if not db_path.exists():
        return []
    with sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True) as db:
        return db.execute(
            "SELECT state, attempts, json_extract(payload, '$.payload.op') FROM jobs WHERE kind = 'provider_write'"
        ).fetchall()


async def kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()


async def chat_while_down(url: str) -> None:
    async with aiohttp.ClientSession() as http:
        clients = {
            name: await ChatClient.connect(http, url, user_id.split(":", 1)[1])
            for name, user_id in USERS.items()
        }
        for name, text in TURNS:
            await clients[name].say(text)
            reply = await clients[name].next("reply", timeout=TIMEOUT)
            assert reply["text"], f"{name}'s message was answered while the provider is down"
        for client in clients.values():
            await client.close()


@pytest.mark.parametrize("external", EXTERNAL, ids=str)
async def test_queued_writes_survive_kill_9_and_arrive_exactly_once(
    external: External, home: Path, tmp_path: Path
) -> None:
    fake = external.fake()
    await fake.start()
    try:
        external.configure(home, fake)
        (home / "config.yaml").write_text(f"memory:\n  provider: {external.name}\n")
        fake.down = True
        env = clean_env(tmp_path, MNEMO_WEB_PORT="0")
        db_path = home / "state.db"

        first = await start(home, env)
        seen: list[str] = []
        try:
            url = (await asyncio.wait_for(read_until(first.stderr, WEB, seen), TIMEOUT))[1]
            await chat_while_down(url)

            def all_tried_and_waiting() -> bool:
                turns = [j for j in provider_jobs(db_path) if j[2] == "turn"]
                return len(turns) == len(TURNS) and all(
                    state == "queued" and attempts >= 1 for state, attempts, _ in turns
                )

            await wait_until(all_tried_and_waiting, TIMEOUT, "every turn's write tried once and queued")
            assert fake.requests, "the provider was called (and answered 503) before the kill"
        finally:
            await kill(first)
        assert first.returncode == -signal.SIGKILL

        fake.down = False
        since = len(fake.requests)
        second = await start(home, env)
        try:
            await wait_until(
                lambda: {s for s, _, _ in provider_jobs(db_path)} == {"done"},
                TIMEOUT,
                "every queued write done",
            )
            # Every write that will be sent has been: the job table holds no more work.
            writes = {id(r) for r in external.writes(fake)}
            arrived = [r for r in fake.requests[since:] if id(r) in writes]
            for name, text in TURNS:
                carrying = [r for r in arrived if marker(text) in request_text(r)]
                assert len(carrying) == 1, f"{marker(text)} arrived {len(carrying)} times"
                assert scopes_in(carrying[0], USERS) == {name}, "written in the speaker's scope only"
            assert len(arrived) == len(TURNS), [request_text(r) for r in arrived]
            second.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(second.wait(), TIMEOUT) == 0
        finally:
            await kill(second)
    finally:
        await fake.stop()
