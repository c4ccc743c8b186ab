"""``validate_request``: what the real API refuses, refused with a useful message;
what it accepts, accepted."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mnemo.gateway.emulator import validate_request

EPHEMERAL = {"type": "ephemeral"}
TOOL = {"name": "memory", "input_schema": {"type": "object", "properties": {}}}

_VALID: dict[str, Any] = {
    "model": "claude-test-1",
    "max_tokens": 100,
    "system": [{"type": "text", "text": "You help.", "cache_control": EPHEMERAL}],
    "tools": [TOOL],
    "messages": [
        {"role": "user", "content": "remember I like tea"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Saving."},
                {"type": "tool_use", "id": "toolu_1", "name": "memory", "input": {"action": "add"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": '{"success": true}'},
                {"type": "text", "text": "thanks"},
            ],
        },
        {"role": "assistant", "content": "You're welcome."},
    ],
}


def valid() -> dict[str, Any]:
    return copy.deepcopy(_VALID)


def test_a_full_valid_conversation_passes() -> None:
    assert validate_request(valid()) is None


def test_a_final_assistant_message_with_an_open_tool_use_passes() -> None:
    body = valid()
    body["messages"] = body["messages"][:2]
    assert validate_request(body) is None


def test_an_empty_final_assistant_message_passes() -> None:
    body = valid()
    body["messages"][-1]["content"] = ""
    assert validate_request(body) is None


def _set(path: str, value: Any) -> Any:
    def mutate(body: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = body
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        if value is _DELETE:
            del node[int(last) if last.isdigit() else last]
        else:
            node[int(last) if last.isdigit() else last] = value

    return mutate


_DELETE = object()

CASES = [
    ("no model", _set("model", _DELETE), "model: Field required"),
    ("empty model", _set("model", ""), "model"),
    ("no max_tokens", _set("max_tokens", _DELETE), "max_tokens: Field required"),
    ("zero max_tokens", _set("max_tokens", 0), "max_tokens"),
    ("bool max_tokens", _set("max_tokens", True), "max_tokens"),
    ("unknown field", _set("temperatureX", 1), "temperatureX: Extra inputs are not permitted"),
    ("bad temperature", _set("temperature", 3), "temperature"),
    ("no messages", _set("messages", _DELETE), "messages: Field required"),
    ("empty messages", _set("messages", []), "at least one message"),
    ("assistant first", _set("messages.0.role", "assistant"), 'first message must use the "user" role'),
    ("system role", _set("messages.0.role", "system"), "messages.0.role"),
    ("empty user text", _set("messages.0.content", ""), "non-empty content"),
    ("empty text block", _set("messages.1.content.0.text", ""), "text content blocks must be non-empty"),
    ("unknown block", _set("messages.1.content.0.type", "video"), "'video'"),
    ("tool_use in user", _set("messages.2.content.1", {"type": "tool_use", "id": "x", "name": "m", "input": {}}),
     "can only be in `assistant` messages"),
    ("tool_use without input", _set("messages.1.content.1.input", _DELETE), "input"),
    ("result without use", _set("messages.2.content.0.tool_use_id", "toolu_other"),
     "unexpected `tool_use_id` found in `tool_result` blocks: toolu_other"),
    ("result after text", _set("messages.2.content", [{"type": "text", "text": "hi"},
     {"type": "tool_result", "tool_use_id": "toolu_1"}]), "must come before any other content"),
    ("use never answered", _set("messages.2.content", "no result here"),
     "`tool_use` ids were found without `tool_result` blocks immediately after: toolu_1"),
    ("system not text", _set("system", [{"type": "image", "text": "x"}]), "system.0"),
    ("system number", _set("system", 5), "system"),
    ("tool without schema", _set("tools.0.input_schema", _DELETE), "tools.0.input_schema: Field required"),
    ("tool bad name", _set("tools.0.name", "has space"), "tools.0.name"),
    ("duplicate tools", _set("tools", [TOOL, TOOL]), "duplicate"),
    ("tool_choice unknown tool", _set("tool_choice", {"type": "tool", "name": "nope"}), "tool_choice.name"),
    ("bad cache_control type", _set("system.0.cache_control", {"type": "persistent"}), "ephemeral"),
    ("bad ttl", _set("system.0.cache_control", {"type": "ephemeral", "ttl": "2h"}), "ttl"),
    ("bad image", _set("messages.0.content",
                       [{"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": "x"}}]),
     "media_type"),
    ("stream not bool", _set("stream", "yes"), "stream"),
]  # fmt: skip


@pytest.mark.parametrize(("mutate", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_invalid_requests_are_refused_with_a_message(mutate: Any, expected: str) -> None:
    body = valid()
    mutate(body)
    problem = validate_request(body)
    assert problem is not None and expected in problem


def test_roles_must_alternate() -> None:
    body = valid()
    body["messages"].insert(1, {"role": "user", "content": "again"})
    assert 'found multiple "user" roles in a row' in (validate_request(body) or "")


def test_tool_use_ids_must_be_unique() -> None:
    body = valid()
    body["messages"] += [
        {"role": "user", "content": "more"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "memory", "input": {}}],
        },
    ]
    assert "unique" in (validate_request(body) or "")


def test_tool_result_must_answer_the_immediately_preceding_assistant_turn() -> None:
    body = valid()
    body["messages"] += [
        {"role": "user", "content": "more"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "late"}]},
    ]
    assert "toolu_1" in (validate_request(body) or "")


def _with_breakpoints(n: int) -> dict[str, Any]:
    body = valid()
    body["system"] = [{"type": "text", "text": f"s{i}", "cache_control": EPHEMERAL} for i in range(n)]
    return body


def test_four_breakpoints_pass_five_fail() -> None:
    assert validate_request(_with_breakpoints(3)) is None  # + none elsewhere
    body = _with_breakpoints(3)
    body["tools"] = [{**TOOL, "cache_control": EPHEMERAL}]
    assert validate_request(body) is None
    body["messages"][0]["content"] = [{"type": "text", "text": "x", "cache_control": EPHEMERAL}]
    assert validate_request(body) == "A maximum of 4 blocks with cache_control may be provided. Found 5."


def test_automatic_caching_takes_a_slot() -> None:
    body = _with_breakpoints(4)
    assert validate_request(body) is None
    body["cache_control"] = EPHEMERAL
    assert "Found 5" in (validate_request(body) or "")


def test_one_hour_breakpoints_must_come_before_five_minute_ones() -> None:
    body = valid()
    body["system"] = [
        {"type": "text", "text": "a", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
        {"type": "text", "text": "b", "cache_control": {"type": "ephemeral", "ttl": "5m"}},
    ]
    assert validate_request(body) is None
    body["system"].reverse()
    assert "must not come after" in (validate_request(body) or "")


def test_non_object_body() -> None:
    assert validate_request([1, 2]) is not None
    assert validate_request(None) is not None


# -- generated conversations ---------------------------------------------------------------

turn = st.tuples(
    st.text(min_size=1, max_size=20).filter(str.strip),  # user text
    st.integers(min_value=0, max_value=3),  # tool calls the assistant makes in that turn
)


def conversation(turns: list[tuple[str, int]]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    n = 0
    for text, calls in turns:
        messages.append({"role": "user", "content": text})
        for _ in range(calls):
            n += 1
            messages.append(
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": f"toolu_{n}", "name": "memory", "input": {}}],
                }
            )
            messages.append(
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": "ok"}],
                }
            )
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "done"}]})
    return messages


@settings(max_examples=100, deadline=None)
@given(turns=st.lists(turn, min_size=1, max_size=6), data=st.data())
def test_generated_conversations_are_valid_and_dropping_a_result_is_not(
    turns: list[tuple[str, int]], data: st.DataObject
) -> None:
    messages = conversation(turns)
    body = {"model": "m", "max_tokens": 5, "tools": [TOOL], "messages": messages}
    assert validate_request(body) is None
    results = [
        i
        for i, m in enumerate(messages)
        if isinstance(m["content"], list) and m["content"][0]["type"] == "tool_result"
    ]
    if results:
        broken = copy.deepcopy(body)
        i = data.draw(st.sampled_from(results))
        broken["messages"][i]["content"] = "the result went missing"
        assert "without `tool_result` blocks" in (validate_request(broken) or "")
