"""The ``delegate`` tool through the whole pipeline, on SQLite and PostgreSQL: a
sub-agent with a fresh context and the tools it was granted answers, its requests are
billed to the person (``/usage``), the holographic provider records the delegation, its
transcript is a session linked to the caller's, and the rules hold (who may delegate,
what may be granted, the profile, the budget)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aiohttp

from mnemo.gateway.emulator import Emulator, Reply, ToolUse
from mnemo.gateway.turns.delegate import SUBAGENT_PROMPT
from mnemo.memory.provider import ProviderContext
from mnemo.memory.scope import AgentContext, UserRef
from tests.adapters.test_admin_dashboard import sign_in, text_of
from tests.mcp.conftest import result_text, server_config, telegram_app, tool_results
from tests.support.admin_seed import ADMIN_TOKEN
from tests.support.loopback import LoopbackAdapter
from tests.support.webchat import open_web_app, web_settings

ADMIN, USER = "1", "42"
TASK = "Add 2 and 3 with the add tool and answer with the sum."


def settings(database: dict[str, str], **more: Any) -> dict[str, Any]:
    return {
        "memory.provider": "holographic",
        "mcp.servers": {"tt": server_config(tools=["add", "echo"], allowed="admins")},
        **database,
        **more,
    }


async def test_a_delegated_task_is_answered_billed_recorded_and_stored(
    home: Path, emulator: Emulator, database: dict[str, str]
) -> None:
    emulator.script(
        Reply(tool_uses=[ToolUse("delegate", {"task": TASK, "tools": ["tt__add", "session_search"]})]),
        Reply(tool_uses=[ToolUse("tt__add", {"a": 2, "b": 3})]),  # the sub-agent
        Reply(text="The sum is 5."),  # the sub-agent's answer
        Reply(text="My helper found: 5."),
        Reply(text="Hello."),
    )
    adapter = LoopbackAdapter("telegram")
    async with telegram_app(home, emulator, adapter, **settings(database)) as app:
        await adapter.say("please delegate: what is 2 + 3?", user=ADMIN)
        await adapter.wait_sent(1)
        await adapter.say("/usage", user=ADMIN)
        usage = (await adapter.wait_sent(2))[1].text
        await adapter.say("hi", user=USER)
        await adapter.wait_sent(3)
        await app.providers.pending()
        parent = await app.store.active_session(f"telegram:dm:{ADMIN}")
        assert parent is not None
        children = [
            s for s in await app.store.list_sessions(parent.chat_key) if s.parent_session_id == parent.id
        ]
        facts = await app.providers.handle_tool_call(
            "fact_store",
            {"action": "search", "query": "delegated task add sum"},
            ProviderContext("x", "x", "telegram", UserRef("telegram", ADMIN), AgentContext.PRIMARY, home),
        )
        [child] = children
        transcript = await app.store.load_messages(child.id)

    caller, sub1, sub2, caller2, user = emulator.requests[:5]
    assert caller.tool_names.index("delegate") > caller.tool_names.index("session_search")
    assert caller.tool_names.index("delegate") < caller.tool_names.index("tt__add"), "MCP tools come last"
    assert "delegate" not in user.tool_names, "delegation is for admins by default"
    # The sub-agent: its own prompt, the task alone, exactly the tools granted.
    assert sub1.system_text == SUBAGENT_PROMPT
    assert [m["role"] for m in sub1.messages] == ["user"] and TASK in json.dumps(sub1.messages)
    assert "please delegate" not in json.dumps(sub1.body)
    assert sub1.tool_names == ("session_search", "tt__add")
    assert sub2.tool_names == sub1.tool_names
    assert "\n5\n" in result_text(tool_results(sub2)[0])
    [delegated] = tool_results(caller2)
    assert result_text(delegated) == "The sum is 5." and not delegated.get("is_error")

    assert (child.source, child.agent_context, child.chat_key) == ("delegate", "subagent", parent.chat_key)
    assert child.is_ended and child.end_reason == "delegated"
    assert [r.role for r in transcript] == ["user", "assistant", "tool", "assistant"]
    assert child.estimated_cost_usd > 0
    spent = float(re.search(r"Today: \$([0-9.]+)", usage).group(1))  # type: ignore[union-attr]
    assert spent == round(parent.estimated_cost_usd + child.estimated_cost_usd, 4), usage
    assert "Delegated task: Add 2 and 3" in facts and "The sum is 5." in facts


async def test_what_may_be_granted_and_the_profile_grant(
    home: Path, emulator: Emulator, database: dict[str, str]
) -> None:
    profile = {"action": "add", "target": "user", "content": "Likes sums"}
    emulator.script(
        Reply(tool_uses=[ToolUse("delegate", {"task": "t", "tools": ["cronjob", "delegate", "nope"]})]),
        Reply(tool_uses=[ToolUse("delegate", {"task": "save it", "tools": ["memory"]})]),
        Reply(tool_uses=[ToolUse("memory", profile)]),  # sub-agent without the grant
        Reply(text="could not save"),
        Reply(tool_uses=[ToolUse("delegate", {"task": "save it", "allow_profile_write": True})]),
        Reply(tool_uses=[ToolUse("memory", profile)]),  # sub-agent with the grant
        Reply(text="saved"),
        Reply(text="done"),
    )
    adapter = LoopbackAdapter("telegram")
    async with telegram_app(home, emulator, adapter, **settings(database)) as app:
        await adapter.say("delegate three things", user=ADMIN)
        await adapter.wait_sent(1)
        profile_entries = app.files.user(UserRef("telegram", ADMIN)).load().entries

    refused = result_text(tool_results(emulator.requests[1])[0])
    assert "cannot grant 'cronjob', 'delegate', 'nope'" in refused
    assert "you may grant: memory, session_search" in refused
    denied = json.loads(result_text(tool_results(emulator.requests[3])[0]))
    assert denied["success"] is False and "cannot write the user's profile" in denied["message"]
    assert emulator.requests[5].tool_names == ("memory",), "the grant brings the memory tool"
    assert json.loads(result_text(tool_results(emulator.requests[6])[0]))["success"] is True
    assert profile_entries == ("Likes sums",)


async def test_a_person_over_budget_cannot_delegate(
    home: Path, emulator: Emulator, database: dict[str, str]
) -> None:
    emulator.script(
        Reply(tool_uses=[ToolUse("delegate", {"task": "anything"})]),
        Reply(text="I could not delegate."),
    )
    adapter = LoopbackAdapter("telegram")
    overrides = settings(database, **{"delegation.allowed": "users", "budgets.per_user.daily_tokens": 1})
    async with telegram_app(home, emulator, adapter, **overrides):
        await adapter.say("delegate please", user=USER)
        await adapter.wait_sent(1)
    assert len(emulator.requests) == 2, "no sub-agent request was made"
    refused = tool_results(emulator.requests[1])[0]
    assert refused.get("is_error") and "Not delegated: You've reached your daily token budget" in result_text(
        refused
    )


async def test_the_dashboard_shows_the_sub_agents_transcript_linked_to_its_parent(
    home: Path, emulator: Emulator
) -> None:
    emulator.script(
        Reply(tool_uses=[ToolUse("delegate", {"task": "Say which planet is largest."})]),
        Reply(text="Jupiter is the largest planet."),
        Reply(text="Jupiter."),
    )
    settings = web_settings(
        home,
        **{
            "web.admin_token": ADMIN_TOKEN,
            "access.admins": (f"telegram:{ADMIN}",),
            "access.allowed": ("telegram:*",),
            "streaming.enabled": False,
        },
    )
    adapter = LoopbackAdapter("telegram")
    async with open_web_app(settings, emulator.base_url, extra_adapters=(adapter,)) as app:
        await adapter.say("which planet is largest? delegate it", user=ADMIN)
        await adapter.wait_sent(1)
        parent = await app.store.active_session(f"telegram:dm:{ADMIN}")
        assert parent is not None and app.web is not None
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            await sign_in(http, app.web.url)
            page = await text_of(http, f"{app.web.url}/admin/sessions/{parent.id}")
            child_id = re.search(r'href="/admin/sessions/([^"]+)">Say which planet', page)
            assert "Delegated to sub-agents" in page and child_id, page
            child = await text_of(http, f"{app.web.url}/admin/sessions/{child_id.group(1)}")
    assert "Jupiter is the largest planet." in child and "Say which planet is largest." in child
    assert f'href="/admin/sessions/{parent.id}"' in child and "Parent" in child
