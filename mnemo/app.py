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

import json
import os
import socket
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mnemo.gateway.budgets.command import usage_command
from mnemo.gateway.budgets.gate import BudgetGate
from mnemo.gateway.budgets.ledger import Clock, utc_now
from mnemo.gateway.commands import Command
from mnemo.gateway.config import TRIAL_BANNER, Settings
from mnemo.gateway.cron.scheduler import CronRunner, CronScheduler
from mnemo.gateway.cron.service import CronJobs
from mnemo.gateway.cron.tool import CronCommand, cronjob_tool
from mnemo.gateway.delivery import Ledgers
from mnemo.gateway.delivery.inbox import InboxRepository
from mnemo.gateway.delivery.outbox import OutboxRepository
from mnemo.gateway.errors import StartupError
from mnemo.gateway.inbound.access import AccessControl
from mnemo.gateway.inbound.commands import CommandDeps, CommandRegistry, default_commands
from mnemo.gateway.inbound.pipeline import Gateway
from mnemo.gateway.jobs.housekeeping import Housekeeping
from mnemo.gateway.jobs.provider_hooks import ProviderSessionHooks
from mnemo.gateway.jobs.provider_writes import register_provider_writes
from mnemo.gateway.jobs.queue import JobQueue
from mnemo.gateway.jobs.skill_review import SkillReview
from mnemo.gateway.llm.client import LLMClient
from mnemo.gateway.logs import get_logger
from mnemo.gateway.media import MediaStore
from mnemo.gateway.metrics import Metrics
from mnemo.gateway.people.command import ForgetMe
from mnemo.gateway.people.erasure import Erasure
from mnemo.gateway.people.link_command import link_command
from mnemo.gateway.people.links import LinkRepository
from mnemo.gateway.ports import Adapter, Leadership, SoleLeadership, UsesLeadership
from mnemo.gateway.storage import open_backend
from mnemo.gateway.supervisor import AdapterSupervisor
from mnemo.gateway.turns.agent import AgentDeps
from mnemo.gateway.turns.builtin_tools import register_builtin_tools
from mnemo.gateway.turns.digest import LLMSearchDigest
from mnemo.gateway.turns.sessions import SessionResolver
from mnemo.gateway.turns.skill_tools import SkillsCommand, skill_tools
from mnemo.gateway.turns.tools import Tool, ToolRegistry, ToolResult, TurnContext
from mnemo.gateway.webserver import WebServer
from mnemo.memory.db import Database
from mnemo.memory.discovery import load_provider
from mnemo.memory.errors import ProviderError
from mnemo.memory.manager import ManagerLimits, MemoryManager
from mnemo.memory.memory_tool import MemoryWrite
from mnemo.memory.ports import CuratedRepository, SearchRepository, SessionStorage
from mnemo.memory.skills import SkillStore

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
    trial: bool = False
    emulator: object | None = None
    adapters: list[Adapter] = field(default_factory=list)
    cron: CronJobs | None = None
    cron_runner: CronRunner | None = None
    scheduler: CronScheduler | None = None  # None when open_app(..., scheduler=False)
    adapter_supervisor: AdapterSupervisor | None = None  # retries adapters unreachable at start
    budgets: BudgetGate | None = None  # the backend's ledger behind the gate
    links: LinkRepository | None = None  # linked identities (/link)
    replicas: Any = None  # ReplicaMonitor on PostgreSQL (gateway/replicas.py); None on SQLite


def shared_database_config(settings: Settings, provider: Any) -> dict[str, Any] | None:
    """On PostgreSQL, the stored settings of a provider that keeps its data in the bot's
    database (``shares_database``, e.g. holographic) plus ``database_url``; else None
    (the manager reads the stored settings itself)."""
    url = settings.database.url
    if url is None or not getattr(provider, "shares_database", False):
        return None
    from mnemo.memory.discovery import provider_config

    return {**provider_config(settings.home, provider), "database_url": url.get_secret_value()}


async def open_providers(settings: Settings) -> MemoryManager:
    """The MemoryManager with the configured external provider (``memory.provider``).
    A provider that is unknown, unavailable or fails to start is logged and left out:
    the bot runs on its built-in memory rather than not at all."""
    manager = MemoryManager(
        settings.home,
        ManagerLimits(
            provider_timeout_s=settings.providers.timeout_s or settings.memory.provider_timeout_s,
            prefetch_timeout_s=settings.providers.timeout_s or settings.memory.prefetch_timeout_s,
            drain_timeout_s=settings.worker.drain_timeout_s,
        ),
    )
    name = settings.memory.provider
    if name:
        try:
            provider = load_provider(name, settings.home)
            manager.add_provider(provider, shared_database_config(settings, provider))
        except ProviderError as e:
            log.error("memory_provider_not_loaded", provider=name, error=str(e))
    await manager.start()
    return manager


