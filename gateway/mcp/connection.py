"""One MCP server, through the official ``mcp`` SDK: the only module that imports it
for the client side (the import happens when a connection starts, so the ``mcp`` extra
is needed only where servers are configured).

The SDK's ``Client`` is an anyio context whose task group must be entered and left by
one task, so each connection has an owner task that opens the client, lists the tools,
then probes the server every ``probe_interval_s`` until it is stopped; calls from any
turn go through the open client meanwhile. SDK errors are mapped here, in one place:

* a call that times out (the server's ``timeout_s``) marks the server ``slow``: its
  calls are refused at once, with no second wait, until a probe gets an answer;
* a closed connection, a dead process or an unreachable URL marks it ``down``: the owner
  reopens it, waiting longer each time (up to the probe interval);
* a JSON-RPC error about the call itself (unknown tool, bad arguments) and a result the
  server flags as an error are tool errors; the server stays ``ok``.

Nothing raised here reaches a turn: ``call`` always returns a ``CallOutcome``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

from mnemo.gateway.config import McpServerSettings
from mnemo.gateway.logs import get_logger
from mnemo.gateway.mcp.catalog import ListedTool

log = get_logger(__name__)

MAX_BACKOFF_S = 30.0
MAX_STDERR_BYTES = 1_000_000


class ServerState(StrEnum):
    STARTING = "starting"
    OK = "ok"
    SLOW = "slow"  # a call or probe timed out: its calls are refused until it answers again
    DOWN = "down"  # not connected: the owner task keeps trying


@dataclass(frozen=True, slots=True)
class ServerHealth:
    name: str
    transport: str  # stdio | http
    state: ServerState
    error: str | None
    tools_listed: int | None  # None: no listing yet

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state.value,
            "transport": self.transport,
            "error": self.error,
            "tools_listed": self.tools_listed,
        }


@dataclass(frozen=True, slots=True)
class CallOutcome:
    text: str
    is_error: bool = False
    own: bool = False  # mnemo's words (unavailable, timed out), not the server's


class McpUnavailable(Exception):
    """Raised inside this module only: the server cannot be reached right now."""


def _describe(e: BaseException) -> str:
    """One line for an exception (an anyio task group wraps the real one)."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def result_text(result: Any) -> CallOutcome:
    """A ``CallToolResult`` as text: text blocks as they are, other media named only."""
    parts: list[str] = []
    for block in result.content or ():
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind} omitted: {getattr(block, 'mime_type', '') or 'unknown type'}]")
        elif kind == "resource_link":
            parts.append(f"[resource link: {block.uri}]")
        elif kind == "resource":
            text = getattr(block.resource, "text", None)
            parts.append(
                text if isinstance(text, str) else f"[binary resource omitted: {block.resource.uri}]"
            )
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return CallOutcome("\n".join(parts), is_error=bool(result.is_error))


