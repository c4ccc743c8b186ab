"""One person's memory as ``mnemo mcp serve`` offers it: the bot's own code paths.

Every tool acts for the person the client's token is bound to (``tokens.Grant``) and
reaches nothing else: the person comes from the grant, never from the arguments.

* ``memory_read``: the shared MEMORY.md and the person's USER.md as the bot's prompt
  shows them (entries the threat scan flags are masked the same way);
* ``memory_write``: add / replace / remove in the person's own USER.md through the
  memory tool's write path (``memory/memory_tool.py``: the same policy table, threat
  scan, character limit and atomic write; mirrored to the memory provider). The shared
  MEMORY.md is not writable here. Refused for a read-only token;
* ``session_search``: the bot's search over the person's own direct conversations (their
  DM chats, on every linked account) — never a group, never anyone else's;
* ``recall``: the active memory provider's recall for a query, fenced as in a turn.

Provenance: writes carry ``actor = "mcp"`` (``ACTOR``) into the memory journal (trust
``admin``, as every write a person makes through a tool of their own), and the log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from mnemo.gateway.logs import get_logger
from mnemo.gateway.mcp.store import McpRepository
from mnemo.gateway.mcp.tokens import Grant
from mnemo.memory.memory_tool import MemoryCallContext, MemoryWrite, WriteAttempts, run_memory_tool
from mnemo.memory.ports import CuratedRepository, SearchRepository
from mnemo.memory.provider import ProviderContext, Recall
from mnemo.memory.scope import AgentContext, UserRef
from mnemo.memory.search_tool import run_session_search_tool
from mnemo.memory.search_view import ViewSettings

log = get_logger(__name__)

ACTOR = "mcp"

READ_SCHEMA: dict[str, Any] = {
    "name": "memory_read",
    "description": (
        "Read what the assistant remembers: the shared notes (MEMORY.md) and the profile of the person "
        "this connection acts for (USER.md), entry by entry, with how full each is."
    ),
    "input_schema": {"type": "object", "properties": {}, "additionalProperties": False},
}
WRITE_SCHEMA: dict[str, Any] = {
    "name": "memory_write",
    "description": (
        "Change the profile (USER.md) of the person this connection acts for: 'add' (content), "
        "'replace' (old_text: a short part identifying one entry; content: the whole new entry) or "
        "'remove' (old_text). Write declarative facts ('Prefers concise answers'). Entries are "
        "scanned and the profile has a character limit; the bot sees changes from its next session."
    ),
    "input_schema": {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ["add", "replace", "remove"]},
            "content": {"type": "string"},
            "old_text": {"type": "string"},
        },
        "required": ["action"],
        "additionalProperties": False,
    },
}
SEARCH_SCHEMA: dict[str, Any] = {
    "name": "session_search",
    "description": "Search the person's own past conversations with the assistant (their direct messages).",
    "input_schema": {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "A few words to look for."},
            "limit": {"type": "integer", "minimum": 1, "maximum": 20},
        },
        "required": ["query"],
        "additionalProperties": False,
    },
}
RECALL_SCHEMA: dict[str, Any] = {
    "name": "recall",
    "description": "What the assistant's long-term memory provider recalls about a query, for this person.",
    "input_schema": {
        "type": "object",
        "properties": {"query": {"type": "string"}},
        "required": ["query"],
        "additionalProperties": False,
    },
}
READ_TOOLS = (READ_SCHEMA, SEARCH_SCHEMA, RECALL_SCHEMA)


class ProviderMemory(Protocol):
    """The memory providers (``MemoryManager``)."""

    async def prefetch(self, query: str, ctx: ProviderContext) -> Recall | None: ...

    async def on_memory_write(self, write: MemoryWrite, ctx: ProviderContext) -> None: ...


@dataclass(frozen=True, slots=True)
class SearchLimits:
    default: int = 5
    most: int = 20
    view: ViewSettings = ViewSettings()  # what a result shows (search.* as the tool's)


class PersonMemory:
    def __init__(
        self,
        files: CuratedRepository,
        search: SearchRepository,
        repo: McpRepository,
        *,
        home: Path,
        providers: ProviderMemory | None = None,
        accounts: Callable[[UserRef], Awaitable[Sequence[UserRef]]] | None = None,
        limits: SearchLimits = SearchLimits(),
    ) -> None:
        self.files = files
        self.search_store = search
        self.repo = repo
        self.home = home
        self.providers = providers
        self.accounts = accounts
        self.limits = limits

    def tools(self, grant: Grant) -> list[dict[str, Any]]:
        return [READ_SCHEMA, *([] if grant.read_only else [WRITE_SCHEMA]), SEARCH_SCHEMA, RECALL_SCHEMA]

    async def call(self, grant: Grant, name: str, args: Mapping[str, Any]) -> dict[str, Any]:
        """Run one tool for ``grant``; problems come back as ``{"success": false, …}``."""
        if name == "memory_read":
            return await self.read(grant)
        if name == "memory_write":
            if grant.read_only:
                return {"success": False, "error": "this token is read-only: memory_write is refused"}
            return await self.write(grant, args)
        if name == "session_search":
            return await self.session_search(grant, args)
        if name == "recall":
            return await self.recall(grant, args)
        return {"success": False, "error": f"unknown tool {name!r}"}

    def _provider_ctx(self, grant: Grant) -> ProviderContext:
        person = grant.person
        return ProviderContext(
            session_id=f"mcp:{grant.token_id}",
            chat_key=f"mcp:{person}",
            platform=person.platform,
            user=person,
            agent_context=AgentContext.PRIMARY,
            home=self.home,
        )

    async def read(self, grant: Grant) -> dict[str, Any]:
        def load() -> dict[str, Any]:
            out: dict[str, Any] = {"success": True}
            for key, doc in (("shared", self.files.shared()), ("profile", self.files.user(grant.person))):
                snap = doc.load()
                out[key] = {"entries": list(snap.shown_entries), "chars": snap.chars, "limit": snap.limit}
            return out

        return await asyncio.to_thread(load)

    async def write(self, grant: Grant, args: Mapping[str, Any], *, actor: str = ACTOR) -> dict[str, Any]:
        call = {k: v for k, v in args.items() if k in ("action", "content", "old_text")}
        ctx = MemoryCallContext(
            speaker=grant.person, agent_context=AgentContext.PRIMARY, is_admin=False, actor=actor
        )

        async def mirror(write: MemoryWrite) -> None:
            if self.providers is not None:
                await self.providers.on_memory_write(write, self._provider_ctx(grant))

        result = await run_memory_tool(
            self.files, {**call, "target": "user"}, ctx, WriteAttempts(), on_write=mirror
        )
        log.info(
            "mcp_memory_write",
            actor=actor,
            token=grant.token_id,
            person=str(grant.person),
            action=str(call.get("action")),
            success=result.get("success"),
        )
        return result

    async def session_search(self, grant: Grant, args: Mapping[str, Any]) -> dict[str, Any]:
        accounts = [grant.person, *(await self.accounts(grant.person) if self.accounts is not None else ())]
        keys = await self.repo.dm_keys(list(dict.fromkeys(accounts)))
        if not keys:
            query = args.get("query")
            return {
                "query": query,
                "count": 0,
                "results": [],
                "note": "No conversations with this person yet.",
            }
        out = await run_session_search_tool(
            self.search_store,
            args,
            chat_key=keys[0],
            also_chat_keys=keys[1:],
            current_session_id=None,
            view=self.limits.view,
            max_limit=self.limits.most,
        )
        if out.is_error:
            return {"success": False, "error": out.text}
        # The same text the bot's own session_search gives its model.
        shown = out.view.shown if out.view is not None else 0
        return {"query": args.get("query"), "count": shown, "text": out.text}

    async def recall(self, grant: Grant, args: Mapping[str, Any]) -> dict[str, Any]:
        query = args.get("query")
        if not isinstance(query, str) or not query.strip():
            return {"success": False, "error": "recall needs a non-empty 'query'"}
        if self.providers is None:
            return {"success": True, "recalled": "", "note": "No memory provider is configured."}
        found = await self.providers.prefetch(query, self._provider_ctx(grant))
        if found is None:
            return {"success": True, "recalled": "", "count": 0}
        return {"success": True, "recalled": found.text, "count": found.count, "provider": found.label}
