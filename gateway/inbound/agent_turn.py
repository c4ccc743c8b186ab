"""One agent run for a lane's batch: in the chat's session, in order, shown as it goes.

``run`` holds, in this order:

1. the adapter's **typing** indicator, for as long as the model works — but only once
   the turn has run for ``TYPING_DELAY_S``: a reply ready sooner arrives before typing
   would have been noticed, and every typing request costs a platform call (a queued
   turn shows none either: it is not running yet); and no longer once the live reply is
   on screen (``LiveReply``'s ``on_shown``);
2. the session's **lock**, taken only when no older message of the chat waits
   (``_ordered_lock``);
3. the chat's **session** (``SessionResolver.resolve``) and a fresh ``Agent`` built from
   what is stored — nothing of a previous turn is kept in this process;
4. the **live reply** where the platform streams (``delivery/live.py``), closed before
   the reply is queued so no edit lands after the final one.

Ordering across replicas (PostgreSQL): a chat's messages may sit in different
replicas' lanes. The inbox says whether an older one is unfinished elsewhere (then
this turn waits for it) or queued behind this turn here, adopted from a dead replica
(then this turn raises ``GiveWay`` and its runner puts it at the back of its lane). One
process (SQLite) has one FIFO lane per session: just the lock.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from mnemo.gateway.delivery.inbox import InboxRepository
from mnemo.gateway.delivery.live import LiveReplies
from mnemo.gateway.events import ChatRef, InboundMessage, chat_of
from mnemo.gateway.inbound.chats import Chats
from mnemo.gateway.inbound.queued import Queued
from mnemo.gateway.inbound.turn_memory import TurnMemory
from mnemo.gateway.ports import Adapter
from mnemo.gateway.turns.agent import Agent, AgentDeps, TurnInput, TurnResult
from mnemo.gateway.turns.tools import TurnContext
from mnemo.memory.policy import EffectivePolicy
from mnemo.memory.sessions import SessionRow

ORDER_RETRY_S = 0.05  # a turn waiting for an older message of its chat on another replica
TYPING_DELAY_S = 1.0  # a reply ready within this shows no typing at all


class GiveWay(Exception):
    """An older message of the chat is queued behind this turn in this process's lane."""


@runtime_checkable
class OrdersAcrossReplicas(Protocol):
    """An inbox shared by replicas (``PgInbox``) tells a turn whether an older message
    of its chat is still unfinished: ``"other"`` (another replica's), ``"own"`` (queued
    in this process behind the turn) or None."""

    async def earlier_unfinished(self, inbox_id: int, batch: Sequence[int]) -> str | None: ...


class TurnSessions(Protocol):
    """The chats' sessions (``SessionResolver``)."""

    def lock(self, key: str) -> contextlib.AbstractAsyncContextManager[object]: ...

    async def resolve(self, msg: InboundMessage, key: str) -> SessionRow: ...

    def shared_room(self, msg: InboundMessage) -> bool: ...

    async def policy(self, msg: InboundMessage) -> EffectivePolicy: ...


class _DelayedTyping:
    """The adapter's typing indicator from ``delay_s`` after now until ``stop``: a timer,
    not a task, until then (most turns of a fast model end before it fires)."""

    def __init__(self, adapter: Adapter, chat: ChatRef, delay_s: float) -> None:
        self._adapter = adapter
        self._chat = chat
        self._task: asyncio.Task[None] | None = None
        self._ended = asyncio.Event()
        self._timer = asyncio.get_running_loop().call_later(delay_s, self._start)

    def _start(self) -> None:
        self._task = asyncio.create_task(self._show(), name=f"typing:{self._chat.chat_id}")

    async def _show(self) -> None:
        async with self._adapter.typing(self._chat):
            await self._ended.wait()  # until end() or stop()

    def end(self) -> None:
        """No more typing from now (the reply itself is on screen); ``stop`` still awaits."""
        self._timer.cancel()
        self._ended.set()

    async def stop(self) -> None:
        self._timer.cancel()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


@dataclass(frozen=True, slots=True)
class AgentRun:
    session: SessionRow
    ctx: TurnContext
    result: TurnResult


class AgentTurn:
    def __init__(
        self,
        chats: Chats,
        sessions: TurnSessions,
        agent: AgentDeps,
        inbox: InboxRepository,
        adapters: Mapping[str, Adapter],
        live: LiveReplies,
        memory: TurnMemory,
        *,
        typing_delay_s: float = TYPING_DELAY_S,
    ) -> None:
        self.typing_delay_s = typing_delay_s
        self.chats = chats
        self.sessions = sessions
        self.agent = agent
        self.inbox = inbox
        self.adapters = adapters
        self.live = live
        self.memory = memory

    async def run(
        self, key: str, batch: Sequence[Queued], text: str, media: list[dict[str, Any]]
    ) -> AgentRun:
        last = batch[-1].msg
        async with self._typing(chat_of(last)) as end_typing, self._ordered_lock(key, batch):
            session = await self.sessions.resolve(last, key)
            ctx = self.chats.turn_context(last, session, key)
            ctx = replace(ctx, policy=await self.sessions.policy(last))
            agent = await Agent.load(self.agent, session, ctx)
            agent.label_authors = self.sessions.shared_room(last)
            agent.stream = live = await self.live.open(
                chat_of(last),
                batch[-1].inbox_id,
                reply_to=last.message_id,
                dm=last.is_dm and not last.private,
                on_shown=end_typing,  # the reply itself shows the bot is at work
            )
            try:
                result = await agent.run(
                    TurnInput(
                        text=text,
                        author_id=last.user_id,
                        author_name=last.user_name,
                        platform_message_id=last.message_id,
                        request_context=await self.memory.notes(last, text, ctx),
                        meta={"message_ids": [q.msg.message_id for q in batch]}
                        | ({"media": media} if media else {}),
                    )
                )
            finally:
                if live is not None:
                    await live.close()  # before the reply is queued: no edit after the final one
        return AgentRun(session, ctx, result)

    @contextlib.asynccontextmanager
    async def _typing(self, chat: ChatRef) -> AsyncIterator[Callable[[], None] | None]:
        """Yields what ends the typing early (None: no typing here)."""
        adapter = self.adapters.get(chat.platform)
        if adapter is None or not adapter.supports_typing or not adapter.connected:
            yield None
            return
        typing = _DelayedTyping(adapter, chat, self.typing_delay_s)
        try:
            yield typing.end
        finally:
            await typing.stop()

    @contextlib.asynccontextmanager
    async def _ordered_lock(self, key: str, batch: Sequence[Queued]) -> AsyncIterator[None]:
        """The session's lock, taken when no older message of the chat waits (see above)."""
        ordered = self.inbox if isinstance(self.inbox, OrdersAcrossReplicas) else None
        ids = [q.inbox_id for q in batch]
        while True:
            async with self.sessions.lock(key):
                waiting = None if ordered is None else await ordered.earlier_unfinished(min(ids), ids)
                if waiting is None:
                    yield
                    return
            if waiting == "own":
                raise GiveWay
            await asyncio.sleep(ORDER_RETRY_S)
