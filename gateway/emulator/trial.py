"""The scripted "trial model": the emulator's default responder.

It lets ``mnemo demo`` and ``mnemo run``'s local trial mode show the whole pipeline —
memory writes, session search, compression summaries, memory review — on a machine with
no API key. It is a handful of deterministic rules over the last user message and the
tools offered, and every text it produces starts with ``TRIAL_LABEL`` so nobody mistakes
it for a model.

Rules, first match wins:

1. the last user message carries ``tool_result`` blocks → report them: a memory write
   confirmed (or its refusal reason), search hits listed, anything else acknowledged;
2. a compression request (the instruction mentions summarising and has a ``## Goal``
   style template) → the template's headings filled from the transcript;
3. a memory review / flush (only the ``memory`` tool offered, the instruction mentions
   saving or reviewing) → one ``add`` of the first preference statement in the
   transcript, else "nothing to save";
4. "what did I say about X", "do you remember X", "search X" → ``session_search``;
5. "remember …", "my name is …", "I prefer/like …", "call me …" → ``memory`` add of a
   declarative fact about the user;
6. otherwise an acknowledgement that shows what the request says about the person
   (``trial_memory.py``): the USER PROFILE block with this session's memory writes
   applied, recalled provider context, and matching hits of earlier searches — so
   "remember that I like green tea" then "what do you know about me?" answers with
   the tea in the same session, as a real model reading its tool results would.
"""

from __future__ import annotations

import re
from typing import Any

from mnemo.gateway.emulator.script import RecordedRequest, Reply, ToolUse
from mnemo.gateway.emulator.trial_memory import (
    Known,
    blocks,
    found_items,
    known,
    parse_json,
    relevant,
    result_text,
)
from mnemo.memory.flush import BACKGROUND_TAG

TRIAL_LABEL = "[scripted reply — no ANTHROPIC_API_KEY set]"

_FENCE = re.compile(r"<memory-context>.*?</memory-context>", re.S | re.I)
_ROLE_LINE = re.compile(r"^\W*(user|human|assistant|tool)\b[^:\]]{0,40}[:\]]\s*(.*)$", re.I)
_HEADING = re.compile(r"^(#{1,4})\s+(.+?)\s*$", re.M)
_RECALL_VERBS = r"(?:say|tell you|talk about|discuss|mention|decide)"
_SEARCH = [
    re.compile(rf"\bwhat did (?:i|we|you) {_RECALL_VERBS}\b(?:\s+(?:about|regarding|on))?\s*(.+)", re.I),
    re.compile(
        r"\bdid (?:i|we) (?:ever )?(?:talk|speak|say anything|tell you|mention)\b(?:\s+about)?\s*(.+)", re.I
    ),
    re.compile(r"\bdo you remember\s+(.+)", re.I),
    re.compile(
        r"\bsearch\s+(?:(?:our|my|the|past|previous|old|conversations?|chats?|history)\s+)*(?:for\s+)?(.+)",
        re.I,
    ),
]
# Leading filler of a captured query: "what I said about X" -> "X".
_QUERY_NOISE = re.compile(
    r"^(?:(?:what|when|where|how|that|if|whether|the)\s+)?"
    r"(?:(?:i|we|you)\s+(?:said|told you|talked|mentioned|discussed)\s+)?(?:about\s+)?",
    re.I,
)
_REMEMBER = re.compile(r"\b(?:please\s+)?remember\s+(?:that\s+)?(.+)", re.I)
_NOT_A_REQUEST = re.compile(r"\b(?:do|did|can|could|will|would)\s+you\s+$|\b(?:don't|not)\s+$", re.I)
_NAME = re.compile(r"\bmy name is\s+(.+)", re.I)
_CALL_ME = re.compile(r"\bcall me\s+(.+)", re.I)
_LIKES = re.compile(
    r"\bI\s+(?:(?:really|usually|always|also)\s+)?(?:prefer|like|love|enjoy|hate|dislike)\b.+", re.I
)
_MODALS = {"can", "will", "would", "should", "could", "must", "might", "may", "shall"}
_ADVERBS = r"(?:really|usually|always|often|never|also|mostly|still)"


