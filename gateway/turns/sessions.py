"""Which session a message belongs to, and the frozen system prompt it starts with.

``SessionResolver`` is the one place sessions begin and end for the pipeline, for cron
runs and for a compression rollover:

* ``resolve`` finds the chat's active session, ends it first when an idle or daily reset
  is due (off by default), and otherwise starts one;
* ``start`` renders the system prompt once — persona, the MEMORY.md block, in a DM the
  speaker's USER.md block (never in a group: a profile that its person shares with
  groups goes into each of their turns instead, ``turn_memory.py``), the provider's
  static block — and stores it on the new row, where every request of the session reads
  it byte for byte. Entries the journal knows as inferred or imported carry one compact
  marker (``memory/journal.py``);
* ``end`` records the end reason and queues the session-end job (flush, provider hook).

``lock(key)`` is held by a turn while it resolves and uses the chat's session, and by a
rollover while it switches sessions, so a switch is atomic with respect to the lane.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from mnemo.gateway.config import Settings
from mnemo.gateway.events import InboundMessage, is_shared_room
from mnemo.gateway.logs import get_logger
from mnemo.gateway.turns.policy import MemoryPolicies
from mnemo.gateway.turns.prompt import PromptParts, render_system_prompt
from mnemo.memory.curated import MemoryBlocks
from mnemo.memory.journal import JournalRepository, Layer, marked
from mnemo.memory.policy import EffectivePolicy
from mnemo.memory.ports import CuratedRepository, SessionStorage
from mnemo.memory.scope import AgentContext
from mnemo.memory.sessions import SessionRow
from mnemo.memory.skills import SkillStore
from mnemo.memory.skills.index import render_index

log = get_logger(__name__)


class JobSink(Protocol):
    """Where background work is handed (the persisted job queue implements it)."""

    async def enqueue(self, kind: str, session_id: str, payload: dict[str, Any] | None = None) -> Any: ...

    async def depth(self) -> int: ...

    async def status_line(self) -> str: ...


class LinksSource(Protocol):
    """Linked identities (``IdentityLinks``): ``refresh`` brings this process's map up to
    date, so a session starts with the person's USER.md even when another process linked
    the accounts."""

    async def refresh(self) -> None: ...


class McpToolNames(Protocol):
    """The MCP tools a session starting now offers a speaker (``McpHub.names_for``): the
    skills index marks skills whose tools are missing."""

    def __call__(self, msg: InboundMessage) -> frozenset[str]: ...


class PromptBlockSource(Protocol):
    """The memory providers' static system-prompt block (``MemoryManager``)."""

    def system_prompt_block(self) -> str: ...


@asynccontextmanager
async def _both(local: asyncio.Lock, shared: AbstractAsyncContextManager[None]) -> AsyncIterator[None]:
    async with local, shared:  # this process's first: one waiter per key on the shared one
        yield


