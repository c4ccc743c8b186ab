"""The context compressor's phases one by one, and the flush/review helpers."""

from __future__ import annotations

import pytest

from mnemo.memory.compressor import (
    PRUNED,
    SUMMARY_END,
    SUMMARY_KEY,
    TEMPLATE,
    TRIM_KEY,
    CompressionPolicy,
    ContextCompressor,
    is_summary,
    rows_tokens,
    summary_text,
    transcript,
)
from mnemo.memory.flush import MemoryPass, instruction, memory_pass_prompt, review_window, user_turns
from mnemo.memory.sessions import NewMessage, ToolCall
from tests.memory.test_compressor_properties import POLICY, row, to_rows, valid

HEADINGS = [line for line in TEMPLATE.splitlines()]


def chat(n_turns: int, size: int = 300, start: int = 1) -> list:
    rows, i = [], start
    for t in range(n_turns):
        rows.append(row(i, "user", f"question {t} " + "q" * size))
        rows.append(row(i + 1, "assistant", f"answer {t} " + "a" * size))
        i += 2
    return rows


def tool_turn(i: int, output: str) -> list:
    call = ToolCall(f"call{i}", "lookup", {"q": "x"})
    return [
        row(i, "user", "look it up"),
        row(i + 1, "assistant", "", calls=[call]),
        row(i + 2, "tool", output, call_id=call.id, tool_name="lookup"),
        row(i + 3, "assistant", "found it"),
    ]


def test_history_under_the_threshold_is_unchanged():
    rows = chat(3)
    assert rows_tokens(rows) < POLICY.threshold_tokens
    assert ContextCompressor(POLICY).plan(rows) is None


def test_overhead_counts_toward_the_threshold():
    rows = chat(8, size=300)
    c = ContextCompressor(POLICY)
    assert c.plan(rows) is None
    assert c.plan(rows, overhead_tokens=POLICY.threshold_tokens - rows_tokens(rows)) is not None


def test_head_is_the_first_three_messages_and_keeps_its_tool_results():
    rows = [row(1, "user", "start"), *tool_turn(2, "r" * 150)[1:], *chat(40, start=100)]
    # head_messages=2 would cut between a call and its result: the head grows instead.
    c = ContextCompressor(CompressionPolicy(context_window=8_000, head_messages=2))
    plan = c.plan(rows)
    assert plan is not None
    assert [r.role for r in plan.head] == ["user", "assistant", "tool"]


def test_old_long_tool_results_in_the_head_are_pruned_short_ones_kept():
    long_rows = [*tool_turn(1, "x" * 201)[:3], *chat(40, start=100)]
    short_rows = [*tool_turn(1, "x" * 200)[:3], *chat(40, start=100)]
    c = ContextCompressor(POLICY)
    out_long = c.assemble(c.plan(long_rows), "S")
    out_short = c.assemble(c.plan(short_rows), "S")
    assert out_long[2].content == PRUNED and out_long[2].tool_call_id == "call1"
    assert out_long[2].token_count is None, "a pruned row's size is estimated again"
    assert out_short[2].content == "x" * 200


def test_tool_results_in_the_tail_are_never_pruned():
    rows = [*chat(40), *tool_turn(500, "y" * 5000)]
    c = ContextCompressor(POLICY)
    out = c.assemble(c.plan(rows), "S")
    assert out[-2].content == "y" * 5000


def test_tail_never_opens_on_a_tool_result():
    rows = chat(30)
    call_ids = []
    i = 1000
    for k in range(6):
        call = ToolCall(f"c{k}", "lookup", {})
        call_ids.append(call.id)
        rows += [row(i, "assistant", "", calls=[call]), row(i + 1, "tool", "o" * 900, call_id=call.id)]
        i += 2
    rows += [row(i, "user", "and now?"), row(i + 1, "assistant", "done")]
    c = ContextCompressor(POLICY)
    plan = c.plan(rows)
    assert plan is not None and plan.tail[0].role != "tool"
    assert valid(c.assemble(plan, "S"))


def test_latest_user_message_and_reply_are_kept_even_over_the_tail_budget():
    rows = [*chat(30), row(900, "user", "u" * 8000), row(901, "assistant", "r" * 8000)]
    c = ContextCompressor(POLICY)
    plan = c.plan(rows)
    assert [r.id for r in plan.tail][-2:] == [900, 901] and len(plan.tail) == POLICY.tail_min_messages
    assert rows_tokens(plan.tail) > POLICY.tail_budget