def trial_reply(request: RecordedRequest) -> Reply:
    """The default responder: a deterministic, labelled answer to any valid request."""
    messages = request.messages
    last = messages[-1] if messages else {}
    if last.get("role") != "user":
        return Reply(text=f"{TRIAL_LABEL} (nothing to add)")
    if blocks(last, "tool_result"):
        return Reply(text=_after_tools(messages))
    text = _user_text(last)
    # A background pass sent after the conversation itself (gateway/jobs/housekeeping.py)
    # carries its instruction, tagged, in the last user turn.
    background = BACKGROUND_TAG in text
    instruction = text[text.index(BACKGROUND_TAG) :] if background else f"{request.system_text}\n{text}"
    tools = request.tool_names
    if re.search(r"summar", instruction, re.I) and re.search(r"^#{1,4}\s+Goal\b", instruction, re.M | re.I):
        return Reply(text=_summary(instruction, messages))
    if (
        "memory" in tools
        and (tools == ("memory",) or background)
        and re.search(r"\b(?:save|saving|review)\b", instruction, re.I)
    ):
        return _review(messages)
    query = _search_query(text)
    if query and "session_search" in tools:
        return Reply(
            text=f"{TRIAL_LABEL} Let me search our past conversations.",
            tool_uses=[ToolUse("session_search", {_query_field(request): query})],
        )
    fact = fact_to_save(text)
    if fact:
        if "memory" not in tools:
            return Reply(text=f"{TRIAL_LABEL} I would save “{fact}”, but no memory tool is available here.")
        return Reply(
            text=f"{TRIAL_LABEL} I'll save that to memory.",
            tool_uses=[ToolUse("memory", {"action": "add", "target": "user", "content": fact})],
        )
    return Reply(text=_acknowledge(request, text))


# -- statements about the user ---------------------------------------------------------


def fact_to_save(text: str) -> str | None:
    """The first statement worth remembering in ``text``, as a declarative fact."""
    for sentence in _sentences(text):
        m = _REMEMBER.search(sentence)
        if m and not _NOT_A_REQUEST.search(sentence[: m.start()]):
            return _declarative(m.group(1))
        if m := _NAME.search(sentence):
            # "my name is Ada and I prefer…" — the name ends at the first clause break.
            name = re.split(r"\s+(?:and|but|so)\s+|[,;]", m.group(1), maxsplit=1)[0]
            return _declarative("my name is " + name)
        if m := _CALL_ME.search(sentence):
            return _declarative(f"User wants to be called {m.group(1)}")
        if m := _LIKES.search(sentence):
            return _declarative(m.group(0))
    return None


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n+", text) if s.strip()]


def _conjugate(verb: str) -> str:
    low = verb.lower()
    if low in _MODALS:
        return verb
    irregular = {"have": "has", "do": "does", "go": "goes", "am": "is", "was": "was"}
    if low in irregular:
        return irregular[low]
    if re.search(r"(?:s|sh|ch|x|z|o)$", low):
        return verb + "es"
    if re.search(r"[^aeiou]y$", low):
        return verb[:-1] + "ies"
    return verb + "s"


def _declarative(statement: str) -> str:
    """First person to a third-person fact: "I prefer tea" -> "User prefers tea."."""
    s = statement.strip().rstrip(".!?;, ")
    s = re.sub(r"^my name is\b", "User's name is", s, flags=re.I)
    s = re.sub(r"\bI(?:'m| am)\b", "User is", s, flags=re.I)
    s = re.sub(r"\bI(?:'ve| have)\b", "User has", s, flags=re.I)
    s = re.sub(r"\bI (?:don't|do not)\b", "User does not", s, flags=re.I)
    s = re.sub(
        rf"\bI\s+((?:{_ADVERBS}\s+)?)([A-Za-z]+)\b",
        lambda m: f"User {m.group(1)}{_conjugate(m.group(2))}",
        s,
        flags=re.I,
    )
    for word, repl in (("my", "their"), ("me", "them"), ("mine", "theirs"), ("myself", "themselves")):
        s = re.sub(rf"\b{word}\b", repl, s, flags=re.I)
    s = re.sub(r"^their\b", "User's", s)
    return s[:1].upper() + s[1:] + "."


