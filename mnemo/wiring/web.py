"""The local HTTP server's own routes: ``/healthz`` (with this replica's id), and the
operator's dashboard at ``/admin``. Adapters have added their routes before this; the
server starts after the gateway and before the adapters."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

from mnemo.gateway.budgets.gate import BudgetGate
from mnemo.gateway.config import Settings
from mnemo.gateway.cron.service import CronJobs
from mnemo.gateway.inbound.access import AccessControl
from mnemo.gateway.inbound.pipeline import Gateway
from mnemo.gateway.jobs.queue import JobQueue
from mnemo.gateway.mcp.hub import McpHub
from mnemo.gateway.storage import StorageBackend
from mnemo.gateway.webserver import WebServer
from mnemo.memory.skills import SkillStore


async def start_web(
    stack: AsyncExitStack,
    web: WebServer,
    settings: Settings,
    backend: StorageBackend,
    *,
    gateway: Gateway,
    replica_id: str,
    access: AccessControl,
    budgets: BudgetGate,
    cron: CronJobs,
    jobs: JobQueue,
    skills: SkillStore,
    mcp: McpHub,
) -> None:
    async def health() -> dict[str, Any]:
        servers = mcp.health()  # each MCP server's state, when there are any
        return {**await gateway.health(), "replica": replica_id, **({"mcp": servers} if servers else {})}

    web.set_health_probe(health)
    from mnemo.dashboard import mount_dashboard  # /admin: the operator's dashboard

    mount_dashboard(
        web,
        settings,
        directory=backend.directory,
        store=backend.sessions,
        search=backend.search,
        files=backend.files,
        skills=skills,
        cron=cron,
        jobs=jobs,
        budgets=budgets,
        health=gateway.health,
        is_admin=access.is_admin,
        links=backend.links,
        journal=backend.journal,
        policies=backend.policies,
        proposals=backend.proposals,
    )
    await web.start()
    stack.push_async_callback(web.stop)
