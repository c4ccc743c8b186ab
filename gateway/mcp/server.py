"""``mnemo mcp serve``: one person's memory (``person.py``) over MCP, with the official
SDK's low-level ``Server`` (imported here only, when the command runs).

Who a request acts for is its token's grant, checked on every request (a revoked or
expired token stops working for a client that is already connected):

* ``--stdio``: the client starts the process with ``MNEMO_MCP_TOKEN`` in its
  environment; stdout carries only the protocol.
* ``--http HOST:PORT``: streamable HTTP, stateless (each request stands alone), on
  loopback unless told otherwise. ``Guard`` answers before the SDK sees a request:
  403 for an ``Origin`` not in ``mcp.serve.allowed_origins`` (browsers send one; other
  clients do not), 421 for a ``Host`` that is not the loopback address it listens on
  (DNS rebinding), 401 without a valid ``Authorization: Bearer`` token.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from mnemo.gateway.logs import get_logger
from mnemo.gateway.mcp.person import PersonMemory
from mnemo.gateway.mcp.tokens import Grant, Tokens

log = get_logger(__name__)

GRANT_KEY = "mnemo.grant"
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "[::1]"})
INSTRUCTIONS = (
    "mnemo's memory of one person: read it with memory_read, search their past conversations with "
    "session_search, ask the memory provider with recall, and (unless the token is read-only) keep "
    "their profile up to date with memory_write."
)
GrantOf = Callable[[Any], Awaitable[Grant | None]]


def build_server(memory: PersonMemory, grant_of: GrantOf) -> Any:
    import mcp_types as types
    from mcp import MCPError
    from mcp.server.lowlevel.server import Server

    import mnemo

    async def grant(ctx: Any) -> Grant:
        found = await grant_of(ctx)
        if found is None:
            raise MCPError(code=types.INVALID_REQUEST, message="the token is unknown, revoked or expired")
        return found

    async def list_tools(ctx: Any, params: Any) -> Any:
        g = await grant(ctx)
        return types.ListToolsResult(
            tools=[
                types.Tool(name=s["name"], description=s["description"], input_schema=s["input_schema"])
                for s in memory.tools(g)
            ]
        )

    async def call_tool(ctx: Any, params: Any) -> Any:
        g = await grant(ctx)
        result = await memory.call(g, params.name, params.arguments or {})
        failed = result.get("success") is False or "error" in result
        text = json.dumps(result, ensure_ascii=False)
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=failed)

    return Server(
        "mnemo",
        version=mnemo.__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def serve_stdio(memory: PersonMemory, tokens: Tokens, token: str) -> None:
    from mcp.server.stdio import stdio_server

    async def grant_of(ctx: Any) -> Grant | None:
        return await tokens.verify(token)

    server = build_server(memory, grant_of)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Guard:
    """The checks every HTTP request passes before the MCP app (see the module text)."""

    def __init__(self, app: Any, tokens: Tokens, *, host: str, allowed_origins: Sequence[str] = ()) -> None:
        self.app = app
        self.tokens = tokens
        self.allowed_origins = frozenset(o.rstrip("/") for o in allowed_origins)
        self.loopback = is_loopback(host)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        origin = headers.get("origin")
        if origin is not None and origin.rstrip("/") not in self.allowed_origins:
            return await _deny(send, 403, "origin not allowed (mcp.serve.allowed_origins)")
        if self.loopback and _hostname(headers.get("host", "")) not in LOOPBACK_NAMES:
            return await _deny(send, 421, "this server answers on its loopback address only")
        scheme, _, token = headers.get("authorization", "").partition(" ")
        grant = await self.tokens.verify(token.strip()) if scheme.lower() == "bearer" else None
        if grant is None:
            return await _deny(send, 401, "a valid bearer token is required (mnemo mcp token create)")
        await self.app({**scope, GRANT_KEY: grant}, receive, send)


def _hostname(host: str) -> str:
    """``Host`` without its port: ``localhost:8766`` → ``localhost``, ``[::1]:8766`` → ``[::1]``."""
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.split(":", 1)[0]


async def _deny(send: Any, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    extra = [(b"www-authenticate", b'Bearer realm="mnemo"')] if status == 401 else []
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *extra,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def http_app(memory: PersonMemory, tokens: Tokens, *, host: str, allowed_origins: Sequence[str] = ()) -> Any:
    """The ASGI app of ``--http``: ``Guard`` around the SDK's streamable-HTTP app at ``/mcp``."""
    from mcp.server.transport_security import TransportSecuritySettings

    async def grant_of(ctx: Any) -> Grant | None:
        request = ctx.request
        found = request.scope.get(GRANT_KEY) if request is not None else None
        return found if isinstance(found, Grant) else None

    server = build_server(memory, grant_of)
    inner = server.streamable_http_app(
        streamable_http_path="/mcp",
        stateless_http=True,
        json_response=True,
        # Guard checks Origin and Host itself (one place for the rules).
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        host=host,
    )
    return Guard(inner, tokens, host=host, allowed_origins=allowed_origins)


async def serve_http(app: Any, host: str, port: int, *, started: Callable[[int], None] | None = None) -> None:
    """Serve ``app`` until cancelled or interrupted; ``started(port)`` once listening."""
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    if started is None:
        await server.serve()
        return
    import asyncio

    task = asyncio.create_task(server.serve())
    while not server.started and not task.done():
        await asyncio.sleep(0.02)
    if server.started:
        sockets = [s for srv in server.servers for s in srv.sockets]
        started(int(sockets[0].getsockname()[1]) if sockets else port)
    await task
