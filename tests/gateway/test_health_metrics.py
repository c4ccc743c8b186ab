"""``/healthz`` and ``/metrics`` on the local server, after real conversations through
the web chat, the gateway, the anthropic SDK and the emulator."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mnemo.gateway.emulator import Emulator, Fault, RecordedRequest, Reply
from mnemo.gateway.emulator.cache import Usage
from mnemo.gateway.inbound.lanes import default_turn_slots
from tests.support.loopback import LoopbackAdapter
from tests.support.webchat import ChatClient, open_web_app, web_settings

USER = "metrics-user-0001"


async def scrape(
    http: aiohttp.ClientSession, base: str
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with http.get(f"{base}/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def healthz(http: aiohttp.ClientSession, base: str) -> tuple[int, dict]:
    async with http.get(f"{base}/healthz") as resp:
        assert resp.content_type == "application/json"
        return resp.status, await resp.json()


async def test_healthz_reports_adapters_and_queues_and_503_when_an_adapter_is_down(
    home: Path, emulator: Emulator, http
) -> None:
    release = asyncio.Event()

    async def held(_: RecordedRequest) -> Reply:
        await release.wait()
        return Reply(text="done")

    emulator.script(held, Reply(text="second"))
    loop = LoopbackAdapter()
    settings = web_settings(home, **{"access.allowed": ("loop:*",)})
    async with open_web_app(settings, emulator.base_url, extra_adapters=(loop,)) as app:
        base = app.web.url
        status, body = await healthz(http, base)
        assert status == 200
        slots = default_turn_slots(settings.llm.max_concurrency)
        assert body.pop("turns") == {"running": 0, "waiting": 0, "slots": slots, "oldest_wait_s": 0.0}
        assert body == {
            "status": "ok",
            "adapters": {"web": True, "loop": True},
            "lanes": 0,
            "queued_messages": 0,
            "outbox_pending": 0,
            "outbox_failed": 0,
            "jobs_pending": 0,
            "search_index": {"complete": True, "text_percent": 100.0},
            "replica": f"{socket.gethostname()}:{os.getpid()}",  # SQLite: the one process
        }
        # One turn held in the LLM call, one message queued behind it in the same lane.
        chat = await ChatClient.connect(http, base, USER)
        await chat.say("first")
        await emulator.wait_for_requests(1)
        await chat.say("second")
        await chat.next("ack")
        await chat.next("ack")
        _, body = await healthz(http, base)
        assert body["lanes"] == 1 and body["queued_messages"] == 1
        # The page goes away: the reply waits in the outbox.
        await chat.close()
        release.set()

        async def pending() -> dict:
            while True:
                _, b = await healthz(http, base)
                if b["outbox_pending"] == 2:
                    return b
                await asyncio.sleep(0.02)

        body = await asyncio.wait_for(pending(), 10)
        assert body["status"] == "ok", "a closed page is not an adapter failure"
        metrics = await scrape(http, base)
        assert metrics[("mnemo_queue_depth", (("queue", "outbox"),))] == 2

        await loop.stop()
        status, body = await healthz(http, base)
        assert status == 503
        assert body["status"] == "degraded" and body["adapters"] == {"web": True, "loop": False}


async def test_metrics_count_a_real_conversation(home: Path, emulator: Emulator, http) -> None:
    emulator.script(
        Reply(text="one " * 20),
        Reply(text="two " * 20),
        Fault(status=400, body="emulated bad request"),
        Reply(text="four"),
    )
    soul = "You are a careful assistant. " * 60  # long enough for the prompt cache to engage
    (home / "SOUL.md").write_text(soul)
    other = "metrics-user-0002"
    async with open_web_app(web_settings(home), emulator.base_url) as app:
        base = app.web.url
        chat = await ChatClient.connect(http, base, USER)
        for text in ("hello", "again", "this one fails"):
            await chat.say(text)
            await chat.next("reply")
        second = await ChatClient.connect(http, base, other)
        await second.say("hi")
        await second.next("reply")

        async def settled() -> dict:
            # A reply is counted once the outbox has marked it sent, just after the frame left.
            while True:
                m = await scrape(http, base)
                # Gauges are refreshed before the counters are read: a reply marked sent
                # between the two shows in the counter but not yet in the outbox gauge.
                if (
                    m.get(("mnemo_messages_out_total", (("platform", "web"),))) == 4
                    and m.get(("mnemo_queue_depth", (("queue", "outbox"),))) == 0
                ):
                    return m
                await asyncio.sleep(0.02)

        m = await asyncio.wait_for(settled(), 10)
        assert m[("mnemo_messages_in_total", (("platform", "web"),))] == 4
        assert m[("mnemo_messages_out_total", (("platform", "web"),))] == 4
        answered = [r for r in emulator.requests if r.usage is not None]
        assert len(answered) == 3
        assert m[("mnemo_llm_latency_seconds_count", ())] == 3, "only answered calls are timed"
        assert m[("mnemo_llm_latency_seconds_bucket", (("le", "+Inf"),))] == 3
        usage = sum((Usage.from_api(r.usage) for r in answered), Usage())
        # A kind that never occurred has no series yet (the counter is incremented, not pre-created).
        assert m.get(("mnemo_llm_tokens_total", (("kind", "input"),)), 0) == usage.input_tokens
        assert m[("mnemo_llm_tokens_total", (("kind", "output"),))] == usage.output_tokens
        assert usage.cache_read_input_tokens > 0, "the second request of the session reads the cached prefix"
        assert m[("mnemo_llm_tokens_total", (("kind", "cache_read"),))] == usage.cache_read_input_tokens
        assert m[("mnemo_llm_tokens_total", (("kind", "cache_write"),))] == usage.cache_creation_input_tokens
        prompt = usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
        assert m[("mnemo_cache_hit_ratio", ())] == pytest.approx(usage.cache_read_input_tokens / prompt)
        assert m[("mnemo_errors_total", (("kind", "llm_InvalidLLMRequest"),))] == 1
        assert m[("mnemo_queue_depth", (("queue", "outbox"),))] == 0
        assert m[("mnemo_queue_depth", (("queue", "lanes"),))] == 0
        assert ("mnemo_queue_depth", (("queue", "jobs"),)) in m, "background work waiting is exported too"
        assert m[("mnemo_messages_refused_total", ())] == 0


async def test_turns_waiting_for_a_slot_show_in_healthz_and_metrics(
    home: Path, emulator: Emulator, http
) -> None:
    release = asyncio.Event()

    async def held(_: RecordedRequest) -> Reply:
        await release.wait()
        return Reply(text="first answer")

    emulator.script(held, Reply(text="second answer"))
    settings = web_settings(home, **{"gateway.max_concurrent_turns": 1})
    async with open_web_app(settings, emulator.base_url) as app:
        base = app.web.url
        one = await ChatClient.connect(http, base, USER)
        two = await ChatClient.connect(http, base, "metrics-user-0002")
        await one.say("first")
        await emulator.wait_for_requests(1)
        await two.say("second")

        async def waiting() -> dict:
            while True:
                _, b = await healthz(http, base)
                if b["turns"]["waiting"] == 1 and b["turns"]["oldest_wait_s"] > 0:
                    return b
                await asyncio.sleep(0.02)

        body = await asyncio.wait_for(waiting(), 10)
        assert body["turns"]["running"] == 1 and body["turns"]["slots"] == 1
        m = await scrape(http, base)
        assert m[("mnemo_queue_depth", (("queue", "turns"),))] == 1
        assert m[("mnemo_turns_running", ())] == 1
        assert len(emulator.requests) == 1, "the second chat's turn waits for the slot"
        release.set()
        assert (await one.next("reply"))["text"] == "first answer"
        assert (await two.next("reply"))["text"] == "second answer"
        m = await scrape(http, base)
        assert m[("mnemo_turn_wait_seconds_count", ())] == 2
        # The second turn's wait, as /healthz saw it growing, is in the histogram (no
        # wall-clock bound on the first turn's own, near-zero wait: shared machines).
        assert m[("mnemo_turn_wait_seconds_sum", ())] >= body["turns"]["oldest_wait_s"]

        async def idle() -> dict:
            while True:  # a turn ends just after its reply was delivered
                _, b = await healthz(http, base)
                if b["turns"]["running"] == 0:
                    return b
                await asyncio.sleep(0.02)

        body = await asyncio.wait_for(idle(), 10)
        assert body["turns"] == {"running": 0, "waiting": 0, "slots": 1, "oldest_wait_s": 0.0}
