"""MCP tools end to end: the real Telegram adapter (python-telegram-bot against the fake
Bot API), the real anthropic SDK against the emulator, and a stdio MCP server written
with the official SDK (``tests/support/mcp_server.py``) started by the gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from mnemo.gateway.emulator import Emulator, RecordedRequest, Reply, ToolUse
from tests.adapters.telegram_harness import FlakyTelegram, TelegramRig
from tests.mcp.conftest import result_text, server_calls, server_config, tool_results

ALICE, BOB = 4711, 4712


@pytest.fixture
async def fake() -> AsyncIterator[FlakyTelegram]:
    async with FlakyTelegram(bot_username="mnemo_mcp_bot") as server:
        yield server


@pytest.fixture
def rig(fake: FlakyTelegram, emulator: Emulator, home: Path) -> TelegramRig:
    return TelegramRig(fake, emulator, home)


def answer_with_result(request: RecordedRequest) -> Reply:
    [block] = tool_results(request)
    return Reply(text=f"The tool said: {result_text(block)}")


async def test_an_allowed_person_gets_the_tool_result_and_another_never_sees_the_tool(
    rig: TelegramRig, tmp_path: Path
) -> None:
    log = tmp_path / "calls.jsonl"
    rig.emulator.script(
        Reply(tool_uses=[ToolUse("tt__add", {"a": 2, "b": 3})]),
        answer_with_result,
        Reply(text="Hello Bob."),
    )
    servers = {"tt": server_config(log, allowed=[f"telegram:{ALICE}"])}
    async with rig.app(**{"mcp.servers": servers}) as (app, _):
        rig.fake.push_text(ALICE, ALICE, "what is 2 + 3? use the tool", first_name="Alice")
        [reply] = await rig.fake.wait_for_sent(1)
        rig.fake.push_text(BOB, BOB, "hi, what tools do you have?", first_name="Bob")
        await rig.fake.wait_for_sent(2)

    first, second, bob = rig.emulator.requests[:3]
    builtins = ["memory", "session_search"]
    assert first.tool_names[:2] == tuple(builtins)
    mcp = [n for n in first.tool_names if n.startswith("tt__")]
    assert mcp == ["tt__add", "tt__big", "tt__crash", "tt__echo", "tt__fail", "tt__hang", "tt__inject"]
    assert list(first.tool_names[-len(mcp) :]) == mcp, (
        "MCP tools come after every other tool, in a stable order"
    )
    assert first.tool_schema("tt__add") == {
        "type": "object",
        "properties": {"a": {"title": "A", "type": "integer"}, "b": {"title": "B", "type": "integer"}},
        "required": ["a", "b"],
        "title": "addArguments",
    }
    assert second.body["tools"] == first.body["tools"], "the tool definitions are byte-stable"
    [block] = tool_results(second)
    assert not block.get("is_error")
    assert "<mcp-result>" in result_text(block) and "\n5\n" in result_text(block)
    assert reply.chat_id == ALICE and "5" in reply.plain_text
    assert server_calls(log) == [{"tool": "add", "a": 2, "b": 3}]
    assert not [n for n in bob.tool_names if "__" in n], "Bob may not use the server: no tool of it"
    assert bob.tool_names[:2] == tuple(builtins)


async def test_a_hanging_server_costs_one_timeout_and_the_turn_is_answered(
    rig: TelegramRig, tmp_path: Path
) -> None:
    log = tmp_path / "calls.jsonl"
    rig.emulator.script(
        Reply(tool_uses=[ToolUse("tt__hang", {})]),
        Reply(tool_uses=[ToolUse("tt__hang", {"seconds": 1})]),  # the model tries again
        Reply(text="The tool did not answer; let us try later."),
    )
    servers = {"tt": server_config(log, allowed="users", timeout_s=1.5)}
    async with rig.app(webhook=True, **{"mcp.servers": servers, "streaming.enabled": False}) as (app, _):
        rig.fake.push_text(ALICE, ALICE, "wait for the slow tool", first_name="Alice")
        [reply] = await rig.fake.wait_for_sent(1)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{app.settings.web.port}/healthz") as resp:
                health = await resp.json()

    assert reply.plain_text == "The tool did not answer; let us try later."
    first_result = result_text(tool_results(rig.emulator.requests[1])[0])
    second_result = result_text(tool_results(rig.emulator.requests[2])[0])
    assert "did not answer 'hang' in time" in first_result
    assert "unavailable (slow" in second_result, "the second call is refused at once, not waited for"
    assert [c["tool"] for c in server_calls(log)] == ["hang"], "only one call reached the server"
    assert health["mcp"]["tt"]["state"] == "slow"
    assert "no answer within 1.5 s" in health["mcp"]["tt"]["error"]
