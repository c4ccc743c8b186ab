"""The turn: what a chat's lane runs for each batch of messages.

``TurnRunner.run`` is the lanes' handler. For one batch, in order:

1. **log context** — the batch's own platform, chat and user: a lane's task was
   created in the context of its first message, so in a shared room it would
   otherwise log that sender;
2. **budget** — the speaker's caps (``gateway/budgets``): at a cap no LLM request is
   made, and the person is told once per reset when it lifts;
3. **media** — voice alone with no transcription server is no turn (a "not set up"
   notice at most once an hour); otherwise the attachments are read
   (``attachments.py``);
4. **the agent** in the chat's session (``agent_turn.py``), under typing;
5. **the reply** to the newest message through the outbox, the batch marked done, then
   background work (``turn_memory.py``).

A failure answers every message of the batch with an apology and leaves the session's
history valid; a turn cancelled by ``/stop`` gets the command's one "Stopped." and
nothing more. On start, inbox rows
left unfinished by a crash are fed back into their lanes; the agent recognises a user
message it already stored and a reply it already produced, so nothing is asked twice.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Protocol

import structlog

from mnemo.gateway.budgets.gate import Refusal
from mnemo.gateway.delivery.inbox import InboxRepository
from mnemo.gateway.events import InboundMessage, chat_of
from mnemo.gateway.inbound.agent_turn import ORDER_RETRY_S, AgentTurn, GiveWay
from mnemo.gateway.inbound.attachments import TurnMedia
from mnemo.gateway.inbound.chats import Chats
from mnemo.gateway.inbound.queued import Queued, messages
from mnemo.gateway.inbound.replies import Replies
from mnemo.gateway.inbound.turn_memory import TurnMemory
from mnemo.gateway.logs import get_logger
from mnemo.gateway.metrics import Metrics
from mnemo.gateway.transcription import NOT_SET_UP as VOICE_NOT_SET_UP
from mnemo.memory.scope import UserRef

log = get_logger(__name__)

STOPPED = "Stopped."

APOLOGY = "Sorry — something went wrong on my side. Please try again."


class TurnBudget(Protocol):
    """Whether a person's turn may ask the model (``BudgetGate``): entered around the
    turn, it yields None to go on or the refusal."""

    def turn(
        self, user: UserRef, *, admin: bool
    ) -> contextlib.AbstractAsyncContextManager[Refusal | None]: ...


def turn_text(batch: Sequence[InboundMessage]) -> str:
    """The batch's text for the model: each message, with the text it quotes and the
    attachments nobody can download named (the others are ``TurnMedia``'s)."""
    parts = []
    for m in batch:
        text = m.text
        if m.reply_to:
            quoted = m.reply_to[:500].replace("\n", "\n> ")
            text = f"> {quoted}\n{text}"
        unread = [a for a in m.attachments if not a.ref]
        if unread:
            kinds = ", ".join(a.kind + (f" ({a.name})" if a.name else "") for a in unread)
            text = f"{text}\n[attached: {kinds}]".strip()
        parts.append(text)
    return "\n".join(parts)


class TurnRunner:
    def __init__(
        self,
        chats: Chats,
        inbox: InboxRepository,
        replies: Replies,
        media: TurnMedia,
        agent: AgentTurn,
        memory: TurnMemory,
        metrics: Metrics,
        *,
        budget: TurnBudget | None,
    ) -> None:
        self.chats = chats
        self.inbox = inbox
        self.replies = replies
        self.media = media
        self.agent = agent
        self.memory = memory
        self.metrics = metrics
        self.budget = budget

    async def run(self, key: str, batch: Sequence[Queued]) -> None:
        last = batch[-1].msg
        with structlog.contextvars.bound_contextvars(
            platform=last.platform, chat=last.chat_id, user=last.user_id
        ):
            await self._within_budget(key, batch, last)

    async def _within_budget(self, key: str, batch: Sequence[Queued], last: InboundMessage) -> None:
        if self.budget is None:
            return await self._turn(key, batch)
        async with self.budget.turn(last.speaker, admin=self.chats.is_admin(last)) as refusal:
            if refusal is None:
                return await self._turn(key, batch)
        log.info("turn_over_budget", key=key, cap=refusal.cap, notified=refusal.notify)
        if refusal.notify:
            await self.replies.finish(batch, refusal.text, kind="notice")
        else:
            await self.replies.done(batch)

    async def _turn(self, key: str, batch: Sequence[Queued]) -> None:
        for q in batch:
            await self.inbox.mark_processing(q.inbox_id)
        msgs = messages(batch)
        text = turn_text(msgs)
        try:
            if not text and self.media.voice_unavailable(msgs):
                return await self._voice_not_set_up(batch)
            media = await self.media.prepare(msgs)
            text = "\n".join(t for t in (text, media.text) if t) or "(attachment)"
            run = await self.agent.run(key, batch, text, media.refs)
        except GiveWay:  # an older message of the chat is queued behind: it goes first
            await asyncio.sleep(ORDER_RETRY_S)
            for q in batch:
                self.chats.requeue(key, q)
            return
        except asyncio.CancelledError:
            # The turn is abandoned. /stop has answered already (one message, not two);
            # a shutdown answers the messages with a note.
            if self.chats.take_stopped(key):
                await self.replies.done(batch)
            else:
                await self.replies.finish(batch, STOPPED, kind="notice")
            raise
        except Exception:
            self.metrics.errors.labels("turn").inc()
            log.exception("turn_failed", key=key)
            await self.replies.finish(batch, APOLOGY, kind="notice")
            return
        reply = self.memory.with_recall_note(run.result.reply or "(no reply)", key)
        reply = await self.memory.with_proposals(reply, batch[-1].msg, run.ctx)
        # A history: off chat keeps nothing of the turn: gone before its reply is out, so
        # the person's next message can never meet it (the reply waits in the outbox).
        await self.memory.forget_turn(run.session, run.ctx)
        await self.replies.finish(batch, reply, kind="reply", session_id=run.session.id)
        await self.memory.after(run.session, run.ctx, text, run.result)

    async def _voice_not_set_up(self, batch: Sequence[Queued]) -> None:
        if self.media.voice_notice_due(chat_of(batch[-1].msg)):
            await self.replies.finish(batch, VOICE_NOT_SET_UP, kind="notice")
        else:
            await self.replies.done(batch)
