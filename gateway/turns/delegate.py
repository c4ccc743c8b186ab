"""The ``delegate`` tool: a sub-agent with a fresh context works on one task.

Offered in conversations to the people ``delegation.allowed`` names (admins by
default). A call runs a new ``Agent`` on a new session that

* starts from the task alone: its system prompt is the sub-agent's own, its only user
  message is the task — it never sees the caller's conversation or memory blocks;
* has the tools the call grants, a subset of the caller's own (never ``delegate``), in
  the ``subagent`` context: the person's profile is read-only unless the call sets
  ``allow_profile_write`` (then ``memory`` with ``target: user`` writes as in the
  conversation); shared memory stays add-only, provider tools do not write;
* stops after ``max_steps`` tool rounds or ``delegation.max_tokens`` tokens;
* is billed to the person like the turn (its requests are counted in their budget and
  ``/usage``), and refused when the person's budget is used up;
* is stored as a session with ``source = 'delegate'`` linked to the caller's session
  (``parent_session_id``), so the dashboard shows its transcript.

Its final answer is the tool's result; memory providers hear of it through
``on_delegation(task, result, ctx)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from mnemo.gateway.budgets.gate import Refusal
from mnemo.gateway.config import DelegationSettings
from mnemo.gateway.logs import get_logger
from mnemo.gateway.turns.agent import Agent, AgentDeps, TurnInput
from mnemo.gateway.turns.audience import may_use
from mnemo.gateway.turns.tools import Tool, ToolRegistry, ToolResult, ToolSet, TurnContext
from mnemo.memory.memory_tool import WriteAttempts
from mnemo.memory.provider import ProviderContext
from mnemo.memory.scope import AgentContext, UserRef
from mnemo.memory.sessions import SessionRow

log = get_logger(__name__)

NAME = "delegate"
SOURCE = "delegate"  # sessions.source of a sub-agent's transcript
MAX_TASK_CHARS = 8000

SUBAGENT_PROMPT = (
    "You are a sub-agent of mnemo, working on one delegated task. You do not see the "
    "conversation that led to it: the task below is everything you know. Use the tools you "
    "were given when they help, then answer with your result: concise, complete and "
    "self-contained. Your answer is returned to the agent that delegated the task (it is "
    "not shown to the user directly). If you cannot do the task, say what is missing.\n"
)


class DelegationBudget(Protocol):
    """The person's caps (``BudgetGate.check``), checked without the turn's lock."""

    async def check(self, user: UserRef, *, admin: bool) -> Refusal | None: ...


class DelegationHook(Protocol):
    """The memory providers (``MemoryManager.on_delegation``)."""

    def on_delegation(self, task: str, result: str, ctx: ProviderContext) -> None: ...


def schema(settings: DelegationSettings) -> dict[str, Any]:
    return {
        "name": NAME,
        "description": (
            "Hand a self-contained sub-task to a sub-agent that starts with a fresh context: it sees "
            "only the task you write (not this conversation) and the tools you grant it, works on its "
            "own, and returns its final answer as this tool's result. Use it for research or multi-step "
            "work whose intermediate steps would clutter the conversation. Write the task so it can be "
            "done without any other context, and say what the answer should contain."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "task": {"type": "string", "description": "What to do and what to return, self-contained."},
                "tools": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Names of your tools the sub-agent may use (default: none).",
                },
                "allow_profile_write": {
                    "type": "boolean",
                    "description": "Let it update the user's profile (memory, target 'user'); default false.",
                },
                "max_steps": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": settings.max_steps,
                    "description": f"Tool rounds it may use (default and most: {settings.max_steps}).",
                },
            },
            "required": ["task"],
            "additionalProperties": False,
        },
    }


def profile_writer(memory: Tool) -> Tool:
    """The ``memory`` tool writing the speaker's profile as in the conversation (granted
    by the call); shared memory keeps the sub-agent's add-only rule."""

    async def handler(args: Mapping[str, Any], ctx: TurnContext) -> Any:
        if isinstance(args, Mapping) and args.get("target") == "user":
            ctx = dataclasses.replace(ctx, agent_context=AgentContext.PRIMARY)
        return await memory.handler(args, ctx)

    return Tool(memory.name, memory.schema, handler, memory.contexts)