def register_provider_tools(tools: ToolRegistry, providers: MemoryManager, home: Path) -> None:
    """Provider tools go through the same registry as the built-ins."""
    for schema in providers.tool_schemas():
        name = schema["name"]

        async def handler(args: Mapping[str, Any], ctx: TurnContext, name: str = name) -> ToolResult:
            text = await providers.handle_tool_call(name, args, ctx.for_providers(home))
            return ToolResult(text, is_error=_reports_failure(text))

        tools.register(Tool(name, schema, handler))


def _reports_failure(text: str) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return isinstance(value, dict) and (value.get("ok") is False or value.get("success") is False)


def check_startup(settings: Settings) -> None:
    if settings.platform_tokens and not settings.has_llm_endpoint:
        raise StartupError(
            f"{', '.join(settings.platform_tokens)} token configured but no ANTHROPIC_API_KEY or "
            "ANTHROPIC_BASE_URL: refusing to answer a public chat with the scripted trial model."
        )


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
    check_startup(settings)
    use_trial = settings.trial_mode and llm_base_url is None if trial is None else trial
    async with AsyncExitStack() as stack:
        # SQLite state.db or PostgreSQL (database.url): the same repositories either way,
        # and the backend builds what differs (links, budgets, erasure, rate limits).
        backend = await open_backend(settings, serve=True, clock=clock)
        stack.push_async_callback(backend.close)
        db = backend.db
        store = backend.sessions
        inbox = backend.inbox
        outbox = backend.outbox
        # Linked accounts share a USER.md, a budget and a provider scope (gateway/people/links).
        identities = backend.identities
        files = backend.files  # MEMORY.md/USER.md: files on SQLite, rows on PostgreSQL
        search = backend.search
        links = backend.links
        # Spend is counted in the same write as the session's usage (gateway/budgets).
        budgets = BudgetGate(settings.budgets, backend.budgets)
        from mnemo.backups import scrubber

        forget_me = ForgetMe(Erasure(backend.personal_data, settings, scrub=scrubber(settings)))

        emulator = None
        if use_trial:
            from mnemo.gateway.emulator import Emulator

            emulator = Emulator(record_limit=100)
            await emulator.start()
            stack.push_async_callback(emulator.stop)
            llm_base_url = emulator.base_url
            api_key = api_key or "trial-mode"
            log.info("trial_mode", banner=TRIAL_BANNER)  # the commands print TRIAL_BANNER once themselves
        llm = LLMClient(settings.llm, base_url=llm_base_url, api_key=api_key, metrics=metrics)
        stack.push_async_callback(llm.aclose)

        providers = await open_providers(settings)
        providers.identities = identities
        stack.push_async_callback(providers.shutdown)

        tools = ToolRegistry(max_output_chars=settings.sessions.tool_output_max_chars)

        async def mirror_write(write: MemoryWrite, ctx: TurnContext) -> None:
            await providers.on_memory_write(write, ctx.for_providers(settings.home))

        register_builtin_tools(
            tools,
            files=files,
            search=search,
            settings=settings,
            on_memory_write=mirror_write,
            digest=LLMSearchDigest(llm, settings.llm.aux_model, store=store),
            linked_dms=links.linked_dm_keys,
        )
        access = AccessControl(settings, backend.pairings, rate=backend.rate_limits)
        cron = CronJobs(
            backend.cron,
            settings.cron,
            default_timezone=settings.cron.timezone or settings.gateway.timezone,
            platforms=settings.known_platforms,
        )
        tools.register(cronjob_tool(cron))
        skill_store = SkillStore(settings.skills_dir, settings.skills.max_visible)
        for tool in skill_tools(skill_store):
            tools.register(tool)
        jobs = JobQueue(backend.jobs, settings.worker, metrics=metrics)
        register_provider_writes(jobs, providers)
        commands = default_commands(
            CommandDeps(
                store=store,
                files=files,
                pairings=access.pairings,
                search=search,
                jobs=jobs,
                search_limit=settings.search.default_limit,
                trial=use_trial,
                forget_me=forget_me,
                linked_dms=links.linked_dm_keys if settings.search.linked_dms else None,
            ),
            extra=[
                Command(
                    "cron",
                    "scheduled jobs: list, add, pause, resume, remove",
                    CronCommand(cron),
                    takes_args=True,
                ),
                Command(
                    "skills",
                    "skills: list; admins: promote NAME PLATFORM:ID",
                    SkillsCommand(skill_store),
                    takes_args=True,
                ),
                usage_command(budgets),
                link_command(links),
            ],
        )
        sessions = SessionResolver(
            settings,
            store,
            files,
            providers=providers,
            jobs=jobs,
            shared_lock=backend.shared_lock,
            links=links,
        )
        agent = AgentDeps(
            llm=llm,
            store=store,
            tools=tools,
            sessions=settings.sessions,
            memory=settings.memory,
            media=MediaStore(settings.home, history_images=settings.media.history_images),
        )
        gateway = Gateway(
            settings,
            sessions=sessions,
            agent=agent,
            ledgers=Ledgers(inbox, outbox, backend.streams),
            access=access,
            commands=commands,
            providers=providers,
            jobs=jobs,
            metrics=metrics,
            budget=budgets,
            search_index=search.index_status,
        )
        register_provider_tools(tools, providers, settings.home)
        housekeeping = Housekeeping(
            settings,
            sessions=sessions,
            agent=agent,
            access=access,
            hooks=ProviderSessionHooks(providers, settings.home),
        )
        housekeeping.register(jobs)
        # After a turn with many tool calls, a background pass may keep it as a skill.
        skill_review = SkillReview(settings, agent=agent, skills=skill_store, access=access)
        skill_review.register(jobs)
        gateway.turn_listeners.append(skill_review.after_turn)
        for adapter in adapters:
            gateway.add_adapter(adapter)
        # The worker starts before the gateway and stops after it: jobs the last turns
        # enqueue are persisted, and the running ones get their drain time.
        await jobs.start()
        stack.push_async_callback(jobs.stop)
        # The cron scheduler likewise: a run in flight at shutdown gets its drain time
        # while the LLM client and the store are still open.
        cron_runner = CronRunner(gateway, access, cron.store)
        cron_scheduler = None
        if scheduler:
            await cron.sync_declared(settings.cron.jobs)
            cron_scheduler = CronScheduler(
                cron, cron_runner, settings.cron, drain_s=settings.worker.drain_timeout_s
            )
            await cron_scheduler.start()
            stack.push_async_callback(cron_scheduler.stop)
        if scheduler and settings.backup.enabled and backend.name == "sqlite":
            # Automatic backups (backup.schedule), only while this process serves the profile.
            from mnemo.backups import BackupScheduler

            backups = BackupScheduler(settings)
            await backups.start()
            stack.push_async_callback(backups.stop)
        await gateway.start()
        stack.push_async_callback(gateway.stop)
        # Several replicas (PostgreSQL): heartbeats, takeover of a dead replica's work and
        # the leader locks adapters poll under (gateway/replicas.py); SQLite: one process.
        leadership: Leadership = SoleLeadership()
        replica_id = f"{socket.gethostname()}:{os.getpid()}"
        replicas = None
        if backend.replica is not None:
            from mnemo.gateway.replicas import ReplicaMonitor
            from mnemo.gateway.storage_pg.heartbeats import HEARTBEAT_S

            replicas = ReplicaMonitor(
                backend.replica,
                gateway=gateway,
                inbox=inbox,
                outbox=outbox,
                jobs=backend.jobs,
                max_attempts=settings.worker.max_attempts,
                interval_s=HEARTBEAT_S,
            )
            await replicas.start()
            stack.push_async_callback(replicas.stop)
            leadership, replica_id = replicas, replicas.replica_id
        for adapter in adapters:
            if isinstance(adapter, UsesLeadership):
                adapter.use_leadership(leadership)
        if web is not None:

            async def health() -> dict[str, Any]:
                return {**await gateway.health(), "replica": replica_id}

            web.set_health_probe(health)
            from mnemo.dashboard import mount_dashboard  # /admin: the operator's dashboard

            mount_dashboard(
                web,
                settings,
                directory=backend.directory,
                store=store,
                search=search,
                files=files,
                skills=skill_store,
                cron=cron,
                jobs=jobs,
                budgets=budgets,
                health=gateway.health,
                is_admin=access.is_admin,
                links=links,
            )
            await web.start()
            stack.push_async_callback(web.stop)
        for line in access.describe():
            log.info("access_policy", policy=line)
        app = App(
            settings=settings,
            db=db,
            store=store,
            inbox=inbox,
            outbox=outbox,
            files=files,
            search=search,
            llm=llm,
            tools=tools,
            access=access,
            commands=commands,
            gateway=gateway,
            metrics=metrics,
            providers=providers,
            web=web,
            jobs=jobs,
            housekeeping=housekeeping,
            trial=use_trial,
            emulator=emulator,
            adapters=list(adapters),
            cron=cron,
            cron_runner=cron_runner,
            scheduler=cron_scheduler,
            budgets=budgets,
            links=links,
            replicas=replicas,
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
