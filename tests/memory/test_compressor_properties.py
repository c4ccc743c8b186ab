"""Hypothesis over generated conversations (text, tool pairs, long tool outputs): the
compressor keeps head and tail verbatim, never splits a tool pair, fits the budget,
always adds the summary message, and leaves short histories alone."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mnemo.gateway.emulator import validate_request
from mnemo.gateway.turns.history import to_api_messages
from mnemo.memory.compressor import (
    PRUNED,
    SUMMARY_END,
    CompressionPolicy,
    ContextCompressor,
    is_summary,
    rows_tokens,
)
from mnemo.memory.sessions import MessageRow, NewMessage, ToolCall

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def row(
    i: int, role: str, content: str = "", *, calls=(), call_id=None, tool_name=None, meta=None
) -> MessageRow:
    tokens = (len(content) + 3) // 4 + (10 * len(calls))
    return MessageRow(
        id=i,
        session_id="s",
        role=role,
        content=content,
        tool_calls=tuple(calls),
        tool_call_id=call_id,
        tool_name=tool_name,
        is_error=False,
        author_id="u" if role == "user" else None,
        author_name="Ada" if role == "user" else None,
        platform_message_id=f"m{i}" if role == "user" else None,
        created_at=T0 + timedelta(seconds=i),
        token_count=tokens,
        finish_reason=None,
        meta=meta or {},
    )


def to_rows(messages: list[NewMessage], start: int) -> list[MessageRow]:
    """NewMessages as stored rows (fresh ids), like append_messages + load_messages."""
    return [
        MessageRow(
            id=start + k,
            session_id="s2",
            role=m.role,
            content=m.content,
            tool_calls=m.tool_calls,
            tool_call_id=m.tool_call_id,
            tool_name=m.tool_name,
            is_error=m.is_error,
            author_id=m.author_id,
            author_name=m.author_name,
            platform_message_id=m.platform_message_id,
            created_at=m.created_at or T0,
            token_count=m.token_count if m.token_count is not None else (len(m.content) + 3) // 4,
            finish_reason=m.finish_reason,
            meta=m.meta,
        )
        for k, m in enumerate(messages)
    ]


@dataclass(frozen=True)
class Turn:
    user_len: int
    rounds: tuple[tuple[int, ...], ...]  # per tool round: the output length of each call
    reply_len: int | None  # None: the turn has no final reply (yet)


# Bounds chosen so a compressed history always fits under the threshold of the 8k
# window used below: messages <= 400 chars, tool outputs <= 1,600, <= 2 rounds of <= 2 calls.
turns_strategy = st.lists(
    st.builds(
        Turn,
        user_len=st.integers(1, 400),
        rounds=st.lists(st.lists(st.integers(1, 1600), min_size=1, max_size=2).map(tuple), max_size=2).map(
            tuple
        ),
        reply_len=st.one_of(st.none(), st.integers(1, 400)),
    ),
    min_size=1,
    max_size=40,
)


def build(turns: list[Turn], start: int = 1) -> list[MessageRow]:
    ids = itertools.count(start)
    rows: list[MessageRow] = []
    for t, turn in enumerate(turns):
        n = next(ids)
        rows.append(row(n, "user", f"u{n} " + "q" * turn.user_len))
        for r, outputs in enumerate(turn.rounds):
            n = next(ids)
            calls = [ToolCall(f"call_{n}_{k}", "lookup", {"q": f"t{t}r{r}k{k}"}) for k in range(len(outputs))]
            rows.append(row(n, "assistant", f"a{n} checking", calls=calls))
            for call, size in zip(calls, outputs, strict=True):
                n = next(ids)
                rows.append(row(n, "tool", f"o{n} " + "z" * size, call_id=call.id, tool_name="lookup"))
        # Only the last turn may stop without a reply: every earlier turn was answered.
        if turn.reply_len is not None or t < len(turns) - 1:
            n = next(ids)
            rows.append(row(n, "assistant", f"r{n} " + "w" * (turn.reply_len or 20)))
    return rows


def same(a, b) -> bool:
    return (a.role, a.content, tuple(a.tool_calls), a.tool_call_id) == (
        b.role,
        b.content,
        tuple(b.tool_calls),
        b.tool_call_id,
    )


def tool_pairs_intact(rows) -> bool:
    """Every tool_use is answered right after its assistant row and every result has its call."""
    i = 0
    while i < len(rows):
        r = rows[i]
        if r.role == "tool":
            return False  # a result not directly after its call
        if r.role == "assistant" and r.tool_calls:
            wanted = {c.id for c in r.tool_calls}
            got = set()
            j = i + 1
            while j < len(rows) and rows[j].role == "tool":
                got.add(rows[j].tool_call_id)
                j += 1
            if got != wanted:
                return False
            i = j
            continue
        i += 1
    return True


def valid(rows) -> bool:
    body = {"model": "m", "max_tokens": 100, "messages": to_api_messages(rows)}
    return validate_request(body) is None


POLICY = CompressionPolicy(context_window=8_000)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turns=turns_strategy)
def test_compression_keeps_head_and_tail_verbatim_pairs_intact_and_fits(turns):
    rows = build(turns)
    compressor = ContextCompressor(POLICY)
    plan = compressor.plan(rows)
    if rows_tokens(rows) < POLICY.threshold_tokens:
        assert plan is None, "a history under the threshold is returned unchanged"
        return
    assert plan is not None, "over the threshold there is always a middle to summarise (at these sizes)"
    summary = "S" * (4 * plan.summary_budget)  # the longest summary the request allows
    out = compressor.assemble(plan, summary)

    h = plan.head_end
    assert len(out) == h + 1 + len(plan.tail)
    for before, after in zip(plan.head, out[:h], strict=True):
        if before.role == "tool" and len(before.content) > 200:
            assert after.content == PRUNED and after.tool_call_id == before.tool_call_id
        else:
            assert same(before, after), "the head is carried verbatim"
    marker = out[h]
    assert marker.role == "user" and is_summary(marker) and summary in marker.content
    assert marker.content.endswith(SUMMARY_END)
    for before, after in zip(plan.tail, out[h + 1 :], strict=True):
        assert same(before, after) and after.token_count == before.token_count, "the tail is carried verbatim"

    last_user = max(i for i, r in enumerate(rows) if r.role == "user")
    assert plan.tail_start <= last_user, "the latest user message stays"
    replies = [i for i, r in enumerate(rows) if r.role == "assistant" and not r.tool_calls]
    if replies:
        assert plan.tail_start <= replies[-1], "the last assistant reply stays"

    assert tool_pairs_intact(out)
    assert valid(out), "the result converts to a valid Messages API conversation"
    assert rows_tokens(out) < POLICY.threshold_tokens, "the compressed history fits under the threshold"
    assert rows_tokens(out) < rows_tokens(rows)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=turns_strategy, more=turns_strategy)
def test_second_compression_updates_the_first_summary_and_keeps_one_summary(first, more):
    compressor = ContextCompressor(POLICY)
    rows = build(first)
    plan = compressor.plan(rows, force=True)
    if plan is None:
        return
    stored = to_rows(compressor.assemble(plan, "FIRST SUMMARY: the user wants q."), 10_000)
    # The conversation goes on in the new session.
    grown = stored + build(more, start=20_000)
    plan2 = compressor.plan(grown, force=True)
    if plan2 is None:
        return
    assert plan2.previous_summary == "FIRST SUMMARY: the user wants q."
    request = compressor.summary_request(plan2)
    assert "FIRST SUMMARY: the user wants q." in request.prompt and "PRESERVE" in request.prompt
    out = compressor.assemble(plan2, "SECOND")
    assert sum(1 for r in out if is_summary(r)) == 1
    assert tool_pairs_intact(out) and valid(out)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turns=turns_strategy, budget=st.integers(1_500, 6_000))
def test_preflight_trim_fits_when_the_tail_can(turns, budget):
    rows = build(turns)
    compressor = ContextCompressor(POLICY)
    trimmed = compressor.trim(rows, budget)
    assert valid(trimmed) and tool_pairs_intact([r for r in trimmed])
    if rows_tokens(rows) <= budget:
        assert trimmed == rows
        return
    last_user = max(i for i, r in enumerate(rows) if r.role == "user")
    assert any(r is rows[last_user] for r in trimmed), "the latest user message is always sent"
    forced = rows_tokens(rows[last_user - 1 :]) + rows_tokens(rows[:6]) + 80
    if forced <= budget:
        assert rows_tokens(trimmed) <= budget