class McpConnection:
    """One configured server. ``start`` returns once the first listing succeeded or
    failed (or ``connect_timeout_s`` passed); ``stop`` is idempotent."""

    def __init__(
        self,
        name: str,
        settings: McpServerSettings,
        *,
        connect_timeout_s: float,
        probe_interval_s: float,
        log_dir: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.settings = settings
        self.connect_timeout_s = connect_timeout_s
        self.probe_interval_s = probe_interval_s
        self.log_dir = log_dir
        self.clock = clock
        self.state = ServerState.STARTING
        self.error: str | None = None
        self.listed: tuple[ListedTool, ...] | None = None
        self._client: Any = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()  # a probe or a reconnect is due now
        self._listed = asyncio.Event()  # the first listing attempt finished
        self._stopping = False
        self._stderr: IO[str] | None = None

    @property
    def health(self) -> ServerHealth:
        listed = None if self.listed is None else len(self.listed)
        return ServerHealth(self.name, self.settings.transport, self.state, self.error, listed)

    # --- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"mcp:{self.name}")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.connect_timeout_s):
                await self._listed.wait()
        if self.listed is None and self.state is ServerState.STARTING:
            self._mark(ServerState.DOWN, f"no answer within {self.connect_timeout_s:g} s")

    async def stop(self) -> None:
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    async def relist(self) -> None:
        """List the tools again (a reload): on the open client, or by reconnecting now."""
        client = self._client
        if client is None or self.state is not ServerState.OK:
            self._listed.clear()
            self._wake.set()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.connect_timeout_s):
                    await self._listed.wait()
            return
        try:
            await self._list(client, self.connect_timeout_s)
        except McpUnavailable:
            pass
        except Exception as e:  # the transport failed: the owner task reconnects
            self._lost(e)

    # --- calls -------------------------------------------------------------------------
    async def call(self, tool: str, args: Mapping[str, Any]) -> CallOutcome:
        client = self._client
        if client is None or self.state is not ServerState.OK:
            why = f": {self.error}" if self.error else ""
            return CallOutcome(
                f"MCP server {self.name!r} is unavailable ({self.state.value}{why})", True, own=True
            )
        timeout = self.settings.timeout_s
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        try:
            async with asyncio.timeout(timeout + 1.0):
                result = await client.call_tool(tool, dict(args), read_timeout_seconds=timeout)
        except TimeoutError:
            return self._timed_out(tool)
        except MCPError as e:
            if e.code == REQUEST_TIMEOUT:
                return self._timed_out(tool)
            if e.code == CONNECTION_CLOSED:
                return self._lost(e)
            return CallOutcome(f"MCP server {self.name!r} refused the call to {tool!r}: {e}", True)
        except Exception as e:  # the transport failed (a dead process, a refused connection)
            return self._lost(e)
        return result_text(result)

    def _timed_out(self, tool: str) -> CallOutcome:
        message = f"no answer within {self.settings.timeout_s:g} s"
        self._mark(ServerState.SLOW, message)  # refused until the next probe gets an answer
        return CallOutcome(
            f"MCP server {self.name!r} did not answer {tool!r} in time ({message})", True, own=True
        )

    def _lost(self, e: BaseException) -> CallOutcome:
        self._mark(ServerState.DOWN, _describe(e))
        self._wake.set()
        return CallOutcome(f"MCP server {self.name!r} is unavailable: {_describe(e)}", True, own=True)

    def _mark(self, state: ServerState, error: str | None) -> None:
        if state is not self.state or error != self.error:
            level = log.info if state is ServerState.OK else log.warning
            level("mcp_server_state", server=self.name, state=state.value, error=error)
        self.state = state
        self.error = error

    # --- the owner task ----------------------------------------------------------------
    def _transport(self) -> Any:
        from mcp import Client, StdioServerParameters
        from mcp.client.stdio import stdio_client
        from mcp.client.streamable_http import streamable_http_client

        s = self.settings
        if s.command is not None:
            params = StdioServerParameters(
                command=s.command, args=list(s.args), env={k: v.get_secret_value() for k, v in s.env.items()}
            )
            return Client(stdio_client(params, errlog=self._errlog()))
        assert s.url is not None
        import httpx2

        headers = {k: v.get_secret_value() for k, v in s.headers.items()}
        http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=max(300.0, s.timeout_s)))
        return _OwnedHttp(Client(streamable_http_client(s.url, http_client=http)), http)

    def _errlog(self) -> Any:
        """The server's stderr goes to ``$MNEMO_HOME/logs/mcp-NAME.log`` (not the console)."""
        import sys

        if self.log_dir is None:
            return sys.stderr
        if self._stderr is None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            path = self.log_dir / f"mcp-{self.name}.log"
            if path.exists() and path.stat().st_size > MAX_STDERR_BYTES:
                path.unlink()
            self._stderr = path.open("a", encoding="utf-8")
        return self._stderr

    async def _list(self, client: Any, timeout: float) -> None:
        from mcp import MCPError

        try:
            async with asyncio.timeout(timeout):
                tools: list[ListedTool] = []
                cursor: str | None = None
                for _ in range(100):  # a paginator that never ends cannot hang a reload
                    page = await client.list_tools(cursor=cursor, cache_mode="bypass")
                    tools += [
                        ListedTool(t.name, t.description or "", dict(t.input_schema)) for t in page.tools
                    ]
                    cursor = page.next_cursor
                    if cursor is None:
                        break
            self.listed = tuple(tools)
            self._mark(ServerState.OK, None)
        except TimeoutError:
            self._mark(ServerState.SLOW, f"listing its tools took longer than {timeout:g} s")
            raise McpUnavailable from None
        except MCPError as e:
            self._mark(ServerState.DOWN, _describe(e))
            raise McpUnavailable from e
        finally:
            self._listed.set()

    async def _run(self) -> None:
        backoff = 0.5
        while not self._stopping:
            try:
                async with self._transport() as client:
                    await self._list(client, self.connect_timeout_s)
                    self._client = client
                    backoff = 0.5
                    await self._serve(client)
            except asyncio.CancelledError:
                raise
            except ImportError:
                self._mark(ServerState.DOWN, "the MCP SDK is not installed: pip install 'mnemo[mcp]'")
                self._listed.set()
                return
            except Exception as e:  # loop boundary: whatever the SDK raised, try again later
                if not isinstance(e, McpUnavailable):
                    self._mark(ServerState.DOWN, _describe(e))
            finally:
                self._client = None
                self._listed.set()
            if self._stopping:
                return
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(backoff, self.probe_interval_s)):
                    await self._wake.wait()
            backoff = min(backoff * 2, MAX_BACKOFF_S)

    async def _serve(self, client: Any) -> None:
        """Probe until the connection breaks (then return, and the owner reconnects)."""
        while not self._stopping:
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.probe_interval_s):
                    await self._wake.wait()
            if self._down():
                return
            try:
                await self._list(client, self.settings.timeout_s)
            except McpUnavailable:
                if self._down():
                    return

    def _down(self) -> bool:
        # A method, not an inline test: calls made from other tasks change the state.
        return self.state is ServerState.DOWN


class _OwnedHttp:
    """An HTTP ``Client`` and the httpx client it was given, closed together."""

    def __init__(self, client: Any, http: Any) -> None:
        self.client = client
        self.http = http

    async def __aenter__(self) -> Any:
        try:
            return await self.client.__aenter__()
        except BaseException:
            await self.http.aclose()
            raise

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.client.__aexit__(*exc)
        finally:
            await self.http.aclose()
