"""The typed provider writes and their job payload (``memory/writes.py``): every operation
comes back from its stored JSON as it went in, payloads of the previous version decode to
``LegacyWrite`` with their fields intact, and a malformed payload is a ``ValueError``
naming what is wrong — never another exception inside the job queue's handler."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mnemo.memory.curated import Action, Target
from mnemo.memory.durable import forget_user
from mnemo.memory.memory_tool import MemoryWrite
from mnemo.memory.provider import ProviderContext
from mnemo.memory.provider_scope import ProviderScope
from mnemo.memory.scope import AgentContext, UserRef
from mnemo.memory.writes import (
    CONVERSATION_MESSAGES,
    SAID_MAX_CHARS,
    ForgetUser,
    LegacyWrite,
    MirrorWrite,
    PreCompress,
    ProviderWrite,
    Remember,
    Said,
    SessionEnd,
    SyncTurn,
    WriteOp,
    label,
)

SCOPE = ProviderScope("telegram:1", "s1", "mnemo")
text = st.text(max_size=200)
said = st.builds(Said, st.sampled_from(["user", "assistant"]), text)
operations = st.one_of(
    st.builds(SyncTurn, text, text),
    st.builds(MirrorWrite, text),
    st.builds(SessionEnd, st.lists(said, max_size=5).map(tuple)),
    st.builds(PreCompress, st.lists(said, max_size=5).map(tuple)),
    st.builds(Remember, text, st.sampled_from(["remember", "conclude", "retain"])),
)


def ctx(user: str = "telegram:1", session: str = "s1") -> ProviderContext:
    return ProviderContext(
        session, "telegram:dm:1", "telegram", UserRef.parse(user), AgentContext.PRIMARY, Path(".")
    )


def through_json(payload: dict[str, Any]) -> ProviderWrite:
    return ProviderWrite.from_payload(json.loads(json.dumps(payload)))


@given(operations)
def test_every_operation_comes_back_from_its_payload(operation: Any) -> None:
    write = ProviderWrite.of(operation, ctx(), SCOPE)
    assert through_json(write.to_payload()) == write
    assert write.to_payload()["op"] == operation.op.value and write.key.startswith(label(operation))


def test_the_key_is_the_turns_and_the_contents() -> None:
    a = ProviderWrite.of(SyncTurn("hi", "hello"), ctx(), SCOPE)
    assert a.key == ProviderWrite.of(SyncTurn("hi", "hello"), ctx(), SCOPE).key
    others = [
        ProviderWrite.of(SyncTurn("hi", "hello!"), ctx(), SCOPE),
        ProviderWrite.of(SyncTurn("hi", "hello"), ctx(session="s2"), SCOPE),
        ProviderWrite.of(SyncTurn("hi", "hello"), ctx(user="telegram:2"), SCOPE),
        ProviderWrite.of(SessionEnd((Said("user", "hi"),)), ctx(), SCOPE),
        ProviderWrite.of(PreCompress((Said("user", "hi"),)), ctx(), SCOPE),
    ]
    assert len({a.key, *(w.key for w in others)}) == 6


def test_a_previous_versions_payload_is_a_legacy_write_with_its_fields() -> None:
    old = {
        "op": "turn",
        "key": "turn-ab",
        "scope": SCOPE.as_dict(),
        "content": "user: a\nassistant: b",
        "x": 1,
    }
    write = through_json(old)
    assert write == ProviderWrite(
        LegacyWrite(WriteOp.TURN, {"content": "user: a\nassistant: b", "x": 1}), "turn-ab", SCOPE
    )
    assert write.to_payload() == old  # kept as it was, should it be queued again


def test_an_erasure_is_one_write_per_user_with_no_session() -> None:
    write = through_json(forget_user("telegram:1"))
    assert write.operation == ForgetUser() and write.scope.user_id == "telegram:1"
    assert write.session_id == "" and write.key == through_json(forget_user("telegram:1")).key
    assert write.key != through_json(forget_user("telegram:2")).key
    old = through_json({"op": "forget_user", "key": "forget-1", "user_id": "telegram:3"})  # oldest form
    assert old.scope.user_id == "telegram:3"


@pytest.mark.parametrize(
    "payload, reason",
    [
        ({"op": "nope", "key": "k", "scope": SCOPE.as_dict()}, "unknown provider write operation"),
        ({"op": "turn", "scope": SCOPE.as_dict(), "v": 2, "user": "a", "assistant": "b"}, "no key"),
        ({"op": "turn", "key": "k", "scope": SCOPE.as_dict(), "v": 2, "user": "a"}, "malformed"),
        ({"op": "turn", "key": "k", "v": 2, "user": "a", "assistant": "b"}, "malformed"),
        ({"op": "forget_user", "key": "k", "scope": {}}, "no user_id"),
    ],
)
def test_a_malformed_payload_says_what_is_wrong(payload: dict[str, Any], reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        ProviderWrite.from_payload(payload)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)


@given(
    st.fixed_dictionaries(
        {},
        optional={
            "op": st.sampled_from([*(o.value for o in WriteOp), "x"]) | json_values,
            "key": st.text(max_size=5) | json_values,
            "scope": json_values,
            "v": st.just(2) | json_values,
            "user": json_values,
            "assistant": json_values,
            "content": json_values,
            "messages": json_values,
        },
    )
)
def test_any_payload_decodes_or_is_a_value_error(payload: dict[str, Any]) -> None:
    try:
        ProviderWrite.from_payload(payload)
    except ValueError:
        pass


def test_a_mirror_is_the_speakers_own_entry_added_or_replaced() -> None:
    mine = MemoryWrite(Action.ADD, Target.USER, UserRef.parse("telegram:1"), "likes tea", None)
    shared = MemoryWrite(Action.REPLACE, Target.MEMORY, None, "the server is in Oslo", "old")
    theirs = MemoryWrite(Action.ADD, Target.USER, UserRef.parse("telegram:2"), "secret", None)
    removal = MemoryWrite(Action.REMOVE, Target.USER, UserRef.parse("telegram:1"), None, "likes tea")
    assert MirrorWrite.of(mine, ctx()) == MirrorWrite("likes tea")
    assert MirrorWrite.of(shared, ctx()) == MirrorWrite("the server is in Oslo")
    assert MirrorWrite.of(theirs, ctx()) is None and MirrorWrite.of(removal, ctx()) is None


def test_a_conversation_keeps_what_was_said_bounded() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "image"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]},
        {"role": "assistant", "content": "x" * (SAID_MAX_CHARS + 10)},
        {"role": "system", "content": "not said"},
        {"role": "user", "content": "   "},
    ]
    end = SessionEnd.of(messages)
    assert end is not None and end.messages == (
        Said("user", "hello"),
        Said("assistant", "x" * SAID_MAX_CHARS),
    )
    assert SessionEnd.of(messages[1:3]) is None and PreCompress.of([]) is None
    many = [{"role": "user", "content": f"m{i}"} for i in range(CONVERSATION_MESSAGES + 5)]
    long = PreCompress.of(many)
    assert long is not None and len(long.messages) == CONVERSATION_MESSAGES
    assert long.messages[-1].text == f"m{CONVERSATION_MESSAGES + 4}"