# -- recall ------------------------------------------------------------------------------


def _search_query(text: str) -> str | None:
    for pattern in _SEARCH:
        if m := pattern.search(text):
            query = _QUERY_NOISE.sub("", m.group(1).strip()).strip().rstrip("?!. ")
            if query:
                return query
    return None


def _query_field(request: RecordedRequest) -> str:
    """``query`` unless the offered schema names its required string field otherwise."""
    schema = request.tool_schema("session_search") or {}
    props = schema.get("properties") or {}
    if "query" in props:
        return "query"
    for name in schema.get("required") or ():
        if (props.get(name) or {}).get("type") == "string":
            return str(name)
    return "query"


# -- after a tool call -------------------------------------------------------------------


def _after_tools(messages: list[dict[str, Any]]) -> str:
    calls = {b["id"]: b for b in blocks(messages[-2], "tool_use")} if len(messages) > 1 else {}
    lines = []
    for result in blocks(messages[-1], "tool_result"):
        call = calls.get(result["tool_use_id"], {})
        raw = result_text(result)
        data = parse_json(raw)
        failed = bool(result.get("is_error")) or (isinstance(data, dict) and data.get("success") is False)
        if call.get("name") == "memory":
            lines.append(_memory_outcome(call.get("input", {}), raw, data, failed))
        elif call.get("name") == "session_search":
            lines.append(_search_outcome(call.get("input", {}), raw, data, failed))
        else:
            lines.append(f"The {call.get('name', 'tool')} call {'failed' if failed else 'is done'}.")
    return f"{TRIAL_LABEL} " + "\n".join(lines)


def _memory_outcome(args: dict[str, Any], raw: str, data: Any, failed: bool) -> str:
    if failed:
        reason = _reason(data) or raw or "no reason given"
        return f"I couldn't save that: {reason}"
    return f"Noted — saved to memory: {args.get('content', '')}".rstrip(": ")


def _search_outcome(args: dict[str, Any], raw: str, data: Any, failed: bool) -> str:
    query = next((v for v in args.values() if isinstance(v, str)), "")
    if failed:
        return f"The search for “{query}” failed: {_reason(data) or raw}"
    found = found_items(data) if data is not None else ([raw.strip()[:160]] if raw.strip() else [])
    if not found:
        return f"I searched our past conversations for “{query}” and found nothing."
    return f"From our past conversations about “{query}”:\n" + "\n".join(f"- {item}" for item in found)


def _reason(data: Any) -> str | None:
    if isinstance(data, dict):
        for key in ("error", "message", "reason"):
            if isinstance(data.get(key), str) and data[key]:
                return str(data[key])
    return None


# -- compression and memory review -----------------------------------------------------


