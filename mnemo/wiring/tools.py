"""The tools a turn's agent may call, in their registration (= prompt) order:
the built-ins (memory, session_search), cronjob, the skill tools, then the external
provider's tools; after them the tool sources (``open_tool_sources``): delegate, then
the MCP servers'. Tool schemas are part of the cached prefix, so the order is fixed."""

from __future__ import annotations

import os
import socket
from contextlib import AsyncExitStack

from mnemo.gateway.budgets.gate import BudgetGate
from mnemo.gateway.config import McpSettings, Settings, load_settings
from mnemo.gateway.cron.service import CronJobs
from mnemo.gateway.cron.tool import cronjob_tool
from mnemo.gateway.llm.client import LLMClient
from mnemo.gateway.mcp.hub import McpHub
from mnemo.gateway.mcp.store import McpRepository
from mnemo.gateway.storage import StorageBackend
from mnemo.gateway.turns.agent import AgentDeps
from mnemo.gateway.turns.builtin_tools import register_builtin_tools
from mnemo.gateway.turns.delegate import Delegation
from mnemo.gateway.turns.digest import LLMSearchDigest
from mnemo.gateway.turns.policy import MemoryPolicies
from mnemo.gateway.turns.providers import memory_mirror, register_provider_tools
from mnemo.gateway.turns.skill_tools import skill_tools
from mnemo.gateway.turns.tools import ToolRegistry
from mnemo.memory.manager import MemoryManager
from mnemo.memory.skills import SkillStore


def build_tools(
    settings: Settings,
    backend: StorageBackend,
    llm: LLMClient,
    providers: MemoryManager,
    cron: CronJobs,
    skills: SkillStore,
    policies: MemoryPolicies,
) -> ToolRegistry:
    tools = ToolRegistry(max_output_chars=settings.sessions.tool_output_max_chars)
    register_builtin_tools(
        tools,
        files=backend.files,
        search=backend.search,
        settings=settings,
        on_memory_write=memory_mirror(providers, settings.home),
        digest=LLMSearchDigest(llm, settings.llm.aux_model, store=backend.sessions),
        linked_dms=backend.links.linked_dm_keys,
        policies=policies,  # read at every memory write (gateway/turns/policy.py)
        journal=backend.journal,
        proposals=backend.proposals,
    )
    tools.register(cronjob_tool(cron))
    for tool in skill_tools(skills):
        tools.register(tool)
    register_provider_tools(tools, providers, settings.home)
    return tools


async def open_tool_sources(
    stack: AsyncExitStack,
    settings: Settings,
    *,
    repo: McpRepository,
    agent: AgentDeps,
    budgets: BudgetGate | None,
    providers: MemoryManager,
) -> McpHub:
    """The tools offered after the registered ones, in this order: ``delegate`` (to the
    people ``delegation.allowed`` names), then the MCP servers' (``mcp.servers``). The
    hub connects and lists the servers before the first turn, and stops on exit."""
    agent.tools.add_source(
        Delegation(
            settings.delegation,
            registry=agent.tools,
            agent=agent,
            home=settings.home,
            budget=budgets,
            hook=providers,
        )
    )

    def reread() -> McpSettings:
        return load_settings(settings.home).mcp

    hub = McpHub(
        settings.mcp,
        repo,
        log_dir=settings.home / "logs",
        reload_settings=reread,
        replica=f"{socket.gethostname()}:{os.getpid()}",
    )
    agent.tools.add_source(hub)
    await hub.start()
    stack.push_async_callback(hub.stop)
    return hub
