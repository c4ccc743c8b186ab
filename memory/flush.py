"""Memory flush and memory review: what the background memory pass asks, and about which rows.

Both give the model one chance to save what is worth keeping, with the ``memory`` tool
only and add-only rights (``AgentContext.FLUSH`` / ``REVIEW``):

* a **flush** runs before every compression (the older turns are about to become a
  summary) and when a session ends with at least ``flush_min_user_turns`` user turns;
* a **review** (the nudge) runs every ``nudge_interval`` user turns without a memory
  write and looks at the recent turns only.

The system we are modelled on appended the flush instruction to the live conversation:
it blocked the reply, broke the prompt cache, overwrote newer memory with the stale view
in the frozen system prompt, and ran again on every restart. Here the pass is a separate
request built by ``memory_pass_prompt`` from a transcript of the stored rows and the
memory files *as they are when the job runs*; nothing of it — instruction, calls,
results — is ever written to the conversation. This module only builds text and picks
rows; the job that sends it lives in ``gateway/housekeeping.py``.

The job sends it **after the conversation itself** (``memory_pass_instruction``): the
request repeats the conversation's cached prefix — tools, frozen system prompt, stored
messages — and appends the instruction with the memory as it is now, so the pass reads
the conversation from the prompt cache instead of paying for a transcript of it.
``memory_pass_prompt`` (a stand-alone transcript) remains for callers without a cached
conversation.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import TypeVar

from mnemo.memory.compressor import Row, is_summary, transcript

R = TypeVar("R", bound=Row)  # review_window keeps its rows' type


class MemoryPass(StrEnum):
    COMPRESSION = "compression"
    SESSION_END = "session_end"
    REVIEW = "review"


MEMORY_PASS_SYSTEM = (
    "You keep the long-term memory of a chat assistant. You read a conversation and decide "
    "whether anything in it deserves to be remembered in later conversations. You can only add "
    "entries, with the memory tool; you never talk to the user."
)

_INSTRUCTIONS: dict[MemoryPass, str] = {
    MemoryPass.COMPRESSION: (
        "[System: The session is being compressed: its older turns are about to be replaced by a "
        "short summary. Save anything worth remembering — prioritize user preferences, corrections, "
        "and recurring patterns over task-specific details.]"
    ),
    MemoryPass.SESSION_END: (
        "[System: The session has ended. Save anything worth remembering from it — prioritize user "
        "preferences, corrections, and recurring patterns over task-specific details.]"
    ),
    MemoryPass.REVIEW: (
        "[System: Review the recent turns of this conversation below and save what is worth "
        "remembering across sessions — prioritize user preferences, corrections, and recurring "
        "patterns over task-specific details.]"
    ),
}

_RULES = (
    "How to save: call the memory tool with action 'add' — target 'user' for facts about the person "
    "in this conversation, target 'memory' for your own notes shared with every user (environment "
    "facts, conventions; never one person's details). Write short declarative facts (\"User prefers "
    'concise answers"). Only add what the current memory below does not already say; replace and '
    "remove are not available here. Do not save task progress, outcomes, TODO state or raw dumps — "
    'past conversations can be searched. If nothing is worth saving, answer "Nothing to save." '
    "without calling the tool."
)


def instruction(kind: MemoryPass) -> str:
    return _INSTRUCTIONS[kind]


def memory_pass_prompt(
    kind: MemoryPass,
    rows: Sequence[Row],
    *,
    memory_block: str,
    user_block: str | None,
    max_chars: int = 200_000,
) -> str:
    """The one user-role message of a flush or review request.

    ``memory_block`` / ``user_block`` are the rendered files read when the job runs
    (``user_block`` None: no profile can be written in this session, e.g. a shared
    room). Summary rows of earlier compressions are left out: they were flushed when
    they were made. The transcript keeps its newest part when it is too long.
    """
    turns = transcript([r for r in rows if not is_summary(r)], message_chars=2000, tool_chars=300)
    if len(turns) > max_chars:
        turns = "[…older turns left out…]\n" + turns[-max_chars:]
    current = [memory_block.strip() or "(the shared notes, MEMORY.md, are empty)"]
    if user_block is not None:
        current.append(user_block.strip() or "(this user's profile is empty)")
    else:
        current.append("(no user profile can be written in this conversation)")
    return "\n\n".join(
        [
            instruction(kind),
            _RULES,
            "CURRENT MEMORY (read just now):\n" + "\n\n".join(current),
            "CONVERSATION:\n" + (turns or "(no messages)"),
        ]
    )


BACKGROUND_TAG = "[Background task — not a message from the user; the user does not see your answer.]"


def memory_pass_instruction(
    kind: MemoryPass,
    *,
    memory_block: str,
    user_block: str | None,
    recent_user_turns: int | None = None,
) -> str:
    """The instruction appended after the conversation (the request's cached prefix).

    ``recent_user_turns``: a review looks at the last N user turns only (None: the whole
    conversation above). The memory blocks are read when the job runs: the frozen system
    prompt above may be older."""
    current = [memory_block.strip() or "(the shared notes, MEMORY.md, are empty)"]
    if user_block is not None:
        current.append(user_block.strip() or "(this user's profile is empty)")
    else:
        current.append("(no user profile can be written in this conversation)")
    scope = (
        f"Look at the last {recent_user_turns} user turns of the conversation above."
        if recent_user_turns
        else "Look at the whole conversation above."
    )
    return "\n\n".join(
        [
            BACKGROUND_TAG,
            instruction(kind).replace("below", "above"),
            scope,
            _RULES + " Use no tool other than memory.",
            "CURRENT MEMORY (read just now; it may be newer than the system prompt):\n"
            + "\n\n".join(current),
        ]
    )


def user_turns(rows: Sequence[Row]) -> int:
    """User messages, not counting compression summaries (stored with the user role)."""
    return sum(1 for r in rows if r.role == "user" and not is_summary(r))


def review_window(rows: Sequence[R], max_user_turns: int) -> list[R]:
    """The turns a review looks at: everything since the last memory write, at most the
    last ``max_user_turns`` user turns (a review is about what is recent)."""
    start = 0
    for i, row in enumerate(rows):
        if row.role == "tool" and row.meta.get("memory_write"):
            start = i + 1
    seen = 0
    for i in range(len(rows) - 1, start - 1, -1):
        if rows[i].role == "user" and not is_summary(rows[i]):
            seen += 1
            if seen == max_user_turns:
                start = i
                break
    return list(rows[start:])
