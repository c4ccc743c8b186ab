"""The ``memory`` tool: the model's only way to write the curated files.

Who may write what is decided here, in one table (``_ALLOWED``) plus two rules:

* ``target="user"`` always means the *current speaker's* USER.md. The model never names
  a user: whose file is written comes from the turn's context, so a message from user A
  can never make the bot write user B's profile.
* the shared MEMORY.md reaches every user's prompt, so by default only admins write it
  (``memory.shared_write: admins``; ``all`` opens it).

================  ======================  ====================
agent_context     user (speaker's USER)   memory (shared)
================  ======================  ====================
primary           add, replace, remove    add, replace, remove
review, flush     add                     add
cron, subagent    refused                 add
================  ======================  ====================

Background and machine-paced runs may only add: a replace or remove there would act on a
view of memory no person is looking at. Refusals, bad arguments and store refusals are
all returned as error results (``success: false`` and a reason), never raised, because
the model must read them. After ``MAX_FAILED_WRITES`` failures in one turn every further
call answers with a terminal "stop retrying" error (models otherwise loop on a full file).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import structlog

from mnemo.memory.curated import Action, Target, WriteResult
from mnemo.memory.errors import InvalidIdentifier
from mnemo.memory.ports import CuratedDocument, CuratedRepository
from mnemo.memory.scope import AgentContext, UserRef

log = structlog.get_logger(__name__)

MAX_FAILED_WRITES = 3

MEMORY_TOOL_SCHEMA: dict[str, Any] = {
    "name": "memory",
    "description": (
        "Save durable facts to your persistent memory. It is small and bounded, survives across "
        "sessions, and is shown in your system prompt at the start of every later session (not "
        "this one: the result of this call confirms the write).\n"
        "WHEN TO SAVE (do it on your own, without being asked):\n"
        "- the user corrects you, or says 'remember this' / 'don't do that again';\n"
        "- the user states a preference, habit or personal detail worth knowing next time;\n"
        "- you learn a stable fact about the environment, a convention, or a tool's quirk.\n"
        "PRIORITY when space is short: user preferences and corrections > environment facts > "
        "procedures.\n"
        "Write declarative facts ('User prefers concise answers'), not instructions to yourself.\n"
        "DO NOT SAVE task progress, session outcomes, TODO state, temporary details or raw dumps "
        "(logs, code, transcripts): past conversations can be searched with session_search.\n"
        "TWO TARGETS:\n"
        "- 'user': who the person you are talking to is: name, role, preferences, communication "
        "style, pet peeves. It is always the current speaker's own profile.\n"
        "- 'memory': your own notes, shared with every user: environment facts, conventions, tool "
        "quirks. Never put one user's personal details here. Writing it may be limited to admins.\n"
        "ACTIONS: 'add' (content); 'replace' (old_text: a short part that identifies exactly one "
        "entry; content: the whole new entry); 'remove' (old_text). When a file is full, "
        "consolidate: replace several entries with one shorter entry, or remove outdated ones. "
        "After a successful write, do not repeat it."
    ),
    "input_schema": {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ["add", "replace", "remove"], "description": "What to do."},
            "target": {
                "type": "string",
                "enum": ["memory", "user"],
                "description": "'user': the current speaker's profile; 'memory': your shared notes.",
            },
            "content": {
                "type": "string",
                "description": "The entry to add, or the whole new entry for replace.",
            },
            "old_text": {
                "type": "string",
                "description": "For replace/remove: a short substring that identifies exactly one existing entry.",
            },
        },
        "required": ["action", "target"],
        "additionalProperties": False,
    },
}

_EVERYTHING = frozenset(Action)
_ADD_ONLY = frozenset({Action.ADD})
_NOTHING: frozenset[Action] = frozenset()

# The policy table (mirrored in the module docstring and the README).
_ALLOWED: dict[AgentContext, dict[Target, frozenset[Action]]] = {
    AgentContext.PRIMARY: {Target.USER: _EVERYTHING, Target.MEMORY: _EVERYTHING},
    AgentContext.REVIEW: {Target.USER: _ADD_ONLY, Target.MEMORY: _ADD_ONLY},
    AgentContext.FLUSH: {Target.USER: _ADD_ONLY, Target.MEMORY: _ADD_ONLY},
    AgentContext.CRON: {Target.USER: _NOTHING, Target.MEMORY: _ADD_ONLY},
    AgentContext.SUBAGENT: {Target.USER: _NOTHING, Target.MEMORY: _ADD_ONLY},
}


@dataclass(frozen=True)
class MemoryCallContext:
    """Who is speaking in this turn and why the agent runs; decides what may be written."""

    speaker: UserRef | None
    agent_context: AgentContext
    is_admin: bool
    shared_write: Literal["admins", "all"] = "admins"


class WriteAttempts:
    """Failed memory writes in one turn; create one per turn."""

    def __init__(self, limit: int = MAX_FAILED_WRITES) -> None:
        self.limit = limit
        self.failures = 0

    @property
    def exhausted(self) -> bool:
        return self.failures >= self.limit

    def record(self, success: bool) -> None:
        if not success:
            self.failures += 1


@dataclass(frozen=True)
class MemoryWrite:
    """A write that changed a file, for mirrors (memory providers).

    ``content`` is the entry as stored (None for remove); ``old_text`` is the *whole*
    entry that was replaced or removed (not the model's substring), so a mirror can find
    exactly what to update or delete.
    """

    action: Action
    target: Target
    owner: UserRef | None  # whose USER.md; None for the shared MEMORY.md
    content: str | None
    old_text: str | None


OnWrite = Callable[[MemoryWrite], Awaitable[None] | None]


@dataclass(frozen=True)
class _Call:
    action: Action
    target: Target
    content: str | None
    old_text: str | None


_STOP_MESSAGE = (
    "Stop retrying: {n} memory writes failed in this turn. Do not call the memory tool again in this turn; "
    "carry on with the user's request."
)


def _parse(args: Mapping[str, Any]) -> _Call | str:
    """The call, or the reason it is malformed."""
    if not isinstance(args, Mapping):
        return "The arguments must be an object with 'action' and 'target'."
    action, target = args.get("action"), args.get("target")
    if action not in {a.value for a in Action}:
        return f"Unknown action {action!r}: use 'add', 'replace' or 'remove'."
    if target not in {t.value for t in Target}:
        return (
            f"Unknown target {target!r}: use 'memory' (your shared notes) or 'user' (the speaker's profile)."
        )
    fields: dict[str, str | None] = {}
    for name in ("content", "old_text"):
        value = args.get(name)
        if value is not None and not isinstance(value, str):
            return f"'{name}' must be a string."
        fields[name] = value
    call = _Call(Action(action), Target(target), fields["content"], fields["old_text"])
    if call.action in (Action.ADD, Action.REPLACE) and call.content is None:
        return f"'{call.action}' needs 'content'."
    if call.action in (Action.REPLACE, Action.REMOVE) and call.old_text is None:
        return f"'{call.action}' needs 'old_text' (a short part of the entry to {call.action})."
    return call


def policy_refusal(action: Action, target: Target, ctx: MemoryCallContext) -> str | None:
    """Why ``ctx`` may not do ``action`` on ``target``, or None if it may."""
    allowed = _ALLOWED[ctx.agent_context][target]
    if not allowed:
        return f"A {ctx.agent_context} run cannot write the user's profile: it is read-only outside a conversation."
    if action not in allowed:
        return f"In a {ctx.agent_context} run memory is add-only: '{action}' is refused."
    if target is Target.USER and ctx.speaker is None:
        return "There is no current speaker in this context, so there is no user profile to write."
    if target is Target.MEMORY and ctx.shared_write == "admins" and not ctx.is_admin:
        return (
            "Only admins can write the shared memory (it reaches every user). "
            "Save facts about the person you are talking to with target 'user'."
        )
    return None


def _execute(file: CuratedDocument, call: _Call) -> WriteResult:
    if call.action is Action.ADD:
        return file.add(call.content or "")
    if call.action is Action.REPLACE:
        return file.replace(call.old_text or "", call.content or "")
    return file.remove(call.old_text or "")


def _usage(file: CuratedDocument) -> dict[str, Any]:
    snap = file.load()
    return {"target": str(file.target), "chars": snap.chars, "limit": snap.limit, "pct": snap.pct}


def _fail(attempts: WriteAttempts, message: str, usage: Mapping[str, Any] | None = None) -> dict[str, Any]:
    attempts.record(False)
    return _maybe_stop(attempts, {"success": False, **(usage or {}), "message": message})


def _maybe_stop(attempts: WriteAttempts, out: dict[str, Any]) -> dict[str, Any]:
    if not out["success"] and attempts.exhausted:
        out["message"] = f"{out['message']} {_STOP_MESSAGE.format(n=attempts.failures)}"
        out["stop"] = True
    return out


async def run_memory_tool(
    files: CuratedRepository,
    args: Mapping[str, Any],
    ctx: MemoryCallContext,
    attempts: WriteAttempts,
    on_write: OnWrite | None = None,
) -> dict[str, Any]:
    """Run one ``memory`` tool call and return its JSON result. Never raises for bad input."""
    if attempts.exhausted:
        return {"success": False, "stop": True, "message": _STOP_MESSAGE.format(n=attempts.failures)}
    call = _parse(args)
    if isinstance(call, str):
        return _fail(attempts, call)
    file: CuratedDocument | None = None
    try:
        if call.target is Target.MEMORY:
            file = files.shared()
        elif ctx.speaker is not None:
            file = files.user(ctx.speaker)
    except InvalidIdentifier as e:
        return _fail(attempts, f"The user profile cannot be used: {e}.")
    refusal = policy_refusal(call.action, call.target, ctx)
    if refusal is not None:
        usage = await asyncio.to_thread(_usage, file) if file is not None else None
        log.info(
            "memory.refused", action=str(call.action), target=str(call.target), context=str(ctx.agent_context)
        )
        return _fail(attempts, refusal, usage)
    assert file is not None  # policy_refusal refuses a user write without a speaker
    result = await asyncio.to_thread(_execute, file, call)
    attempts.record(result.success)
    log.info(
        "memory.write",
        action=str(call.action),
        target=str(call.target),
        owner=str(ctx.speaker) if call.target is Target.USER else None,
        success=result.success,
        changed=result.changed,
        chars=result.chars,
    )
    if result.changed and on_write is not None:
        owner = ctx.speaker if call.target is Target.USER else None
        await _notify(on_write, MemoryWrite(call.action, call.target, owner, result.entry, result.old_entry))
    return _maybe_stop(attempts, result.to_dict())


async def _notify(on_write: OnWrite, write: MemoryWrite) -> None:
    # The write is already on disk and the model must see its result: a failing mirror
    # is logged, never turned into a failed tool call.
    try:
        pending = on_write(write)
        if inspect.isawaitable(pending):
            await pending
    except Exception:
        log.exception("memory.on_write_failed", action=str(write.action), target=str(write.target))
