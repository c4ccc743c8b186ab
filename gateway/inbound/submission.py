"""What happens to an inbound message, in one ordered chain (``Submission.submit``).

The cross-cutting concerns, in this order, and why:

1. **authorize** — allowlists, admins, pairing (``access.py``): first, so nothing of an
   unauthorized user is stored, queued or logged beyond the refusal line; a refusal is
   sent directly, never through the outbox;
2. **rate limit** — the same verdict (``AccessControl.check``), after authorization so
   a stranger's flood never counts against anyone's window, before anything is stored;
3. **bind log context** — platform, chat, user for every log line from here on;
4. **persist** — the durable inbox (insert-or-ignore on platform+chat+message id): a
   redelivered update is a no-op, and a message is never acknowledged before it is
   durable;
5. **dispatch** — a slash command runs now (it bypasses the queue, so ``/stop``
   answers while a turn runs); anything else goes to its session's lane;
6. **typing** — shown by the turn (``agent_turn.py``) while the model works, not here:
   a message waiting in its lane, or a command, shows none.

A message with nothing readable in it (a sticker: ``note_unreadable``) takes steps 1-3
and is answered with the adapter's note instead of being stored and dispatched. A
stranger's gets nothing at all — no note, no refusal, no pairing code — so sending
stickers tells them nothing and stores nothing.
"""

from __future__ import annotations

from typing import Protocol

import structlog

from mnemo.gateway.commands import ChatControl, Unrecorded, parse_command
from mnemo.gateway.delivery.inbox import InboxRepository
from mnemo.gateway.events import InboundMessage, Submitted, to_payload
from mnemo.gateway.inbound.access import AccessDecision, Verdict
from mnemo.gateway.inbound.chats import Chats
from mnemo.gateway.inbound.queued import Queued
from mnemo.gateway.inbound.replies import Replies
from mnemo.gateway.logs import get_logger
from mnemo.gateway.metrics import Metrics
from mnemo.memory.scope import AgentContext, UserRef

log = get_logger(__name__)


class Authorizer(Protocol):
    """Access control (``AccessControl``): ``check`` is steps 1-2 with their side
    effects (a pairing code, the rate window); the two halves have none."""

    async def check(self, msg: InboundMessage) -> AccessDecision: ...

    def chat_allowed(self, msg: InboundMessage) -> bool: ...

    async def user_allowed(self, user: UserRef) -> bool: ...


class CommandRunner(Protocol):
    """Runs a slash command for the chat it was typed in (``CommandRegistry``)."""

    async def run(
        self, chats: ChatControl, msg: InboundMessage, name: str, args: str
    ) -> str | Unrecorded: ...


class Submission:
    def __init__(
        self,
        access: Authorizer,
        inbox: InboxRepository,
        chats: Chats,
        replies: Replies,
        metrics: Metrics,
        *,
        commands: CommandRunner | None,
    ) -> None:
        self.access = access
        self.inbox = inbox
        self.chats = chats
        self.replies = replies
        self.metrics = metrics
        self.commands = commands

    async def submit(self, msg: InboundMessage) -> Submitted:
        """Called by adapters for every supported inbound message. Returns what became
        of it, so an adapter can close a pending interaction that will get no reply.
        The steps are the chain of the module docstring, in its order."""
        refused = await self._authorize(msg)  # 1. authorize, 2. rate limit
        if refused is not None:
            return refused
        with structlog.contextvars.bound_contextvars(  # 3. log context
            platform=msg.platform, chat=msg.chat_id, user=msg.user_id
        ):
            row = await self.inbox.accept(msg.platform, msg.chat_id, msg.message_id, to_payload(msg))  # 4.
            if row is None:
                log.debug("duplicate_delivery_ignored", message_id=msg.message_id)
                return Submitted.DUPLICATE
            self.metrics.messages_in.labels(msg.platform).inc()
            # 5. dispatch (6. typing is the turn's)
            command = parse_command(msg.text) if msg.agent_context is AgentContext.PRIMARY else None
            if command is not None and self.commands is not None:
                # Known or not, a /word never reaches the model: an unknown one is
                # answered with a pointer to /help.
                await self._run_command(row.id, msg, *command, commands=self.commands)
                return Submitted.ACCEPTED
            self.chats.enqueue(Queued(row.id, msg))
            return Submitted.ACCEPTED

    async def note_unreadable(self, msg: InboundMessage, note: str) -> Submitted:
        """Answer a message with nothing readable in it with ``note``, if its author may
        talk to the bot here; never stored. ``ACCEPTED`` when the note was sent."""
        if not (self.access.chat_allowed(msg) and await self.access.user_allowed(msg.speaker)):
            log.info("unreadable_message_ignored", platform=msg.platform, user=msg.user_id)
            return Submitted.DROPPED
        refused = await self._authorize(msg)
        if refused is not None:
            return refused
        with structlog.contextvars.bound_contextvars(
            platform=msg.platform, chat=msg.chat_id, user=msg.user_id
        ):
            await self.replies.send_direct(msg, note)
        return Submitted.ACCEPTED

    async def _authorize(self, msg: InboundMessage) -> Submitted | None:
        """Steps 1-2: None to go on, else what became of the message."""
        decision = await self.access.check(msg)
        if decision.verdict is Verdict.ALLOW:
            return None
        self.metrics.refused.inc()
        if decision.verdict is Verdict.REFUSE and decision.reply:
            await self.replies.send_direct(msg, decision.reply)
            return Submitted.REFUSED
        return Submitted.DROPPED

    async def _run_command(
        self, inbox_id: int, msg: InboundMessage, name: str, args: str, *, commands: CommandRunner
    ) -> None:
        try:
            reply = await commands.run(self.chats, msg, name, args)
        except Exception:  # loop boundary: a broken command answers, never crashes the adapter
            log.exception("command_failed", command=name)
            reply = f"/{name} failed unexpectedly; the error is in the bot's log."
        if isinstance(reply, Unrecorded):  # /forget me's receipt: no row may name them again
            await self.replies.send_direct(msg, reply.text)
            return
        await self.replies.reply(msg, reply, inbox_id=inbox_id, kind="command")
        await self.inbox.mark_done(inbox_id)
