"""A loopback adapter for gateway tests: implements the Adapter port in memory.

It is a fake at the port (like the fake servers are fakes of the far end): tests push
InboundMessages through ``say`` and read what the gateway delivered from ``sent``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Sequence

from mnemo.gateway.errors import PlatformUnavailable
from mnemo.gateway.events import ChatRef, ChatType, InboundMessage, OutboundMessage
from mnemo.gateway.ports import CommandInfo, InboundSink

_ids = itertools.count(1)


class LoopbackAdapter:
    supports_typing = True
    max_message_len = 4096

    def __init__(self, name: str = "loop", *, debounce_s: float | None = 0.0) -> None:
        self.name = name
        self.debounce_s = debounce_s
        self.sent: list[OutboundMessage] = []
        self.typing_calls: list[ChatRef] = []
        self.sink: InboundSink | None = None
        self.down = False  # sends fail with PlatformUnavailable while True
        self._connected = False
        self._cond = asyncio.Condition()

    @property
    def connected(self) -> bool:
        return self._connected

    async def start(self, sink: InboundSink, commands: Sequence[CommandInfo] = ()) -> None:
        self.sink = sink
        self._connected = True

    async def stop(self) -> None:
        self._connected = False

    async def send(self, message: OutboundMessage) -> list[str]:
        if self.down:
            raise PlatformUnavailable("loopback is down")
        async with self._cond:
            self.sent.append(message)
            self._cond.notify_all()
        return [f"out-{len(self.sent)}"]

    @contextlib.asynccontextmanager
    async def typing(self, chat: ChatRef) -> AsyncIterator[None]:
        self.typing_calls.append(chat)
        yield

    def message(
        self,
        text: str,
        *,
        user: str = "u1",
        chat: str | None = None,
        name: str = "",
        chat_type: ChatType = ChatType.DM,
        message_id: str | None = None,
        thread_id: str | None = None,
    ) -> InboundMessage:
        return InboundMessage(
            platform=self.name,
            chat_id=chat or user,
            user_id=user,
            user_name=name or user,
            message_id=message_id or f"m{next(_ids)}",
            text=text,
            chat_type=chat_type,
            thread_id=thread_id,
        )

    async def say(self, text: str, **kw: object) -> InboundMessage:
        assert self.sink is not None, "adapter not started"
        msg = self.message(text, **kw)  # type: ignore[arg-type]  # kw: message()'s fields, typed object
        await self.sink(msg)
        return msg

    async def wait_sent(self, n: int, timeout: float = 10.0) -> list[OutboundMessage]:
        async def enough() -> None:
            async with self._cond:
                await self._cond.wait_for(lambda: len(self.sent) >= n)

        await asyncio.wait_for(enough(), timeout)
        return self.sent

    def texts(self, chat: str | None = None) -> list[str]:
        return [m.text for m in self.sent if chat is None or m.chat.chat_id == chat]
