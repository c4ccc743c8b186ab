"""``mnemo mcp serve --stdio`` as a real process, driven by the official ``mcp`` SDK's
client, on SQLite and PostgreSQL: a token binds the client to person A, who reads,
writes and searches A's memory and never anything of person B; revoked and expired
tokens are refused. A and B first talk to the bot (a loopback adapter standing in for
Telegram), so their profiles, facts and conversations are the bot's own."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, MCPError, StdioServerParameters

from mnemo.gateway.config import load_settings
from mnemo.gateway.emulator import Emulator, Reply, ToolUse
from mnemo.gateway.mcp.tokens import Tokens
from mnemo.gateway.storage import open_backend
from mnemo.memory.scope import UserRef
from tests.mcp.conftest import clean_environ, env_for, mnemo, telegram_app
from tests.support.loopback import LoopbackAdapter

A, B = "100", "200"


def text_of(result: Any) -> dict[str, Any]:
    return json.loads(result.content[0].text)


@asynccontextmanager
async def served(home: Path, token: str, database: dict[str, str]) -> AsyncIterator[Client]:
    """The SDK's client on ``mnemo mcp serve --stdio`` for ``token``."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "mnemo", "--home", str(home), "mcp", "serve", "--stdio"],
        env={**clean_environ(), **env_for(database, MNEMO_MCP_TOKEN=token)},
    )
    async with Client(params) as client:
        yield client


async def talk(home: Path, emulator: Emulator, database: dict[str, str]) -> None:
    """A and B each tell the bot something: a profile entry, a fact, a message."""
    emulator.script(
        Reply(
            tool_uses=[
                ToolUse("memory", {"action": "add", "target": "user", "content": "A drinks green tea"}),
                ToolUse("fact_store", {"action": "add", "content": "A's dog is called Rex"}),
            ]
        ),
        Reply(text="Noted, Rex it is."),
        Reply(
            tool_uses=[
                ToolUse("memory", {"action": "add", "target": "user", "content": "B's locker code is 4711"}),
                ToolUse("fact_store", {"action": "add", "content": "B's cat Tom chases the dog Rex"}),
            ]
        ),
        Reply(text="Noted."),
    )
    adapter = LoopbackAdapter("telegram")
    async with telegram_app(home, emulator, adapter, **{"memory.provider": "holographic", **database}):
        await adapter.say("my dog is called Rex and I drink green tea", user=A)
        await adapter.wait_sent(1)
        await adapter.say("my cat Tom chases Rex; my locker code is 4711", user=B)
        await adapter.wait_sent(2)


async def new_token(home: Path, database: dict[str, str], user: str, **kw: Any) -> str:
    settings = load_settings(home, environ={}, overrides=database)
    backend = await open_backend(settings)
    try:
        return (
            await Tokens(backend.mcp, **kw.pop("tokens", {})).create(UserRef("telegram", user), **kw)
        ).token
    finally:
        await backend.close()


def without_queries(results: list[dict]) -> str:
    """The answers as JSON, less the queries they repeat (a result echoes its query)."""
    out = []
    for r in results:
        query = r.get("query") or ""
        kept = {k: v for k, v in r.items() if k != "query"}
        out.append(
            {k: v.replace(f'"{query}"', '""') if isinstance(v, str) and query else v for k, v in kept.items()}
        )
    return json.dumps(out)


