"""Many chats at once through the real Telegram adapter, the gateway and the anthropic
SDK: at most ``gateway.max_concurrent_turns`` turns run, slots go to chats in the order
they asked (a flooding chat does not hold back another chat's first reply beyond one
turn), each chat's replies keep its order, and typing is requested only for running
turns that take their time — counted on the fake Bot API."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mnemo.gateway.emulator import Emulator, RecordedRequest, Reply
from tests.adapters.telegram_harness import FlakyTelegram, TelegramRig, last_user_text, wait_until

BOT = "mnemo_test_bot"


@pytest.fixture
async def fake() -> AsyncIterator[FlakyTelegram]:
    async with FlakyTelegram(bot_username=BOT) as server:
        yield server


@pytest.fixture
def rig(fake: FlakyTelegram, emulator: Emulator, home: Path) -> TelegramRig:
    return TelegramRig(fake, emulator, home)


class Echo:
    """The model: answers ``re: <the message>``; the first request waits for ``release``
    when ``hold_first``; counts the requests in flight at once."""

    def __init__(self, *, hold_first: bool) -> None:
        self.release = asyncio.Event()
        self.hold_first = hold_first
        self.in_flight = 0
        self.most_in_flight = 0

    async def __call__(self, request: RecordedRequest) -> Reply:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.hold_first:
                self.hold_first = False
                await self.release.wait()
            await asyncio.sleep(0.02)  # overlap with the other turns that may run
            return Reply(text=f"re: {last_user_text(request)}")
        finally:
            self.in_flight -= 1


def script(emulator: Emulator, echo: Echo, n: int) -> None:
    emulator.script(*([echo] * n))


def replies_of(rig: TelegramRig, chat: int) -> list[str]:
    return [m.plain_text for m in rig.fake.sent if m.chat_id == chat]


async def test_a_flooding_chat_delays_another_chats_first_reply_by_one_turn_at_most(rig: TelegramRig) -> None:
    flood, other = 5101, 5202
    echo = Echo(hold_first=True)
    script(rig.emulator, echo, 6)
    async with rig.app(**{"gateway.max_concurrent_turns": 1}) as (app, _):
        rig.fake.push_text(flood, flood, "flood 1")
        await rig.emulator.wait_for_requests(1)
        for i in range(2, 6):
            rig.fake.push_text(flood, flood, f"flood {i}")
        lanes = app.gateway.lanes
        await wait_until(lambda: sum(lanes.queued(k) for k in lanes.keys()) == 4, what="the flood queued")
        rig.fake.push_text(other, other, "hello")
        await wait_until(lambda: lanes.slots.waiting == 1, what="the other chat waiting")
        assert len(rig.emulator.requests) == 1, "one slot: the other turns wait"
        echo.release.set()
        sent = await rig.fake.wait_for_sent(6)
    order = [m.plain_text for m in sent]
    assert order[:2] == ["re: flood 1", "re: hello"], "the other chat's first reply waited one turn"
    assert replies_of(rig, flood) == [f"re: flood {i}" for i in range(1, 6)]
    assert echo.most_in_flight == 1


async def test_turns_are_bounded_and_each_chat_keeps_its_order(rig: TelegramRig) -> None:
    chats = [6100 + i for i in range(8)]
    echo = Echo(hold_first=False)
    script(rig.emulator, echo, 3 * len(chats))
    async with rig.app(**{"gateway.max_concurrent_turns": 3}):
        for n in range(1, 4):
            for chat in chats:
                rig.fake.push_text(chat, chat, f"{chat} says {n}")
        await rig.fake.wait_for_sent(3 * len(chats), timeout=30)
    assert echo.most_in_flight <= 3
    for chat in chats:
        # Messages of one chat that wait together may be answered as one turn.
        replies = replies_of(rig, chat)
        said = [int(line.rsplit(" ", 1)[1]) for r in replies for line in r.removeprefix("re: ").split("\n")]
        assert said == sorted(said) and said[-1] == 3, replies


async def test_typing_is_requested_only_for_running_turns_that_take_their_time(rig: TelegramRig) -> None:
    slow, queued, quick = 7101, 7202, 7303
    echo = Echo(hold_first=True)
    script(rig.emulator, echo, 3)
    async with rig.app(adapter_options={"typing_interval_s": 0.2}, **{"gateway.max_concurrent_turns": 1}):
        rig.fake.push_text(slow, slow, "think hard")
        await rig.emulator.wait_for_requests(1)
        rig.fake.push_text(queued, queued, "me too")
        rig.fake.push_text(quick, quick, "and me")
        # Shown after AgentTurn's TYPING_DELAY_S, then refreshed: one loop for the chat.
        await rig.fake.wait_for_call("sendChatAction", 3)
        echo.release.set()
        await rig.fake.wait_for_sent(3)
        await asyncio.sleep(0.5)  # refreshes that would follow, had typing not stopped
    typing = rig.fake.calls_to("sendChatAction")
    assert {c.params["chat_id"] for c in typing} == {slow}, "queued and quick turns show no typing"
    assert all(c.params["action"] == "typing" for c in typing)
    reply_at = next(m.at for m in rig.fake.sent if m.chat_id == slow)
    assert all(c.at <= reply_at for c in typing), "typing stops with the turn"


async def test_typing_ends_once_the_streamed_reply_is_on_screen(rig: TelegramRig) -> None:
    chat = 8101
    thinking = asyncio.Event()

    async def slow_then_streamed(_: RecordedRequest) -> Reply:
        await thinking.wait()  # long enough for typing to show first
        return Reply(text="A long answer, written slowly. " * 100, chunk_delay=0.02)

    rig.emulator.script(slow_then_streamed)
    options = {"typing_interval_s": 0.2, "stream_interval_s": 0.3}
    async with rig.app(
        adapter_options=options, **{"streaming.enabled": True, "streaming.min_interval_s": 0.3}
    ):
        rig.fake.push_text(chat, chat, "explain at length")
        await rig.fake.wait_for_call("sendChatAction", 2)
        thinking.set()
        await wait_until(lambda: any(e.parse_mode == "HTML" for e in rig.fake.edits), 30, "the final edit")
    first_post = next(c for c in rig.fake.calls if c.method == "sendMessage" and c.status == 200)
    live_edits = [
        c for c in rig.fake.calls if c.method == "editMessageText" and not c.params.get("parse_mode")
    ]
    assert len(live_edits) >= 2, "the reply was streamed for a while"
    late = [c for c in rig.fake.calls_to("sendChatAction") if c.at > first_post.at]
    assert len(late) <= 1, f"typing went on under the live reply: {len(late)} requests"
