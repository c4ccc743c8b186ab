"""``mnemo mcp serve --http``: the guard in front of the SDK's streamable-HTTP app
(bearer token, Origin, Host) and one person per token, with the official SDK's client
over HTTP; and ``--http`` as a real process on loopback."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from mnemo.gateway.config import load_settings
from mnemo.gateway.mcp.person import PersonMemory
from mnemo.gateway.mcp.server import http_app, serve_http
from mnemo.gateway.mcp.tokens import Tokens
from mnemo.gateway.storage import open_backend
from mnemo.memory.scope import UserRef
from tests.mcp.conftest import clean_environ, env_for

A, B = UserRef("telegram", "100"), UserRef("telegram", "200")


@asynccontextmanager
async def http_server(home: Path, database: dict[str, str]) -> AsyncIterator[tuple[str, Tokens, Any]]:
    settings = load_settings(
        home, environ={}, overrides={**database, "mcp.serve.allowed_origins": ("https://ok.example",)}
    )
    backend = await open_backend(settings)
    files = backend.files
    memory = PersonMemory(files, backend.search, backend.mcp, home=home)
    tokens = Tokens(backend.mcp)
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    app = http_app(memory, tokens, host="127.0.0.1", allowed_origins=settings.mcp.serve.allowed_origins)
    task = asyncio.create_task(serve_http(app, "127.0.0.1", 0, started=bound.set_result))
    try:
        port = await asyncio.wait_for(bound, 30)
        yield f"http://127.0.0.1:{port}/mcp", tokens, files
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await backend.close()


@asynccontextmanager
async def client(url: str, token: str) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http:
        async with Client(streamable_http_client(url, http_client=http)) as c:
            yield c


async def test_each_token_reaches_its_own_person_and_the_guard_refuses_the_rest(
    home: Path, database: dict[str, str]
) -> None:
    async with http_server(home, database) as (url, tokens, files):
        await asyncio.to_thread(files.user(A).add, "A likes tea")
        await asyncio.to_thread(files.user(B).add, "B's PIN is 9876")
        token_a = (await tokens.create(A)).token
        token_b = (await tokens.create(B, read_only=True)).token

        async with client(url, token_a) as a:
            read = json.loads((await a.call_tool("memory_read", {})).content[0].text)
            assert read["profile"]["entries"] == ["A likes tea"]
            await a.call_tool("memory_write", {"action": "add", "content": "A cycles", "user": str(B)})
        async with client(url, token_b) as b:
            read = json.loads((await b.call_tool("memory_read", {})).content[0].text)
            assert read["profile"]["entries"] == ["B's PIN is 9876"]
            assert "memory_write" not in [t.name for t in (await b.list_tools()).tools]
        assert files.user(A).load().entries == ("A likes tea", "A cycles")
        assert files.user(B).load().entries == ("B's PIN is 9876",)

        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        accept = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        async with aiohttp.ClientSession() as http:
            for headers, status in (
                ({}, 401),
                ({"Authorization": "Bearer mnemo_mcp_0000_forged"}, 401),
                ({"Authorization": token_a}, 401),
                ({"Authorization": f"Bearer {token_a}", "Origin": "https://evil.example"}, 403),
                ({"Authorization": f"Bearer {token_a}", "Host": "attacker.example"}, 421),
                ({"Authorization": f"Bearer {token_a}", "Origin": "https://ok.example"}, 200),
                ({"Authorization": f"Bearer {token_a}"}, 200),
            ):
                async with http.post(url, json=body, headers={**accept, **headers}) as resp:
                    assert resp.status == status, (headers, await resp.text())
            await tokens.revoke(token_a)
            async with http.post(
                url, json=body, headers={**accept, "Authorization": f"Bearer {token_a}"}
            ) as resp:
                assert resp.status == 401, "a revoked token is refused at the next request"


@pytest.mark.parametrize("database", ["sqlite"], indirect=True)
async def test_serve_http_listens_on_loopback_by_default(home: Path, database: dict[str, str]) -> None:
    settings = load_settings(home, environ={})
    backend = await open_backend(settings)
    try:
        token = (await Tokens(backend.mcp).create(A)).token
    finally:
        await backend.close()
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "mnemo", "--home", str(home), "mcp", "serve", "--http", "0"),
        stderr=asyncio.subprocess.PIPE,
        env={**clean_environ(), **env_for(database)},
    )
    try:
        assert proc.stderr is not None
        line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/mcp", line)
        assert m, line
        async with client(f"http://127.0.0.1:{m.group(1)}/mcp", token) as c:
            assert "memory_read" in [t.name for t in (await c.list_tools()).tools]
    finally:
        proc.terminate()
        await proc.wait()
