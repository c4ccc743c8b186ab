"""Layer 3: the context compressor — pure functions over stored message rows.

No LLM call and no I/O happen here: the housekeeping job (``gateway/housekeeping.py``)
asks for a ``CompressionPlan``, sends the ``SummaryRequest`` built from it to the
auxiliary model, and hands the answer back to ``assemble``. Keeping the compressor pure
is what lets a property test run it over thousands of generated conversations.

A plan splits a session's rows into three parts::

    rows[:head_end]            head — the first messages, carried verbatim
    rows[head_end:tail_start]  middle — replaced by one summary message
    rows[tail_start:]          tail — the newest messages, carried verbatim

* **Prune.** Tool results longer than 200 characters outside the tail become
  ``PRUNED`` in the carried head (the middle is summarised anyway, and the summariser
  only sees a short preview of each tool result). The head is carried into every later
  session, so a big tool output there would otherwise be paid for forever.
* **Head.** The first ``head_messages`` rows, extended so a tool call in the head keeps
  its results. A summary row never belongs to the head: it is replaced, not carried.
* **Tail.** Walk back from the end adding rows until the token budget (a share of the
  threshold, so it scales with the context window) is spent, but never fewer than
  ``tail_min_messages``; the latest user message and the last assistant reply are
  always in it; it never starts on a tool result (its call comes along), so a
  ``tool_use`` and its ``tool_result`` are never separated.
* **Summary.** The middle goes to the summariser in a fixed template. When the middle
  holds the summary of an earlier compression, the request asks to *update* it with
  the newer turns, keeping everything it said (iterative summaries do not decay).
* **Assemble.** head + one user-role summary message + tail, as ``NewMessage`` rows.
  ``gateway.history.to_api_messages`` merges consecutive user-role rows, so the result
  is always a valid alternating conversation whatever the head ends with and the tail
  starts with. ``assemble`` may be given the rows as they are *now*: rows appended
  after the plan was made (messages that arrived while the summary was written) land
  in the tail, none lost, none duplicated.

Token figures are estimates (``memory.tokens``) or the counts stored on the rows.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mnemo.memory.sessions import MessageRow, NewMessage
from mnemo.memory.tokens import estimate_json_tokens, estimate_tokens

Row = MessageRow | NewMessage

PRUNED = "[Old tool output cleared to save context space]"
SUMMARY_KEY = "compression_summary"  # meta flag of the summary row
TRIM_KEY = "context_trimmed"  # meta flag of the preflight's omission note (never stored)
SUMMARY_END = "END OF CONTEXT SUMMARY — respond to the message below"
MESSAGE_OVERHEAD = 4  # role and framing tokens per message

TEMPLATE = """## Goal
## Constraints & Preferences
## Progress
### Done
### In Progress
### Blocked
## Key Decisions
## Relevant Files
## Next Steps
## Critical Context
## Tools & Patterns"""

SUMMARISER_SYSTEM = (
    "You are the summarisation step of a chat assistant. You write checkpoint notes that let the "
    "assistant continue a long conversation after its older turns are removed from its context. "
    "You never answer the user and never continue the conversation yourself: output only the notes."
)

_RULES = """Rules:
- Keep every detail that may matter later: names, numbers, dates, file paths, commands, error \
messages and their fixes, decisions and their reasons, the user's preferences and corrections.
- Write state that is no longer current on a line starting with "Historical:" in its section, \
so nobody takes a finished or abandoned task for something to do now.
- Do not invent anything. Under a heading with nothing to say, write "None."
- Write in the language of the conversation. Stay under about {budget} tokens."""

_FIRST = """Summarise the older part of the conversation below for the assistant that will \
continue it. The first messages and the most recent turns are kept verbatim and are not \
shown here.

{rules}

Use exactly this template:

{template}

CONVERSATION TURNS TO SUMMARISE:
{turns}"""

