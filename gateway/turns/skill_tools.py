"""The skill tools: ``skills_list``, ``skill_view`` and ``skill_manage``.

Who writes where is decided here, from the turn's context, in :func:`write_owner`:

* a cron run never writes (it reads the job creator's and the shared skills);
* an admin answering in a primary turn writes the shared skills;
* anyone else — and every background pass — writes only the speaker's own skills
  (marked as written in a conversation, unlike what an admin installs for a user);
  a background pass (the skill review, ``gateway/jobs/skill_review.py``) may only
  ``create`` or ``patch``, so it never deletes or rewrites anything, and it cannot reach
  a shared skill at all — not even by creating one of the user's own under a shared
  skill's name, which would hide the shared one from that user.

A skill written mid-session is readable at once with ``skill_view``; the session's
frozen system prompt keeps its index until the next session (the result says so).

Skills are memory: a turn whose memory policy does not let it store (an ephemeral
chat, a person with remember off or ask) writes none, and every write is journaled
with the turn's provenance.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mnemo.gateway.turns.tools import Tool, ToolResult, TurnContext
from mnemo.memory.errors import InvalidIdentifier
from mnemo.memory.journal import Actor, Provenance, Trust
from mnemo.memory.scope import AgentContext, UserRef
from mnemo.memory.skills import SkillRefused, SkillStore, parse_skill

if TYPE_CHECKING:
    from mnemo.gateway.commands import CommandCall

ACTIONS = ("create", "edit", "patch", "write_file", "remove_file", "delete")
BACKGROUND_ACTIONS = frozenset({"create", "patch"})
_FROZEN_NOTE = (
    "It is usable now through skill_view; the skills index in your system prompt shows it "
    "from the next session on."
)

LIST_SCHEMA = {
    "name": "skills_list",
    "description": "List your skills.",
    "input_schema": {
        "type": "object",
        "properties": {
            "category": {"type": "string"},
            "query": {"type": "string"},
        },
        "additionalProperties": False,
    },
}
VIEW_SCHEMA = {
    "name": "skill_view",
    "description": "Read a skill's SKILL.md, or a file in it (file_path, e.g. references/api.md).",
    "input_schema": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "file_path": {"type": "string"},
        },
        "required": ["name"],
        "additionalProperties": False,
    },
}
MANAGE_SCHEMA = {
    "name": "skill_manage",
    "description": (
        "Save a how-to skill: content is a whole SKILL.md (front matter name, description). Worth it after "
        "a task that took 5+ tool calls, a tricky error overcome, or a workflow the user asks to keep; not "
        "for one-off answers, facts about the user (use memory) or secrets."
    ),
    "input_schema": {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": list(ACTIONS)},
            "name": {"type": "string"},
            "content": {"type": "string"},
            "category": {"type": "string"},
            "old_string": {"type": "string"},
            "new_string": {"type": "string"},
            "file_path": {"type": "string"},
            "file_content": {"type": "string"},
        },
        "required": ["action", "name"],
        "additionalProperties": False,
    },
}

_NEEDS: dict[str, tuple[str, ...]] = {
    "create": ("content",),
    "edit": ("content",),
    "patch": ("old_string", "new_string"),
    "write_file": ("file_path", "file_content"),
    "remove_file": ("file_path",),
    "delete": (),
}


def reader(ctx: TurnContext) -> UserRef | None:
    return ctx.speaker


def write_owner(ctx: TurnContext, action: str) -> UserRef | None:
    """Whose skills this turn may change (None: the shared ones); raise if it may not."""
    if ctx.agent_context is AgentContext.CRON:
        raise SkillRefused("read_only: a scheduled run may read skills but never write them")
    if not ctx.policy.stores:
        raise SkillRefused("memory_policy: nothing is remembered from this conversation (its memory policy)")
    if ctx.agent_context is AgentContext.PRIMARY:
        if ctx.is_admin:
            return None
        if ctx.speaker is None:
            raise SkillRefused("no_owner: this conversation has no speaker to own a skill")
        return ctx.speaker
    if action not in BACKGROUND_ACTIONS:
        raise SkillRefused(f"add_only: a background pass may only create or patch skills, not {action}")
    if ctx.speaker is None:
        raise SkillRefused("no_owner: a background pass of a shared room owns no skills")
    return ctx.speaker


def provenance(ctx: TurnContext) -> Provenance:
    primary = ctx.agent_context is AgentContext.PRIMARY
    return Provenance(
        Actor.MODEL if primary else Actor.job(ctx.agent_context.value),
        Trust.INFERRED,
        speaker=None if ctx.speaker is None else str(ctx.speaker),
        session=ctx.session_id,
        message=ctx.message_id,
        chat=ctx.chat_key,
        tool_call=ctx.tool_call_id,
    )


def skill_tools(store: SkillStore) -> list[Tool]:
    async def list_skills(args: Mapping[str, Any], ctx: TurnContext) -> dict[str, Any]:
        skills = await asyncio.to_thread(store.visible, reader(ctx), ctx.platform)
        query = str(args.get("query") or "").lower().split()
        rows = [
            {"name": s.name, "description": s.meta.description, "category": s.meta.category, "scope": s.scope}
            for s in skills
            if (args.get("category") is None or s.meta.category == args["category"])
            and all(w in f"{s.name} {s.meta.description}".lower() for w in query)
        ]
        return {"success": True, "skills": rows, "count": len(rows)}

    async def view(args: Mapping[str, Any], ctx: TurnContext) -> dict[str, Any]:
        def read() -> dict[str, Any]:
            skill = store.find(args["name"], reader(ctx))
            if skill is None:
                return {"success": False, "error": f"no skill named {args['name']!r}"}
            text = store.read(skill, args.get("file_path"))
            return {
                "success": True,
                "name": skill.name,
                "scope": skill.scope,
                "file": args.get("file_path") or "SKILL.md",
                "content": text,
                "files": store.files(skill),
            }

        try:
            return await asyncio.to_thread(read)
        except SkillRefused as e:
            return {"success": False, "error": e.reason}

    async def manage(args: Mapping[str, Any], ctx: TurnContext) -> ToolResult | dict[str, Any]:
        action, name = args["action"], args["name"]
        missing = [k for k in _NEEDS[action] if not isinstance(args.get(k), str)]
        if missing:
            return {"success": False, "error": f"{action} needs {', '.join(missing)}"}

        def run() -> str:
            owner = write_owner(ctx, action)
            by = provenance(ctx)
            background = ctx.agent_context is not AgentContext.PRIMARY
            if background and action == "create" and any(s.name == name for s in store.shared()):
                raise SkillRefused(
                    f"add_only: {name!r} is a shared skill; a background pass never replaces or shadows it"
                )
            if background and action == "patch" and owner is not None:
                mine = next((s for s in store.own(owner) if s.name == name), None)
                if mine is not None and not store.written_in_conversation(mine):
                    raise SkillRefused(
                        f"add_only: {name!r} was written by an admin; a background pass never changes it"
                    )
            if action == "create":
                declared = parse_skill(args["content"]).name
                if declared != name:
                    raise SkillRefused(
                        f"invalid_name: name {name!r} differs from the front matter name {declared!r}"
                    )
                written_by = (
                    None
                    if owner is None
                    else ("user" if ctx.agent_context is AgentContext.PRIMARY else "review")
                )
                store.create(args["content"], owner, args.get("category"), written_by=written_by, by=by)
            elif action == "edit":
                store.edit(name, args["content"], owner, by)
            elif action == "patch":
                store.patch(name, args["old_string"], args["new_string"], owner, by)
            elif action == "write_file":
                store.write_file(name, args["file_path"], args["file_content"], owner, by)
            elif action == "remove_file":
                store.remove_file(name, args["file_path"], owner, by)
            else:
                store.delete(name, owner, by)
                return f"Deleted skill {name!r} (its last version is kept in history)."
            where = "the shared skills" if owner is None else "your own skills (only you see them)"
            return f"Saved skill {name!r} ({action}) in {where}. {_FROZEN_NOTE}"

        try:
            return {"success": True, "message": await asyncio.to_thread(run)}
        except SkillRefused as e:
            return {"success": False, "error": e.reason}

    return [
        Tool("skills_list", LIST_SCHEMA, list_skills),
        Tool("skill_view", VIEW_SCHEMA, view),
        Tool(
            "skill_manage",
            MANAGE_SCHEMA,
            manage,
            contexts=frozenset({AgentContext.PRIMARY, AgentContext.REVIEW, AgentContext.CRON}),
        ),
    ]


SKILLS_USAGE = "Usage: /skills — list the skills you can use; admins: /skills promote NAME PLATFORM:ID"


class SkillsCommand:
    """The handler of ``/skills`` (added to the command registry by the app): lists the
    skills the speaker sees; an admin may promote a user's skill to the shared ones."""

    def __init__(self, store: SkillStore) -> None:
        self.store = store

    async def __call__(self, call: CommandCall) -> str:
        verb, _, rest = call.args.strip().partition(" ")
        if verb.lower() in ("", "list"):
            skills = await asyncio.to_thread(self.store.visible, call.msg.speaker, call.msg.platform)
            if not skills:
                return "No skills yet.\n" + SKILLS_USAGE
            return "\n".join(f"• {s.name} ({s.scope}): {s.meta.description}" for s in skills)
        if verb.lower() != "promote":
            return SKILLS_USAGE
        if not call.admin:
            return "Only an admin can promote a skill to the shared skills."
        parts = rest.split()
        if len(parts) != 2:
            return SKILLS_USAGE
        try:
            user = UserRef.parse(parts[1])
            by = Provenance(
                Actor.ADMIN, Trust.ADMIN, speaker=str(call.msg.speaker), message=call.msg.message_id
            )
            skill = await asyncio.to_thread(self.store.promote, parts[0], user, by)
        except (SkillRefused, InvalidIdentifier) as e:
            return f"Not promoted: {e}"
        return f"Promoted {skill.name} to the shared skills; everyone sees it from their next session."
