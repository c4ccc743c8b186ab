"""Gateway overhead: per-message time spent outside the LLM, and throughput.

    python bench/gateway_overhead.py [--messages 50] [--past 100000] [--chats 200]

1. Per-message end-to-end time (submit → reply handed to the adapter) with an *instant*
   emulator, for a chat whose past sessions hold 10 messages and one whose past
   sessions hold ``--past`` messages (the current session is short in both). The
   emulator's own handling time is measured per request and subtracted, so the
   figure is the gateway's: inbox, lane, session resolution, agent rebuild, stores,
   outbox. Target: ratio big/small <= 1.5 (the per-message cost must not grow with a
   chat's past).
2. Messages per second over ``--chats`` concurrent chats (one message each, then a
   second round), also with the instant emulator.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mnemo.app import open_app
from mnemo.gateway.config import load_settings
from mnemo.gateway.emulator import Emulator, Reply
from mnemo.gateway.logs import configure_logging
from mnemo.memory.sessions import NewMessage
from tests.support.loopback import LoopbackAdapter

OVERRIDES = {"access.allowed": ("loop:*",), "access.rate_limit_per_minute": 0, "gateway.debounce_s": 0.0}


class TimedResponder:
    def __init__(self) -> None:
        self.spent: list[float] = []

    def __call__(self, request: object) -> Reply:
        t0 = time.perf_counter()
        reply = Reply(text="ok, noted.")
        self.spent.append(time.perf_counter() - t0)
        return reply


async def seed_past(app, chat_key: str, user: str, n: int) -> None:
    """n past messages in ended sessions of the same chat (1,000 per session)."""
    start = datetime.now(UTC) - timedelta(days=30)
    per_session = 1000
    made = 0
    while made < n:
        count = min(per_session, n - made)
        s = await app.store.create_session(
            chat_key=chat_key,
            platform="loop",
            chat_id=user,
            thread_id=None,
            user_id=user,
            agent_context="primary",
            source="chat",
            model="m",
            system_prompt="past",
        )
        msgs = [
            NewMessage(
                role="user" if i % 2 == 0 else "assistant",
                content=f"past message {made + i} about things",
                created_at=start + timedelta(seconds=made + i),
            )
            for i in range(count)
        ]
        await app.store.append_messages(s.id, msgs)
        await app.store.end_session(s.id, "reset")
        made += count


async def per_message_ms(past: int, messages: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        settings = load_settings(Path(tmp), environ={}, overrides=OVERRIDES)
        responder = TimedResponder()
        async with Emulator(responder=responder) as emu:
            adapter = LoopbackAdapter()
            async with open_app(
                settings, adapters=[adapter], llm_base_url=emu.base_url, api_key="k", trial=False
            ) as app:
                await seed_past(app, "loop:dm:ada", "ada", past)
                llm_legs: list[float] = []

                async def on_turn(ctx, result) -> None:
                    llm_legs.append(result.llm_seconds)

                app.gateway.turn_listeners.append(on_turn)
                await adapter.say("warm up", user="ada")
                await adapter.wait_sent(1)
                samples = []
                for i in range(messages):
                    t0 = time.perf_counter()
                    await adapter.say(f"message {i}", user="ada")
                    await adapter.wait_sent(i + 2, timeout=30)
                    while len(llm_legs) < i + 2:  # the turn's listener runs just after its reply is queued
                        await asyncio.sleep(0)
                    # The LLM leg of this very turn (the SDK round trip), subtracted.
                    samples.append(time.perf_counter() - t0 - llm_legs[-1])
        return statistics.median(samples) * 1000


async def throughput(chats: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        settings = load_settings(Path(tmp), environ={}, overrides=OVERRIDES)
        async with Emulator(responder=TimedResponder()) as emu:
            adapter = LoopbackAdapter()
            async with open_app(
                settings, adapters=[adapter], llm_base_url=emu.base_url, api_key="k", trial=False
            ):
                t0 = time.perf_counter()
                for round_ in range(2):
                    await asyncio.gather(
                        *(adapter.say(f"hello {round_}", user=f"u{c}") for c in range(chats))
                    )
                    await adapter.wait_sent(chats * (round_ + 1), timeout=300)
                elapsed = time.perf_counter() - t0
        return 2 * chats / elapsed


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=50)
    ap.add_argument("--past", type=int, default=100_000)
    ap.add_argument("--chats", type=int, default=200)
    args = ap.parse_args()
    configure_logging("warning")
    await per_message_ms(10, 10)  # warm-up: imports, first connections, SQLite page cache
    small = await per_message_ms(10, args.messages)
    big = await per_message_ms(args.past, args.messages)
    print(f"gateway time per message (median, LLM leg subtracted), {args.messages} messages:")
    print(f"  past sessions hold {10:>9,} messages: {small:7.2f} ms")
    print(f"  past sessions hold {args.past:>9,} messages: {big:7.2f} ms")
    print(f"  ratio: {big / small:.2f} (target <= 1.5)")
    rate = await throughput(args.chats)
    print(f"throughput over {args.chats} concurrent chats (instant emulator): {rate:,.0f} messages/s")


if __name__ == "__main__":
    asyncio.run(main())
