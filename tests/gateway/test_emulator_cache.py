"""Prompt-cache accounting: through the real SDK for the headline behaviours, and on
``PromptCache`` directly for the rules (lookback, TTLs, normalisation, invariants)."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mnemo.gateway.emulator import Emulator, ManualClock, PromptCache, Reply, prefix_blocks
from mnemo.memory.tokens import estimate_json_tokens

MODEL = "claude-test-1"
EPHEMERAL = {"type": "ephemeral"}
BIG_SYSTEM = "You are a careful assistant. " * 400  # ~2,900 tokens, above the 1,024 minimum


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1000.0)


@pytest.fixture
async def emu(clock: ManualClock) -> AsyncIterator[Emulator]:
    async with Emulator(clock=clock, responder=lambda req: Reply("ok")) as e:
        yield e


def sdk(emu: Emulator) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=emu.base_url, api_key="test", max_retries=0)


def system(text: str = BIG_SYSTEM, ttl: str | None = None) -> list[dict[str, Any]]:
    cc = {**EPHEMERAL, "ttl": ttl} if ttl else EPHEMERAL
    return [{"type": "text", "text": text, "cache_control": cc}]


async def ask(
    emu: Emulator, sys: Any = None, text: str = "hello", model: str = MODEL
) -> anthropic.types.Usage:
    kw: dict[str, Any] = {"system": sys if sys is not None else system()}
    msg = await sdk(emu).messages.create(
        model=model, max_tokens=20, messages=[{"role": "user", "content": text}], **kw
    )
    return msg.usage


def system_tokens(text: str = BIG_SYSTEM) -> int:
    return estimate_json_tokens({"type": "text", "text": text})


async def test_repeated_prefix_is_written_then_read(emu: Emulator) -> None:
    first = await ask(emu)
    assert first.cache_creation_input_tokens == system_tokens() and first.cache_read_input_tokens == 0
    assert first.cache_creation.ephemeral_5m_input_tokens == system_tokens()
    second = await ask(emu, text="another question")
    assert second.cache_read_input_tokens == system_tokens() and second.cache_creation_input_tokens == 0
    # input_tokens counts only what follows the last breakpoint: the user message.
    assert second.input_tokens == estimate_json_tokens({"type": "text", "text": "another question"})


async def test_prefix_below_the_minimum_is_never_cached(emu: Emulator) -> None:
    small = system("Short system prompt.")
    for _ in range(2):
        usage = await ask(emu, small)
        assert usage.cache_read_input_tokens == 0 and usage.cache_creation_input_tokens == 0
        assert usage.input_tokens == system_tokens("Short system prompt.") + estimate_json_tokens(
            {"type": "text", "text": "hello"}
        )
    emu.min_cacheable_tokens = 5
    await ask(emu, small)
    assert (await ask(emu, small)).cache_read_input_tokens == system_tokens("Short system prompt.")


async def test_entry_expires_after_five_minutes(emu: Emulator, clock: ManualClock) -> None:
    await ask(emu)
    clock.advance(299)
    assert (await ask(emu)).cache_read_input_tokens > 0
    clock.advance(301)  # the read above refreshed the TTL; now it is past it
    again = await ask(emu)
    assert again.cache_read_input_tokens == 0 and again.cache_creation_input_tokens == system_tokens()


async def test_a_read_refreshes_the_ttl(emu: Emulator, clock: ManualClock) -> None:
    await ask(emu)
    for _ in range(4):  # 4 x 200 s: far beyond 5 minutes in total, never 5 minutes idle
        clock.advance(200)
        assert (await ask(emu)).cache_read_input_tokens == system_tokens()


async def test_one_hour_ttl(emu: Emulator, clock: ManualClock) -> None:
    first = await ask(emu, system(ttl="1h"))
    assert first.cache_creation.ephemeral_1h_input_tokens == system_tokens()
    clock.advance(3000)
    assert (await ask(emu, system(ttl="1h"))).cache_read_input_tokens == system_tokens()
    clock.advance(3601)
    assert (await ask(emu, system(ttl="1h"))).cache_read_input_tokens == 0


async def test_changed_system_prompt_does_not_hit(emu: Emulator) -> None:
    await ask(emu)
    changed = await ask(emu, system(BIG_SYSTEM + " Now with one more sentence."))
    assert changed.cache_read_input_tokens == 0 and changed.cache_creation_input_tokens > 0


async def test_model_change_means_no_hit(emu: Emulator) -> None:
    await ask(emu)
    assert (await ask(emu, model="claude-other-2")).cache_read_input_tokens == 0
    assert (await ask(emu)).cache_read_input_tokens == system_tokens()


async def test_more_than_four_breakpoints_is_a_400(emu: Emulator) -> None:
    blocks = [{"type": "text", "text": f"part {i}", "cache_control": EPHEMERAL} for i in range(5)]
    with pytest.raises(anthropic.BadRequestError, match="maximum of 4"):
        await ask(emu, blocks)
    assert emu.last_request.usage is None


async def test_growing_conversation_with_system_and_3_reads_the_previous_prefix(emu: Emulator) -> None:
    """Markers move every turn (string content re-sent as a list and back) and still hit."""
    history: list[dict[str, Any]] = []
    usages = []
    for turn in range(6):
        history.append({"role": "user", "content": f"question number {turn} " * 20})
        messages = copy.deepcopy(history)
        for msg in messages[-3:]:
            msg["content"] = [{"type": "text", "text": msg["content"], "cache_control": EPHEMERAL}]
        reply = await sdk(emu).messages.create(model=MODEL, max_tokens=20, system=system(), messages=messages)
        usages.append(reply.usage)
        history.append({"role": "assistant", "content": reply.content[0].text})
    for prev, usage in zip(usages, usages[1:], strict=False):
        prev_total = prev.input_tokens + prev.cache_read_input_tokens + prev.cache_creation_input_tokens
        assert usage.cache_read_input_tokens == prev_total  # everything sent before was cached
        assert usage.input_tokens == 0  # the last breakpoint is on the newest message
    total = emu.total_usage()
    assert total.cache_read_share > 0.6


# -- PromptCache directly ----------------------------------------------------------------


def body(blocks: int, marks: tuple[int, ...], model: str = MODEL, word: str = "block") -> dict[str, Any]:
    """One user message with ``blocks`` text blocks, breakpoints at ``marks``."""
    content = [
        {"type": "text", "text": f"{word} {i} " * 30, **({"cache_control": EPHEMERAL} if i in marks else {})}
        for i in range(blocks)
    ]
    return {"model": model, "max_tokens": 10, "messages": [{"role": "user", "content": content}]}


def test_lookback_reaches_twenty_blocks_back_and_no_further() -> None:
    cache = PromptCache(ManualClock(), min_cacheable_tokens=1)
    cache.account(body(1, (0,)))
    assert cache.account(body(21, (20,))).cache_read_input_tokens > 0  # block 0 is 20 back
    cache.clear()
    cache.account(body(1, (0,)))
    assert cache.account(body(22, (21,))).cache_read_input_tokens == 0  # 21 back: missed
    # An earlier breakpoint within the window rescues it.
    assert cache.account(body(22, (0, 21))).cache_read_input_tokens > 0


def test_longest_live_prefix_wins() -> None:
    cache = PromptCache(ManualClock(), min_cacheable_tokens=1)
    cache.account(body(3, (0, 2)))
    usage = cache.account(body(5, (0, 2, 4)))
    blocks = prefix_blocks(body(5, (0, 2, 4)))
    assert usage.cache_read_input_tokens == blocks[2].tokens
    assert usage.cache_creation_input_tokens == blocks[4].tokens - blocks[2].tokens
    assert usage.input_tokens == 0


def test_tokens_after_the_last_breakpoint_are_plain_input() -> None:
    cache = PromptCache(ManualClock(), min_cacheable_tokens=1)
    blocks = prefix_blocks(body(4, (1,)))
    usage = cache.account(body(4, (1,)))
    assert usage.cache_creation_input_tokens == blocks[1].tokens
    assert usage.input_tokens == blocks[3].tokens - blocks[1].tokens


def test_no_breakpoint_means_all_plain_input() -> None:
    cache = PromptCache(ManualClock(), min_cacheable_tokens=1)
    for _ in range(2):
        usage = cache.account(body(3, ()))
        assert (
            usage.input_tokens == prefix_blocks(body(3, ()))[-1].tokens and usage.cache_read_input_tokens == 0
        )
    assert len(cache) == 0


def test_tools_are_part_of_the_prefix() -> None:
    cache = PromptCache(ManualClock(), min_cacheable_tokens=1)
    tool = {"name": "t", "input_schema": {"type": "object"}}
    with_tool = {**body(2, (1,)), "tools": [tool]}
    cache.account(with_tool)
    assert cache.account(with_tool).cache_read_input_tokens == prefix_blocks(with_tool)[-1].tokens
    renamed = {**body(2, (1,)), "tools": [{**tool, "description": "changed"}]}
    assert cache.account(renamed).cache_read_input_tokens == 0


def test_tool_choice_change_invalidates_the_messages_part() -> None:
    cache = PromptCache(ManualClock(), min_cacheable_tokens=1)
    tools = [{"name": "t", "input_schema": {"type": "object"}, "cache_control": EPHEMERAL}]
    base = {**body(2, (1,)), "tools": tools}
    cache.account(base)
    other = {**base, "tool_choice": {"type": "any"}}
    usage = cache.account(other)
    assert usage.cache_read_input_tokens == prefix_blocks(other)[0].tokens  # the tools still hit


def test_marker_position_and_string_form_do_not_change_keys() -> None:
    as_string = {"model": MODEL, "system": "S" * 50, "messages": [{"role": "user", "content": "hi"}]}
    as_list = {
        "model": MODEL,
        "system": [{"type": "text", "text": "S" * 50, "cache_control": EPHEMERAL}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": EPHEMERAL}]}
        ],
    }
    assert [b.key for b in prefix_blocks(as_string)] == [b.key for b in prefix_blocks(as_list)]
    assert [b.ttl for b in prefix_blocks(as_list)] == ["5m", "5m"]


def test_automatic_cache_control_marks_the_last_block() -> None:
    cache = PromptCache(ManualClock(), min_cacheable_tokens=1)
    auto = {**body(3, ()), "cache_control": EPHEMERAL}
    assert prefix_blocks(auto)[-1].ttl == "5m"
    cache.account(auto)
    assert cache.account(auto).cache_read_input_tokens == prefix_blocks(auto)[-1].tokens


def test_clock_swapped_after_construction_is_used() -> None:
    emu = Emulator()
    clock = ManualClock(0)
    emu.clock = clock
    emu.cache.min_cacheable_tokens = 1
    emu.cache.account(body(1, (0,)))
    clock.advance(301)
    assert emu.cache.account(body(1, (0,))).cache_read_input_tokens == 0


request_plans = st.lists(
    st.tuples(
        st.integers(min_value=1, max_value=30),  # blocks in the request
        st.sets(st.integers(min_value=0, max_value=29), max_size=4),  # breakpoints
        st.integers(min_value=0, max_value=400),  # seconds before it
        st.sampled_from(["block", "other"]),  # content family (shared prefixes or not)
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(plan=request_plans, minimum=st.sampled_from([1, 100, 1024]))
def test_usage_always_adds_up(plan: list[tuple[int, set[int], int, str]], minimum: int) -> None:
    clock = ManualClock()
    cache = PromptCache(clock, min_cacheable_tokens=minimum)
    for blocks, marks, wait, word in plan:
        clock.advance(wait)
        request = body(blocks, tuple(m for m in marks if m < blocks), word=word)
        prefix = prefix_blocks(request)
        usage = cache.account(request)
        assert min(usage.input_tokens, usage.cache_read_input_tokens, usage.cache_creation_input_tokens) >= 0
        assert usage.total_input_tokens == prefix[-1].tokens
        assert (
            usage.cache_creation_input_tokens
            == usage.cache_creation_5m_tokens + usage.cache_creation_1h_tokens
        )
        if usage.cache_read_input_tokens or usage.cache_creation_input_tokens:
            assert max(usage.cache_read_input_tokens + usage.cache_creation_input_tokens, 0) >= minimum
        # Asking again at once reads at least everything that was just cached.
        assert cache.account(request).cache_read_input_tokens >= (
            usage.cache_read_input_tokens + usage.cache_creation_input_tokens
        )
