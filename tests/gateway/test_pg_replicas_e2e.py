"""Three real ``mnemo run`` replicas (one configuration, one home, one PostgreSQL from the
throw-away cluster) serve one bot against the fake Telegram Bot API and the Anthropic
emulator; one replica is killed with SIGKILL half-way.

* **polling**: exactly one replica polls (``getUpdates`` never answers 409 Conflict); the
  leader is the one killed, another takes over (``mnemo status --json`` shows the role
  move) and answers the rest;
* **webhook**: the fake posts every update to a round-robin proxy in this test, which
  spreads them over the three replicas (a dead one's share goes to the next).

Either way: every message is answered, in order per chat, exactly once — except sends
that were in flight at the kill, which are labelled as possible duplicates — and no two
LLM requests of one chat's session ever run at the same time (the emulator records when
each request started and ended).

Size: ``MNEMO_E2E_CHATS`` (polling) / ``MNEMO_E2E_WEBHOOK_CHATS`` × ``MNEMO_E2E_MESSAGES``,
by default the issue's 100 chats × 10 messages for both (about a minute each on 2 cores).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest
import yaml
from aiohttp import web

from mnemo.gateway.emulator import Emulator, RecordedRequest, Reply
from tests.fakes.telegram_api import FakeTelegram
from tests.support.pgcluster import Cluster
from tests.support.ports import reserve_port

pytestmark = pytest.mark.slow  # real processes: started first, with the longer timeout

MNEMO = [sys.executable, "-m", "mnemo"]
REPLICAS = 3
POLL_CHATS = int(os.environ.get("MNEMO_E2E_CHATS", "100"))
WEBHOOK_CHATS = int(os.environ.get("MNEMO_E2E_WEBHOOK_CHATS", "100"))
MESSAGES = int(os.environ.get("MNEMO_E2E_MESSAGES", "10"))
QUESTION = re.compile(r"chat (\d+) message (\d+)")
DUPLICATE = "possible duplicate"
LEADER = "leader:telegram-polling"
SECRET = "replica-e2e-secret"


@dataclass
class Span:
    chat: int
    message: int
    start: float
    end: float
    request: RecordedRequest


@dataclass
class World:
    home: Path
    url: str
    fake: FakeTelegram
    emulator: Emulator
    spans: list[Span] = field(default_factory=list)
    procs: list[asyncio.subprocess.Process] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)  # each replica's stderr

    def log_tails(self, lines: int = 30) -> str:
        return "\n".join(
            f"--- {log.name} ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
            for log in self.logs
        )


def _question(rec: RecordedRequest) -> tuple[int, int] | None:
    messages = rec.body.get("messages", []) if isinstance(rec.body, dict) else []
    users = [m for m in messages if m.get("role") == "user"]
    if not users:
        return None
    content = users[-1]["content"]
    text = content if isinstance(content, str) else " ".join(str(b.get("text", "")) for b in content)
    found = QUESTION.findall(text)
    return (int(found[-1][0]), int(found[-1][1])) if found else None


@pytest.fixture
async def world(pg_cluster: Cluster, home: Path) -> AsyncIterator[World]:
    url = pg_cluster.fresh_database()
    async with FakeTelegram() as fake, Emulator() as emulator:
        w = World(home, url, fake, emulator)

        async def responder(rec: RecordedRequest) -> Reply:
            asked = _question(rec)
            if asked is None:
                return Reply(text="ok")
            start = time.monotonic()
            await asyncio.sleep(0.02)  # long enough for an overlap to show
            w.spans.append(Span(asked[0], asked[1], start, time.monotonic(), rec))
            return Reply(text=f"re: chat {asked[0]} message {asked[1]}")

        emulator.default = responder
        (home / "config.yaml").write_text(yaml.safe_dump({
            "access": {"allowed": ["telegram:*"], "rate_limit_per_minute": 0},
            "web": {"enabled": False, "admin_token": "replica-e2e-admin"},
            "gateway": {"debounce_s": 0},
        }))  # fmt: skip
        try:
            yield w
        finally:
            for proc in w.procs:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()


def _env(w: World, port: int, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ANTHROPIC_", "TELEGRAM_", "DISCORD_", "MNEMO_"))
    }
    env.update(
        MNEMO_HOME=str(w.home), MNEMO_DATABASE_URL=w.url, MNEMO_WEB_PORT=str(port), MNEMO_LOG_LEVEL="warning",
        TELEGRAM_BOT_TOKEN=w.fake.token, TELEGRAM_API_BASE_URL=w.fake.root,
        ANTHROPIC_BASE_URL=w.emulator.base_url, ANTHROPIC_API_KEY="test-key", **extra,
    )  # fmt: skip
    return env


async def _start(w: World, ports: list[int], **extra: str) -> None:
    for port in ports:
        log = w.home.parent / f"replica-{len(w.logs)}.log"
        w.logs.append(log)
        with log.open("wb") as stderr:
            w.procs.append(await asyncio.create_subprocess_exec(
                *MNEMO, "run", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                env=_env(w, port, **extra),
            ))  # fmt: skip


async def _status(w: World) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        *MNEMO, "status", "--json", stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(w, 0)
    )
    out, err = await proc.communicate()
    assert proc.returncode in (0, 1), err.decode()
    return json.loads(out)


async def _wait_status(w: World, ready: Any, timeout: float = 120) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        while True:
            report = await _status(w)
            if ready(report):
                return report
            await asyncio.sleep(0.3)


def _leaders(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in report["replicas"] if LEADER in r["roles"]]


def _push_all(fake: FakeTelegram, chats: int) -> None:
    for k in range(MESSAGES):
        for c in range(chats):
            fake.push_text(10_000 + c, 10_000 + c, f"chat {c} message {k}")


def _answers(fake: FakeTelegram) -> dict[int, list[tuple[int, bool]]]:
    """Per chat, the (message number, labelled as a possible duplicate) of each reply, in
    the order Telegram shows them."""
    by_chat: dict[int, list[tuple[int, bool]]] = defaultdict(list)
    for sent in sorted(fake.sent, key=lambda s: s.message_id):
        found = QUESTION.search(sent.plain_text)
        assert found is not None, sent.plain_text
        assert int(found.group(1)) == sent.chat_id - 10_000, "a reply went to another chat"
        by_chat[int(found.group(1))].append((int(found.group(2)), DUPLICATE in sent.plain_text))
    return by_chat


def _answered(fake: FakeTelegram) -> int:
    return len({(s.chat_id, m.group(2)) for s in fake.sent if (m := QUESTION.search(s.plain_text))})


async def _settled(url: str) -> bool:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        inbox = await (
            await conn.execute("SELECT count(*) FROM inbox WHERE state IN ('received', 'processing')")
        ).fetchone()
        outbox = await (
            await conn.execute("SELECT count(*) FROM outbox WHERE state IN ('queued', 'sending')")
        ).fetchone()
        return inbox == (0,) and outbox == (0,)


async def _wait_answered(w: World, count: int, timeout: float) -> None:
    async with asyncio.timeout(timeout):
        while _answered(w.fake) < count:
            # A reply that answers no question (an error notice) fails the test: say so now.
            wrong = [s.plain_text for s in w.fake.sent if not QUESTION.search(s.plain_text)]
            assert not wrong, f"{len(wrong)} replies are no answer, e.g. {wrong[0]!r}\n{w.log_tails()}"
            await asyncio.sleep(0.1)


async def _finish(w: World, chats: int) -> int:
    """Wait for every answer and a settled database, stop the live replicas, check the
    answers; return how many replies were labelled as possible duplicates."""
    await _wait_answered(w, chats * MESSAGES, timeout=900)
    async with asyncio.timeout(120):
        while not await _settled(w.url):
            await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)  # anything a replica would still send, it sends now
    for proc in w.procs:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
    for proc in w.procs:
        await asyncio.wait_for(proc.wait(), 60)
    labelled = 0
    answers = _answers(w.fake)
    assert sorted(answers) == list(range(chats))
    for chat, replies in answers.items():
        firsts = list(dict.fromkeys(n for n, _ in replies))
        assert firsts == list(range(MESSAGES)), f"chat {chat}: every message answered, in order: {replies}"
        for n in range(MESSAGES):
            copies = [dup for m, dup in replies if m == n]
            assert sum(not dup for dup in copies) <= 1, (
                f"chat {chat} message {n}: sent twice unlabelled: {replies}\n{w.log_tails()}"
            )
            labelled += sum(copies)
    _assert_no_concurrent_session_requests(w.spans)
    return labelled


def _assert_no_concurrent_session_requests(spans: list[Span]) -> None:
    by_chat: dict[int, list[Span]] = defaultdict(list)
    for span in spans:
        if span.request.response_status == 200:  # a dead replica's abandoned request is no turn
            by_chat[span.chat].append(span)
    for chat, chat_spans in by_chat.items():
        chat_spans.sort(key=lambda s: s.start)
        for a, b in zip(chat_spans, chat_spans[1:], strict=False):
            assert b.start >= a.end, (
                f"chat {chat}: LLM requests for messages {a.message} and {b.message} overlapped"
            )


async def test_polling_three_replicas_one_leader_survive_kill_9_of_the_leader(world: World) -> None:
    w = world
    ports = [reserve_port() for _ in range(REPLICAS)]
    await _start(w, ports)
    report = await _wait_status(w, lambda r: len(r["replicas"]) == REPLICAS and len(_leaders(r)) == 1)
    assert report["backend"] == "postgresql" and report["running"]
    [leader] = _leaders(report)
    # /healthz of each replica names it.
    async with aiohttp.ClientSession() as http:
        ids = set()
        for port in ports:
            async with http.get(f"http://127.0.0.1:{port}/healthz") as resp:
                ids.add((await resp.json())["replica"])
    assert ids == {r["replica_id"] for r in report["replicas"]}

    _push_all(w.fake, POLL_CHATS)
    await _wait_answered(w, POLL_CHATS * MESSAGES // 2, timeout=600)
    os.kill(leader["pid"], signal.SIGKILL)
    killed_at = time.monotonic()
    after = await _wait_status(
        w, lambda r: len(r["replicas"]) == REPLICAS - 1 and len(_leaders(r)) == 1, timeout=60
    )
    takeover_s = time.monotonic() - killed_at
    [successor] = _leaders(after)
    assert successor["replica_id"] != leader["replica_id"]
    assert [d["replica_id"] for d in after["dead"] if not d["alive"]] == [leader["replica_id"]]

    labelled = await _finish(w, POLL_CHATS)
    conflicts = [c for c in w.fake.calls if c.method == "getUpdates" and c.status == 409]
    assert conflicts == [], "only one replica polls at a time"
    print(
        f"\npolling: {POLL_CHATS}x{MESSAGES} answered; new leader listed {takeover_s:.1f} s after the kill; "
        f"{labelled} replies labelled as possible duplicates"
    )


class RoundRobin:
    """A webhook load balancer: each update to the next replica; a replica that does not
    answer is skipped (502 when none does, and Telegram delivers the update again)."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self.next = 0
        self.served: dict[int, int] = defaultdict(int)
        self._runner: web.AppRunner | None = None
        self._client: aiohttp.ClientSession | None = None
        self.port = reserve_port()

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/tg", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        self._client = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))

    async def stop(self) -> None:
        if self._client is not None:
            await self._client.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _forward(self, request: web.Request) -> web.Response:
        assert self._client is not None
        body = await request.read()
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() in ("content-type", "x-telegram-bot-api-secret-token")
        }
        for _ in range(len(self.ports)):
            port = self.ports[self.next % len(self.ports)]
            self.next += 1
            try:
                async with self._client.post(
                    f"http://127.0.0.1:{port}/tg", data=body, headers=headers
                ) as resp:
                    await resp.read()
                    self.served[port] += 1
                    return web.Response(status=resp.status)
            except aiohttp.ClientError:
                continue
        return web.Response(status=502)


