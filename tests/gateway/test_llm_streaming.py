"""The LLM client's streamed call with the real SDK against the emulator's SSE: text
deltas reach the callback, the result is the same ``LLMResponse`` as without
streaming, and a stream that breaks after deltas is retried (the viewer told to start
over) or fails like any other request — never a partial answer."""

from __future__ import annotations

import pytest

from mnemo.gateway.budgets.charge import UNMETERED, Charge, RequestKind
from mnemo.gateway.config import LLMSettings
from mnemo.gateway.emulator import Emulator, Fault, Reply, ToolUse
from mnemo.gateway.errors import InvalidLLMRequest
from mnemo.gateway.llm.client import LLMClient

TURN = Charge(RequestKind.TURN)  # no gate here: the client on its own

MSG = [{"role": "user", "content": "hi"}]
TEXT = "A streamed answer that is long enough to arrive in several deltas. " * 4
TOOL = {"name": "lookup", "description": "Look it up.", "input_schema": {"type": "object", "properties": {}}}


async def _no_sleep(_: float) -> None:
    return None


_opened: list[LLMClient] = []  # closed after each test: the aiohttp transport's session


@pytest.fixture
async def emu():
    async with Emulator() as e:
        yield e
        while _opened:
            await _opened.pop().aclose()


def client(emu: Emulator) -> LLMClient:
    llm = LLMClient(
        LLMSettings(max_retries=2), gate=UNMETERED, base_url=emu.base_url, api_key="k", sleep=_no_sleep
    )
    _opened.append(llm)
    return llm


async def test_deltas_reach_the_callback_and_the_response_matches_the_unstreamed_one(emu: Emulator) -> None:
    emu.script(Reply(text=TEXT, tool_uses=[ToolUse("lookup", {"q": "x"}, id="toolu_1")]))
    emu.script(Reply(text=TEXT, tool_uses=[ToolUse("lookup", {"q": "x"}, id="toolu_1")]))
    deltas: list[str] = []
    llm = client(emu)
    streamed = await llm.create(charge=TURN, system="s", messages=MSG, tools=[TOOL], on_text=deltas.append)
    plain = await llm.create(charge=TURN, system="s", messages=MSG, tools=[TOOL])
    assert emu.requests[0].stream and not emu.requests[1].stream
    assert len(deltas) > 3 and "".join(deltas) == TEXT
    assert streamed.content == plain.content
    assert streamed.stop_reason == plain.stop_reason == "tool_use"
    assert (streamed.usage.input_tokens, streamed.usage.output_tokens) == (
        plain.usage.input_tokens,
        plain.usage.output_tokens,
    )
    assert streamed.tool_uses == (
        {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "x"}},
    )


async def test_a_failure_before_any_delta_is_retried_as_without_streaming(emu: Emulator) -> None:
    emu.script(Fault(status=529), Fault(status=500), Reply(text="ok"))
    resets: list[None] = []
    resp = await client(emu).create(
        charge=TURN, system="s", messages=MSG, on_text=lambda t: None, on_reset=lambda: resets.append(None)
    )
    assert resp.text == "ok" and resp.attempts == 3
    assert resets == [], "nothing was shown, nothing to take back"


async def test_a_stream_broken_after_deltas_is_retried_and_the_viewer_starts_over(emu: Emulator) -> None:
    emu.script(Fault(status=529, mid_stream=True), Reply(text=TEXT))
    shown: list[str] = []

    def reset() -> None:
        shown.clear()

    resp = await client(emu).create(
        charge=TURN, system="s", messages=MSG, on_text=shown.append, on_reset=reset
    )
    assert resp.text == TEXT and resp.attempts == 2
    assert "".join(shown) == TEXT, "the partial text was taken back before the retry"


async def test_a_stream_broken_for_good_raises_and_returns_no_partial_answer(emu: Emulator) -> None:
    emu.script(Fault(status=400, mid_stream=True, body="bad request mid-stream"))
    shown: list[str] = []
    resets: list[None] = []
    with pytest.raises(InvalidLLMRequest):
        await client(emu).create(
            charge=TURN, system="s", messages=MSG, on_text=shown.append, on_reset=lambda: resets.append(None)
        )
    assert shown and resets == [None]
    assert len(emu.requests) == 1, "not retryable: asked once"


async def test_a_failing_callback_never_fails_the_request(emu: Emulator) -> None:
    emu.script(Reply(text=TEXT))

    def broken(_: str) -> None:
        raise RuntimeError("display bug")

    resp = await client(emu).create(charge=TURN, system="s", messages=MSG, on_text=broken)
    assert resp.text == TEXT
