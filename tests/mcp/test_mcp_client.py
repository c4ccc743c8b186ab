"""The MCP servers the agent uses, through the whole pipeline (a loopback adapter, the
real anthropic SDK against the emulator, the stdio test server): a session keeps the tool
set it started with across reloads and restarts, ``/mcp reload`` and ``mnemo mcp reload``
reach the running bot, a server that is down is reported and its tools withheld, and
``mnemo mcp list`` / ``mnemo doctor`` show the servers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from mnemo.gateway.emulator import Emulator, Reply
from tests.mcp.conftest import env_for, mnemo, server_config, telegram_app
from tests.support.loopback import LoopbackAdapter

ADMIN, U1 = "1", "42"


def write_config(home: Path, servers: dict[str, Any], **more: Any) -> None:
    (home / "config.yaml").write_text(yaml.safe_dump({"mcp": {"servers": servers, **more}}))


def mcp_tools(emulator: Emulator, index: int) -> list[str]:
    return [n for n in emulator.requests[index].tool_names if "__" in n]


async def test_a_session_keeps_its_tools_across_reloads_and_restarts(
    home: Path, emulator: Emulator, database: dict[str, str]
) -> None:
    write_config(home, {"tt": server_config(tools=["echo"], allowed="users")})
    emulator.script(*(Reply(text=f"reply {i}") for i in range(6)))
    adapter = LoopbackAdapter("telegram")
    async with telegram_app(home, emulator, adapter, **database):
        await adapter.say("hello", user=U1)
        await adapter.wait_sent(1)
        write_config(home, {"tt": server_config(tools=["echo", "add"], allowed="users")})
        await adapter.say("/mcp reload", user=ADMIN)
        sent = await adapter.wait_sent(2)
        assert "tt__add" not in sent[1].text and "tt (stdio, for users): 2 tool(s)" in sent[1].text
        await adapter.say("/mcp reload", user=U1)
        assert "admins only" in (await adapter.wait_sent(3))[2].text
        await adapter.say("again", user=U1)
        await adapter.wait_sent(4)
        await adapter.say("/new", user=U1)
        await adapter.say("a new conversation", user=U1)
        await adapter.wait_sent(6)
    first, same_session, new_session = (mcp_tools(emulator, i) for i in range(3))
    assert first == ["tt__echo"]
    assert emulator.requests[1].body["tools"] == emulator.requests[0].body["tools"], "frozen for the session"
    assert new_session == ["tt__add", "tt__echo"], "a session that starts after the reload gets the new list"

    # A restart with yet another list: the running session keeps the tools it started with.
    write_config(home, {"tt": server_config(tools=["add"], allowed="users")})
    adapter = LoopbackAdapter("telegram")
    async with telegram_app(home, emulator, adapter, **database):
        await adapter.say("after the restart", user=U1)
        await adapter.wait_sent(1)
        await adapter.say("/new", user=U1)
        await adapter.say("newest", user=U1)
        await adapter.wait_sent(3)
    assert emulator.requests[3].body["tools"] == emulator.requests[2].body["tools"]
    assert mcp_tools(emulator, 4) == ["tt__add"]


async def test_mnemo_mcp_reload_reaches_the_running_bot(
    home: Path, emulator: Emulator, database: dict[str, str]
) -> None:
    write_config(home, {"tt": server_config(tools=["echo"], allowed="users")})
    emulator.script(Reply(text="one"), Reply(text="two"))
    adapter = LoopbackAdapter("telegram")
    async with telegram_app(home, emulator, adapter, **database):
        write_config(home, {"tt": server_config(tools=["big"], allowed="users")})
        code, out, err = await mnemo(home, "mcp", "reload", "--timeout", "60", env=env_for(database))
        assert code == 0, err
        assert "Reloaded by" in out and "tt (stdio, for users): 1 tool(s)" in out
        await adapter.say("hello", user=U1)
        await adapter.wait_sent(1)
    assert mcp_tools(emulator, 0) == ["tt__big"]


async def test_a_server_that_is_down_is_reported_and_its_tools_withheld(
    home: Path, emulator: Emulator, tmp_path: Path
) -> None:
    broken = {"command": str(tmp_path / "no-such-server"), "allowed": "users"}
    write_config(home, {"gone": broken, "tt": server_config(tools=["echo"], allowed="users")})
    emulator.script(Reply(text="hi"))
    adapter = LoopbackAdapter("telegram")
    async with telegram_app(home, emulator, adapter) as app:
        await adapter.say("hello", user=U1)
        await adapter.wait_sent(1)
        await adapter.say("/mcp", user=U1)
        listing = (await adapter.wait_sent(2))[1].text
        health = app.mcp.health() if app.mcp is not None else {}
    assert mcp_tools(emulator, 0) == ["tt__echo"], "nothing of the server that did not start"
    assert health["gone"]["state"] == "down" and "No such file" in health["gone"]["error"]
    assert health["tt"] == {
        "state": "ok",
        "transport": "stdio",
        "error": None,
        "tools_listed": 6,
        "tools_offered": 1,
    }
    assert "gone (stdio, for users): down: FileNotFoundError" in listing

    code, out, _ = await mnemo(home, "mcp", "list", "--json")
    assert code == 1, "a server is down"
    servers = {s["name"]: s for s in json.loads(out)["servers"]}
    assert servers["tt"]["state"] == "ok" and servers["tt"]["tools"] == ["tt__echo"]
    assert servers["gone"]["state"] == "down" and servers["gone"]["tools"] == []

    code, out, _ = await mnemo(home, "doctor", "--timeout", "10")
    lines = out.splitlines()
    assert "✓ mcp tt: 1 tool(s)" in lines
    assert any(line.startswith("✗ mcp gone: down: FileNotFoundError") for line in lines), out


async def test_reload_without_a_running_bot_says_so(home: Path) -> None:
    write_config(home, {"tt": server_config()})
    code, out, _ = await mnemo(home, "mcp", "reload")
    assert code == 0 and "No mnemo is running on this profile" in out


async def test_a_reload_with_a_broken_config_keeps_the_servers(home: Path, emulator: Emulator) -> None:
    write_config(home, {"tt": server_config(tools=["echo"], allowed="users")})
    emulator.script(Reply(text="hi"))
    adapter = LoopbackAdapter("telegram")
    async with telegram_app(home, emulator, adapter) as app:
        (home / "config.yaml").write_text("mcp:\n  servers:\n    tt: {command: x, url: http://y}\n")
        await adapter.say("/mcp reload", user=ADMIN)
        reply = (await adapter.wait_sent(1))[0].text
        await adapter.say("hello", user=U1)
        await adapter.wait_sent(2)
        assert app.mcp is not None and app.mcp.health()["tt"]["state"] == "ok"
    assert "error: invalid configuration" in reply and "mcp.servers.tt" in reply
    assert mcp_tools(emulator, 0) == ["tt__echo"]