def test_tail_budget_scales_with_the_context_window():
    small = CompressionPolicy(context_window=8_000)
    large = CompressionPolicy(context_window=200_000)
    assert small.tail_budget == 800 and large.tail_budget == 20_000
    rows = chat(400)
    tail_small = ContextCompressor(small).plan(rows, force=True).tail
    tail_large = ContextCompressor(large).plan(rows, force=True).tail
    assert len(tail_large) > len(tail_small) >= small.tail_min_messages


def test_summary_budget_is_a_fifth_of_the_middle_clamped():
    p = CompressionPolicy(context_window=200_000)
    assert p.summary_budget(1_000) == 2_000
    assert p.summary_budget(20_000) == 4_000
    assert p.summary_budget(500_000) == 10_000
    assert CompressionPolicy(context_window=8_000).summary_budget(50_000) == 1_000


def test_first_summary_request_uses_the_template_and_the_turns():
    c = ContextCompressor(POLICY)
    rows = [row(1, "user", "hi"), row(2, "assistant", "hello"), row(3, "user", "ok"), *chat(40, start=10)]
    plan = c.plan(rows)
    req = c.summary_request(plan)
    for heading in HEADINGS:
        assert heading in req.prompt
    assert "Historical" in req.prompt and "PREVIOUS SUMMARY" not in req.prompt
    assert "[user Ada] question 0" in req.prompt and "[assistant] answer 0" in req.prompt
    assert req.max_tokens == plan.summary_budget and "summar" in req.system.lower()


def test_update_request_carries_the_previous_summary():
    c = ContextCompressor(POLICY)
    first = c.plan(chat(40), force=True)
    stored = to_rows(c.assemble(first, "## Goal\nShip the parser."), 5_000)
    plan = c.plan([*stored, *chat(40, start=9_000)], force=True)
    assert plan.previous_summary == "## Goal\nShip the parser."
    req = c.summary_request(plan)
    assert "PREVIOUS SUMMARY:\n## Goal\nShip the parser." in req.prompt
    assert "PRESERVE all existing information" in req.prompt and "NEW TURNS TO INCORPORATE" in req.prompt
    assert "[CONTEXT SUMMARY" not in req.prompt.split("NEW TURNS TO INCORPORATE")[1], (
        "the old summary is not a turn"
    )


def test_summary_message_is_user_role_marked_and_ends_with_the_marker():
    c = ContextCompressor(POLICY)
    plan = c.plan(chat(40))
    out = c.assemble(plan, "  the summary  ", meta={"source_session": "old"})
    s = out[plan.head_end]
    assert s.role == "user" and s.meta[SUMMARY_KEY] and s.meta["source_session"] == "old"
    assert s.content.endswith(SUMMARY_END) and summary_text(s) == "the summary"
    assert s.meta["summarised_messages"] == len(plan.middle)


def test_earlier_summary_still_in_the_tail_means_nothing_to_compress():
    c = ContextCompressor(POLICY)
    summary = NewMessage(role="user", content="old summary", meta={SUMMARY_KEY: True, "summary": "old"})
    rows = [*chat(2), *to_rows([summary], 50), row(60, "user", "x" * 20_000), row(61, "assistant", "y")]
    assert c.plan(rows, force=True) is None


def test_rows_appended_after_the_plan_land_in_the_tail_once_in_order():
    c = ContextCompressor(POLICY)
    rows = chat(40)
    plan = c.plan(rows)
    later = [row(500, "user", "late 1"), row(501, "assistant", "reply 1"), row(502, "user", "late 2")]
    out = c.assemble(plan, "S", current=[*rows, *later])
    assert [m.content for m in out[-3:]] == ["late 1", "reply 1", "late 2"]
    assert sum(1 for m in out if m.content == "late 1") == 1
    assert out[-4].content == rows[-1].content


def test_assemble_refuses_a_history_that_is_not_an_extension():
    c = ContextCompressor(POLICY)
    rows = chat(40)
    plan = c.plan(rows)
    with pytest.raises(ValueError, match="append-only"):
        c.assemble(plan, "S", current=rows[:-1])
    with pytest.raises(ValueError, match="append-only"):
        c.assemble(plan, "S", current=[row(999, "user", "other"), *rows[1:]])


