"""What the model reads on one request, assembled in this one module.

A request is, in cache-prefix order:

1. **tools** — the registry's schemas for the turn's agent context, stable and ordered
   (``ToolRegistry.schemas``);
2. **system** — the session's frozen system prompt, rendered once when the session
   started (``SessionResolver.system_prompt`` → ``prompt.render_system_prompt``) and
   sent byte for byte;
3. **messages** — the stored history as a valid Messages API conversation
   (``history.to_api_messages``), and appended to its newest user turn the per-turn
   notes: fenced recall from the memory providers and, in a shared room, the current
   speaker's profile (``turn_notes``). Notes are never stored and never reach the
   system prompt, so the cached prefix stays intact and one member's profile never
   reaches a request made for another.

The LLM client adds the ``cache_control`` breakpoints ("system_and_3",
``llm.client.apply_cache_breakpoints``) as the last step before sending.

**Background requests share the prefix.** A flush, review or compression summary of a
session (``gateway/jobs/housekeeping.py``) sends the very same tools, system prompt and
messages as the conversation's requests — built here by ``model_input`` from the same
rows — and only appends its instruction after them (``with_instruction``). The bytes up
to the conversation's cached breakpoint are therefore identical and are read from the
cache instead of being paid for again; the instruction, and anything the background
pass needs to know (the memory files as they are now), comes after the prefix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mnemo.gateway.media import MediaStore
from mnemo.gateway.turns.history import to_api_messages
from mnemo.memory.compressor import Row
from mnemo.memory.fence import fence


@dataclass(frozen=True, slots=True)
class ModelInput:
    system: str
    messages: list[dict[str, Any]]
    tools: Sequence[Mapping[str, Any]] = ()


def turn_notes(
    *, recall: str | None = None, speaker_profile: str | None = None, speaker_label: str = ""
) -> str:
    """The per-turn notes: provider recall (already fenced by the memory manager) and a
    shared room's speaker profile (fenced here)."""
    parts = []
    if recall:
        parts.append(recall)
    if speaker_profile:
        parts.append(fence(f"Profile of the current speaker ({speaker_label}):\n{speaker_profile}"))
    return "\n\n".join(p for p in parts if p)


def with_notes(messages: list[dict[str, Any]], notes: str) -> list[dict[str, Any]]:
    """``notes`` in front of the newest user turn's text (a tool-result turn gets them as
    a last text block); the stored history is not touched."""
    if not notes or not messages or messages[-1]["role"] != "user":
        return messages
    last = messages[-1]
    if isinstance(last["content"], str):
        last["content"] = f"{notes}\n\n{last['content']}"
    else:
        last["content"] = [*last["content"], {"type": "text", "text": notes}]
    return messages


def with_instruction(request: ModelInput, instruction: str) -> ModelInput:
    """``request`` with ``instruction`` after its last message: as a new user message
    after an assistant reply, or as a last text block of a trailing user turn (the
    roles must alternate). Nothing before it changes, so the cached prefix still hits."""
    messages = [dict(m) for m in request.messages]
    if messages and messages[-1]["role"] == "user":
        last = messages[-1]
        content = last["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
        last["content"] = [*blocks, {"type": "text", "text": instruction}]
    else:
        messages.append({"role": "user", "content": instruction})
    return ModelInput(request.system, messages, request.tools)


def model_input(
    system: str,
    rows: Sequence[Row],
    *,
    notes: str = "",
    tools: Sequence[Mapping[str, Any]] = (),
    label_authors: bool = False,
    media: MediaStore | None = None,
) -> ModelInput:
    """The whole request body but the breakpoints: to debug a prompt, start here.

    With ``media``, a user message's stored images and PDFs go in as content blocks
    before its text — for the last ``media.history_images`` such turns only; older ones
    get a one-line placeholder, so a long chat's prompt (and cached prefix) stays bounded."""
    blocks = None
    if media is not None:
        with_media = [id(r) for r in rows if r.role == "user" and r.meta.get("media")]
        shown = set(with_media[-max(1, media.history_images) :])

        def blocks(row: Row) -> list[dict[str, Any]]:
            return media.blocks(list(row.meta.get("media") or []), show=id(row) in shown)

    messages = to_api_messages(rows, label_authors=label_authors, media=blocks)
    return ModelInput(system, with_notes(messages, notes), tools)
