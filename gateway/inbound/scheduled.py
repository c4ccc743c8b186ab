"""Cron runs through the same agent pipeline as a message (``cron/scheduler.py``'s
``ScheduledTurns``).

A run is a fresh session (``source="cron"``, ``agent_context="cron"``) scoped to the
job's target chat and ended when the run ends; it is never mirrored into that chat's
conversation. Its result goes out through the outbox unless it is exactly
``[SILENT]`` or the run failed.
"""

from __future__ import annotations

from typing import Protocol

from mnemo.gateway.events import SILENT, InboundMessage
from mnemo.gateway.inbound.chats import Chats
from mnemo.gateway.inbound.replies import Replies
from mnemo.gateway.turns.agent import Agent, AgentDeps, TurnInput, TurnResult
from mnemo.memory.scope import AgentContext
from mnemo.memory.sessions import SessionRow


class RunSessions(Protocol):
    """Where a run's session begins and ends (``SessionResolver``)."""

    async def start(self, msg: InboundMessage, key: str, *, source: str = "chat") -> SessionRow: ...

    async def end(self, session: SessionRow, reason: str) -> None: ...


class ScheduledRuns:
    def __init__(self, chats: Chats, sessions: RunSessions, agent: AgentDeps, replies: Replies) -> None:
        self.chats = chats
        self.sessions = sessions
        self.agent = agent
        self.replies = replies

    async def run(self, msg: InboundMessage, *, deliver: bool = True) -> TurnResult:
        if msg.agent_context is not AgentContext.CRON:
            raise ValueError("run_scheduled takes a cron message")
        key = self.chats.session_key(msg)
        session = await self.sessions.start(msg, key, source="cron")
        ctx = self.chats.turn_context(msg, session, key)
        try:
            agent = await Agent.load(self.agent, session, ctx)
            result = await agent.run(
                TurnInput(
                    text=msg.text,
                    author_id=msg.user_id,
                    author_name="scheduled job",
                    platform_message_id=msg.message_id,
                )
            )
        finally:
            await self.sessions.end(session, "cron_done")  # a cron session: no session-end job
        if deliver and result.reply.strip() != SILENT and not result.failed:
            await self.replies.reply(msg, result.reply, kind="cron", session_id=session.id)
        return result
