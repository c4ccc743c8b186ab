"""Stored rows -> a valid Messages API conversation, and counters rebuilt from history."""

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from mnemo.gateway.emulator.validation import validate_request
from mnemo.gateway.turns.history import missing_tool_results, rebuild_counters, to_api_messages
from mnemo.memory.sessions import MessageRow, ToolCall

_T0 = datetime(2026, 1, 1, tzinfo=UTC)


def row(i, role, content="", *, calls=(), call_id=None, name=None, error=False, meta=None, author=None):
    return MessageRow(
        id=i,
        session_id="s",
        role=role,
        content=content,
        tool_calls=tuple(calls),
        tool_call_id=call_id,
        tool_name=name,
        is_error=error,
        author_id=None,
        author_name=author,
        platform_message_id=None,
        created_at=_T0,
        token_count=1,
        finish_reason=None,
        meta=meta or {},
    )


def valid(messages):
    return validate_request({"model": "m", "max_tokens": 10, "messages": messages}) is None


def test_tool_round_trip_converts_to_blocks():
    rows = [
        row(1, "user", "hi"),
        row(2, "assistant", "let me look", calls=[ToolCall("t1", "memory", {"action": "add"})]),
        row(3, "tool", '{"success": true}', call_id="t1", name="memory"),
        row(4, "assistant", "done"),
    ]
    msgs = to_api_messages(rows)
    assert msgs == [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "let me look"},
                {"type": "tool_use", "id": "t1", "name": "memory", "input": {"action": "add"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": '{"success": true}'}],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "done"}]},
    ]
    assert valid(msgs)


def test_unanswered_tool_use_is_repaired_and_results_merge_with_next_text():
    rows = [
        row(1, "user", "hi"),
        row(2, "assistant", "", calls=[ToolCall("t1", "memory", {}), ToolCall("t2", "session_search", {})]),
        row(3, "tool", "ok", call_id="t1", name="memory"),
    ]
    repairs = missing_tool_results(rows)
    assert [r.tool_call_id for r in repairs] == ["t2"] and repairs[0].is_error
    fixed = rows + [
        row(4, "tool", repairs[0].content, call_id="t2", name="session_search", error=True),
        row(5, "user", "again"),
    ]
    msgs = to_api_messages(fixed)
    assert msgs[-1]["role"] == "user"
    types = [b["type"] for b in msgs[-1]["content"]]
    assert types == ["tool_result", "tool_result", "text"]
    assert valid(msgs)


def test_orphan_tool_result_is_dropped():
    rows = [row(1, "user", "a"), row(2, "tool", "x", call_id="nope", name="memory"), row(3, "assistant", "b")]
    assert to_api_messages(rows) == [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": [{"type": "text", "text": "b"}]},
    ]


def test_shared_room_labels_authors():
    rows = [row(1, "user", "hello", author="Ann")]
    assert to_api_messages(rows, label_authors=True)[0]["content"] == "[Ann] hello"


def test_counters_rebuilt_from_history():
    rows = [
        row(1, "user", "a"),
        row(2, "assistant", "b"),
        row(3, "user", "c"),
        row(4, "tool", "{}", call_id="x", name="memory", meta={"memory_write": True}),
        row(5, "user", "d"),
        row(6, "user", "e"),
    ]
    c = rebuild_counters(rows, nudge_interval=10)
    assert (c.user_turns, c.turns_since_memory) == (4, 2)
    c = rebuild_counters(rows, nudge_interval=2)
    assert c.turns_since_memory == 0 and c.raw_since_memory == 2


kinds = st.lists(st.sampled_from(["user", "assistant", "assistant_tool", "tool", "tool_orphan"]), max_size=25)


@given(kinds)
def test_any_stored_history_converts_to_a_valid_conversation(seq):
    rows, n, open_calls = [], 0, []
    for k in seq:
        n += 1
        if k == "user":
            rows.append(row(n, "user", f"u{n}"))
        elif k == "assistant":
            rows.append(row(n, "assistant", f"a{n}"))
        elif k == "assistant_tool":
            open_calls = [f"t{n}a", f"t{n}b"]
            rows.append(row(n, "assistant", "", calls=[ToolCall(c, "memory", {}) for c in open_calls]))
        elif k == "tool" and open_calls:
            rows.append(row(n, "tool", "r", call_id=open_calls.pop(0), name="memory"))
        else:
            rows.append(row(n, "tool", "r", call_id=f"zz{n}", name="memory"))
    for r in missing_tool_results(rows):
        n += 1
        rows.append(row(n, "tool", r.content, call_id=r.tool_call_id, name=r.tool_name, error=True))
    rows.append(row(n + 1, "user", "latest"))
    msgs = to_api_messages(rows)
    assert valid(msgs), validate_request({"model": "m", "max_tokens": 10, "messages": msgs})


def test_a_compression_summary_is_not_a_user_turn():
    rows = [row(1, "user", "summary of before", meta={"compression_summary": True}), row(2, "user", "hi")]
    c = rebuild_counters(rows, nudge_interval=10)
    assert c.user_turns == 1 and c.raw_since_memory == 1
