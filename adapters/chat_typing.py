"""The typing indicator of each chat, shown by one loop per chat whoever asks for it.

A platform shows "typing…" for a few seconds after one request (Telegram 5 s, Discord
about 10 s), so a turn that takes longer re-sends it. ``TypingLoops.hold(chat)`` is the
adapter's ``typing(chat)``: the first holder of a chat starts its loop, the last one to
leave stops it. So two turns in one chat (members of a group, each with their own
session) share one loop, and a chat never has more than one request in flight: the
loop waits for each answer before it sleeps ``interval_s`` (measured from the request,
never more often than that). A failed request is logged at debug level and the loop
goes on: typing never fails a turn.

The loops are tasks owned here; ``close`` cancels and awaits them (the adapter's stop).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from mnemo.gateway.errors import PlatformError
from mnemo.gateway.events import ChatRef
from mnemo.gateway.logs import get_logger

log = get_logger(__name__)

SendTyping = Callable[[ChatRef], Awaitable[None]]


@dataclass(slots=True)
class _Loop:
    task: asyncio.Task[None]
    holders: int = 1


class TypingLoops:
    def __init__(self, send: SendTyping, *, interval_s: float, platform: str) -> None:
        self._send = send
        self.interval_s = interval_s
        self._platform = platform
        self._loops: dict[ChatRef, _Loop] = {}
        self.requests = 0  # typing requests made (for logs and tests)

    @contextlib.asynccontextmanager
    async def hold(self, chat: ChatRef) -> AsyncIterator[None]:
        loop = self._loops.get(chat)
        if loop is None or loop.task.done():
            loop = self._loops[chat] = _Loop(
                asyncio.create_task(self._run(chat), name=f"{self._platform}-typing-{chat.chat_id}")
            )
        else:
            loop.holders += 1
        try:
            yield
        finally:
            loop.holders -= 1
            if loop.holders == 0:
                if self._loops.get(chat) is loop:
                    del self._loops[chat]
                loop.task.cancel()
                await asyncio.gather(loop.task, return_exceptions=True)

    async def _run(self, chat: ChatRef) -> None:
        clock = asyncio.get_running_loop().time
        while True:
            started = clock()
            self.requests += 1
            try:
                await self._send(chat)
            except (PlatformError, ValueError) as e:
                log.debug("typing_failed", platform=self._platform, chat=chat.chat_id, error=str(e))
            await asyncio.sleep(max(0.0, started + self.interval_s - clock()))

    async def close(self) -> None:
        loops, self._loops = list(self._loops.values()), {}
        for loop in loops:
            loop.task.cancel()
        await asyncio.gather(*(loop.task for loop in loops), return_exceptions=True)
