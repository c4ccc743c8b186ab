"""``TypingLoops``: one loop per chat whoever holds it, one request in flight per chat,
refreshes no more often than the interval, and a failing request never ends the loop."""

from __future__ import annotations

import asyncio

from mnemo.adapters.chat_typing import TypingLoops
from mnemo.gateway.errors import PlatformUnavailable
from mnemo.gateway.events import ChatRef

A = ChatRef("telegram", "1")
B = ChatRef("telegram", "2")


class SlowPlatform:
    """Answers each typing request when the test says so; records what was asked."""

    def __init__(self) -> None:
        self.asked: list[ChatRef] = []
        self.in_flight: dict[ChatRef, int] = {}
        self.most_in_flight = 0
        self.answer = asyncio.Event()
        self.fail = False

    async def send(self, chat: ChatRef) -> None:
        self.asked.append(chat)
        self.in_flight[chat] = self.in_flight.get(chat, 0) + 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight[chat])
        try:
            await self.answer.wait()
            if self.fail:
                raise PlatformUnavailable("typing refused")
        finally:
            self.in_flight[chat] -= 1


async def test_two_turns_in_one_chat_share_one_loop_with_one_request_in_flight() -> None:
    platform = SlowPlatform()
    loops = TypingLoops(platform.send, interval_s=0.01, platform="telegram")
    async with loops.hold(A):
        async with loops.hold(A):
            await asyncio.sleep(0.1)  # ten intervals while the first request hangs
            assert platform.asked == [A] and platform.most_in_flight == 1
        platform.answer.set()
        while len(platform.asked) < 3:
            await asyncio.sleep(0.01)  # the remaining holder keeps it refreshed
    asked = len(platform.asked)
    await asyncio.sleep(0.05)
    assert len(platform.asked) == asked, "the last holder's exit stops the loop"
    assert platform.most_in_flight == 1 and loops.requests == asked


async def test_each_chat_has_its_own_loop_and_a_failure_does_not_stop_it() -> None:
    platform = SlowPlatform()
    platform.fail = True
    platform.answer.set()
    loops = TypingLoops(platform.send, interval_s=0.01, platform="telegram")
    async with loops.hold(A), loops.hold(B):
        while platform.asked.count(A) < 3 or platform.asked.count(B) < 3:
            await asyncio.sleep(0.01)
    await loops.close()


async def test_refreshes_come_no_faster_than_the_interval() -> None:
    platform = SlowPlatform()
    platform.answer.set()
    loops = TypingLoops(platform.send, interval_s=3600, platform="telegram")
    async with loops.hold(A):
        await asyncio.sleep(0.1)
    assert platform.asked == [A], "one request, the next one due an hour later"


async def test_close_stops_every_loop() -> None:
    platform = SlowPlatform()
    loops = TypingLoops(platform.send, interval_s=0.01, platform="telegram")
    held = asyncio.Event()

    async def turn() -> None:
        async with loops.hold(A):
            held.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(turn())
    await held.wait()
    await asyncio.sleep(0)
    await loops.close()
    assert platform.in_flight == {A: 0}, "the hanging request was cancelled"
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
