"""The MCP servers the agent uses, through the whole pipeline (a loopback adapter, the
real anthropic SDK against the emulator, the stdio test server): a session keeps the tool
set it started with across reloads and restarts, ``/mcp reload`` and ``mnemo mcp reload``
reach the running bot, a server that is down is reported and its tools withheld, and
``mnemo mcp list`` / ``mnemo doctor`` show the servers."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from mnemo.gateway.config import load_settings
from mnemo.gateway.emulator import Emulator, Reply, ToolUse
from mnemo.gateway.mcp.connection import CallOutcome, ServerState
from mnemo.gateway.mcp.hub import McpHub
from mnemo.gateway.mcp.store import McpStore
from mnemo.gateway.storage import state_database
from tests.adapters.telegram_harness import free_port
from tests.mcp.conftest import (
    ROOT,
    clean_environ,
    env_for,
    mnemo,
    result_text,
    server_calls,
    server_config,
    telegram_app,
    tool_results,
)
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
        "tools_listed": 7,
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


async def test_a_streamable_http_server_with_a_secret_header_from_dotenv(
    home: Path, emulator: Emulator
) -> None:
    port = free_port()
    server = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.mcp_server",
        "--http",
        str(port),
        env={**clean_environ(), "PYTHONPATH": str(ROOT), "MCP_TEST_BEARER": "s3cret-token"},
    )
    try:
        async with asyncio.timeout(60):
            while True:
                try:
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.close()
                    break
                except OSError:
                    await asyncio.sleep(0.1)
        url = f"http://127.0.0.1:{port}/mcp"
        (home / ".env").write_text("WEB_MCP_TOKEN=s3cret-token\n")
        write_config(
            home,
            {
                "web": {
                    "url": url,
                    "headers": {"Authorization": "Bearer ${WEB_MCP_TOKEN}"},
                    "allowed": "users",
                },
                "wrong": {"url": url, "headers": {"Authorization": "Bearer nope"}, "allowed": "users"},
            },
        )
        emulator.script(
            Reply(tool_uses=[ToolUse("web__echo", {"text": "over http"})]),
            Reply(text="done"),
        )
        adapter = LoopbackAdapter("telegram")
        async with telegram_app(home, emulator, adapter) as bot:
            await adapter.say("echo it", user=U1)
            await adapter.wait_sent(1)
            health = bot.mcp.health() if bot.mcp is not None else {}
    finally:
        server.terminate()
        await server.wait()
    assert [n for n in emulator.requests[0].tool_names if "__" in n][0] == "web__add"
    assert not [n for n in emulator.requests[0].tool_names if n.startswith("wrong__")]
    [block] = tool_results(emulator.requests[1])
    assert "echo: over http" in result_text(block)
    assert health["web"]["state"] == "ok" and health["web"]["transport"] == "http"
    assert health["wrong"]["state"] == "down"


async def test_a_server_that_dies_is_down_then_started_again(home: Path, tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    settings = load_settings(
        home, environ={}, overrides={"mcp.servers": {"tt": server_config(log, allowed="users")}}
    )
    db = state_database(settings.state_db)
    await db.open()
    hub = McpHub(settings.mcp, McpStore(db), log_dir=home / "logs")
    await hub.start()
    try:
        conn = hub.connections["tt"]
        died = await conn.call("crash", {})
        assert died.is_error and died.own and "unavailable" in died.text
        assert conn.state is ServerState.DOWN
        refused = await conn.call("echo", {"text": "too soon"})
        assert refused.is_error and refused.own
        async with asyncio.timeout(60):
            while conn.state is not ServerState.OK:
                await asyncio.sleep(0.05)
        back = await conn.call("echo", {"text": "again"})
        assert back == CallOutcome("echo: again")
    finally:
        await hub.stop()
        await db.close()
    assert [c["tool"] for c in server_calls(log)] == ["crash", "echo"], "the refused call never reached it"


async def test_without_the_sdk_the_commands_say_which_extra_to_install(home: Path) -> None:
    write_config(home, {"tt": server_config()})
    script = (
        "import sys; sys.modules['mcp'] = None; from mnemo.cli.main import main; "
        f"sys.exit(main(['--home', {str(home)!r}, 'mcp', 'list']))"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stderr=asyncio.subprocess.PIPE, env=clean_environ()
    )
    _, err = await proc.communicate()
    assert proc.returncode == 2
    assert err.decode().strip() == "mnemo: the MCP SDK is not installed: pip install 'mnemo[mcp]'"
