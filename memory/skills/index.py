"""The skills index for the frozen system prompt: names and descriptions only.

Bodies never go into the system prompt (progressive disclosure): the model reads one
with ``skill_view`` when a task matches. The index is bounded; when it is cut, a note
says how many were left out and that ``skills_list`` shows them all.

A skill whose front matter names MCP tools (``mcp_tools``) that the session does not
offer is marked unavailable, with the missing tools named: the model should not start
a workflow it has no tools for.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from mnemo.memory.skills.store import Skill

SKILLS_GUIDANCE = (
    "Skills are your procedural memory: how-to documents for tasks you have done before. "
    "Before a task that one of them covers, read it with `skill_view` (name, then any "
    "file it points to). After a task that took five or more tool calls, a tricky error "
    "you overcame, or a workflow the user asks you to keep, save the steps with "
    "`skill_manage` (action=create, or patch an existing one). Do not save one-off "
    "answers, facts about the user (that is the `memory` tool) or secrets."
)


def availability(skill: Skill, tools: Collection[str]) -> str:
    """ "" when the skill's MCP tools are all in ``tools``, else why it is unavailable."""
    missing = [t for t in skill.meta.mcp_tools if t not in tools]
    return f" (unavailable: needs {', '.join(missing)}, not set up for this person)" if missing else ""


def render_index(skills: Sequence[Skill], max_chars: int = 3000, tools: Collection[str] = ()) -> str:
    """The ``## Skills`` section; "" when there are none (the ``skill_manage`` tool's
    description carries the guidance on when to write one). ``tools``: the MCP tools the
    session offers."""
    head = "## Skills\n" + SKILLS_GUIDANCE
    if not skills:
        return ""
    lines: list[str] = []
    used = len(head) + 1
    for i, skill in enumerate(skills):
        category = f" [{skill.meta.category}]" if skill.meta.category else ""
        line = f"- {skill.name}{category}: {skill.meta.description}{availability(skill, tools)}"
        if used + len(line) + 1 > max_chars - 80:
            lines.append(
                f"(index cut: {len(skills) - i} more skills not shown; `skills_list` lists them all)"
            )
            break
        lines.append(line)
        used += len(line) + 1
    return head + "\n" + "\n".join(lines)