def test_carried_rows_keep_author_platform_id_meta_and_time():
    c = ContextCompressor(POLICY)
    rows = chat(40)
    plan = c.plan(rows)
    out = c.assemble(plan, "S")
    first, original = out[0], rows[0]
    assert (first.author_name, first.platform_message_id, first.created_at) == (
        original.author_name,
        original.platform_message_id,
        original.created_at,
    )
    assert first.meta["carried_from"] == original.id


def test_fallback_summary_fills_the_template_and_keeps_an_earlier_summary():
    c = ContextCompressor(POLICY)
    stored = to_rows(c.assemble(c.plan(chat(40), force=True), "EARLIER FACTS"), 5_000)
    rows = [*stored, row(9_000, "user", "edit src/parser.py please"), *chat(40, start=9_001)]
    plan = c.plan(rows, force=True)
    text = c.fallback_summary(plan)
    for heading in HEADINGS:
        assert heading in text
    assert "EARLIER FACTS" in text and "src/parser.py" in text
    assert c.fallback_summary(plan) == text, "deterministic"


def test_trim_keeps_head_last_summary_a_note_and_the_tail():
    c = ContextCompressor(POLICY)
    stored = to_rows(c.assemble(c.plan(chat(40), force=True), "KEEP ME"), 5_000)
    rows = [*stored, *chat(60, start=9_000)]
    trimmed = c.trim(rows, 3_000)
    assert rows_tokens(trimmed) <= 3_000
    assert trimmed[:3] == rows[:3]
    assert is_summary(trimmed[3]) and "KEEP ME" in trimmed[3].content
    assert trimmed[4].meta[TRIM_KEY] and "left out" in trimmed[4].content
    assert trimmed[-1] is rows[-1] and valid(trimmed)


def test_transcript_labels_roles_and_clips_tool_output():
    call = ToolCall("c1", "memory", {"action": "add", "content": "likes tea"})
    rows = [
        row(1, "user", "line one\nline two"),
        row(2, "assistant", "", calls=[call]),
        row(3, "tool", "r" * 500, call_id="c1", tool_name="memory"),
    ]
    text = transcript(rows)
    assert text.startswith("[user Ada] line one\n    line two")
    assert '[assistant calls memory] {"action": "add", "content": "likes tea"}' in text
    tool_line = text.splitlines()[-1]
    assert tool_line.startswith("[tool memory] ") and len(tool_line) < 300 and "characters cut" in tool_line


# --- memory/flush.py -----------------------------------------------------------------


def test_memory_pass_prompt_has_instruction_current_memory_and_turns_but_no_summaries():
    c = ContextCompressor(POLICY)
    stored = to_rows(c.assemble(c.plan(chat(40), force=True), "## Goal\nold"), 5_000)
    prompt = memory_pass_prompt(
        MemoryPass.COMPRESSION, stored, memory_block="MEMORY block", user_block="USER PROFILE block"
    )
    assert prompt.startswith(instruction(MemoryPass.COMPRESSION))
    assert "prioritize user preferences, corrections, and recurring patterns" in prompt
    assert "MEMORY block" in prompt and "USER PROFILE block" in prompt
    assert "## Goal" not in prompt and "[user Ada] question" in prompt


def test_memory_pass_prompt_without_a_profile_and_with_a_long_transcript():
    prompt = memory_pass_prompt(
        MemoryPass.REVIEW, chat(200), memory_block="", user_block=None, max_chars=2_000
    )
    assert "no user profile can be written" in prompt and "MEMORY.md, are empty" in prompt
    assert "older turns left out" in prompt and "question 199" in prompt and "question 0 " not in prompt


def test_user_turns_do_not_count_summaries():
    summary = to_rows([NewMessage(role="user", content="s", meta={SUMMARY_KEY: True})], 100)
    assert user_turns([*chat(3), *summary]) == 3


def test_review_window_starts_after_the_last_memory_write_and_is_bounded():
    rows = chat(10)
    write = row(100, "tool", "{}", call_id="c", meta={"memory_write": True})
    later = chat(3, start=200)
    assert review_window([*rows, write, *later], 20) == later
    assert user_turns(review_window(chat(30), 4)) == 4
