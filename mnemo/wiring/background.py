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
from mnemo.gateway.jobs.housekeeping import Housekeeping, UploadSweep
from mnemo.gateway.jobs.provider_hooks import ProviderSessionHooks
from mnemo.gateway.jobs.provider_writes import register_provider_writes
from mnemo.gateway.jobs.queue import JobQueue
from mnemo.gateway.jobs.skill_review import SkillReview
from mnemo.gateway.media_quota import KeepsUploads, MediaQuota
from mnemo.gateway.ports import Adapter
from mnemo.gateway.turns.agent import AgentDeps
from mnemo.gateway.turns.policy import MemoryPolicies
from mnemo.gateway.turns.sessions import SessionResolver
from mnemo.memory.journal import JournalRepository
from mnemo.memory.manager import MemoryManager
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
    skill_review = SkillReview(settings, agent=agent, skills=skills, access=access, policies=policies)
    skill_review.register(jobs)
    gateway.turn_listeners.append(skill_review.after_turn)
    return housekeeping


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
