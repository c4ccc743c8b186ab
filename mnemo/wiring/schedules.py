"""Time-driven work: the cron scheduler (jobs from the database and ``cron.jobs``)
and the automatic backups (``backup.schedule``). Both run only in a process that
serves the profile (``scheduler=True``); a run in flight at shutdown gets its drain
time while the LLM client and the store are still open."""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass

from mnemo.gateway.config import Settings
from mnemo.gateway.cron.scheduler import CronRunner, CronScheduler, RunBudget
from mnemo.gateway.cron.service import CronJobs
from mnemo.gateway.inbound.access import AccessControl
from mnemo.gateway.inbound.pipeline import Gateway
from mnemo.gateway.storage import StorageBackend


@dataclass(frozen=True)
class Schedules:
    runner: CronRunner
    scheduler: CronScheduler | None  # None when this process runs no schedules


async def start_schedules(
    stack: AsyncExitStack,
    settings: Settings,
    backend: StorageBackend,
    *,
    cron: CronJobs,
    gateway: Gateway,
    access: AccessControl,
    budget: RunBudget,
    enabled: bool,
) -> Schedules:
    runner = CronRunner(gateway, access, cron.store, budget=budget)  # a capped person's runs are skipped
    if not enabled:
        return Schedules(runner, None)
    await cron.sync_declared(settings.cron.jobs)
    scheduler = CronScheduler(cron, runner, settings.cron, drain_s=settings.worker.drain_timeout_s)
    await scheduler.start()
    stack.push_async_callback(scheduler.stop)
    if settings.backup.enabled:
        # Automatic backups (backup.schedule) of the configured backend while this process
        # serves the profile; replicas take each slot under the backend's shared lock.
        from mnemo.backups import BackupScheduler

        backups = BackupScheduler(settings, lock=backend.shared_lock)
        await backups.start()
        stack.push_async_callback(backups.stop)
    return Schedules(runner, scheduler)