class Delegation:
    """A ``ToolSource``: the ``delegate`` tool for whoever may delegate."""

    def __init__(
        self,
        settings: DelegationSettings,
        *,
        registry: ToolRegistry,
        agent: AgentDeps,
        home: Path,
        budget: DelegationBudget | None = None,
        hook: DelegationHook | None = None,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.agent = agent
        self.home = home
        self.budget = budget
        self.hook = hook
        self.tool = Tool(NAME, schema(settings), self._run, contexts=frozenset({AgentContext.PRIMARY}))

    async def tools_for(self, ctx: TurnContext, session: SessionRow) -> list[Tool]:
        if may_use(self.settings.allowed, ctx.speaker, is_admin=ctx.is_admin):
            return [self.tool]
        return []

    async def _grant(self, args: Mapping[str, Any], ctx: TurnContext) -> ToolSet | str:
        parent = await self.agent.store.get_session(ctx.session_id)
        if parent is None:
            return "this conversation's session is gone"
        caller = await self.registry.for_turn(ctx, parent)
        wanted = args.get("tools") or []
        if not all(isinstance(n, str) for n in wanted):
            return "'tools' must be a list of tool names"
        if args.get("allow_profile_write") is True and "memory" not in wanted:
            wanted = [*wanted, "memory"]
        grantable = [t.name for t in caller.tools if t.name != NAME and t.offered_in(AgentContext.SUBAGENT)]
        refused = [n for n in wanted if n not in grantable]
        if refused:
            return f"cannot grant {', '.join(map(repr, refused))}; you may grant: {', '.join(grantable) or 'nothing'}"
        granted = caller.only(wanted)
        memory = granted.get("memory")
        if args.get("allow_profile_write") is True and memory is not None:
            granted = granted.replace(profile_writer(memory))
        return granted

    async def _run(self, args: Mapping[str, Any], ctx: TurnContext) -> ToolResult:
        task = str(args.get("task", "")).strip()
        if not task:
            return ToolResult("Error: 'task' must describe the work", is_error=True)
        if len(task) > MAX_TASK_CHARS:
            return ToolResult(f"Error: the task is longer than {MAX_TASK_CHARS:,} characters", is_error=True)
        granted = await self._grant(args, ctx)
        if isinstance(granted, str):
            return ToolResult(f"Error: {granted}", is_error=True)
        if self.budget is not None and ctx.speaker is not None:
            refusal = await self.budget.check(ctx.speaker, admin=ctx.is_admin)
            if refusal is not None:
                return ToolResult(f"Not delegated: {refusal.text}", is_error=True)
        steps = min(int(args.get("max_steps") or self.settings.max_steps), self.settings.max_steps)
        store = self.agent.store
        child = await store.create_session(
            chat_key=ctx.chat_key,
            platform=ctx.platform,
            chat_id=ctx.chat_id,
            thread_id=ctx.thread_id,
            user_id=ctx.speaker.user_id if ctx.speaker is not None else None,
            agent_context=AgentContext.SUBAGENT.value,
            source=SOURCE,
            model=self.agent.llm.settings.model,
            system_prompt=SUBAGENT_PROMPT,
            parent_session_id=ctx.session_id,
            title=" ".join(task.split())[:80],
        )
        sub_ctx = dataclasses.replace(
            ctx, session_id=child.id, agent_context=AgentContext.SUBAGENT, memory_attempts=WriteAttempts()
        )
        deps = dataclasses.replace(
            self.agent, sessions=self.agent.sessions.model_copy(update={"max_tool_iterations": steps})
        )
        agent = Agent(deps, child, [], sub_ctx)
        agent.granted = granted
        agent.token_limit = self.settings.max_tokens
        try:
            result = await agent.run(TurnInput(text=task, author_name="(delegated task)"))
        finally:
            await store.end_session(child.id, "delegated")
        log.info(
            "delegated",
            session=ctx.session_id,
            subagent_session=child.id,
            tools=granted.names(),
            requests=result.requests,
            cost_usd=round(result.cost_usd, 6),
            failed=result.failed,
        )
        if result.failed:
            return ToolResult(f"The sub-agent could not finish: {result.reply}", is_error=True)
        if self.hook is not None:
            self.hook.on_delegation(task, result.reply, ctx.for_providers(self.home))
        return ToolResult(result.reply)