class SessionResolver:
    def __init__(
        self,
        settings: Settings,
        store: SessionStorage,
        files: CuratedRepository,
        *,
        providers: PromptBlockSource | None = None,
        jobs: JobSink | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        shared_lock: Callable[[str], AbstractAsyncContextManager[None]] | None = None,
        links: LinksSource | None = None,
        policies: MemoryPolicies | None = None,
        journal: JournalRepository | None = None,
        mcp_tools: McpToolNames | None = None,
    ) -> None:
        self.settings = settings
        self.mcp_tools = mcp_tools
        self.links = links
        self.policies = policies  # None: the defaults everywhere (tests without a store)
        self.journal = journal  # trust markers in the prompt; None: no markers
        # Several replicas on one database: a lock every process sees (PostgreSQL's
        # advisory lock), taken after this process's own, so a session's turns never
        # run in two replicas at once. None: this process's locks are enough (SQLite).
        self.shared_lock = shared_lock
        self.store = store
        self.files = files
        self.providers = providers
        self.jobs = jobs
        self.clock = clock
        self._locks: dict[str, asyncio.Lock] = {}

    def shared_room(self, msg: InboundMessage) -> bool:
        return is_shared_room(msg, per_user=self.settings.sessions.group_sessions_per_user)

    async def policy(self, msg: InboundMessage) -> EffectivePolicy:
        """The memory policy of ``msg``'s author in its chat (``memory/policy.py``)."""
        if self.policies is None:
            return EffectivePolicy.default()
        speaker = None if msg.agent_context is AgentContext.CRON else msg.speaker
        return await self.policies.holding(
            platform=msg.platform, chat_id=msg.chat_id, user=speaker, is_group=not msg.is_dm
        )

    def lock(self, key: str) -> AbstractAsyncContextManager[object]:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        if self.shared_lock is None:
            return lock
        return _both(lock, self.shared_lock(f"session:{key}"))

    async def system_prompt(self, msg: InboundMessage, *, shared_room: bool) -> str:
        def read() -> tuple[str | None, MemoryBlocks]:
            soul_path = self.settings.soul_path
            soul = soul_path.read_text(encoding="utf-8-sig") if soul_path.is_file() else None
            # A group prompt carries nobody's USER.md (DESIGN.md): a member who shares
            # their profile with groups gets it in their own turns only (turn_memory.py).
            blocks = self.files.blocks(msg.speaker if msg.is_dm else None)
            for warning in blocks.warnings:
                log.warning("memory_file_problem", warning=warning)
            return soul, blocks

        def skills() -> str:
            # Only the speaker's own and the shared skills, for this platform; in a
            # shared room nobody's own skills (they would reach every member).
            store = SkillStore(self.settings.skills_dir, self.settings.skills.max_visible)
            owner = None if shared_room else msg.speaker
            tools = self.mcp_tools(msg) if self.mcp_tools is not None else frozenset()
            return render_index(
                store.visible(owner, msg.platform), self.settings.skills.index_max_chars, tools
            )

        soul, blocks = await asyncio.to_thread(read)
        memory_block, user_block = await self._marked(blocks, msg)
        skills_index = await asyncio.to_thread(skills)
        provider_block = self.providers.system_prompt_block() if self.providers is not None else ""
        return render_system_prompt(
            PromptParts(
                persona=soul,
                memory_block=memory_block,
                user_block=user_block,
                platform=msg.platform,
                is_group=not msg.is_dm,
                is_cron=msg.agent_context is AgentContext.CRON,
                provider_block=provider_block,
                skills_index=skills_index,
            )
        )

    async def _marked(self, blocks: MemoryBlocks, msg: InboundMessage) -> tuple[str, str | None]:
        """The blocks with one marker on each entry the journal holds as inferred or imported."""
        if self.journal is None:
            return blocks.memory_block, blocks.user_block
        shared = blocks.memory
        trusts = await self.journal.trusts(Layer.CURATED, self.files.shared().owner, shared.entries)
        memory_block = shared.render_block(marked(shared.entries, trusts))
        user = blocks.user
        if user is None:
            return memory_block, None
        owner = self.files.user(msg.speaker).owner
        trusts = await self.journal.trusts(Layer.CURATED, owner, user.entries)
        return memory_block, user.render_block(marked(user.entries, trusts))

    async def start(
        self, msg: InboundMessage, key: str, *, source: str = "chat", parent_session_id: str | None = None
    ) -> SessionRow:
        prompt = await self.system_prompt(msg, shared_room=self.shared_room(msg))
        return await self.store.create_session(
            chat_key=key,
            platform=msg.platform,
            chat_id=msg.chat_id,
            thread_id=msg.thread_id,
            user_id=msg.user_id,
            agent_context=msg.agent_context.value,
            source=source,
            model=self.settings.llm.model,
            system_prompt=prompt,
            parent_session_id=parent_session_id,
        )

    def _expired(self, session: SessionRow, last_activity: datetime | None) -> str | None:
        cfg = self.settings.sessions
        now = self.clock()
        last = last_activity or session.started_at
        if cfg.idle_reset_minutes is not None and now - last >= timedelta(minutes=cfg.idle_reset_minutes):
            return "idle"
        if cfg.daily_reset_hour is not None:
            boundary = now.replace(hour=cfg.daily_reset_hour, minute=0, second=0, microsecond=0)
            if boundary > now:
                boundary -= timedelta(days=1)
            if last < boundary:
                return "daily"
        return None

    async def end(self, session: SessionRow, reason: str) -> None:
        await self.store.end_session(session.id, reason)
        if self.jobs is not None and session.agent_context == AgentContext.PRIMARY.value:
            await self.jobs.enqueue("session_end", session.id, {"reason": reason})

    async def resolve(self, msg: InboundMessage, key: str) -> SessionRow:
        if self.links is not None:
            await self.links.refresh()
        session = await self.store.active_session(key)
        cfg = self.settings.sessions
        if session is not None and (cfg.idle_reset_minutes is not None or cfg.daily_reset_hour is not None):
            reason = self._expired(session, await self.store.last_activity(session.id))
            if reason is not None:
                log.info("session_expired", session=session.id, reason=reason)
                await self.end(session, reason)
                session = None
        if session is None:
            session = await self.start(msg, key)
        return session

    async def reset(self, key: str) -> SessionRow | None:
        """End the chat's session; the next message starts a new one."""
        session = await self.store.active_session(key)
        if session is not None:
            await self.end(session, "reset")
        return session
