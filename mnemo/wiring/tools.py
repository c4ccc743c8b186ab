"""The tools a turn's agent may call, in their registration (= prompt) order:
the built-ins (memory, session_search), cronjob, the skill tools, then the external
provider's tools. Tool schemas are part of the cached prefix, so the order is fixed."""

from __future__ import annotations

from mnemo.gateway.config import Settings
from mnemo.gateway.cron.service import CronJobs
from mnemo.gateway.cron.tool import cronjob_tool
from mnemo.gateway.llm.client import LLMClient
from mnemo.gateway.storage import StorageBackend
from mnemo.gateway.turns.builtin_tools import register_builtin_tools
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
