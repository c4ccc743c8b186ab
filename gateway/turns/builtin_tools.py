"""The built-in tools (``memory``, ``session_search``) bound to their stores.

They are registered through the same ``ToolRegistry.register`` path every other tool
uses; this module only adapts each tool's memory-layer handler to the turn context.
The memory tool never takes *whose* USER.md from its arguments: the speaker comes from
the turn context, which the gateway built from the platform event. Its memory policy is
read again on every call (``gateway/turns/policy.py``), background passes included, and
every write carries the turn's provenance to the journal.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from mnemo.gateway.config import Settings
from mnemo.gateway.turns.policy import MemoryPolicies
from mnemo.gateway.turns.tools import Tool, ToolRegistry, ToolResult, TurnContext
from mnemo.memory.journal import JournalRepository, ProposalRepository
from mnemo.memory.memory_tool import MEMORY_TOOL_SCHEMA, MemoryCallContext, MemoryWrite, run_memory_tool
from mnemo.memory.ports import CuratedRepository, SearchRepository
from mnemo.memory.scope import UserRef
from mnemo.memory.search import SearchDigest
from mnemo.memory.search_tool import SESSION_SEARCH_TOOL_SCHEMA, run_session_search_tool
from mnemo.memory.search_view import BUDGET_HITS, ViewSettings

OnWrite = Callable[[MemoryWrite, TurnContext], Awaitable[None]]
# The DM chats of the speaker's other linked accounts (``IdentityLinks.linked_dm_keys``).
LinkedDms = Callable[[UserRef], Awaitable[Sequence[str]]]


def memory_tool(
    files: CuratedRepository,
    settings: Settings,
    on_write: OnWrite | None = None,
    *,
    policies: MemoryPolicies | None = None,
    journal: JournalRepository | None = None,
    proposals: ProposalRepository | None = None,
) -> Tool:
    async def handler(args: Mapping[str, Any], ctx: TurnContext) -> ToolResult:
        policy = ctx.policy
        if policies is not None:  # read where the write happens: a change holds at once
            policy = await policies.holding(
                platform=ctx.platform, chat_id=ctx.chat_id, user=ctx.speaker, is_group=not ctx.is_dm
            )
        call_ctx = MemoryCallContext(
            speaker=ctx.speaker,
            agent_context=ctx.agent_context,
            is_admin=ctx.is_admin,
            shared_write=settings.memory.shared_write,
            policy=policy,
            is_group=not ctx.is_dm,
            session=ctx.session_id,
            message=ctx.message_id,
            chat=ctx.chat_key,
            tool_call=ctx.tool_call_id,
        )

        async def mirror(write: MemoryWrite) -> None:
            if on_write is not None:
                await on_write(write, ctx)

        result = await run_memory_tool(
            files, args, call_ctx, ctx.memory_attempts, on_write=mirror, journal=journal, proposals=proposals
        )
        wrote = result.get("success") is True and result.get("changed") is True
        return ToolResult(
            json.dumps(result, ensure_ascii=False), is_error=not result.get("success"), memory_write=wrote
        )

    return Tool("memory", MEMORY_TOOL_SCHEMA, handler)


def search_view_settings(settings: Settings) -> ViewSettings:
    """What the tool shows, from ``search.*``: within ``max_result_tokens`` as many
    of the best 40 matches as fit (``max_limit`` caps only a ``limit`` the model asks
    for: 20 matches with their windows filled a third of the budget); with the budget
    off, ``default_limit``."""
    cfg = settings.search
    return ViewSettings(
        max_tokens=cfg.max_result_tokens,
        max_hits=BUDGET_HITS if cfg.max_result_tokens else min(cfg.default_limit, cfg.max_limit),
        before=cfg.context_before,
        after=cfg.context_after,
    )


def session_search_tool(
    search: SearchRepository,
    settings: Settings,
    digest: SearchDigest | None = None,
    linked_dms: LinkedDms | None = None,
) -> Tool:
    view = search_view_settings(settings)

    async def handler(args: Mapping[str, Any], ctx: TurnContext) -> ToolResult:
        # ``search.linked_dms``: in a DM, the person's own DMs on their linked accounts
        # too; never from a group, whose members must not reach anyone's DMs.
        also: Sequence[str] = ()
        if settings.search.linked_dms and linked_dms is not None and ctx.is_dm and ctx.speaker is not None:
            also = await linked_dms(ctx.speaker)
        out = await run_session_search_tool(
            search,
            args,
            chat_key=ctx.chat_key,
            also_chat_keys=also,
            current_session_id=ctx.session_id,
            view=view,
            max_limit=settings.search.max_limit,
            digest=digest if settings.search.digest else None,
        )
        return ToolResult(out.text, is_error=out.is_error)

    return Tool("session_search", SESSION_SEARCH_TOOL_SCHEMA, handler)


def register_builtin_tools(
    registry: ToolRegistry,
    *,
    files: CuratedRepository,
    search: SearchRepository,
    settings: Settings,
    on_memory_write: OnWrite | None = None,
    digest: SearchDigest | None = None,
    linked_dms: LinkedDms | None = None,
    policies: MemoryPolicies | None = None,
    journal: JournalRepository | None = None,
    proposals: ProposalRepository | None = None,
) -> None:
    tool = memory_tool(
        files, settings, on_memory_write, policies=policies, journal=journal, proposals=proposals
    )
    registry.register(tool)
    registry.register(session_search_tool(search, settings, digest, linked_dms))
