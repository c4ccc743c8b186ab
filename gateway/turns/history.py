"""Stored message rows -> a valid Messages API conversation, and counters rebuilt
from history.

The conversion is deterministic (the same rows always give the same bytes, which is
what keeps the cached prefix hitting) and always valid:

* consecutive user-role rows (tool results, then text) merge into one user message,
  tool_result blocks first, as the API requires;
* a tool_use whose result never got stored (the process died mid-tool) is answered by
  a synthetic error result in place — and ``missing_tool_results`` gives the rows to
  persist once, so the stored history itself becomes valid too;
* a tool_result whose call is not in the preceding assistant message is dropped;
* an assistant row with no text and no calls gets a placeholder text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from mnemo.memory.sessions import MessageRow, NewMessage

INTERRUPTED = "Error: interrupted — the bot restarted before this tool call finished. Do not assume it ran."
EMPTY_ASSISTANT = "(no reply)"


@dataclass(frozen=True, slots=True)
class Counters:
    user_turns: int
    turns_since_memory: int  # user turns since the last memory write, modulo the interval
    raw_since_memory: int  # the same without the modulo


def rebuild_counters(rows: Iterable[MessageRow], nudge_interval: int) -> Counters:
    """``user_turns`` = user messages (a compression summary is not one); turns since the
    last memory write (mod interval)."""
    user_turns = 0
    since = 0
    for row in rows:
        if row.role == "user" and not row.meta.get("compression_summary"):
            user_turns += 1
            since += 1
        elif row.role == "tool" and row.meta.get("memory_write"):
            since = 0
    mod = since % nudge_interval if nudge_interval > 0 else since
    return Counters(user_turns, mod, since)


def missing_tool_results(rows: Sequence[MessageRow]) -> list[NewMessage]:
    """Synthetic error results for every tool_use that was never answered."""
    answered = {r.tool_call_id for r in rows if r.role == "tool"}
    out: list[NewMessage] = []
    for row in rows:
        if row.role != "assistant":
            continue
        for call in row.tool_calls:
            if call.id not in answered:
                out.append(
                    NewMessage(
                        role="tool",
                        content=INTERRUPTED,
                        tool_call_id=call.id,
                        tool_name=call.name,
                        is_error=True,
                    )
                )
    return out


def _user_text(row: MessageRow | NewMessage, label_authors: bool) -> str:
    if label_authors and row.author_name:
        return f"[{row.author_name}] {row.content}"
    return row.content


def to_api_messages(
    rows: Sequence[MessageRow | NewMessage],
    *,
    label_authors: bool = False,
    media: Callable[[MessageRow | NewMessage], list[dict[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """``rows``: the stored history, and the messages of the turn not stored yet.
    ``media`` gives a user row's image/document blocks (``model_input``), put before
    its text."""
    messages: list[dict[str, Any]] = []
    open_calls: set[str] = set()
    order: dict[str, int] = {}  # call id -> position in its assistant message
    pending_user: list[dict[str, Any]] = []  # blocks of the user message being assembled

    def close_open_calls() -> None:
        # A call never answered before the conversation moved on gets an error result
        # in place; a late result for it becomes an orphan and is dropped.
        for call_id in sorted(open_calls, key=order.__getitem__):
            pending_user.append(
                {"type": "tool_result", "tool_use_id": call_id, "content": INTERRUPTED, "is_error": True}
            )
        open_calls.clear()

    def flush_user() -> None:
        close_open_calls()
        if not pending_user:
            return
        results = [b for b in pending_user if b["type"] == "tool_result"]
        texts = [b for b in pending_user if b["type"] != "tool_result"]
        blocks = results + texts
        if len(blocks) == 1 and blocks[0]["type"] == "text":
            messages.append({"role": "user", "content": blocks[0]["text"]})
        else:
            messages.append({"role": "user", "content": blocks})
        pending_user.clear()

    for row in rows:
        if row.role == "user":
            close_open_calls()
            if media is not None and row.meta.get("media"):
                pending_user.extend(media(row))
            pending_user.append({"type": "text", "text": _user_text(row, label_authors) or "(empty message)"})
        elif row.role == "tool":
            if row.tool_call_id in open_calls:
                open_calls.discard(row.tool_call_id)
                block: dict[str, Any] = {
                    "type": "tool_result",
                    "tool_use_id": row.tool_call_id,
                    "content": row.content,
                }
                if row.is_error:
                    block["is_error"] = True
                pending_user.append(block)
        elif row.role == "assistant":
            if not pending_user and not messages:
                # A conversation must start with a user turn.
                messages.append({"role": "user", "content": "(conversation start)"})
            flush_user()
            if messages and messages[-1]["role"] == "assistant":
                messages.append({"role": "user", "content": "(continue)"})
            blocks: list[dict[str, Any]] = []
            if row.content:
                blocks.append({"type": "text", "text": row.content})
            for call in row.tool_calls:
                blocks.append(
                    {"type": "tool_use", "id": call.id, "name": call.name, "input": dict(call.input)}
                )
            if not blocks:
                blocks.append({"type": "text", "text": EMPTY_ASSISTANT})
            open_calls = {c.id for c in row.tool_calls}
            order = {c.id: i for i, c in enumerate(row.tool_calls)}
            messages.append({"role": "assistant", "content": blocks})
    flush_user()
    return messages