_UPDATE = """Update the existing summary of this conversation with the newer turns below. \
PRESERVE all existing information that is still relevant, add the new progress, decisions \
and facts, and turn what is finished or superseded into "Historical:" lines instead of \
deleting it. The first messages and the most recent turns are kept verbatim and are not \
shown here.

{rules}

Use exactly this template:

{template}

PREVIOUS SUMMARY:
{previous}

NEW TURNS TO INCORPORATE:
{turns}"""

_HEADER = (
    "[CONTEXT SUMMARY — the earlier part of this conversation ({n} messages) was compressed into "
    "the notes below. They are background for you, not a new request; lines marked historical "
    "are no longer current.]"
)

_FILE = re.compile(
    r"(?:[\w.-]+/)+[\w.-]+|\b[\w-]+\.(?:py|md|txt|json|yaml|yml|toml|js|ts|go|rs|sh|sql|csv|html|css)\b"
)


def row_tokens(row: Row) -> int:
    """The stored count when there is one (real API counts for replies), else an estimate."""
    if row.token_count is not None:
        return row.token_count + MESSAGE_OVERHEAD
    calls = [c.to_json() for c in row.tool_calls]
    return estimate_tokens(row.content) + (estimate_json_tokens(calls) if calls else 0) + MESSAGE_OVERHEAD


def rows_tokens(rows: Sequence[Row]) -> int:
    return sum(row_tokens(r) for r in rows)


def is_summary(row: Row) -> bool:
    return bool(row.meta.get(SUMMARY_KEY))


def clip(text: str, limit: int) -> str:
    """At most ``limit`` characters: the start and the end of ``text`` around a marker."""
    if len(text) <= limit:
        return text
    keep_end = limit // 4
    cut = len(text) - (limit - keep_end)
    return f"{text[: limit - keep_end]} […{cut:,} characters cut…] {text[-keep_end:] if keep_end else ''}".rstrip()


def transcript(rows: Sequence[Row], *, message_chars: int = 3000, tool_chars: int = 200) -> str:
    """Rows as labelled lines (``[user] …``, ``[assistant] …``, ``[tool memory] …``) for
    a summariser or a memory review; continuation lines are indented so every line that
    starts a message is recognisable."""
    out: list[str] = []

    def add(label: str, text: str) -> None:
        out.append(f"[{label}] " + text.strip().replace("\n", "\n    "))

    for row in rows:
        if row.role == "user":
            add(f"user {row.author_name}" if row.author_name else "user", clip(row.content, message_chars))
        elif row.role == "assistant":
            if row.content.strip():
                add("assistant", clip(row.content, message_chars))
            for call in row.tool_calls:
                args = json.dumps(dict(call.input), ensure_ascii=False)
                add(f"assistant calls {call.name}", clip(args, 300))
        else:
            status = " error" if row.is_error else ""
            add(f"tool {row.tool_name or 'result'}{status}", clip(row.content, tool_chars))
    return "\n".join(out)