async def test_a_token_reads_writes_and_searches_only_its_persons_memory(
    home: Path, emulator: Emulator, database: dict[str, str]
) -> None:
    (home / "config.yaml").write_text("memory:\n  provider: holographic\n")
    settings = load_settings(home, environ={}, overrides=database)
    backend = await open_backend(settings)
    try:
        assert backend.files.shared().add("The bot runs on Debian").success
    finally:
        await backend.close()
    await talk(home, emulator, database)
    code, out, err = await mnemo(
        home, "mcp", "token", "create", "--user", f"telegram:{A}", env=env_for(database)
    )
    assert code == 0, err
    token = out.splitlines()[0]

    async with served(home, token, database) as client:
        tools = [t.name for t in (await client.list_tools()).tools]
        assert tools == ["memory_read", "memory_write", "session_search", "recall"]

        read = text_of(await client.call_tool("memory_read", {}))
        assert read["profile"]["entries"] == ["A drinks green tea"]
        assert read["shared"]["entries"] == ["The bot runs on Debian"]

        wrote = text_of(await client.call_tool("memory_write", {"action": "add", "content": "A plays chess"}))
        assert wrote["success"] is True
        # Naming B, or the shared file, changes nothing about whose profile is written.
        for sneaky in ({"target": "memory"}, {"user": f"telegram:{B}"}, {"target": "user", "owner": B}):
            result = await client.call_tool("memory_write", {"action": "add", "content": "A sails", **sneaky})
            assert text_of(result)["success"] is True
        removed = await client.call_tool(
            "memory_write", {"action": "remove", "old_text": "locker code", "user": f"telegram:{B}"}
        )
        assert text_of(removed)["success"] is False, "B's entry is not in A's profile"

        found = text_of(await client.call_tool("session_search", {"query": "Rex"}))
        assert found["count"] >= 1
        texts = json.dumps(found)
        assert "green tea" in texts and "Tom" not in texts and "4711" not in texts

        recalled = text_of(await client.call_tool("recall", {"query": "Rex the dog"}))
        assert "A's dog is called Rex" in recalled["recalled"]
        assert "Tom" not in recalled["recalled"]

        every = [
            text_of(await client.call_tool(name, args))
            for name, args in (
                ("memory_read", {}),
                ("session_search", {"query": "4711 locker Tom cat"}),
                ("recall", {"query": "4711 locker Tom cat"}),
            )
        ]
        answers = without_queries(every)
        assert "4711" not in answers and "Tom" not in answers, "nothing of B, by any tool"

        # Revoked while connected: the next request is refused.
        code, out, err = await mnemo(home, "mcp", "token", "revoke", token, env=env_for(database))
        assert code == 0, err
        with pytest.raises(MCPError, match="unknown, revoked or expired"):
            await client.call_tool("memory_read", {})

    # And the other way round: B's token reaches nothing of A, by any tool.
    code, out, err = await mnemo(
        home, "mcp", "token", "create", "--user", f"telegram:{B}", env=env_for(database)
    )
    assert code == 0, err
    async with served(home, out.splitlines()[0], database) as client:
        seen = [
            text_of(await client.call_tool(name, args))
            for name, args in (
                ("memory_read", {}),
                ("session_search", {"query": "green tea dog chess"}),
                ("recall", {"query": "green tea dog chess sails"}),
            )
        ]
    answers = without_queries(seen)
    assert "4711" in answers, "B sees B's own profile"
    assert "tea" not in answers and "chess" not in answers and "sails" not in answers and "A's" not in answers

    settings = load_settings(home, environ={}, overrides=database)
    backend = await open_backend(settings)
    try:
        files = backend.files
        mine = files.user(UserRef("telegram", A)).load().entries
        theirs = files.user(UserRef("telegram", B)).load().entries
        shared = files.shared().load().entries
    finally:
        await backend.close()
    assert mine == ("A drinks green tea", "A plays chess", "A sails")
    assert theirs == ("B's locker code is 4711",)
    assert shared == ("The bot runs on Debian",)
    # Journaled as the MCP client's, in A's history.
    code, out, err = await mnemo(
        home, "memory", "history", "--user", f"telegram:{A}", "--json", env=env_for(database)
    )
    assert code == 0, err
    added = [e for e in json.loads(out) if e["new"] == "A plays chess" and e["layer"] == "curated"]
    assert [(e["actor"], e["op"]) for e in added] == [("mcp", "add")], added

    # The bot's next session for A starts with the profile the client wrote.
    emulator.script(Reply(text="Hi A."))
    adapter = LoopbackAdapter("telegram")
    async with telegram_app(home, emulator, adapter, **database) as app:
        await adapter.say("/new", user=A)
        await adapter.say("hello again", user=A)
        await adapter.wait_sent(2)
        assert app is not None
    assert "A plays chess" in emulator.requests[-1].system_text


