"""Memory around a turn: what is recalled before it, shown with it, and done after it.

* ``notes`` — this turn's notes for the model (``model_input.turn_notes``): the memory
  providers' recall and, in a group, the speaker's profile when they share it with
  groups (``groups: shared``; by default nobody's profile reaches a group). They go into
  the user turn, never into the frozen system prompt.
* ``with_recall_note`` — the "recalled N memories" line under the reply
  (``memory.show_recall_indicator``).
* ``with_proposals`` — for a person who confirms every memory (``remember: ask``), what
  the turn proposed to remember and how to confirm it, under the reply.
* ``forget_turn`` — in a chat whose policy is ``history: off``, after the reply is in the
  outbox: the session ends and its messages are deleted, so nothing carries over.
* ``after`` — background work, never on the reply path: the providers' sync of the
  turn, the compression or memory-review job the turn made due, then the turn
  listeners (``SkillReview`` and tests).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from mnemo.gateway.config import CompressionSettings
from mnemo.gateway.events import InboundMessage
from mnemo.gateway.logs import get_logger
from mnemo.gateway.turns.agent import TurnResult
from mnemo.gateway.turns.model_input import turn_notes
from mnemo.gateway.turns.sessions import JobSink
from mnemo.gateway.turns.tools import TurnContext
from mnemo.memory.journal import ProposalRepository
from mnemo.memory.manager import MemoryManager
from mnemo.memory.policy import Groups, History, Remember
from mnemo.memory.ports import CuratedRepository
from mnemo.memory.sessions import SessionRow

log = get_logger(__name__)

TurnListener = Callable[[TurnContext, TurnResult], Awaitable[None]]


class SpeakerProfiles(Protocol):
    """Whether a chat is a shared room, the curated files, ending a session
    (``SessionResolver``)."""

    files: CuratedRepository

    def shared_room(self, msg: InboundMessage) -> bool: ...

    async def end(self, session: SessionRow, reason: str) -> None: ...


class TurnMemory:
    def __init__(
        self,
        sessions: SpeakerProfiles,
        providers: MemoryManager | None,
        jobs: JobSink | None,
        *,
        home: Path,
        show_recall: bool,
        compression: CompressionSettings,
        context_window: int,
        proposals: ProposalRepository | None = None,
        forget_session: Callable[[str], Awaitable[int]] | None = None,
    ) -> None:
        self.proposals = proposals
        self.forget_session = forget_session
        self.sessions = sessions
        self.providers = providers
        self.jobs = jobs
        self.home = home
        self.show_recall = show_recall
        self.compression = compression
        self.context_window = context_window
        self.listeners: list[TurnListener] = []

    async def notes(self, msg: InboundMessage, text: str, ctx: TurnContext) -> str:
        recall = None
        if self.providers is not None:
            prefetched = await self.providers.prefetch(text, ctx.for_providers(self.home))
            recall = prefetched.text if prefetched is not None else None
        profile = None
        if not msg.is_dm and ctx.policy.groups is Groups.SHARED:
            profile = (await asyncio.to_thread(self.sessions.files.blocks, msg.speaker)).user_block
        return turn_notes(recall=recall, speaker_profile=profile, speaker_label=msg.user_name or msg.user_id)

    def with_recall_note(self, reply: str, key: str) -> str:
        if self.providers is None or not self.show_recall:
            return reply
        indicator = self.providers.recall_indicator(key)
        return f"{reply}\n\n{indicator.render()}" if indicator is not None and indicator.count else reply

    async def with_proposals(self, reply: str, msg: InboundMessage, ctx: TurnContext) -> str:
        if self.proposals is None or ctx.policy.person_remember is not Remember.ASK:
            return reply
        mine = [
            p
            for p in await self.proposals.proposals([str(msg.speaker)])
            if p.message == msg.message_id and p.session == ctx.session_id
        ]
        if not mine:
            return reply
        lines = [
            f"📝 May I remember this? “{p.new or p.old}” — /memory confirm {p.id} · /memory reject {p.id}"
            for p in reversed(mine)
        ]
        return "\n\n".join([reply, "\n".join(lines)])

    async def forget_turn(self, session: SessionRow, ctx: TurnContext) -> None:
        if ctx.policy.history is not History.OFF or self.forget_session is None:
            return
        await self.sessions.end(session, "history_off")
        gone = await self.forget_session(session.id)
        log.info("turn_forgotten", session=session.id, messages=gone)

    async def after(self, session: SessionRow, ctx: TurnContext, text: str, result: TurnResult) -> None:
        if self.providers is not None and not result.failed:
            self.providers.sync_turn(text, result.reply, ctx.for_providers(self.home))
        if self.jobs is not None and not result.failed:
            threshold = self.compression.threshold * self.context_window
            over = result.last_prompt_tokens >= threshold or result.context_trimmed
            if self.compression.enabled and over:
                await self.jobs.enqueue("compress", session.id, {"prompt_tokens": result.last_prompt_tokens})
            elif result.review_due and ctx.policy.stores:
                await self.jobs.enqueue("review", session.id, {"user_turns": result.user_turns})
        for listener in self.listeners:
            await listener(ctx, result)
