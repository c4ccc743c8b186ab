"""The LLM client against the emulator with the real SDK: error mapping and retries."""

from datetime import UTC, datetime

import pytest

from mnemo.gateway.budgets.charge import UNMETERED, Charge, RequestKind
from mnemo.gateway.config import LLMSettings
from mnemo.gateway.emulator import Emulator, Fault, Reply
from mnemo.gateway.errors import (
    InvalidLLMRequest,
    OverBudget,
    ProviderAuthError,
    RateLimited,
    TransientNetworkError,
)
from mnemo.gateway.llm.client import LLMClient
from mnemo.memory.scope import UserRef

TURN = Charge(RequestKind.TURN)  # no gate here: the client on its own


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
    llm = LLMClient(
        LLMSettings(max_retries=2, **kw), gate=UNMETERED, base_url=emu.base_url, api_key="k", sleep=_no_sleep
    )
    _opened.append(llm)
    return llm


MSG = [{"role": "user", "content": "hi"}]


async def test_retries_then_succeeds_and_counts_attempts(emu):
    emu.script(Fault(status=500), Fault(status=529), Reply(text="ok"))
    resp = await client(emu).create(charge=TURN, system="s", messages=MSG)
    assert resp.text == "ok" and resp.attempts == 3


async def test_rate_limit_after_the_last_retry_is_typed_with_retry_after(emu):
    emu.script(*[Fault(status=429, retry_after=7)] * 3)
    with pytest.raises(RateLimited) as e:
        await client(emu).create(charge=TURN, system="s", messages=MSG)
    assert e.value.retry_after == 7


async def test_retry_after_is_capped(emu):
    waits = []

    async def sleep(s: float) -> None:
        waits.append(s)

    emu.script(Fault(status=429, retry_after=3600), Reply(text="ok"))
    llm = LLMClient(
        LLMSettings(max_retries=2, retry_after_cap_s=2.5),
        gate=UNMETERED,
        base_url=emu.base_url,
        api_key="k",
        sleep=sleep,
    )
    _opened.append(llm)
    await llm.create(charge=TURN, system="s", messages=MSG)
    assert waits == [2.5]


async def test_malformed_body_is_retried(emu):
    emu.script(Fault(status=200, malformed=True), Reply(text="fine"))
    assert (await client(emu).create(charge=TURN, system="s", messages=MSG)).text == "fine"


async def test_server_errors_after_the_last_retry_are_transient(emu):
    emu.script(*[Fault(status=500)] * 3)
    with pytest.raises(TransientNetworkError):
        await client(emu).create(charge=TURN, system="s", messages=MSG)


async def test_a_bad_request_is_not_retried(emu):
    emu.script(
        Fault(
            status=404, body={"type": "error", "error": {"type": "not_found_error", "message": "model: nope"}}
        )
    )
    with pytest.raises(InvalidLLMRequest):
        await client(emu).create(charge=TURN, system="s", messages=MSG)
    assert len(emu.requests) == 1


async def test_auth_failure_is_typed(emu):
    emu.script(Fault(status=401))
    with pytest.raises(ProviderAuthError):
        await client(emu).create(charge=TURN, system="s", messages=MSG)


async def test_usage_and_cost_are_reported(emu):
    emu.script(Reply(text="x" * 400))
    resp = await client(emu, model="claude-sonnet-4-6").create(charge=TURN, system="s" * 10, messages=MSG)
    assert resp.usage.output_tokens > 0 and resp.cost_usd > 0


class Refusing:
    """A gate at its cap: records what it was asked to admit."""

    def __init__(self) -> None:
        self.asked: list[Charge] = []

    async def admit(self, charge: Charge) -> None:
        self.asked.append(charge)
        raise OverBudget("at the cap", "daily_usd", datetime(2030, 1, 1, tzinfo=UTC), 60.0)


async def test_every_request_asks_the_gate_first_and_a_refusal_sends_nothing(emu):
    gate = Refusing()
    llm = LLMClient(
        LLMSettings(max_retries=2), gate=gate, base_url=emu.base_url, api_key="k", sleep=_no_sleep
    )
    charge = Charge(RequestKind.FLUSH, UserRef("loop", "u1"))
    with pytest.raises(OverBudget):
        await llm.create(charge=charge, system="s", messages=MSG)
    with pytest.raises(OverBudget):
        await llm.create(charge=charge, system="s", messages=MSG, on_text=lambda t: None)
    assert gate.asked == [charge, charge] and emu.requests == []


async def test_cache_last_false_leaves_the_last_message_unmarked(emu):
    """A background pass's instruction is never repeated: it is sent without a breakpoint,
    the ones before it stay."""
    emu.script(Reply(text="ok"))
    messages = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "answer"},
        {"role": "user", "content": "instruction"},
    ]
    async with client(emu) as llm:
        await llm.create(system="sys", messages=messages, charge=TURN, cache_last=False)
    sent = emu.requests[-1].messages
    assert sent[-1]["content"] == "instruction", "no marker, string content as given"
    assert [b.get("cache_control") for m in sent[:2] for b in m["content"]] == [{"type": "ephemeral"}] * 2
    assert messages[-1] == {"role": "user", "content": "instruction"}, "the caller's list is not changed"
