"""The skill review: which turns a background pass looks at, and what it is asked.

After a turn that used at least ``skills.review_min_tool_calls`` tool calls, a job
(``gateway/jobs/skill_review.py``) gives the model one chance to keep what it learned
as a skill, with ``skill_manage`` only and background rights (create or patch that
user's own skills; see ``gateway/turns/skill_tools.write_owner``). Like the memory
review, the request repeats the conversation (its cached prefix) and appends
``review_instruction`` with the skills *as they are when the job runs*; nothing of it
reaches the conversation. ``review_prompt`` (a stand-alone transcript) remains for
callers without a conversation.

A turn is the user's message and every row up to the next user message. Turns are
identified by the id of their last row, which only grows: a job records the last turn
it reviewed (``reviewed_upto``), so a later job — or the same one after a restart —
never reviews it again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mnemo.memory.compressor import clip, is_summary, transcript
from mnemo.memory.sessions import MessageRow
from mnemo.memory.skills.store import Skill

MAX_TURNS = 3  # the newest turns a review looks at
MAX_TRANSCRIPT_CHARS = 24_000
MAX_SKILL_BODY_CHARS = 4_000
MAX_OWN_SKILLS_CHARS = 12_000

SKILL_REVIEW_SYSTEM = (
    "You keep the procedural memory (skills) of a chat assistant: short how-to documents it reads "
    "before a task it has done before. You read one finished piece of work and decide whether its "
    "steps deserve to be kept as a skill. You can only create a new skill or patch one of this "
    "user's own skills, with the skill_manage tool; you never talk to the user."
)

_RULES = (
    "When a skill is worth it: the work took many tool calls, overcame a tricky error, or the user "
    "asked for the workflow to be kept — and it is likely to come up again. Not for one-off answers, "
    "facts about the user (that is the memory tool's job), task progress or secrets.\n"
    "How: call skill_manage with action 'create' (name: lowercase letters, digits and '-'; content: "
    "the whole SKILL.md, starting with front matter '---\\nname: <name>\\ndescription: <one line>\\n"
    "---' and then the steps, the pitfalls and how they were solved), or action 'patch' (name, "
    "old_string copied exactly once from the skill's current text below, new_string) to improve "
    "one of this user's skills. Edit, delete and file actions are not available here, the "
    "read-only skills cannot be changed, and no new skill may take a shared skill's name. If nothing is "
    'worth keeping, answer "Nothing to save." without calling the tool.'
)


@dataclass(frozen=True, slots=True)
class Turn:
    rows: tuple[MessageRow, ...]

    @property
    def last_id(self) -> int:
        return self.rows[-1].id

    @property
    def tool_calls(self) -> int:
        return sum(len(r.tool_calls) for r in self.rows if r.role == "assistant")


def turns(rows: Sequence[MessageRow]) -> list[Turn]:
    """The session's rows cut at every user message (compression summaries left out)."""
    out: list[list[MessageRow]] = []
    for row in rows:
        if is_summary(row):
            continue
        if row.role == "user" or not out:
            out.append([])
        out[-1].append(row)
    return [Turn(tuple(t)) for t in out if t[0].role == "user"]


def turn_ending(rows: Sequence[MessageRow], last_id: int) -> Turn | None:
    """The turn whose rows include ``last_id`` (the reply of a finished turn)."""
    return next((t for t in turns(rows) if any(r.id == last_id for r in t.rows)), None)


def turns_to_review(rows: Sequence[MessageRow], *, after: int, min_tool_calls: int) -> list[Turn]:
    """The turns newer than ``after`` that used at least ``min_tool_calls`` tool calls,
    newest ``MAX_TURNS`` of them, oldest first."""
    due = [t for t in turns(rows) if t.last_id > after and t.tool_calls >= min_tool_calls]
    return due[-MAX_TURNS:]


def _own_block(own: Sequence[tuple[Skill, str]]) -> str:
    if not own:
        return "(this user has no skills of their own yet)"
    parts: list[str] = []
    used = 0
    for skill, text in own:
        block = f"### {skill.name}\n{clip(text, MAX_SKILL_BODY_CHARS)}"
        if used + len(block) > MAX_OWN_SKILLS_CHARS:
            parts.append(f"- {skill.name}: {skill.meta.description} (text not shown)")
            continue
        parts.append(block)
        used += len(block)
    return "\n\n".join(parts)


def review_instruction(
    due: Sequence[Turn],
    *,
    own: Sequence[tuple[Skill, str]],
    read_only: Sequence[Skill],
    tag: str,
) -> str:
    """The skill review asked *after* the conversation itself (its cached prefix, see
    ``gateway/jobs/skill_review.py``): the turns are named, not copied; the skills are
    shown as they are now."""
    first = due[0].rows[0]
    text = " ".join(first.content.split())[:80]
    locked = "\n".join(f"- {s.name}: {s.meta.description}" for s in read_only) or "(none)"
    return "\n\n".join(
        [
            tag,
            f"[System: Review the work of the last {len(due)} user turn(s) of the conversation above "
            f"(from the user message beginning «{text}») and keep its procedure as a skill if it is "
            "worth it. Use no tool other than skill_manage.]",
            _RULES,
            "THIS USER'S OWN SKILLS (current text):\n" + _own_block(own),
            "READ-ONLY SKILLS (shared, or installed by an admin; their names are taken):\n" + locked,
        ]
    )


def review_prompt(
    due: Sequence[Turn], *, own: Sequence[tuple[Skill, str]], read_only: Sequence[Skill]
) -> str:
    """The one user-role message of a skill review: the rules, the user's own skills it
    may patch with their current text, the names of those it may not touch (shared ones,
    and what an admin installed for the user) and the turns' transcript (its newest part
    when it is too long)."""
    work = "\n\n".join(transcript(t.rows, message_chars=3000, tool_chars=600) for t in due)
    if len(work) > MAX_TRANSCRIPT_CHARS:
        work = "[…older part left out…]\n" + work[-MAX_TRANSCRIPT_CHARS:]
    locked = "\n".join(f"- {s.name}: {s.meta.description}" for s in read_only) or "(none)"
    return "\n\n".join(
        [
            "[System: Review the work below and keep its procedure as a skill if it is worth it.]",
            _RULES,
            "THIS USER'S OWN SKILLS (current text):\n" + _own_block(own),
            "READ-ONLY SKILLS (shared, or installed by an admin; their names are taken):\n" + locked,
            "THE WORK:\n" + (work or "(no messages)"),
        ]
    )
