"""Lifecycle in one place: build every component and enter it in one AsyncExitStack.

    store → LLM client (→ emulator in trial mode) → memory providers → worker queue
          → scheduler → gateway → adapters

and exit in reverse. ``mnemo run``, ``mnemo chat``, ``mnemo demo`` and the end-to-end
tests all go through ``open_app`` so they run the same pipeline.

Start-up rules: with nothing configured mnemo runs in **local trial mode** (loopback
adapters, the scripted offline model served by the in-process emulator, a banner
saying so). A platform token without an LLM key or base URL is refused: a public bot
never answers with the scripted model.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mnemo.gateway.budgets.gate import BudgetGate
from mnemo.gateway.budgets.ledger import Clock, utc_now
from mnemo.gateway.budgets.upkeep import Upkeep
from mnemo.gateway.config import Settings
from mnemo.gateway.cron.scheduler import CronRunner, CronScheduler
from mnemo.gateway.cron.service import CronJobs
from mnemo.gateway.delivery import Ledgers
from mnemo.gateway.delivery.inbox import InboxRepository
from mnemo.gateway.delivery.outbox import OutboxRepository
from mnemo.gateway.inbound.access import AccessControl
from mnemo.gateway.inbound.commands import CommandRegistry
from mnemo.gateway.inbound.pipeline import Gateway
from mnemo.gateway.jobs.consolidation import Consolidation
from mnemo.gateway.jobs.housekeeping import Housekeeping
from mnemo.gateway.jobs.queue import JobQueue
from mnemo.gateway.llm.client import LLMClient
from mnemo.gateway.logs import get_logger
from mnemo.gateway.mcp.command import mcp_command
from mnemo.gateway.mcp.hub import McpHub
from mnemo.gateway.media import MediaStore
from mnemo.gateway.media_quota import MediaQuota
from mnemo.gateway.metrics import Metrics
from mnemo.gateway.people.command import ForgetMe
from mnemo.gateway.people.erasure import Erasure
from mnemo.gateway.people.link_command import OutboxNotices
from mnemo.gateway.people.links import LinkRepository
from mnemo.gateway.ports import Adapter
from mnemo.gateway.replicas import ReplicaMonitor
from mnemo.gateway.storage import open_backend
from mnemo.gateway.supervisor import AdapterSupervisor
from mnemo.gateway.turns.agent import AgentDeps
from mnemo.gateway.turns.policy import MemoryPolicies, defaults_of
from mnemo.gateway.turns.providers import open_providers
from mnemo.gateway.turns.sessions import SessionResolver
from mnemo.gateway.turns.tools import ToolRegistry
from mnemo.gateway.webserver import WebServer
from mnemo.memory.db import Database
from mnemo.memory.journal import JournalRepository
from mnemo.memory.manager import MemoryManager
from mnemo.memory.ports import CuratedRepository, SearchRepository, SessionStorage
from mnemo.memory.skills import SkillStore
from mnemo.wiring.background import (
    register_background,
    register_consolidation,
    start_consolidation,
    start_jobs,
    start_upload_sweep,
)
from mnemo.wiring.commands import build_commands
from mnemo.wiring.model import open_model
from mnemo.wiring.replicas import join_replicas
from mnemo.wiring.schedules import start_schedules
from mnemo.wiring.tools import build_tools, open_tool_sources
from mnemo.wiring.web import start_web

if TYPE_CHECKING:
    from mnemo.memory.pg.db import PgDatabase

log = get_logger(__name__)


@dataclass
class App:
    settings: Settings
    db: Database | PgDatabase
    store: SessionStorage
    inbox: InboxRepository
    outbox: OutboxRepository
    files: CuratedRepository
    search: SearchRepository
    llm: LLMClient
    tools: ToolRegistry
    access: AccessControl
    commands: CommandRegistry
    gateway: Gateway
    metrics: Metrics
    providers: MemoryManager
    web: WebServer | None = None
    jobs: JobQueue | None = None
    housekeeping: Housekeeping | None = None
    consolidation: Consolidation | None = None
    trial: bool = False
    emulator: object | None = None
    adapters: list[Adapter] = field(default_factory=list)
    cron: CronJobs | None = None
    cron_runner: CronRunner | None = None
    scheduler: CronScheduler | None = None  # None when open_app(..., scheduler=False)
    adapter_supervisor: AdapterSupervisor | None = None  # retries adapters unreachable at start
    budgets: BudgetGate | None = None  # the backend's ledger behind the gate
    links: LinkRepository | None = None  # linked identities (/link)
    journal: JournalRepository | None = None  # every memory write with its provenance
    policies: MemoryPolicies | None = None  # what may be remembered, per person and chat
    replicas: ReplicaMonitor | None = None  # on PostgreSQL (gateway/replicas.py); None on SQLite
    mcp: McpHub | None = None  # the MCP servers the agent uses (gateway/mcp)


@asynccontextmanager
async def open_app(
    settings: Settings,
    *,
    adapters: Sequence[Adapter] = (),
    web: WebServer | None = None,
    metrics: Metrics | None = None,
    llm_base_url: str | None = None,
    api_key: str | None = None,
    trial: bool | None = None,
    scheduler: bool = True,
    clock: Clock = utc_now,
) -> AsyncIterator[App]:
    """Build, start and yield the whole application; stop it in reverse on exit.

    ``trial`` forces (or forbids) the scripted emulator; by default it is on exactly
    when nothing is configured. ``llm_base_url`` points the client elsewhere (tests).
    ``web`` is the local HTTP server adapters have added their routes to; it gets
    ``/healthz`` and ``/metrics`` and is started after the gateway, before adapters.
    ``scheduler=False`` leaves cron jobs to another process (``mnemo cron run-now``'s
    minimal app runs one job and nothing else). ``clock`` is the budgets' time (which
    day a request counts in); tests move it across midnight.
    """
    metrics = metrics or (web.metrics if web is not None else Metrics())
    settings.check_can_serve()
    use_trial = settings.trial_mode and llm_base_url is None if trial is None else trial
    async with AsyncExitStack() as stack:
        # SQLite state.db or PostgreSQL (database.url): the same repositories either way,
        # and the backend builds what differs (links, budgets, erasure, rate limits).
        backend = await open_backend(settings, serve=True, clock=clock)
        stack.push_async_callback(backend.close)
        # Spend is counted in the same write as the session's usage (gateway/budgets).
        # Background memory work has caps of its own (memory.upkeep, gateway/budgets/upkeep.py).
        upkeep = Upkeep(settings.memory.upkeep, backend.budgets)
        budgets = BudgetGate(settings.budgets, backend.budgets, upkeep)
        from mnemo.backups import scrubber

        forget_me = ForgetMe(Erasure(backend.personal_data, settings, scrub=scrubber(settings)))
        # Memory policies, read where each write happens (memory/policy.py).
        policies = MemoryPolicies(backend.policies, defaults_of(settings.memory.policy), backend.identities)
        # Every model request passes the budget gate (gateway/budgets/gate.py).
        model = await open_model(
            stack, settings, metrics, gate=budgets, trial=use_trial, base_url=llm_base_url, api_key=api_key
        )
        providers = await open_providers(settings, backend.documents)  # local providers journal their writes
        # Linked accounts share a USER.md, a budget and a provider scope (gateway/people/links).
        providers.identities = backend.identities
        stack.push_async_callback(providers.shutdown)

        cron = CronJobs(
            backend.cron,
            settings.cron,
            default_timezone=settings.cron.timezone or settings.gateway.timezone,
            platforms=settings.known_platforms,
        )
        skills = SkillStore(settings.skills_dir, settings.skills.max_visible, journal=backend.documents)
        tools = build_tools(settings, backend, model.llm, providers, cron, skills, policies)
        access = AccessControl(settings, backend.pairings, rate=backend.rate_limits)
        jobs = JobQueue(backend.jobs, settings.worker, metrics=metrics)
        commands = build_commands(
            settings,
            backend,
            access=access,
            jobs=jobs,
            budgets=budgets,
            cron=cron,
            skills=skills,
            forget_me=forget_me,
            # A redeemed /link code is announced to the person's other accounts.
            notices=OutboxNotices(backend.outbox, wake=lambda: gateway.wake_delivery()),
            trial=use_trial,
            policies=policies,
        )
        sessions = SessionResolver(
            settings,
            backend.sessions,
            backend.files,
            providers=providers,
            jobs=jobs,
            shared_lock=backend.shared_lock,
            links=backend.links,
            policies=policies,
            journal=backend.journal,  # the trust markers of the prompt's entries
        )
        quota = MediaQuota(backend.media_usage, settings.media.quota)  # what people may store
        agent = AgentDeps(
            llm=model.llm,
            store=backend.sessions,
            tools=tools,
            sessions=settings.sessions,
            memory=settings.memory,
            media=MediaStore(settings.home, history_images=settings.media.history_images, quota=quota),
        )
        gateway = Gateway(
            settings,
            sessions=sessions,
            agent=agent,
            ledgers=Ledgers(backend.inbox, backend.outbox, backend.streams),
            access=access,
            commands=commands,
            providers=providers,
            jobs=jobs,
            metrics=metrics,
            budget=budgets,
            proposals=backend.proposals,
            forget_session=backend.personal_data.forget_session,
            search_index=backend.search.index_status,
        )
        # delegate, then the MCP servers' tools, after the registered ones (wiring/tools.py)
        mcp = await open_tool_sources(
            stack, settings, repo=backend.mcp, agent=agent, budgets=budgets, providers=providers
        )
        commands.add(mcp_command(mcp))
        sessions.mcp_tools = lambda msg: mcp.names_for(
            msg.speaker, is_admin=access.is_admin(msg.platform, msg.user_id)
        )
        housekeeping = register_background(
            settings,
            jobs,
            gateway=gateway,
            sessions=sessions,
            agent=agent,
            access=access,
            providers=providers,
            skills=skills,
            policies=policies,
            journal=backend.journal,
            upkeep=upkeep,
        )
        # memory.consolidation: proposals people accept, on a schedule (opt-in).
        consolidation = register_consolidation(settings, jobs, llm=model.llm, backend=backend, upkeep=upkeep)
        for adapter in adapters:
            gateway.add_adapter(adapter)
        await start_upload_sweep(stack, adapters, quota)
        await start_jobs(stack, jobs)
        await start_consolidation(stack, settings, consolidation, jobs, backend)
        schedules = await start_schedules(
            stack,
            settings,
            backend,
            cron=cron,
            gateway=gateway,
            access=access,
            budget=budgets,
            enabled=scheduler,
        )
        await gateway.start()
        stack.push_async_callback(gateway.stop)
        replicas = await join_replicas(stack, settings, backend, gateway, adapters)
        if web is not None:
            await start_web(
                stack,
                web,
                settings,
                backend,
                gateway=gateway,
                replica_id=replicas.replica_id,
                access=access,
                budgets=budgets,
                cron=cron,
                jobs=jobs,
                skills=skills,
                mcp=mcp,
            )
        for line in access.describe():
            log.info("access_policy", policy=line)
        app = App(
            settings=settings,
            db=backend.db,
            store=backend.sessions,
            inbox=backend.inbox,
            outbox=backend.outbox,
            files=backend.files,
            search=backend.search,
            llm=model.llm,
            tools=tools,
            access=access,
            commands=commands,
            gateway=gateway,
            metrics=metrics,
            providers=providers,
            web=web,
            jobs=jobs,
            housekeeping=housekeeping,
            consolidation=consolidation,
            trial=use_trial,
            emulator=model.emulator,
            adapters=list(adapters),
            cron=cron,
            cron_runner=schedules.runner,
            scheduler=schedules.scheduler,
            budgets=budgets,
            links=backend.links,
            replicas=replicas.monitor,
            journal=backend.journal,
            policies=policies,
            mcp=mcp,
        )
        # Every adapter's stop is on the stack before its first attempt, so one the
        # supervisor starts later (a platform unreachable at boot) is stopped like the
        # others; the supervisor stops first, so no retry starts one during teardown.
        for adapter in adapters:
            stack.push_async_callback(adapter.stop)
        supervisor = AdapterSupervisor()
        app.adapter_supervisor = supervisor
        stack.push_async_callback(supervisor.stop)
        menu = commands.infos()
        await supervisor.start(adapters, lambda adapter: adapter.start(gateway.submit, menu))
        gateway.delivery.wake()
        yield app
