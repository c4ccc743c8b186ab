"""The tool registry: a tool is an Anthropic schema plus an async handler.

Handlers receive the validated arguments and the ``TurnContext`` of the turn that
called them; whatever they need beyond that (stores, the LLM) is bound when the tool is
registered. The registry turns every failure into an error ``tool_result`` the model can
read — unknown tool, bad arguments, a handler exception — so a tool can never end a
turn. Schemas are returned in registration order: tool definitions are part of the
cached prompt prefix, so their bytes must not change between requests.

A turn's tools are a ``ToolSet``: the registered tools its context is offered, then
what each ``ToolSource`` adds for that session and speaker (the ``delegate`` tool for
the people allowed to delegate, then the MCP servers' tools), in the order the sources
were added. A source must answer the same for every turn of a session.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from mnemo.gateway.events import InboundMessage
from mnemo.gateway.logs import get_logger
from mnemo.memory.memory_tool import WriteAttempts
from mnemo.memory.policy import EffectivePolicy
from mnemo.memory.provider import ProviderContext
from mnemo.memory.scope import AgentContext, UserRef

if TYPE_CHECKING:
    from mnemo.memory.sessions import SessionRow

log = get_logger(__name__)

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


@dataclass(frozen=True)
class TurnContext:
    """Who is speaking, where, and in which context — fixed for one turn."""

    session_id: str
    chat_key: str
    platform: str
    chat_id: str
    speaker: UserRef | None
    speaker_name: str
    agent_context: AgentContext
    is_admin: bool
    is_dm: bool
    thread_id: str | None = None
    # Per-turn mutable counter of failed memory writes (3 → "stop retrying").
    memory_attempts: WriteAttempts = field(default_factory=WriteAttempts)
    message_id: str | None = None  # the platform message this turn answers
    tool_call_id: str | None = None  # set for each tool call (journal provenance)
    # The memory policy read when the turn started (``gateway/turns/policy.py``).
    policy: EffectivePolicy = field(default_factory=EffectivePolicy.default)

    def for_providers(self, home: Path) -> ProviderContext:
        """The memory providers' view of this turn (layer 4 never sees gateway types)."""
        return ProviderContext(
            session_id=self.session_id,
            chat_key=self.chat_key,
            platform=self.platform,
            user=self.speaker,
            agent_context=self.agent_context,
            home=home,
            remember=self.policy.stores,
            message_id=self.message_id,
            tool_call_id=self.tool_call_id,
        )


def turn_context(
    msg: InboundMessage,
    *,
    session_id: str,
    chat_key: str,
    is_admin: bool,
    shared_room: bool,
    agent_context: AgentContext | None = None,
    background: bool = False,
) -> TurnContext:
    """The one factory of ``TurnContext``, for turns and for background memory passes.

    A turn always has a speaker (the author of the message: the memory tool's ``user``
    target is *their* USER.md, in a shared room too). A background pass over a shared
    room speaks for nobody, so it gets no speaker and cannot write any member's profile.
    """
    return TurnContext(
        session_id=session_id,
        chat_key=chat_key,
        platform=msg.platform,
        chat_id=msg.chat_id,
        speaker=None if background and shared_room else msg.speaker,
        speaker_name=msg.user_name,
        agent_context=agent_context or msg.agent_context,
        is_admin=is_admin,
        is_dm=msg.is_dm,
        thread_id=msg.thread_id,
        message_id=None if background else msg.message_id,
    )


@dataclass(frozen=True, slots=True)
class ToolResult:
    content: str
    is_error: bool = False
    # True when the call changed curated memory (rebuilds the nudge counter).
    memory_write: bool = False


Handler = Callable[[Mapping[str, Any], TurnContext], Awaitable["str | dict[str, Any] | ToolResult"]]


@dataclass(frozen=True)
class Tool:
    name: str
    schema: Mapping[str, Any]
    handler: Handler
    # Contexts in which the tool is offered; empty means all.
    contexts: frozenset[AgentContext] = frozenset()

    def offered_in(self, ctx: AgentContext) -> bool:
        return not self.contexts or ctx in self.contexts


def _check_args(schema: Mapping[str, Any], args: Any) -> str | None:
    """Shallow JSON-schema check: object, required keys, top-level types and enums."""
    if not isinstance(args, dict):
        return "arguments must be a JSON object"
    input_schema = schema.get("input_schema") or {}
    props: Mapping[str, Any] = input_schema.get("properties") or {}
    missing = [k for k in input_schema.get("required", ()) if k not in args]
    if missing:
        return f"missing required argument(s): {', '.join(missing)}"
    for key, value in args.items():
        spec = props.get(key)
        if spec is None:
            if input_schema.get("additionalProperties") is False:
                return f"unknown argument {key!r} (allowed: {', '.join(props)})"
            continue
        expected = spec.get("type")
        types = _JSON_TYPES.get(expected) if isinstance(expected, str) else None
        if types and (not isinstance(value, types) or (expected != "boolean" and isinstance(value, bool))):
            return f"argument {key!r} must be of type {expected}"
        if "enum" in spec and value not in spec["enum"]:
            return f"argument {key!r} must be one of {', '.join(map(str, spec['enum']))}"
    return None


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    note = f"\n[output truncated: {len(text) - limit:,} of {len(text):,} characters cut]"
    return text[: max(0, limit - len(note))] + note