async def test_revoked_expired_unknown_and_read_only_tokens(home: Path, database: dict[str, str]) -> None:
    settings = load_settings(home, environ={}, overrides=database)
    backend = await open_backend(settings)
    try:
        tokens = Tokens(backend.mcp)
        read_only = (await tokens.create(UserRef("telegram", A), read_only=True)).token
        revoked = (await tokens.create(UserRef("telegram", A))).token
        assert await tokens.revoke(revoked) is not None
        past = Tokens(backend.mcp, clock=lambda: time.time() - 7200)
        expired = (await past.create(UserRef("telegram", A), expires_in_s=60)).token
    finally:
        await backend.close()

    async with served(home, read_only, database) as client:
        assert [t.name for t in (await client.list_tools()).tools] == [
            "memory_read",
            "session_search",
            "recall",
        ]
        refused = await client.call_tool("memory_write", {"action": "add", "content": "x"})
        assert refused.is_error and "read-only" in refused.content[0].text

    for token, why in ((revoked, "revoked"), (expired, "expired"), ("mnemo_mcp_0000_forged", "unknown")):
        code, _, err = await mnemo(
            home, "mcp", "serve", "--stdio", env=env_for(database, MNEMO_MCP_TOKEN=token)
        )
        assert code == 1, (why, err)
        assert "MNEMO_MCP_TOKEN is unknown, revoked or expired" in err, why


@pytest.mark.parametrize("database", ["sqlite"], indirect=True)
async def test_token_commands(home: Path, database: dict[str, str]) -> None:
    code, out, _ = await mnemo(
        home, "mcp", "token", "create", "--user", "telegram:100", "--read-only", "--expires", "30d"
    )
    assert code == 0
    token, info = out.splitlines()[:2]
    assert token.startswith("mnemo_mcp_") and "read-only" in info and "shown only now" in info
    code, out, _ = await mnemo(home, "mcp", "token", "list", "--json")
    [row] = [json.loads(line) for line in out.splitlines()]
    assert row["user"] == "telegram:100" and row["read_only"] is True and row["state"] == "active"
    assert row["expires_at"] - row["created_at"] == pytest.approx(30 * 86400)
    assert token not in out and token.split("_")[2] == row["id"]
    code, _, err = await mnemo(home, "mcp", "token", "create", "--user", "nobody")
    assert code == 2 and "--user" in err
    code, _, err = await mnemo(home, "mcp", "token", "create", "--user", "telegram:1", "--expires", "soon")
    assert code == 2 and "--expires" in err
    code, out, _ = await mnemo(home, "mcp", "token", "revoke", row["id"])
    assert code == 0 and row["id"] in out
    code, _, err = await mnemo(home, "mcp", "token", "revoke", row["id"])
    assert code == 1 and "no active token" in err
    code, out, _ = await mnemo(home, "mcp", "token", "list")
    assert "revoked" in out
    db = (home / "state.db").read_bytes()
    assert token.encode() not in db, "only the token's hash is stored"


async def test_erasing_a_person_removes_their_tokens(home: Path, database: dict[str, str]) -> None:
    from mnemo.gateway.people.erasure import Erasure

    settings = load_settings(home, environ={}, overrides=database)
    backend = await open_backend(settings)
    try:
        tokens = Tokens(backend.mcp)
        theirs = (await tokens.create(UserRef("telegram", A))).token
        other = (await tokens.create(UserRef("telegram", B))).token
        receipt = await Erasure(backend.personal_data, settings).erase(UserRef("telegram", A))
        assert await tokens.verify(theirs) is None
        assert await tokens.verify(other) is not None
        assert [str(t.user) for t in await tokens.list()] == [f"telegram:{B}"]
    finally:
        await backend.close()
    assert receipt.counts["mcp_tokens"] == 1