def _turns(instruction: str, messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(role, text) of the transcript: role-prefixed lines in the instruction, else the
    earlier messages of the request."""
    turns = [
        (m.group(1).lower(), m.group(2)) for line in instruction.splitlines() if (m := _ROLE_LINE.match(line))
    ]
    turns = [("user" if role == "human" else role, text) for role, text in turns if text.strip()]
    if not turns:
        turns = [(m["role"], t) for m in messages[:-1] if (t := _user_text(m))]
    return turns


def _summary(instruction: str, messages: list[dict[str, Any]]) -> str:
    turns = _turns(instruction, messages)
    user = [t for role, t in turns if role == "user"]
    facts = [f for t in user if (f := fact_to_save(t))]
    files = sorted(
        {f for _, t in turns for f in re.findall(r"[\w./-]+\.[A-Za-z]{1,5}\b", t) if "/" in f or "_" in f}
    )
    tools = sorted({b["name"] for m in messages for b in blocks(m, "tool_use")})
    headings: list[tuple[int, str]] = []
    for m in _HEADING.finditer(instruction):
        heading = (len(m.group(1)), m.group(2))
        if heading not in headings:
            headings.append(heading)

    def body(name: str) -> str:
        low = name.lower()
        if "in progress" in low:
            return _short(user[-1]) if user else "Nothing in progress."
        if "done" in low:
            return "\n".join(f"- User said: {_short(t, 100)}" for t in user[:5]) or "Nothing yet."
        if "blocked" in low:
            return "Nothing blocked."
        if "progress" in low:
            return f"{len(user)} user turns and {len(turns) - len(user)} other messages summarised."
        if "goal" in low:
            return _short(user[0]) if user else "Not stated."
        if "constraint" in low or "preference" in low:
            return "\n".join(f"- {f}" for f in facts) or "None stated."
        if "file" in low:
            return ", ".join(files) or "None mentioned."
        if "next" in low:
            return f"Answer the latest message: {_short(user[-1], 100)}" if user else "Wait for the user."
        if "critical" in low:
            return "\n".join(f"- {f}" for f in facts) or "None."
        if "tool" in low:
            return ", ".join(tools) or "None used."
        return "None recorded."

    parts = [TRIAL_LABEL] + [f"{'#' * level} {name}\n{body(name)}" for level, name in headings]
    return "\n\n".join(parts)


def _review(messages: list[dict[str, Any]]) -> Reply:
    """Memory flush/review: one add of the first preference found, else nothing."""
    candidates = [_user_text(m) for m in messages[:-1] if m.get("role") == "user"]
    for line in _user_text(messages[-1]).splitlines():
        if (m := _ROLE_LINE.match(line)) and m.group(1).lower() in ("user", "human"):
            candidates.append(m.group(2))
    for text in candidates:
        if fact := fact_to_save(text):
            return Reply(
                text=f"{TRIAL_LABEL} Saving one preference from this conversation.",
                tool_uses=[ToolUse("memory", {"action": "add", "target": "user", "content": fact})],
            )
    return Reply(text=f"{TRIAL_LABEL} Nothing to save.")


# -- plain acknowledgement -------------------------------------------------------------


def _user_name(entries: list[str]) -> str | None:
    for entry in entries:
        if m := re.search(r"(?:wants to be called|User's name is|Name:)\s*([^\n.;,§]+)", entry, re.I):
            return m.group(1).strip()
    return None


def _acknowledge(request: RecordedRequest, text: str) -> str:
    seen: Known = known(request.system_text, request.messages)
    name = _user_name(list(seen.profile))
    greeting = f"Hi {name}! " if name else ""
    said = f"You said: “{_short(text)}”." if text else "I got your message."
    parts = [f"{TRIAL_LABEL} {greeting}{said}"]
    if seen.profile:
        # The newest entries: what was just saved is what a person checks for.
        parts.append(
            "What I remember about you: " + "; ".join(e.rstrip(".") for e in seen.profile[-8:]) + "."
        )
    else:
        parts.append("I have nothing saved about you yet.")
    if seen.recalled:
        parts.append(
            "Recalled from long-term memory: " + "; ".join(_short(r, 120) for r in seen.recalled[:3]) + "."
        )
    if hits := relevant(seen.searched, text):
        parts.append(
            "Our past conversations mention: " + "; ".join(f"“{_short(h, 120)}”" for h in hits) + "."
        )
    return " ".join(parts)


# -- small readers ---------------------------------------------------------------------


def _user_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    text = content if isinstance(content, str) else "\n".join(b["text"] for b in blocks(message, "text"))
    return _FENCE.sub("", text).strip()


def _short(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
