"""What the pipeline says to a chat, and how it gets there.

A reply, a notice or an admin notice is queued in the durable outbox and the delivery
loop is woken: the outbox, not this module, sends it (exactly once, after a crash too).
A turn's batch is finished by replying to its newest message and marking every message
of the batch done, in that order, so a crash between the two answers again rather than
never.

``send_direct`` bypasses the outbox for answers to messages that are never stored: a
refusal (nothing of an unauthorized user is stored) and the note for a message with
nothing readable in it. It is best effort: a failure is logged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from mnemo.gateway.delivery.inbox import InboxRepository
from mnemo.gateway.delivery.outbox import OutboxQueue
from mnemo.gateway.events import ChatRef, InboundMessage, OutboundMessage, chat_of
from mnemo.gateway.inbound.queued import Queued
from mnemo.gateway.logs import get_logger
from mnemo.gateway.ports import Adapter

log = get_logger(__name__)


class Wakes(Protocol):
    """The delivery loop (``DeliveryLoop``): ``wake`` after queuing sends at once."""

    def wake(self) -> None: ...


class Replies:
    def __init__(
        self,
        outbox: OutboxQueue,
        inbox: InboxRepository,
        delivery: Wakes,
        adapters: Mapping[str, Adapter],
        *,
        admins: Sequence[str],
    ) -> None:
        self.outbox = outbox
        self.inbox = inbox
        self.delivery = delivery
        self.adapters = adapters
        self.admins = admins

    async def reply(
        self,
        msg: InboundMessage,
        text: str,
        *,
        inbox_id: int | None = None,
        kind: str = "reply",
        session_id: str | None = None,
    ) -> int:
        out = OutboundMessage(
            chat=chat_of(msg),
            text=text,
            reply_to_message_id=msg.message_id,
            mention_user_id=msg.user_id,
            scheduled=kind == "cron",
        )
        row_id = await self.outbox.enqueue(out, kind=kind, session_id=session_id, inbox_id=inbox_id)
        self.delivery.wake()
        return row_id

    async def finish(
        self, batch: Sequence[Queued], text: str, *, kind: str, session_id: str | None = None
    ) -> None:
        last = batch[-1]
        await self.reply(last.msg, text, inbox_id=last.inbox_id, kind=kind, session_id=session_id)
        await self.done(batch)

    async def done(self, batch: Sequence[Queued]) -> None:
        """Mark the batch done without a reply (a notice already given)."""
        for q in batch:
            await self.inbox.mark_done(q.inbox_id)

    async def send_direct(self, msg: InboundMessage, text: str) -> None:
        """Straight to the platform, never stored: refusals and notes (see above)."""
        chat = chat_of(msg)
        adapter = self.adapters.get(chat.platform)
        if adapter is None:
            return
        try:
            await adapter.send(
                OutboundMessage(
                    chat=chat, text=text, reply_to_message_id=msg.message_id, mention_user_id=msg.user_id
                )
            )
        except Exception as e:  # loop boundary: best effort, logged
            log.warning("direct_reply_not_sent", platform=chat.platform, error=f"{type(e).__name__}: {e}")

    async def notify_admins(self, text: str) -> None:
        """A notice to every admin's DM, through the outbox."""
        for admin in self.admins:
            platform, _, user_id = admin.partition(":")
            await self.outbox.enqueue(OutboundMessage(ChatRef(platform, user_id), text), kind="notice")
        self.delivery.wake()
