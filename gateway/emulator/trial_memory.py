"""What the scripted trial model knows about the person, read from one request.

A real model reads everything in the request; the trial model has to be told where to
look. Four places, in the order a reply lists them:

* the USER PROFILE block of the frozen system prompt (what was saved before this
  session started);
* memory writes made earlier in *this* session: the ``memory`` tool calls in the
  history whose ``tool_result`` did not fail, replayed in order (add, replace, remove) —
  they reach the system prompt only at the next session, so without this the trial
  says "nothing saved" right after "Noted — saved to memory";
* recalled provider context, inside the ``<memory-context>`` fence of the newest user
  turn (the fence's own note left out);
* hits of earlier ``session_search`` calls in the session.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from mnemo.memory.fence import FENCE_TAG, RECALL_NOTE

_SEPARATOR = re.compile(r"^[═=─-]{10,}$")
_FENCE_BODY = re.compile(rf"<{FENCE_TAG}>(.*?)</{FENCE_TAG}>", re.S | re.I)
_WORD = re.compile(r"[^\W\d_]{4,}")
# Words of a question that say nothing about what it is about.
_STOPWORDS = frozenset(
    "what when where which about know remember tell does have your mine that this there with from "
    "they them their were would could should said saved anything something".split()
)


@dataclass(frozen=True, slots=True)
class Known:
    """Everything the request shows about the person, each list in reading order."""

    profile: tuple[str, ...]  # the frozen USER PROFILE, with this session's writes applied
    recalled: tuple[str, ...]  # the provider's fenced recall in the newest user turn
    searched: tuple[str, ...]  # snippets of this session's session_search results


def known(system: str, messages: list[dict[str, Any]]) -> Known:
    entries = profile_entries(system)
    for action, content, old in session_writes(messages):
        entries = _apply(entries, action, content, old)
    last = messages[-1] if messages else {}
    return Known(tuple(entries), tuple(recalled(last)), tuple(search_snippets(messages)))


def profile_entries(system: str) -> list[str]:
    """Entries of the USER PROFILE block of a rendered system prompt."""
    lines = system.splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith("USER PROFILE")), None)
    if start is None:
        return []
    body: list[str] = []
    for line in lines[start + 1 :]:
        if _SEPARATOR.match(line.strip()):
            if body:
                break
            continue
        if not line.strip():
            break
        body.append(line)
    entries = re.split(r"^§$", "\n".join(body), flags=re.M)
    return [" ".join(e.split()) for e in entries if e.strip()]


def session_writes(messages: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(action, content, old_text) of each successful ``memory`` call on the person's
    profile in the history, oldest first."""
    writes: list[tuple[str, str, str]] = []
    for call, result in _calls(messages):
        if call.get("name") != "memory" or _failed(result):
            continue
        args = call.get("input") or {}
        if not isinstance(args, dict) or args.get("target", "user") != "user":
            continue
        action = str(args.get("action", ""))
        if action in ("add", "replace", "remove"):
            writes.append((action, str(args.get("content") or ""), str(args.get("old_text") or "")))
    return writes


def recalled(message: dict[str, Any]) -> list[str]:
    """The lines of the recall fence in one user message."""
    lines: list[str] = []
    for body in _FENCE_BODY.findall(_text(message)):
        for line in body.replace(RECALL_NOTE, "").splitlines():
            item = " ".join(line.strip().lstrip("-•*").split())
            if item:
                lines.append(item)
    return lines


def search_snippets(messages: list[dict[str, Any]], limit: int = 10) -> list[str]:
    found: list[str] = []
    for call, result in _calls(messages):
        if call.get("name") == "session_search" and not _failed(result):
            for item in found_items(parse_json(result_text(result)), limit):
                if item not in found:
                    found.append(item)
    return found[:limit]


def relevant(snippets: tuple[str, ...], question: str, limit: int = 2) -> list[str]:
    """The snippets sharing a content word with ``question``."""
    words = {w.lower() for w in _WORD.findall(question)} - _STOPWORDS
    return [s for s in snippets if words & {w.lower() for w in _WORD.findall(s)}][:limit]


def found_items(data: Any, limit: int = 5) -> list[str]:
    """Text snippets anywhere in a search result, whatever its exact shape."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if len(found) >= limit:
            return
        if isinstance(node, dict):
            for key in ("snippet", "summary", "digest", "content", "text", "excerpt"):
                value = node.get(key)
                if isinstance(value, str) and value.strip():
                    item = " ".join(value.split())[:160]
                    if item not in found:
                        found.append(item)
                    break
            else:
                for value in node.values():
                    walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(data)
    return found[:limit]


def _apply(entries: list[str], action: str, content: str, old: str) -> list[str]:
    content = " ".join(content.split())
    if action == "add":
        return [*entries, content] if content and content not in entries else entries
    at = next((i for i, e in enumerate(entries) if old and old in e), None)
    if at is None:
        return entries
    if action == "remove":
        return entries[:at] + entries[at + 1 :]
    return [*entries[:at], content, *entries[at + 1 :]] if content else entries


def _calls(messages: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(tool_use, its tool_result) pairs in the history, in order."""
    pairs = []
    for i, message in enumerate(messages[:-1]):
        uses = {b.get("id"): b for b in blocks(message, "tool_use")}
        if not uses:
            continue
        for result in blocks(messages[i + 1], "tool_result"):
            call = uses.get(result.get("tool_use_id"))
            if call is not None:
                pairs.append((call, result))
    return pairs


def _failed(result: dict[str, Any]) -> bool:
    data = parse_json(result_text(result))
    return bool(result.get("is_error")) or (isinstance(data, dict) and data.get("success") is False)


def blocks(message: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    content = message.get("content")
    return (
        [b for b in content if isinstance(b, dict) and b.get("type") == kind]
        if isinstance(content, list)
        else []
    )


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    return (
        content if isinstance(content, str) else "\n".join(b.get("text", "") for b in blocks(message, "text"))
    )


def result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, str):
        return content
    return "\n".join(
        b.get("text", "") for b in content or () if isinstance(b, dict) and b.get("type") == "text"
    )


def parse_json(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None
