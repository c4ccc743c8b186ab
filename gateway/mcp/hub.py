"""The MCP servers the agent uses (``mcp.servers``): connections, catalogs, reloads.

``McpHub`` is a ``ToolSource`` (``gateway/turns/tools.py``). Its life:

* ``start`` connects every server at once and waits for their tool lists (at most
  ``mcp.connect_timeout_s``), then stores the catalog (``catalog.py``). A server that
  is down or slow then contributes no tools: they are withheld, not half-called.
* ``tools_for`` gives a turn the tools of the catalog its session started with — never
  one fetched later, so a session's tool definitions stay byte for byte the same —
  minus the servers the speaker may not use (``allowed``, checked at every turn with the
  current configuration, so taking someone off a list applies at once) and those no
  longer configured.
* ``reload`` (``/mcp reload``, or ``mnemo mcp reload`` through ``mcp_reloads``, which
  every running process polls) reads ``mcp.servers`` again, reconnects what changed,
  lists every server again and stores a new catalog for the sessions that start after it.
* ``health`` is each server's state for ``/healthz``.

A call goes to the server's live connection (``connection.py``), which refuses at once
while the server is down or has just timed out; the result is made safe in ``results.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mnemo.gateway.config import McpServerSettings, McpSettings
from mnemo.gateway.errors import ConfigError
from mnemo.gateway.logs import get_logger
from mnemo.gateway.mcp.catalog import Catalog, McpTool, server_tools
from mnemo.gateway.mcp.connection import McpConnection, ServerState
from mnemo.gateway.mcp.results import untrusted
from mnemo.gateway.mcp.store import McpRepository, report_json
from mnemo.gateway.turns.audience import describe, may_use
from mnemo.gateway.turns.tools import Tool, ToolResult, TurnContext
from mnemo.memory.scope import AgentContext, UserRef
from mnemo.memory.sessions import SessionRow

log = get_logger(__name__)

RELOAD_POLL_S = 2.0
# MCP tools act for the speaker: offered in conversations and scheduled runs, and to a
# sub-agent only when its task grants them; never to background memory passes.
CONTEXTS = frozenset({AgentContext.PRIMARY, AgentContext.CRON, AgentContext.SUBAGENT})
_SESSION_CACHE = 10_000


@dataclass(frozen=True, slots=True)
class ServerReport:
    name: str
    transport: str
    state: str
    error: str | None
    allowed: str
    tools: tuple[str, ...]  # SERVER__TOOL names offered
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "transport": self.transport,
            "state": self.state,
            "error": self.error,
            "allowed": self.allowed,
            "tools": list(self.tools),
            "warnings": list(self.warnings),
        }

    def line(self) -> str:
        what = (
            f"{len(self.tools)} tool(s)"
            if self.state == "ok"
            else f"{self.state}: {self.error or 'no answer'}"
        )
        return f"{self.name} ({self.transport}, for {self.allowed}): {what}"


@dataclass(frozen=True, slots=True)
class McpReport:
    servers: tuple[ServerReport, ...]
    version: int | None = None  # the catalog stored
    error: str | None = None  # the configuration could not be read (nothing changed)

    def to_json(self) -> dict[str, Any]:
        return {"servers": [s.to_json() for s in self.servers], "catalog": self.version, "error": self.error}

    @classmethod
    def from_json(cls, text: str) -> McpReport:
        data = json.loads(text)
        servers = tuple(
            ServerReport(
                s["name"],
                s["transport"],
                s["state"],
                s["error"],
                s["allowed"],
                tuple(s["tools"]),
                tuple(s.get("warnings", ())),
            )
            for s in data.get("servers", ())
        )
        return cls(servers, data.get("catalog"), data.get("error"))

    def lines(self) -> list[str]:
        out = [f"error: {self.error}"] if self.error else []
        out += [s.line() for s in self.servers] or ["no MCP servers configured (mcp.servers)"]
        out += [f"  warning: {w}" for s in self.servers for w in s.warnings]
        return out


def build_catalog(connections: Mapping[str, McpConnection]) -> tuple[Catalog, dict[str, list[str]]]:
    """The tools of every server that answered (sorted by server), and the warnings."""
    tools: list[McpTool] = []
    warnings: dict[str, list[str]] = {}
    for name in sorted(connections):
        conn = connections[name]
        if conn.state is not ServerState.OK or conn.listed is None:
            continue
        allow = None if conn.settings.tools == "all" else conn.settings.tools
        offered, warned = server_tools(name, conn.listed, allow)
        tools += offered
        warnings[name] = warned
        for w in warned:
            log.warning("mcp_tool_left_out", server=name, warning=w)
    return Catalog(tuple(tools)), warnings


class McpHub:
    def __init__(
        self,
        settings: McpSettings,
        repo: McpRepository,
        *,
        log_dir: Path | None = None,
        reload_settings: Callable[[], McpSettings] | None = None,
        replica: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.repo = repo
        self.log_dir = log_dir
        self.reload_settings = reload_settings
        self.replica = replica
        self.clock = clock
        self.connections: dict[str, McpConnection] = {}
        self.current = Catalog()
        self.warnings: dict[str, list[str]] = {}
        self._catalogs: dict[int, tuple[Catalog, tuple[Tool, ...]]] = {}
        self._session_versions: OrderedDict[str, int | None] = OrderedDict()
        self._reloading = asyncio.Lock()
        self._seen_reload = 0
        self._poller: asyncio.Task[None] | None = None

    # --- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        self._seen_reload = await self.repo.last_reload()
        if self.settings.servers:
            await self._reconcile(self.settings)
            await self._publish()
        self._poller = asyncio.create_task(self._poll(), name="mcp:reloads")

    async def stop(self) -> None:
        poller, self._poller = self._poller, None
        if poller is not None:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
        await asyncio.gather(*(c.stop() for c in self.connections.values()))
        self.connections.clear()

    def _connection(self, name: str, server: McpServerSettings) -> McpConnection:
        return McpConnection(
            name,
            server,
            connect_timeout_s=self.settings.connect_timeout_s,
            probe_interval_s=self.settings.probe_interval_s,
            log_dir=self.log_dir,
        )

    async def _reconcile(self, settings: McpSettings) -> None:
        """Connections for ``settings``: unchanged servers list again, changed ones are
        restarted, removed ones stopped, new ones started."""
        old = self.connections
        self.settings = settings
        keep: dict[str, McpConnection] = {}
        stop: list[McpConnection] = []
        for name, conn in old.items():
            if settings.servers.get(name) == conn.settings:
                keep[name] = conn
            else:
                stop.append(conn)
        await asyncio.gather(*(c.stop() for c in stop))
        new = {n: self._connection(n, s) for n, s in settings.servers.items() if n not in keep}
        self.connections = {n: keep.get(n) or new[n] for n in settings.servers}
        await asyncio.gather(*(c.relist() for c in keep.values()), *(c.start() for c in new.values()))

    async def _publish(self) -> int:
        catalog, self.warnings = build_catalog(self.connections)
        row = await self.repo.add_catalog(catalog.digest, catalog.to_json(), self.clock())
        self.current = catalog
        self._remember(row.version, catalog)
        log.info("mcp_catalog", version=row.version, tools=len(catalog.tools), servers=len(self.connections))
        return row.version

    # --- reloads -----------------------------------------------------------------------
    async def reload(self, *, generation: int | None = None) -> McpReport:
        """Read ``mcp.servers`` again, reconnect and list, store a new catalog."""
        async with self._reloading:
            settings = self.settings
            if self.reload_settings is not None:
                try:
                    settings = self.reload_settings()
                except ConfigError as e:
                    report = McpReport(self.report().servers, None, str(e).replace("\n", " "))
                    await self._finish(generation, report)
                    return report
            await self._reconcile(settings)
            version = await self._publish()
            report = McpReport(self.report().servers, version)
            await self._finish(generation, report)
            return report

    async def request_reload(self) -> McpReport:
        """``/mcp reload``: this process now, the other replicas through the table."""
        generation = await self.repo.request_reload(self.clock())
        self._seen_reload = max(self._seen_reload, generation)
        return await self.reload(generation=generation)

    async def _finish(self, generation: int | None, report: McpReport) -> None:
        if generation is not None:
            await self.repo.finish_reload(
                generation, self.clock(), self.replica, report_json(report.to_json())
            )

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(RELOAD_POLL_S)
            try:
                latest = await self.repo.last_reload()
                if latest > self._seen_reload:
                    self._seen_reload = latest
                    log.info("mcp_reload_requested", generation=latest)
                    await self.reload(generation=latest)
            except Exception:  # loop boundary: the next poll tries again
                log.exception("mcp_reload_failed")

    # --- what people get ---------------------------------------------------------------
    def report(self) -> McpReport:
        servers = []
        for name, server in self.settings.servers.items():
            conn = self.connections.get(name)
            state, error = (conn.state.value, conn.error) if conn is not None else ("down", "not started")
            servers.append(
                ServerReport(
                    name,
                    server.transport,
                    state,
                    error,
                    describe(server.allowed),
                    tuple(t.name for t in self.current.of(name)),
                    tuple(self.warnings.get(name, ())),
                )
            )
        return McpReport(tuple(servers))

    def health(self) -> dict[str, Any]:
        """``/healthz``'s ``mcp``: each server's state and how many of its tools are offered."""
        return {
            name: {**conn.health.to_json(), "tools_offered": len(self.current.of(name))}
            for name, conn in self.connections.items()
        }

    def names_for(self, speaker: UserRef | None, *, is_admin: bool) -> frozenset[str]:
        """The MCP tools a session starting now offers this speaker (the skills index)."""
        return frozenset(t.name for t in self.current.tools if self._allows(t.server, speaker, is_admin))

    def _allows(self, server: str, speaker: UserRef | None, is_admin: bool) -> bool:
        configured = self.settings.servers.get(server)
        return configured is not None and may_use(configured.allowed, speaker, is_admin=is_admin)

    async def tools_for(self, ctx: TurnContext, session: SessionRow) -> Sequence[Tool]:
        if not self.settings.servers or ctx.agent_context not in CONTEXTS:
            return ()
        tools = await self._session_tools(session)
        return [t for t in tools if self._allows(t.name.split("__", 1)[0], ctx.speaker, ctx.is_admin)]

    async def _session_tools(self, session: SessionRow) -> tuple[Tool, ...]:
        version = self._session_versions.get(session.id, -1)
        if version == -1:
            row = await self.repo.catalog_at(session.started_at.timestamp())
            version = None if row is None else row.version
            if row is not None and row.version not in self._catalogs:
                self._remember(row.version, Catalog.from_json(row.tools))
            self._session_versions[session.id] = version
            if len(self._session_versions) > _SESSION_CACHE:
                self._session_versions.popitem(last=False)
        return () if version is None else self._catalogs[version][1]

    def _remember(self, version: int, catalog: Catalog) -> None:
        if version not in self._catalogs:
            self._catalogs[version] = (catalog, tuple(self._tool(t) for t in catalog.tools))

    def _tool(self, spec: McpTool) -> Tool:
        async def handler(args: Mapping[str, Any], ctx: TurnContext) -> ToolResult:
            conn = self.connections.get(spec.server)
            if conn is None:
                return ToolResult(f"MCP server {spec.server!r} is no longer configured.", is_error=True)
            outcome = await conn.call(spec.tool, args)
            if outcome.own:
                return ToolResult(outcome.text, is_error=True)  # mnemo's own words: unavailable, timed out
            text, withheld = untrusted(
                outcome.text, server=spec.server, tool=spec.name, limit=self.settings.max_result_chars
            )
            if withheld:
                log.warning("mcp_result_withheld", server=spec.server, tool=spec.tool, session=ctx.session_id)
            return ToolResult(text, is_error=outcome.is_error or withheld)

        return Tool(spec.name, spec.schema(), handler, contexts=CONTEXTS)