@dataclass(frozen=True, slots=True)
class CompressionPolicy:
    context_window: int
    threshold: float = 0.50
    head_messages: int = 3
    tail_min_messages: int = 6
    tail_token_ratio: float = 0.20
    prune_min_chars: int = 200
    summary_ratio: float = 0.20
    summary_min_tokens: int = 2_000
    summary_max_tokens: int = 10_000

    @property
    def threshold_tokens(self) -> int:
        return int(self.context_window * self.threshold)

    @property
    def tail_budget(self) -> int:
        return int(self.threshold_tokens * self.tail_token_ratio)

    def summary_budget(self, middle_tokens: int) -> int:
        """20% of what is summarised, at least 2k and at most 10k tokens — and never more
        than a quarter of the threshold, so small context windows still gain room."""
        cap = min(self.summary_max_tokens, max(256, self.threshold_tokens // 4))
        floor = min(self.summary_min_tokens, cap)
        return max(floor, min(cap, int(middle_tokens * self.summary_ratio)))


@dataclass(frozen=True, slots=True)
class CompressionPlan:
    rows: tuple[Row, ...]
    head_end: int
    tail_start: int
    tokens_before: int  # the rows' tokens (without system prompt and tools)
    summary_budget: int

    @property
    def head(self) -> tuple[Row, ...]:
        return self.rows[: self.head_end]

    @property
    def middle(self) -> tuple[Row, ...]:
        return self.rows[self.head_end : self.tail_start]

    @property
    def tail(self) -> tuple[Row, ...]:
        return self.rows[self.tail_start :]

    @property
    def turns(self) -> tuple[Row, ...]:
        """The middle without earlier summaries: the turns the summary must cover."""
        return tuple(r for r in self.middle if not is_summary(r))

    @property
    def previous_summary(self) -> str | None:
        found = [r for r in self.middle if is_summary(r)]
        return summary_text(found[-1]) if found else None


@dataclass(frozen=True, slots=True)
class SummaryRequest:
    system: str
    prompt: str
    max_tokens: int


def summary_text(row: Row) -> str:
    """The summariser's text inside a stored summary row."""
    raw = row.meta.get("summary")
    if isinstance(raw, str):
        return raw
    body = row.content
    if body.startswith("[CONTEXT SUMMARY"):
        body = body.split("\n\n", 1)[-1]
    return body.removesuffix(SUMMARY_END).strip()


def _last_index(rows: Sequence[Row], start: int, role: str, *, reply_only: bool = False) -> int | None:
    for i in range(len(rows) - 1, start - 1, -1):
        r = rows[i]
        if r.role == role and not is_summary(r) and not (reply_only and r.tool_calls):
            return i
    return None


class ContextCompressor:
    def __init__(self, policy: CompressionPolicy) -> None:
        self.policy = policy

    # --- planning -------------------------------------------------------------------
    def over_threshold(self, rows: Sequence[Row], overhead_tokens: int = 0) -> bool:
        return rows_tokens(rows) + overhead_tokens >= self.policy.threshold_tokens

    def plan(
        self, rows: Sequence[Row], *, overhead_tokens: int = 0, force: bool = False
    ) -> CompressionPlan | None:
        """Where to cut, or None when the history stays unchanged: under the threshold
        (unless ``force``: the API already measured it over), or nothing to summarise."""
        rows = tuple(rows)
        total = rows_tokens(rows)
        if not force and total + overhead_tokens < self.policy.threshold_tokens:
            return None
        head_end = self._head_end(rows)
        tail_start = self._tail_start(rows, head_end, self.policy.tail_budget, self.policy.tail_min_messages)
        if tail_start is None or any(is_summary(r) for r in rows[tail_start:]):
            # Nothing between head and tail, or the earlier summary is still in the tail
            # (nothing older to fold into it): the history stays as it is.
            return None
        middle_turns = [r for r in rows[head_end:tail_start] if not is_summary(r)]
        if not middle_turns:
            return None
        budget = self.policy.summary_budget(rows_tokens(middle_turns))
        return CompressionPlan(rows, head_end, tail_start, total, budget)

    def _head_end(self, rows: Sequence[Row]) -> int:
        h = min(self.policy.head_messages, len(rows))
        for i in range(h):
            if is_summary(rows[i]):
                h = i
                break
        while h < len(rows) and rows[h].role == "tool":
            h += 1  # the results of a tool call in the head stay with it
        return h

    def _tail_start(self, rows: Sequence[Row], head_end: int, budget: int, min_messages: int) -> int | None:
        n = len(rows)
        t, spent = n, 0
        while t > head_end:
            cost = row_tokens(rows[t - 1])
            if spent + cost > budget and n - t >= min_messages:
                break
            spent += cost
            t -= 1
        limit = n
        for index in (
            _last_index(rows, head_end, "user"),
            _last_index(rows, head_end, "assistant", reply_only=True),
        ):
            if index is not None:
                limit = min(limit, index)
        t = min(t, limit)
        # Never open the tail on a result whose call would be summarised away: skip the
        # rest of that tool group when the budget walk stopped inside it (the tail stays
        # within budget), else take its call along.
        if t < n and rows[t].role == "tool":
            forward = t
            while forward < n and rows[forward].role == "tool":
                forward += 1
            if forward <= limit and n - forward >= min_messages:
                t = forward
            else:
                while head_end < t and rows[t].role == "tool":
                    t -= 1
        return t if t > head_end else None

    # --- the summary ----------------------------------------------------------------
    def summary_request(self, plan: CompressionPlan) -> SummaryRequest:
        rules = _RULES.format(budget=plan.summary_budget)
        turns = transcript(plan.turns)
        previous = plan.previous_summary
        if previous:
            prompt = _UPDATE.format(rules=rules, template=TEMPLATE, previous=previous, turns=turns)
        else:
            prompt = _FIRST.format(rules=rules, template=TEMPLATE, turns=turns)
        return SummaryRequest(SUMMARISER_SYSTEM, prompt, plan.summary_budget)

    def summary_instruction(self, plan: CompressionPlan, *, tag: str = "") -> SummaryRequest:
        """The summary asked *after* the conversation itself (the request's cached
        prefix, ``gateway/turns/model_input.with_instruction``): the turns to summarise
        are named by where they start and end instead of being copied into the prompt.
        ``system`` is empty: the request keeps the conversation's own system prompt."""
        rules = _RULES.format(budget=plan.summary_budget)
        turns = plan.turns
        first, last = turns[0], turns[-1]
        span = (
            f"Summarise the part of the conversation above that starts with the {first.role} message "
            f"beginning «{_excerpt(first)}» and ends with the {last.role} message beginning "
            f"«{_excerpt(last)}» ({len(turns)} stored messages). The messages before and after it are "
            "kept verbatim: do not summarise them."
        )
        previous = plan.previous_summary
        if previous:
            span += (
                " The conversation above starts with a CONTEXT SUMMARY of still earlier turns: update it "
                "with the new turns — PRESERVE all existing information that is still relevant, add the "
                'new progress, decisions and facts, and turn what is finished or superseded into "Historical:" '
                "lines instead of deleting it."
            )
        prompt = "\n\n".join(
            [p for p in (tag, span, rules, "Use exactly this template:", TEMPLATE, SUMMARISER_SYSTEM) if p]
        )
        return SummaryRequest("", prompt, plan.summary_budget)

    def fallback_summary(self, plan: CompressionPlan) -> str:
        """A deterministic summary for when the summariser failed for a non-transient
        reason: worse than a model's, far better than dropping the middle silently."""
        turns = plan.turns
        users = [" ".join(r.content.split()) for r in turns if r.role == "user" and r.content.strip()]
        tools: dict[str, int] = {}
        for r in turns:
            for call in r.tool_calls:
                tools[call.name] = tools.get(call.name, 0) + 1
        files = sorted({m for r in turns for m in _FILE.findall(r.content)})[:20]
        previous = plan.previous_summary
        short = [clip(u, 160) for u in users]
        sections = {
            "## Goal": short[0] if short else "Not recorded.",
            "## Constraints & Preferences": "Not extracted (automatic summary).",
            "## Progress": "",
            "### Done": "\n".join(f"- Historical: the user asked: {u}" for u in short[-12:]) or "None.",
            "### In Progress": "Unknown — see the recent messages below.",
            "### Blocked": "None recorded.",
            "## Key Decisions": "Not extracted (automatic summary).",
            "## Relevant Files": ", ".join(files) or "None mentioned.",
            "## Next Steps": "Continue from the most recent messages below.",
            "## Critical Context": (
                "This summary was made without the summarisation model, from the message list only."
                + (f"\nEarlier summary, kept as it was:\n{previous}" if previous else "")
            ),
            "## Tools & Patterns": ", ".join(f"{name} ×{n}" for name, n in sorted(tools.items()))
            or "None used.",
        }
        text = "\n".join(f"{heading}\n{body}" if body else heading for heading, body in sections.items())
        return clip(text, plan.summary_budget * 4)

    # --- the new history ------------------------------------------------------------
    def assemble(
        self,
        plan: CompressionPlan,
        summary: str,
        *,
        current: Sequence[Row] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> list[NewMessage]:
        """head + summary + tail for the new session. ``current``: the session's rows now,
        which must start with the planned rows (rows are append-only); whatever was
        appended since the plan is part of the tail."""
        rows = plan.rows if current is None else tuple(current)
        if len(rows) < len(plan.rows) or any(
            _identity(a) != _identity(b) for a, b in zip(plan.rows, rows, strict=False)
        ):
            raise ValueError("the session's history changed under the compressor (rows are append-only)")
        summary = summary.strip()
        content = f"{_HEADER.format(n=len(plan.middle))}\n\n{summary}\n\n{SUMMARY_END}"
        summary_row = NewMessage(
            role="user",
            content=content,
            meta={
                SUMMARY_KEY: True,
                "summary": summary,
                "summarised_messages": len(plan.middle),
                **(meta or {}),
            },
        )
        head = [self._carry(r, prune=True) for r in plan.head]
        tail = [self._carry(r, prune=False) for r in rows[plan.tail_start :]]
        return [*head, summary_row, *tail]

    def _carry(self, row: Row, *, prune: bool) -> NewMessage:
        content, tokens = row.content, row.token_count
        if prune and row.role == "tool" and len(content) > self.policy.prune_min_chars:
            content, tokens = PRUNED, None
        meta = dict(row.meta)
        if isinstance(row, MessageRow):
            meta.setdefault("carried_from", row.id)
        return NewMessage(
            role=row.role,
            content=content,
            tool_calls=row.tool_calls,
            tool_call_id=row.tool_call_id,
            tool_name=row.tool_name,
            is_error=row.is_error,
            author_id=row.author_id,
            author_name=row.author_name,
            platform_message_id=row.platform_message_id,
            created_at=row.created_at,
            token_count=tokens,
            finish_reason=row.finish_reason,
            meta=meta,
        )

    # --- the preflight --------------------------------------------------------------
    def trim(self, rows: Sequence[Row], budget_tokens: int) -> list[Row]:
        """For one request that would not fit: head + the latest earlier summary + a
        note + as much tail as fits. No LLM call, nothing stored; the caller makes sure
        a real compression follows."""
        rows = tuple(rows)
        if rows_tokens(rows) <= budget_tokens:
            return list(rows)
        head_end = self._head_end(rows)
        summaries = [r for r in rows[head_end:] if is_summary(r)]
        kept = [summaries[-1]] if summaries else []
        fixed = rows_tokens(rows[:head_end]) + rows_tokens(kept) + 60
        t = self._tail_start(rows, head_end, max(0, budget_tokens - fixed), 1)
        if t is None:
            return list(rows)
        kept = [r for r in kept if r not in rows[t:]]
        omitted = t - head_end - len(kept)
        note = NewMessage(
            role="user",
            content=(
                f"[{omitted} earlier messages are left out of this request to fit the context window; "
                "a summary of them is being prepared.]"
            ),
            meta={TRIM_KEY: True},
        )
        return [*rows[:head_end], *kept, note, *rows[t:]]


def _excerpt(row: Row, limit: int = 80) -> str:
    if row.content.strip():
        text = " ".join(row.content.split())
    else:
        text = " ".join(f"calls {c.name}" for c in row.tool_calls) or "(empty)"
    return text[:limit] + ("…" if len(text) > limit else "")


def _identity(row: Row) -> tuple[Any, ...]:
    return (row.id if isinstance(row, MessageRow) else None, row.role, row.content, row.tool_call_id)
