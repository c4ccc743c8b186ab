""" "system_and_3" breakpoints: never more than 4, on the system prompt and the last
three messages, computed on a copy (stored history is never mutated)."""

import copy

from hypothesis import given
from hypothesis import strategies as st

from mnemo.gateway.llm.client import MAX_BREAKPOINTS, apply_cache_breakpoints


def _markers(system_blocks, messages):
    n = sum(1 for b in system_blocks if "cache_control" in b)
    for m in messages:
        if isinstance(m["content"], list):
            n += sum(1 for b in m["content"] if "cache_control" in b)
    return n


def test_system_and_last_three_messages_are_marked():
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(7)]
    system, out = apply_cache_breakpoints("SYS", messages)
    assert system == [{"type": "text", "text": "SYS", "cache_control": {"type": "ephemeral"}}]
    marked = [
        i for i, m in enumerate(out) if isinstance(m["content"], list) and "cache_control" in m["content"][-1]
    ]
    assert marked == [4, 5, 6]
    assert all(isinstance(m["content"], str) for m in out[:4])


def test_list_content_gets_marker_on_last_block_and_old_markers_are_removed():
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "b"},
                {"type": "tool_use", "id": "t", "name": "x", "input": {}},
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "r"}]},
        {"role": "assistant", "content": "c"},
        {"role": "user", "content": "d"},
    ]
    before = copy.deepcopy(messages)
    _, out = apply_cache_breakpoints("S", messages)
    assert messages == before, "the input must not be mutated"
    assert "cache_control" not in out[0]["content"][0]
    assert "cache_control" not in out[1]["content"][0]
    assert "cache_control" in out[2]["content"][-1]
    assert out[3]["content"][-1]["cache_control"] == {"type": "ephemeral"}


def test_one_hour_ttl_only_on_the_system_prompt():
    system, out = apply_cache_breakpoints("S", [{"role": "user", "content": "x"}], system_ttl="1h")
    assert system[0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    assert out[0]["content"][0]["cache_control"] == {"type": "ephemeral"}


block = st.one_of(
    st.text(max_size=5),
    st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=3)}), max_size=3),
)


@given(st.text(max_size=5), st.lists(block, max_size=12))
def test_never_more_than_four_breakpoints(system, contents):
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": c} for i, c in enumerate(contents)]
    system_blocks, out = apply_cache_breakpoints(system, messages)
    assert _markers(system_blocks, out) <= MAX_BREAKPOINTS
    non_empty = [m for m in messages if m["content"]]
    assert _markers(system_blocks, out) == min(MAX_BREAKPOINTS, (1 if system else 0) + len(non_empty))
