"""The chats the pipeline serves, one lane per session key.

``Chats`` is the one place that knows a message's session key, whether its author is
an admin and what a chat's lane holds. It is what a slash command may do to the chat
it was typed in (``commands.ChatControl``: reset, stop, queue state), and it gives the
turn and the cron run their ``TurnContext``.
"""

from __future__ import annotations

from typing import Protocol

from mnemo.gateway.events import InboundMessage, key_for
from mnemo.gateway.inbound.lanes import LaneSet
from mnemo.gateway.inbound.queued import Queued
from mnemo.gateway.turns.tools import TurnContext, turn_context
from mnemo.memory.sessions import SessionRow


class KnowsAdmins(Protocol):
    """Who the bot's admins are (``AccessControl``)."""

    def is_admin(self, platform: str, user_id: str) -> bool: ...


class ChatSessions(Protocol):
    """The sessions of the chats (``SessionResolver``)."""

    def shared_room(self, msg: InboundMessage) -> bool: ...

    async def reset(self, key: str) -> SessionRow | None: ...


class Chats:
    def __init__(
        self,
        lanes: LaneSet[Queued],
        sessions: ChatSessions,
        admins: KnowsAdmins,
        *,
        group_sessions_per_user: bool,
    ) -> None:
        self.lanes = lanes
        self.sessions = sessions
        self.admins = admins
        self.per_user = group_sessions_per_user
        # Turns cancelled by /stop: its command reply is the one message the person
        # gets, so the cancelled turn itself answers nothing (see take_stopped).
        self._stopped: set[str] = set()

    def session_key(self, msg: InboundMessage) -> str:
        return key_for(msg, per_user=self.per_user)

    def is_admin(self, msg: InboundMessage) -> bool:
        return self.admins.is_admin(msg.platform, msg.user_id)

    def enqueue(self, item: Queued) -> None:
        """Into the lane of the message's session, behind what is queued there."""
        self.lanes.submit(self.session_key(item.msg), item)

    def requeue(self, key: str, item: Queued) -> None:
        self.lanes.submit(key, item)

    async def reset(self, msg: InboundMessage) -> SessionRow | None:
        """/reset: end the chat's session; the next message starts a new one."""
        return await self.sessions.reset(self.session_key(msg))

    def stop_turn(self, key: str) -> bool:
        if not self.lanes.cancel_current(key):
            return False
        self._stopped.add(key)
        return True

    def take_stopped(self, key: str) -> bool:
        """Whether the turn of ``key`` that just ended cancelled was stopped by /stop
        (already answered) rather than by shutdown; forgets it."""
        if key in self._stopped:
            self._stopped.discard(key)
            return True
        return False

    def queue_state(self, key: str) -> tuple[int, bool]:
        return self.lanes.queued(key), self.lanes.busy(key)

    def turn_context(self, msg: InboundMessage, session: SessionRow, key: str) -> TurnContext:
        return turn_context(
            msg,
            session_id=session.id,
            chat_key=key,
            is_admin=self.is_admin(msg),
            shared_room=self.sessions.shared_room(msg),
        )
