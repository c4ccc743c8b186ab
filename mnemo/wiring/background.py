"""Background work on the persisted job queue: external providers' durable writes,
housekeeping (flush, compression, memory review, session ends), and skill review
after tool-heavy turns. The queue starts before the gateway and stops after it, so
jobs the last turns enqueue are persisted and running ones get their drain time."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AsyncExitStack

from mnemo.gateway.budgets.upkeep import Upkeep
from mnemo.gateway.config import Settings
from mnemo.gateway.inbound.access import AccessControl
from mnemo.gateway.inbound.pipeline import Gateway
from mnemo.gateway.jobs.consolidation import Consolidation, ConsolidationSchedule
from mnemo.gateway.jobs.housekeeping import Housekeeping, UploadSweep
from mnemo.gateway.jobs.provider_hooks import ProviderSessionHooks
from mnemo.gateway.jobs.provider_writes import register_provider_writes
from mnemo.gateway.jobs.queue import JobQueue
from mnemo.gateway.jobs.skill_review import SkillReview
from mnemo.gateway.llm.client import LLMClient
from mnemo.gateway.media_quota import KeepsUploads, MediaQuota
from mnemo.gateway.ports import Adapter
from mnemo.gateway.storage import StorageBackend
from mnemo.gateway.turns.agent import AgentDeps
from mnemo.gateway.turns.policy import MemoryPolicies
from mnemo.gateway.turns.sessions import SessionResolver
from mnemo.memory.errors import InvalidIdentifier
from mnemo.memory.journal import SHARED, JournalRepository
from mnemo.memory.manager import MemoryManager
from mnemo.memory.scope import UserRef
from mnemo.memory.skills import SkillStore


def register_background(
    settings: Settings,
    jobs: JobQueue,
    *,
    gateway: Gateway,
    sessions: SessionResolver,
    agent: AgentDeps,
    access: AccessControl,
    providers: MemoryManager,
    skills: SkillStore,
    policies: MemoryPolicies,
    journal: JournalRepository,
    upkeep: Upkeep | None = None,
) -> Housekeeping:
    register_provider_writes(jobs, providers, journal)  # an applied write is journaled
    housekeeping = Housekeeping(
        settings,
        sessions=sessions,
        agent=agent,
        access=access,
        hooks=ProviderSessionHooks(providers, settings.home, policies),
        upkeep=upkeep,
    )
    housekeeping.register(jobs)
    # After a turn with many tool calls, a background pass may keep it as a skill.
    skill_review = SkillReview(
        settings, agent=agent, skills=skills, access=access, policies=policies, upkeep=upkeep
    )
    skill_review.register(jobs)
    gateway.turn_listeners.append(skill_review.after_turn)
    return housekeeping


def register_consolidation(
    settings: Settings, jobs: JobQueue, *, llm: LLMClient, backend: StorageBackend, upkeep: Upkeep | None
) -> Consolidation:
    """The ``consolidate`` job is always registered (queued ones finish even after the
    feature is turned off); the schedule runs only with ``memory.consolidation.enabled``."""
    consolidation = Consolidation(
        settings,
        llm=llm,
        files=backend.files,
        proposals=backend.proposals,
        ledger=backend.budgets,
        upkeep=upkeep,
    )
    consolidation.register(jobs)
    return consolidation


async def start_consolidation(
    stack: AsyncExitStack,
    settings: Settings,
    consolidation: Consolidation,
    jobs: JobQueue,
    backend: StorageBackend,
) -> ConsolidationSchedule | None:
    if not settings.memory.consolidation.enabled:
        return None

    async def targets() -> list[str]:
        """The shared notes and every person's profile (linked accounts: once)."""
        owners: dict[str, None] = {SHARED: None}
        for person in await backend.directory.everyone():
            try:
                owner = backend.identities.canonical(UserRef.parse(person))
            except InvalidIdentifier:
                continue
            if await backend.directory.has_profile(owner):
                owners[str(owner)] = None
        return list(owners)

    schedule = ConsolidationSchedule(consolidation, jobs, targets, timezone=settings.gateway.timezone)
    await schedule.start()
    stack.push_async_callback(schedule.stop)
    return schedule


async def start_jobs(stack: AsyncExitStack, jobs: JobQueue) -> None:
    await jobs.start()
    stack.push_async_callback(jobs.stop)


async def start_upload_sweep(stack: AsyncExitStack, adapters: Sequence[Adapter], quota: MediaQuota) -> None:
    """Web uploads count against ``media.quota`` and are removed after a day, whoever
    made them (``UploadSweep``, at start and hourly)."""
    uploaders = [a for a in adapters if isinstance(a, KeepsUploads)]
    for uploader in uploaders:
        uploader.use_media_quota(quota)
    if uploaders:
        sweep = UploadSweep(uploaders, quota)
        await sweep.start()
        stack.push_async_callback(sweep.stop)
