"""The memory providers as the gateway runs them.

Which external provider is loaded (``memory.provider``) and with which settings, how
its tools join the turn's tool registry, and how built-in memory writes are mirrored
to it. The rules here belong to the gateway, not to the composition root:

* a provider that keeps its data in the bot's database (``shares_database``, e.g.
  holographic) gets ``database_url`` on PostgreSQL, so every replica shares its facts;
* a provider that is unknown, unavailable or fails to start is logged and left out —
  the bot runs on its built-in memory rather than not at all;
* a provider tool's JSON answer with ``"ok": false`` or ``"success": false`` is a tool
  error for the model (the providers report bad arguments that way, never by raising).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mnemo.gateway.config import Settings
from mnemo.gateway.logs import get_logger
from mnemo.gateway.turns.builtin_tools import OnWrite
from mnemo.gateway.turns.tools import Tool, ToolRegistry, ToolResult, TurnContext
from mnemo.memory.discovery import load_provider, provider_config
from mnemo.memory.errors import ProviderError
from mnemo.memory.journal import DocumentJournal
from mnemo.memory.manager import ManagerLimits, MemoryManager
from mnemo.memory.memory_tool import MemoryWrite
from mnemo.memory.provider import MemoryProvider

log = get_logger(__name__)


def shared_database_config(settings: Settings, provider: MemoryProvider) -> dict[str, Any] | None:
    """On PostgreSQL, the stored settings of a provider that keeps its data in the bot's
    database (``shares_database``) plus ``database_url``; else None (the manager reads
    the stored settings itself)."""
    url = settings.database.url
    if url is None or not provider.shares_database:
        return None
    return {**provider_config(settings.home, provider), "database_url": url.get_secret_value()}


async def open_providers(settings: Settings, journal: DocumentJournal | None = None) -> MemoryManager:
    """The started MemoryManager with the configured external provider, if it loads;
    ``journal``: where providers that store locally journal their writes."""
    manager = MemoryManager(
        settings.home,
        ManagerLimits(
            provider_timeout_s=settings.providers.timeout_s or settings.memory.provider_timeout_s,
            prefetch_timeout_s=settings.providers.timeout_s or settings.memory.prefetch_timeout_s,
            drain_timeout_s=settings.worker.drain_timeout_s,
        ),
    )
    manager.journal = journal
    name = settings.memory.provider
    if name:
        try:
            provider = load_provider(name, settings.home)
            manager.add_provider(provider, shared_database_config(settings, provider))
        except ProviderError as e:
            log.error("memory_provider_not_loaded", provider=name, error=str(e))
    await manager.start()
    return manager


def register_provider_tools(tools: ToolRegistry, providers: MemoryManager, home: Path) -> None:
    """Provider tools go through the same registry as the built-ins, after them (the
    registry keeps registration order, and tool schemas are part of the cached prefix)."""
    for schema in providers.tool_schemas():
        name = schema["name"]

        async def handler(args: Mapping[str, Any], ctx: TurnContext, name: str = name) -> ToolResult:
            text = await providers.handle_tool_call(name, args, ctx.for_providers(home))
            return ToolResult(text, is_error=reports_failure(text))

        tools.register(Tool(name, schema, handler))


def reports_failure(text: str) -> bool:
    """Whether a provider tool's answer says it failed (``ok``/``success`` false)."""
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return isinstance(value, dict) and (value.get("ok") is False or value.get("success") is False)


def memory_mirror(providers: MemoryManager, home: Path) -> OnWrite:
    """The built-in memory tool's write hook: each successful write reaches the external
    provider (``on_memory_write``) in the speaker's provider scope."""

    async def mirror(write: MemoryWrite, ctx: TurnContext) -> None:
        await providers.on_memory_write(write, ctx.for_providers(home))

    return mirror