async def test_webhook_behind_a_round_robin_proxy_survives_kill_9_of_a_replica(world: World) -> None:
    w = world
    ports = [reserve_port() for _ in range(REPLICAS)]
    proxy = RoundRobin(ports)
    await proxy.start()
    try:
        await _start(w, ports, TELEGRAM_WEBHOOK_URL=f"http://127.0.0.1:{proxy.port}/tg",
                     TELEGRAM_WEBHOOK_SECRET=SECRET)  # fmt: skip
        report = await _wait_status(
            w,
            lambda r: (
                len(r["replicas"]) == REPLICAS
                and all(a.get("telegram") for x in r["replicas"] for a in [x["adapters"]])
            ),
        )
        assert _leaders(report) == [], "webhook mode has no polling leader"
        _push_all(w.fake, WEBHOOK_CHATS)
        await _wait_answered(w, WEBHOOK_CHATS * MESSAGES // 2, timeout=600)
        victim = report["replicas"][0]
        os.kill(victim["pid"], signal.SIGKILL)
        labelled = await _finish(w, WEBHOOK_CHATS)
    finally:
        await proxy.stop()
    assert all(proxy.served[p] > 0 for p in ports), f"every replica accepted updates: {dict(proxy.served)}"
    assert not [c for c in w.fake.calls if c.method == "getUpdates"], "nobody polls in webhook mode"
    print(
        f"\nwebhook: {WEBHOOK_CHATS}x{MESSAGES} answered through {dict(proxy.served)}; "
        f"{labelled} replies labelled as possible duplicates"
    )
