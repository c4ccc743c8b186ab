"""The LLM client against the emulator with the real SDK: error mapping and retries."""

import pytest

from mnemo.gateway.config import LLMSettings
from mnemo.gateway.emulator import Emulator, Fault, Reply
from mnemo.gateway.errors import InvalidLLMRequest, ProviderAuthError, RateLimited, TransientNetworkError
from mnemo.gateway.llm.client import LLMClient


async def _no_sleep(_: float) -> None:
    return None


_opened: list[LLMClient] = []  # closed after each test: the aiohttp transport's session


@pytest.fixture
async def emu():
    async with Emulator() as e:
        yield e
        while _opened:
            await _opened.pop().aclose()


def client(emu, **kw) -> LLMClient:
    llm = LLMClient(LLMSettings(max_retries=2, **kw), base_url=emu.base_url, api_key="k", sleep=_no_sleep)
    _opened.append(llm)
    return llm


MSG = [{"role": "user", "content": "hi"}]


async def test_retries_then_succeeds_and_counts_attempts(emu):
    emu.script(Fault(status=500), Fault(status=529), Reply(text="ok"))
    resp = await client(emu).create(system="s", messages=MSG)
    assert resp.text == "ok" and resp.attempts == 3


async def test_rate_limit_after_the_last_retry_is_typed_with_retry_after(emu):
    emu.script(*[Fault(status=429, retry_after=7)] * 3)
    with pytest.raises(RateLimited) as e:
        await client(emu).create(system="s", messages=MSG)
    assert e.value.retry_after == 7


async def test_retry_after_is_capped(emu):
    waits = []

    async def sleep(s: float) -> None:
        waits.append(s)

    emu.script(Fault(status=429, retry_after=3600), Reply(text="ok"))
    llm = LLMClient(
        LLMSettings(max_retries=2, retry_after_cap_s=2.5), base_url=emu.base_url, api_key="k", sleep=sleep
    )
    _opened.append(llm)
    await llm.create(system="s", messages=MSG)
    assert waits == [2.5]


async def test_malformed_body_is_retried(emu):
    emu.script(Fault(status=200, malformed=True), Reply(text="fine"))
    assert (await client(emu).create(system="s", messages=MSG)).text == "fine"


async def test_server_errors_after_the_last_retry_are_transient(emu):
    emu.script(*[Fault(status=500)] * 3)
    with pytest.raises(TransientNetworkError):
        await client(emu).create(system="s", messages=MSG)


async def test_a_bad_request_is_not_retried(emu):
    emu.script(
        Fault(
            status=404, body={"type": "error", "error": {"type": "not_found_error", "message": "model: nope"}}
        )
    )
    with pytest.raises(InvalidLLMRequest):
        await client(emu).create(system="s", messages=MSG)
    assert len(emu.requests) == 1


async def test_auth_failure_is_typed(emu):
    emu.script(Fault(status=401))
    with pytest.raises(ProviderAuthError):
        await client(emu).create(system="s", messages=MSG)


async def test_usage_and_cost_are_reported(emu):
    emu.script(Reply(text="x" * 400))
    resp = await client(emu, model="claude-sonnet-4-6").create(system="s" * 10, messages=MSG)
    assert resp.usage.output_tokens > 0 and resp.cost_usd > 0
