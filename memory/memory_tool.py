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

Every write is journaled with its provenance (``memory/journal.py``): the actor (the
model, or the CLI, the dashboard, an MCP client calling this same path), the speaker,
session, message and tool call, and a trust label — ``stated`` only when the model says
the person said it (``stated: true``) in a conversation; a background pass only ever
infers. The memory policy (``memory/policy.py``) is applied here, where the write
happens: ``remember: off`` refuses, ``remember: ask`` turns the write into a proposal the
person confirms. In a group, a person's private profile never comes back in a result
(no entry list, no match previews). The ``history`` action reads past values of the
speaker's profile or the shared memory, with since/until, from the journal.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import structlog

from mnemo.memory.curated import Action, Target, WriteResult
from mnemo.memory.errors import InvalidIdentifier, StoreError
from mnemo.memory.journal import (
    Actor,
    JournalRepository,
    Layer,
    NewEntry,
    ProposalRepository,
    Provenance,
    Trust,
    effective_trust,
)
from mnemo.memory.memory_history import HISTORY_ACTION, past_values
from mnemo.memory.policy import EffectivePolicy, Groups, Remember
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
        "After a successful write, do not repeat it. Set 'stated' to true when the person said it "
        "themselves or asked you to remember it; leave it out when you concluded it.\n"
        "'history' (no content) lists past and current values with since/until: use it for "
        "'what did I use to prefer' or 'since when'."
    ),
    "input_schema": {
        "type": "object",
        "properties": {
            "action": {
                "type": "string",
                "enum": ["add", "replace", "remove", HISTORY_ACTION],
                "description": "What to do.",
            },
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
            "stated": {
                "type": "boolean",
                "description": "true: the person said this themselves (or asked you to remember it).",
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
    """Who is speaking in this turn and why the agent runs; decides what may be written,
    and the provenance every write is journaled with."""

    speaker: UserRef | None
    agent_context: AgentContext
    is_admin: bool
    shared_write: Literal["admins", "all"] = "admins"
    # Who calls: the model in a turn, or a person's tool on the same path ("cli",
    # "admin" for the dashboard, "mcp" for an MCP client) — their writes are ``admin``.
    actor: str = Actor.MODEL
    policy: EffectivePolicy = field(default_factory=EffectivePolicy.default)
    is_group: bool = False  # a group chat: a private profile never comes back in a result
    session: str | None = None
    message: str | None = None  # the platform message the turn answers
    chat: str | None = None  # the conversation (session key)
    tool_call: str | None = None

    @property
    def background(self) -> bool:
        return self.agent_context is not AgentContext.PRIMARY

    def provenance(self, stated: bool) -> Provenance:
        if self.actor == Actor.MODEL:
            trust = effective_trust(Trust.STATED if stated else Trust.INFERRED, background=self.background)
            actor = Actor.MODEL if not self.background else Actor.job(self.agent_context.value)
        else:
            trust, actor = Trust.ADMIN, self.actor
        return Provenance(
            actor,
            trust,
            speaker=None if self.speaker is None else str(self.speaker),
            session=self.session,
            message=self.message,
            chat=self.chat,
            tool_call=self.tool_call,
        )

    @property
    def private_profile(self) -> bool:
        """In a group, the speaker's profile is theirs alone (``groups: private``)."""
        return self.is_group and self.policy.groups is Groups.PRIVATE


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
    # The write's provenance (mirrors journal theirs with it); not part of what was written.
    by: Provenance | None = field(default=None, compare=False)


OnWrite = Callable[[MemoryWrite], Awaitable[None] | None]


@dataclass(frozen=True)
class _Call:
    action: Action
    target: Target
    content: str | None
    old_text: str | None
    stated: bool = False


@dataclass(frozen=True)
class _History:
    target: Target


_STOP_MESSAGE = (
    "Stop retrying: {n} memory writes failed in this turn. Do not call the memory tool again in this turn; "
    "carry on with the user's request."
)


def _parse(args: Mapping[str, Any]) -> _Call | _History | str:
    """The call, or the reason it is malformed."""
    if not isinstance(args, Mapping):
        return "The arguments must be an object with 'action' and 'target'."
    action, target = args.get("action"), args.get("target")
    if action not in {a.value for a in Action} and action != HISTORY_ACTION:
        return f"Unknown action {action!r}: use 'add', 'replace', 'remove' or 'history'."
    if target not in {t.value for t in Target}:
        return (
            f"Unknown target {target!r}: use 'memory' (your shared notes) or 'user' (the speaker's profile)."
        )
    if action == HISTORY_ACTION:
        return _History(Target(target))
    stated = args.get("stated", False)
    if not isinstance(stated, bool):
        return "'stated' must be true or false."
    fields: dict[str, str | None] = {}
    for name in ("content", "old_text"):
        value = args.get(name)
        if value is not None and not isinstance(value, str):
            return f"'{name}' must be a string."
        fields[name] = value
    call = _Call(Action(action), Target(target), fields["content"], fields["old_text"], stated)
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


def policy_stop(ctx: MemoryCallContext) -> str | None:
    """Why the memory policy stores nothing from this call (None: it may write, or ask)."""
    if ctx.policy.chat_remember is Remember.OFF:
        return "Nothing is remembered from this chat (its memory policy is remember: off). Nothing was saved."
    if ctx.policy.person_remember is Remember.OFF:
        return (
            "This person asked me not to remember anything (memory policy remember: off). Nothing was saved."
        )
    if ctx.policy.person_remember is Remember.ASK and ctx.background:
        return "This person confirms every memory, and nobody is here to confirm it. Nothing was saved."
    return None


def execute(
    file: CuratedDocument, action: Action, content: str, old_text: str, by: Provenance
) -> WriteResult:
    """One write on ``file`` with its provenance (the tool, undo, a confirmed proposal)."""
    if action is Action.ADD:
        return file.add(content, by)
    if action is Action.REPLACE:
        return file.replace(old_text, content, by)
    return file.remove(old_text, by)


def _execute(file: CuratedDocument, call: _Call, by: Provenance) -> WriteResult:
    return execute(file, call.action, call.content or "", call.old_text or "", by)


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
    journal: JournalRepository | None = None,
    proposals: ProposalRepository | None = None,
) -> dict[str, Any]:
    """Run one ``memory`` tool call and return its JSON result. Never raises for bad
    input. ``journal`` answers the ``history`` action; ``proposals`` takes the writes a
    person confirms first (``remember: ask``; without it such a write is refused)."""
    if attempts.exhausted:
        return {"success": False, "stop": True, "message": _STOP_MESSAGE.format(n=attempts.failures)}
    call = _parse(args)
    if isinstance(call, str):
        return _fail(attempts, call)
    if isinstance(call, _History):
        return await past_values(files, journal, call.target, ctx.speaker, private=ctx.private_profile)
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
    stop = policy_stop(ctx)
    if stop is not None:
        log.info("memory.policy_refused", action=str(call.action), target=str(call.target))
        return _fail(attempts, stop)
    by = ctx.provenance(call.stated)
    if ctx.policy.person_remember is Remember.ASK:
        return await _propose(file, call, by, proposals)
    result = await asyncio.to_thread(_execute, file, call, by)
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
        write = MemoryWrite(call.action, call.target, owner, result.entry, result.old_entry, by)
        await _notify(on_write, write)
    out = _maybe_stop(attempts, result.to_dict())
    if call.target is Target.USER and ctx.private_profile:
        # A group sees this result: the profile's other entries stay private.
        for key in ("entries", "matches", "replaced", "removed"):
            out.pop(key, None)
    return out


async def _propose(
    file: CuratedDocument, call: _Call, by: Provenance, proposals: ProposalRepository | None
) -> dict[str, Any]:
    """``remember: ask``: nothing is written; the person is asked to confirm."""
    if proposals is None:
        return {"success": False, "message": "This person confirms every memory, which is not possible here."}
    entry = NewEntry(
        Layer.CURATED,
        file.owner,
        str(call.action),
        call.old_text,
        call.content,
        Provenance(by.actor, Trust.PROPOSED, by.speaker, by.session, by.message, by.chat, by.tool_call),
    )
    try:
        proposal = await proposals.propose(entry)
    except StoreError as e:
        return {"success": False, "message": f"The proposal could not be recorded ({e}). Nothing was saved."}
    log.info("memory.proposed", action=str(call.action), target=str(call.target), proposal=proposal)
    return {
        "success": True,
        "changed": False,
        "proposed": True,
        "proposal": proposal,
        "message": "Not saved yet: this person confirms every memory. They are asked under your reply "
        f"(/memory confirm {proposal}); nothing is stored until they do. Do not repeat the call.",
    }


async def _notify(on_write: OnWrite, write: MemoryWrite) -> None:
    # The write is already on disk and the model must see its result: a failing mirror
    # is logged, never turned into a failed tool call.
    try:
        pending = on_write(write)
        if inspect.isawaitable(pending):
            await pending
    except Exception:
        log.exception("memory.on_write_failed", action=str(write.action), target=str(write.target))
