"""The system prompt, rendered once when a session starts and stored on its row.

Everything in it is stable for the session: persona, the MEMORY.md snapshot, in a DM
the speaker's USER.md snapshot (never in a group, per-member sessions included: a
profile shared with groups goes into its person's own turns, ``turn_memory.py``),
platform hints and tool guidance. Nothing per-turn (time, recalled context, notes) ever goes here — that would
change the cached prefix on every request. The renderer is a pure function of its
inputs, so the same inputs give byte-identical prompts.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PERSONA = (
    "You are mnemo, a helpful assistant in a chat app. You remember people across "
    "conversations through your memory tools. Be concise, warm and accurate; answer in "
    "the language the user writes in."
)

MEMORY_GUIDANCE = (
    "## Memory\n"
    "You have persistent memory across sessions. The blocks above are a snapshot taken "
    "when this conversation started; writes you make now are saved at once but appear "
    "here only in a later session.\n"
    "- Save with the `memory` tool: corrections, anything the user asks you to remember, "
    "their preferences, and stable facts about their environment. Priority: user "
    "preferences and corrections > environment facts > procedures.\n"
    '- Write declarative facts ("User prefers concise answers"), not instructions to '
    "yourself. Do not save task progress, session outcomes, TODO lists or raw dumps.\n"
    '- target="user" is the profile of the person you are talking to; target="memory" '
    "is shared by everyone who talks to you, so never put personal details there.\n"
    "- When the user refers to something from an earlier conversation, use "
    "`session_search` before saying you do not remember."
)

PLATFORM_HINTS: dict[str, str] = {
    "telegram": "You are chatting on Telegram. Keep formatting simple: bold, italics, code, short lists; no tables.",
    "discord": "You are chatting on Discord. Markdown works; keep replies under a few paragraphs;"
    " never mention @everyone or roles.",
    "web": "You are chatting in a local web page. Markdown is rendered.",
    "cli": "You are chatting in a terminal. Use plain text and short lines.",
}

GROUP_HINT = (
    "This is a group channel. Several people may write here; each message tells you who "
    "is speaking. Only the current speaker's profile applies to their message."
)
CRON_HINT = (
    "This is a scheduled run: no user is present. Do the task and write the message to "
    "deliver. Reply with exactly [SILENT] if there is nothing worth sending. You may read "
    "memory but not change anyone's profile."
)


@dataclass(frozen=True, slots=True)
class PromptParts:
    persona: str | None
    memory_block: str
    user_block: str | None  # None: no profile in this session's prompt (every group)
    platform: str
    is_group: bool = False
    is_cron: bool = False
    provider_block: str = ""
    # The skills index (names and descriptions only, never bodies); "" leaves it out.
    skills_index: str = ""


def render_system_prompt(parts: PromptParts) -> str:
    sections = [(parts.persona or DEFAULT_PERSONA).strip()]
    if parts.memory_block:
        sections.append(parts.memory_block)
    if parts.user_block:
        sections.append(parts.user_block)
    if parts.provider_block:
        sections.append(parts.provider_block.strip())
    sections.append(MEMORY_GUIDANCE)
    if parts.skills_index:
        sections.append(parts.skills_index)
    hint = PLATFORM_HINTS.get(parts.platform)
    if hint:
        sections.append(hint)
    if parts.is_group:
        sections.append(GROUP_HINT)
    if parts.is_cron:
        sections.append(CRON_HINT)
    return "\n\n".join(sections) + "\n"