class ToolSource(Protocol):
    """Tools offered beyond the registered ones, per session and speaker. The agent asks
    before each turn's first request (``ToolRegistry.for_turn``); the answer must be the
    same for every turn of a session (the definitions sit in the cached prefix)."""

    async def tools_for(self, ctx: TurnContext, session: SessionRow) -> Sequence[Tool]: ...


async def _run(
    tool: Tool | None, name: str, args: Any, ctx: TurnContext, known: Sequence[str], limit: int
) -> ToolResult:
    if tool is None or not tool.offered_in(ctx.agent_context):
        return ToolResult(f"Error: unknown tool {name!r}. Available: {', '.join(known)}", is_error=True)
    problem = _check_args(tool.schema, args)
    if problem is not None:
        return ToolResult(f"Error: {problem}", is_error=True)
    try:
        out = await tool.handler(args, ctx)
    except Exception as e:  # loop boundary: a tool never ends the turn
        log.exception("tool_failed", tool=name, session=ctx.session_id)
        return ToolResult(f"Error: tool {name!r} failed: {type(e).__name__}: {e}", is_error=True)
    if isinstance(out, ToolResult):
        return ToolResult(_truncate(out.content, limit), out.is_error, out.memory_write)
    if isinstance(out, dict):
        text = json.dumps(out, ensure_ascii=False)
        failed = out.get("success") is False or "error" in out and out.get("success") is not True
        return ToolResult(_truncate(text, limit), is_error=bool(failed))
    return ToolResult(_truncate(str(out), limit))


@dataclass(frozen=True)
class ToolSet:
    """The tools of one turn, in the order their definitions are sent."""

    tools: tuple[Tool, ...]
    max_output_chars: int = 20_000

    def names(self) -> list[str]:
        return [t.name for t in self.tools]

    def schemas(self) -> list[Mapping[str, Any]]:
        return [t.schema for t in self.tools]

    def get(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    def only(self, names: Sequence[str]) -> ToolSet:
        """These tools, in this set's order."""
        return ToolSet(tuple(t for t in self.tools if t.name in names), self.max_output_chars)

    def replace(self, tool: Tool) -> ToolSet:
        """This set with ``tool`` in place of the tool of the same name."""
        return ToolSet(tuple(tool if t.name == tool.name else t for t in self.tools), self.max_output_chars)

    async def call(self, name: str, args: Any, ctx: TurnContext) -> ToolResult:
        return await _run(self.get(name), name, args, ctx, self.names(), self.max_output_chars)


class ToolRegistry:
    def __init__(self, max_output_chars: int = 20_000) -> None:
        self._tools: dict[str, Tool] = {}
        self._sources: list[ToolSource] = []
        self.max_output_chars = max_output_chars

    def add_source(self, source: ToolSource) -> None:
        self._sources.append(source)

    async def for_turn(self, ctx: TurnContext, session: SessionRow) -> ToolSet:
        """The registered tools ``ctx`` is offered, then each source's (a name already
        taken is skipped: registered tools win)."""
        tools = [t for t in self._tools.values() if t.offered_in(ctx.agent_context)]
        taken = {t.name for t in tools}
        for source in self._sources:
            for tool in await source.tools_for(ctx, session):
                if tool.name not in taken and tool.offered_in(ctx.agent_context):
                    tools.append(tool)
                    taken.add(tool.name)
        return ToolSet(tuple(tools), self.max_output_chars)

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is already registered")
        if tool.schema.get("name") != tool.name:
            raise ValueError(f"tool {tool.name!r}: schema name {tool.schema.get('name')!r} differs")
        self._tools[tool.name] = tool

    def names(self) -> list[str]:
        return list(self._tools)

    def schemas(self, ctx: AgentContext, only: Sequence[str] | None = None) -> list[Mapping[str, Any]]:
        return [
            t.schema for t in self._tools.values() if t.offered_in(ctx) and (only is None or t.name in only)
        ]

    async def call(self, name: str, args: Any, ctx: TurnContext) -> ToolResult:
        """Call a registered tool (background passes; a turn calls its ``ToolSet``)."""
        return await _run(self._tools.get(name), name, args, ctx, self.names(), self.max_output_chars)
