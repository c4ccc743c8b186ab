"""The emulator as the real ``anthropic`` SDK sees it: replies, tool round trips,
streaming, errors, retries, faults and recording."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from types import MappingProxyType

import anthropic
import httpx
import pytest

from mnemo.gateway.emulator import Emulator, Fault, ManualClock, RecordedRequest, Reply, ToolUse

MODEL = "claude-test-1"
WEATHER = {
    "name": "weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture
async def emu() -> AsyncIterator[Emulator]:
    async with Emulator(clock=ManualClock()) as e:
        yield e


def client(emu: Emulator, max_retries: int = 0, **kw: object) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=emu.base_url, api_key="test", max_retries=max_retries, **kw)


def user(text: str) -> list[dict[str, object]]:
    return [{"role": "user", "content": text}]


async def test_plain_reply_has_the_real_response_shape(emu: Emulator) -> None:
    emu.script(Reply("Hello there"))
    msg = await client(emu).messages.create(model=MODEL, max_tokens=100, messages=user("hi"))
    assert msg.type == "message" and msg.role == "assistant" and msg.model == MODEL
    assert msg.id.startswith("msg_")
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == "Hello there"
    assert msg.stop_reason == "end_turn" and msg.stop_sequence is None
    assert msg.usage.input_tokens > 0 and msg.usage.output_tokens > 0
    assert msg.usage.cache_read_input_tokens == 0 and msg.usage.cache_creation_input_tokens == 0
    rec = emu.last_request
    assert rec.response_status == 200 and rec.body["messages"] == user("hi")
    assert rec.usage == msg.usage.model_dump(include=set(rec.usage), exclude_none=True)
    assert rec.headers["authorization"] == "Bearer test" and rec.reply == Reply("Hello there")
    assert emu.pending() == 0


async def test_tool_use_round_trip(emu: Emulator) -> None:
    emu.script(
        Reply("Checking.", tool_uses=[ToolUse("weather", {"city": "Oslo"})]),
        lambda req: Reply(f"It says: {req.messages[-1]['content'][0]['content']}"),
    )
    c = client(emu)
    messages: list[dict[str, object]] = user("Weather in Oslo?")
    first = await c.messages.create(model=MODEL, max_tokens=200, messages=messages, tools=[WEATHER])
    assert first.stop_reason == "tool_use"
    call = first.content[1]
    assert call.type == "tool_use" and call.name == "weather" and call.input == {"city": "Oslo"}
    assert call.id.startswith("toolu_")
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "rain, 4°C"}],
        },
    ]
    second = await c.messages.create(model=MODEL, max_tokens=200, messages=messages, tools=[WEATHER])
    assert second.content[0].text == "It says: rain, 4°C" and second.stop_reason == "end_turn"
    assert [r.response_status for r in emu.requests] == [200, 200]


async def test_explicit_tool_use_id_is_kept(emu: Emulator) -> None:
    emu.script(Reply(tool_uses=[ToolUse("weather", {"city": "Rome"}, id="toolu_fixed")]))
    msg = await client(emu).messages.create(model=MODEL, max_tokens=50, messages=user("x"), tools=[WEATHER])
    assert [b.type for b in msg.content] == ["tool_use"] and msg.content[0].id == "toolu_fixed"


async def test_streaming_text_and_tool_use_accumulate_into_the_final_message(emu: Emulator) -> None:
    long_text = "A fairly long answer that spans several text deltas on the wire. " * 3
    emu.script(Reply(long_text, tool_uses=[ToolUse("weather", {"city": "Zürich", "days": [1, 2, 3]})]))
    seen: list[str] = []
    async with client(emu).messages.stream(
        model=MODEL, max_tokens=500, messages=user("stream please"), tools=[WEATHER]
    ) as stream:
        async for event in stream:
            seen.append(event.type)
        final = await stream.get_final_message()
    assert final.content[0].text == long_text
    assert final.content[1].input == {"city": "Zürich", "days": [1, 2, 3]}
    assert final.stop_reason == "tool_use"
    assert final.usage.output_tokens > 1 and final.usage.input_tokens > 0
    assert seen.count("content_block_start") == 2 and "message_stop" in seen
    assert seen.count("text") > 1  # the text really arrived in several deltas
    assert emu.last_request.stream and emu.last_request.response_status == 200


async def test_raw_sse_frames_all_carry_an_event_line(emu: Emulator) -> None:
    emu.script(Reply("hi", tool_uses=[ToolUse("weather", {"city": "Oslo"})]))
    body = {"model": MODEL, "max_tokens": 50, "stream": True, "messages": user("x"), "tools": [WEATHER]}
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    async with httpx.AsyncClient() as http:
        resp = await http.post(f"{emu.base_url}/v1/messages", json=body, headers=headers)
    assert resp.headers["content-type"].startswith("text/event-stream")
    frames = [f for f in resp.text.split("\n\n") if f.strip()]
    events = [f.splitlines()[0].removeprefix("event: ") for f in frames]
    assert all(f.startswith("event: ") for f in frames)
    assert events[0] == "message_start" and events[-2:] == ["message_delta", "message_stop"]
    datas = [json.loads(f.splitlines()[1].removeprefix("data: ")) for f in frames]
    assert all(d["type"] == e for d, e in zip(datas, events, strict=True))
    deltas = [d["delta"] for d in datas if d["type"] == "content_block_delta"]
    partial = "".join(d["partial_json"] for d in deltas if d["type"] == "input_json_delta")
    assert json.loads(partial) == {"city": "Oslo"}


async def test_validation_error_surfaces_as_bad_request_and_consumes_nothing(emu: Emulator) -> None:
    emu.script(Reply("unused"))
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(anthropic.BadRequestError) as info:
        await client(emu, max_retries=2).messages.create(model=MODEL, max_tokens=10, messages=bad)
    assert info.value.body["error"]["type"] == "invalid_request_error"
    assert "roles must alternate" in info.value.body["error"]["message"]
    assert len(emu.requests) == 1 and emu.requests[0].response_status == 400  # 400 is not retried
    assert emu.pending() == 1


async def test_missing_auth_is_401_and_other_paths_404(emu: Emulator) -> None:
    body = {"model": MODEL, "max_tokens": 5, "messages": user("x")}
    async with httpx.AsyncClient() as http:
        no_key = await http.post(
            f"{emu.base_url}/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"}
        )
        x_key = await http.post(
            f"{emu.base_url}/v1/messages",
            json=body,
            headers={"x-api-key": "k", "anthropic-version": "2023-06-01"},
        )
        no_version = await http.post(f"{emu.base_url}/v1/messages", json=body, headers={"x-api-key": "k"})
        missing = await http.get(f"{emu.base_url}/v1/models", headers={"x-api-key": "k"})
        not_json = await http.post(
            f"{emu.base_url}/v1/messages",
            content=b"{nope",
            headers={"x-api-key": "k", "anthropic-version": "1"},
        )
    assert no_key.status_code == 401 and no_key.json()["error"]["type"] == "authentication_error"
    assert x_key.status_code == 200
    assert no_version.status_code == 400 and "anthropic-version" in no_version.json()["error"]["message"]
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    assert not_json.status_code == 400 and emu.requests[-1].body is None
    assert [r.response_status for r in emu.requests] == [401, 200, 400, 404, 400]


async def test_sdk_client_without_key_gets_authentication_error(emu: Emulator) -> None:
    c = anthropic.AsyncAnthropic(base_url=emu.base_url, api_key="test", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        await c.messages.create(
            model=MODEL, max_tokens=5, messages=user("x"), extra_headers={"Authorization": anthropic.Omit()}
        )


async def test_429_retry_after_is_honoured_by_the_sdk(emu: Emulator) -> None:
    emu.script(Fault(429, retry_after=0.05), Fault(429, retry_after=0.05), Reply("finally"))
    msg = await client(emu, max_retries=2).messages.create(model=MODEL, max_tokens=10, messages=user("x"))
    assert msg.content[0].text == "finally"
    assert [r.response_status for r in emu.requests] == [429, 429, 200]
    assert [r.fault.status if r.fault else None for r in emu.requests] == [429, 429, None]


async def test_429_error_shape_and_retry_after_header(emu: Emulator) -> None:
    emu.script(Fault(429, retry_after=7))
    with pytest.raises(anthropic.RateLimitError) as info:
        await client(emu).messages.create(model=MODEL, max_tokens=10, messages=user("x"))
    err = info.value
    assert err.status_code == 429 and err.response.headers["retry-after"] == "7"
    assert err.body["type"] == "error" and err.body["error"]["type"] == "rate_limit_error"
    assert err.request_id is not None and err.request_id.startswith("req_")


@pytest.mark.parametrize(("status", "kind"), [(529, "overloaded_error"), (500, "api_error")])
async def test_server_errors_are_retried(emu: Emulator, status: int, kind: str) -> None:
    emu.script(Fault(status, retry_after=0.01), Reply("ok"))
    msg = await client(emu, max_retries=1).messages.create(model=MODEL, max_tokens=10, messages=user("x"))
    assert msg.content[0].text == "ok" and [r.response_status for r in emu.requests] == [status, 200]
    emu.script(Fault(status))
    with pytest.raises(anthropic.APIStatusError) as info:
        await client(emu).messages.create(model=MODEL, max_tokens=10, messages=user("x"))
    assert info.value.status_code == status and info.value.body["error"]["type"] == kind


async def test_retry_without_retry_after_uses_sdk_backoff(emu: Emulator) -> None:
    emu.script(Fault(529), Reply("back"))
    msg = await client(emu, max_retries=1).messages.create(model=MODEL, max_tokens=10, messages=user("x"))
    assert msg.content[0].text == "back" and "retry-after" not in emu.requests[0].headers


async def test_fault_with_a_custom_body(emu: Emulator) -> None:
    emu.script(
        Fault(400, body="prompt is too long: 250000 tokens > 200000 maximum"),
        Fault(503, body={"type": "error", "error": {"type": "api_error", "message": "custom"}}),
    )
    with pytest.raises(anthropic.BadRequestError, match="prompt is too long"):
        await client(emu).messages.create(model=MODEL, max_tokens=10, messages=user("x"))
    with pytest.raises(anthropic.InternalServerError) as info:
        await client(emu).messages.create(model=MODEL, max_tokens=10, messages=user("x"))
    assert info.value.body["error"]["message"] == "custom"


async def test_fault_body_may_be_any_mapping(emu: Emulator) -> None:
    # Fault.body is typed Mapping: a read-only one is the whole JSON body too, as a dict is.
    body = MappingProxyType({"type": "error", "error": {"type": "api_error", "message": "frozen"}})
    emu.script(Fault(503, body=body))
    with pytest.raises(anthropic.InternalServerError) as info:
        await client(emu).messages.create(model=MODEL, max_tokens=10, messages=user("x"))
    assert info.value.body["error"]["message"] == "frozen"
    assert json.loads(emu.last_request.error or "") == dict(body)


async def test_malformed_body_with_200(emu: Emulator) -> None:
    emu.script(Fault(200, malformed=True))
    with pytest.raises(json.JSONDecodeError):
        await client(emu).messages.create(model=MODEL, max_tokens=10, messages=user("x"))
    assert emu.last_request.response_status == 200 and emu.last_request.usage is None


async def test_mid_stream_error_is_not_retried_and_carries_its_type(emu: Emulator) -> None:
    emu.script(Fault(529, mid_stream=True), Reply("not reached"))
    with pytest.raises(anthropic.APIStatusError) as info:
        async with client(emu, max_retries=2).messages.stream(
            model=MODEL, max_tokens=50, messages=user("x")
        ) as s:
            await s.get_final_message()
    assert info.value.status_code == 200
    assert info.value.body["error"]["type"] == "overloaded_error"
    assert len(emu.requests) == 1 and emu.pending() == 1


async def test_mid_stream_fault_on_a_plain_request_is_an_http_error(emu: Emulator) -> None:
    emu.script(Fault(500, mid_stream=True))
    with pytest.raises(anthropic.InternalServerError):
        await client(emu).messages.create(model=MODEL, max_tokens=10, messages=user("x"))


async def test_slow_reply_times_the_client_out(emu: Emulator) -> None:
    emu.script(Reply("late", delay=30))
    with pytest.raises(anthropic.APITimeoutError):
        await client(emu, timeout=0.2).messages.create(model=MODEL, max_tokens=10, messages=user("x"))
    assert emu.last_request.response_status is None  # never answered
    # stop() does not wait the 30 s out (the fixture stops it right after this test).


async def test_slow_fault_then_reply(emu: Emulator) -> None:
    emu.script(Fault(529, delay=0.05, retry_after=0.01), Reply("ok", delay=0.05))
    msg = await client(emu, max_retries=1).messages.create(model=MODEL, max_tokens=10, messages=user("x"))
    assert msg.content[0].text == "ok"


async def test_max_tokens_cuts_the_reply(emu: Emulator) -> None:
    emu.script(Reply("word " * 200, tool_uses=[ToolUse("weather", {"city": "Oslo"})]))
    msg = await client(emu).messages.create(model=MODEL, max_tokens=10, messages=user("x"), tools=[WEATHER])
    assert msg.stop_reason == "max_tokens" and [b.type for b in msg.content] == ["text"]
    assert msg.usage.output_tokens <= 10 and len(msg.content[0].text) < 1000


async def test_stop_sequence_cuts_the_reply(emu: Emulator) -> None:
    emu.script(Reply("alpha STOP beta"))
    msg = await client(emu).messages.create(
        model=MODEL, max_tokens=50, messages=user("x"), stop_sequences=["STOP"]
    )
    assert (
        msg.content[0].text == "alpha " and msg.stop_reason == "stop_sequence" and msg.stop_sequence == "STOP"
    )


async def test_explicit_stop_reason(emu: Emulator) -> None:
    emu.script(Reply("cut", stop_reason="max_tokens"))
    msg = await client(emu).messages.create(model=MODEL, max_tokens=50, messages=user("x"))
    assert msg.stop_reason == "max_tokens"
    with pytest.raises(ValueError, match="stop_reason"):
        Reply("x", stop_reason="bogus")


async def test_default_responder_and_script_order(emu: Emulator) -> None:
    emu.default = lambda req: Reply(f"default:{req.messages[-1]['content']}")
    emu.script(Reply("one"), Reply("two"))
    c = client(emu)
    texts = [
        (await c.messages.create(model=MODEL, max_tokens=20, messages=user(str(i)))).content[0].text
        for i in range(3)
    ]
    assert texts == ["one", "two", "default:2"]


async def test_async_responder_can_hold_a_reply_until_released(emu: Emulator) -> None:
    release = asyncio.Event()

    async def held(req: RecordedRequest) -> Reply:
        await release.wait()
        return Reply("released")

    emu.script(held, Reply("fast"))
    c = client(emu)
    slow = asyncio.create_task(c.messages.create(model=MODEL, max_tokens=20, messages=user("slow")))
    await emu.wait_for_requests(1)
    fast = await c.messages.create(model=MODEL, max_tokens=20, messages=user("fast"))
    assert fast.content[0].text == "fast" and not slow.done()
    release.set()
    assert (await slow).content[0].text == "released"


async def test_broken_responder_becomes_a_500(emu: Emulator) -> None:
    def broken(req: RecordedRequest) -> Reply:
        raise RuntimeError("bug in the test responder")

    emu.script(broken)
    with pytest.raises(anthropic.InternalServerError, match="bug in the test responder"):
        await client(emu).messages.create(model=MODEL, max_tokens=20, messages=user("x"))


async def test_script_rejects_other_objects(emu: Emulator) -> None:
    with pytest.raises(TypeError):
        emu.script("not a reply")  # type: ignore[arg-type]  # the wrong type is the point of the test


async def test_reset_forgets_script_requests_and_faults(emu: Emulator) -> None:
    emu.script(Reply("a"), Reply("b"))
    emu.set_fault_rate(1.0, statuses=(529,))
    with pytest.raises(anthropic.APIStatusError):
        await client(emu).messages.create(model=MODEL, max_tokens=20, messages=user("x"))
    emu.reset()
    assert emu.pending() == 0 and emu.requests == []
    msg = await client(emu).messages.create(model=MODEL, max_tokens=20, messages=user("x"))
    assert msg.content[0].text.startswith("[scripted reply")


async def fault_pattern(seed: int, rate: float = 0.3, n: int = 40) -> list[int | None]:
    async with Emulator() as emu:
        emu.set_fault_rate(rate, seed=seed)
        c = client(emu)
        for i in range(n):
            try:
                await c.messages.create(model=MODEL, max_tokens=20, messages=user(f"m{i}"))
            except anthropic.APIStatusError:
                pass
        return [r.fault.status if r.fault else None for r in emu.requests]


async def test_fault_rate_is_reproducible_with_a_seed() -> None:
    first, again, other = await fault_pattern(1), await fault_pattern(1), await fault_pattern(2)
    assert first == again and first != other
    faults = [s for s in first if s is not None]
    assert 4 <= len(faults) <= 22 and set(faults) <= {429, 529, 500}


async def test_random_faults_do_not_consume_script_items(emu: Emulator) -> None:
    emu.set_fault_rate(0.5, statuses=(529,), seed=3, retry_after=0.01)
    emu.script(*(Reply(f"r{i}") for i in range(5)))
    c = client(emu, max_retries=10)
    texts = [
        (await c.messages.create(model=MODEL, max_tokens=20, messages=user("x"))).content[0].text
        for _ in range(5)
    ]
    assert texts == [f"r{i}" for i in range(5)]
    assert any(r.fault is not None for r in emu.requests)  # seed 3 fails some of them


async def test_fault_rate_bounds() -> None:
    emu = Emulator()
    with pytest.raises(ValueError):
        emu.set_fault_rate(1.5)


async def test_start_and_stop_are_idempotent_and_base_url_needs_start() -> None:
    emu = Emulator()
    with pytest.raises(RuntimeError):
        _ = emu.base_url
    await emu.start()
    url = emu.base_url
    await emu.start()
    assert emu.base_url == url and url.startswith("http://127.0.0.1:")
    await emu.stop()
    await emu.stop()
    with pytest.raises(RuntimeError):
        _ = emu.base_url


async def test_record_limit_keeps_the_newest_requests() -> None:
    async with Emulator(responder=lambda req: Reply("ok"), record_limit=3) as emu:
        c = client(emu)
        for i in range(5):
            await c.messages.create(model=MODEL, max_tokens=5, messages=user(f"m{i}"))
        assert emu.received == 5
        assert [r.body["messages"][0]["content"] for r in emu.requests] == ["m2", "m3", "m4"]
        await emu.wait_for_requests(5, timeout=1)


async def test_stop_does_not_wait_for_a_held_responder() -> None:
    never = asyncio.Event()

    async def held(req: RecordedRequest) -> Reply:
        await never.wait()
        return Reply("never")

    emu = Emulator(responder=held)
    await emu.start()
    call = asyncio.create_task(client(emu).messages.create(model=MODEL, max_tokens=5, messages=user("x")))
    await emu.wait_for_requests(1)
    await asyncio.wait_for(emu.stop(), timeout=30)  # a hang guard, not a speed check
    with pytest.raises(anthropic.APIConnectionError):
        await call
    assert emu.requests[0].response_status is None


async def test_restart_in_the_same_loop_keeps_working() -> None:
    emu = Emulator(responder=lambda req: Reply("again"))
    for _ in range(2):
        await emu.start()
        msg = await client(emu).messages.create(model=MODEL, max_tokens=5, messages=user("x"))
        assert msg.content[0].text == "again"
        await emu.stop()
