"""Several replicas on one PostgreSQL database, while they run: the heartbeat and the
sweep that takes over a dead replica's work (``storage_pg/heartbeats.py`` says what
"alive" means).

Every ``interval_s`` this replica

1. writes its heartbeat (adapters connected, leader roles) — what ``mnemo status`` shows;
2. renews the lease of every job it is running, so a long job stays its own;
3. adopts the work of replicas that are not alive: their unfinished inbox rows go into
   this replica's lanes (``Gateway.recover``), their sends in flight are queued again
   labelled as possible duplicates, their running jobs are queued again.

``ReplicaMonitor`` is also the ``Leadership`` handed to adapters: when it grants a lease
it first runs the sweep, so a new Telegram polling leader queues the dead leader's
unfinished messages before it fetches newer ones — a chat's messages stay in order
across the failover.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from mnemo.gateway.logs import get_logger
from mnemo.gateway.ports import LeaderLease

log = get_logger(__name__)


class ReplicaMonitor:
    def __init__(
        self,
        replica: Any,  # PgReplica
        *,
        gateway: Any,  # Gateway: its adapters, recover(rows), wake_delivery()
        inbox: Any,  # PgInbox
        outbox: Any,  # PgOutbox
        jobs: Any,  # PgJobStore
        max_attempts: int,
        interval_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.replica = replica
        self.gateway = gateway
        self.inbox = inbox
        self.outbox = outbox
        self.jobs = jobs
        self.max_attempts = max_attempts
        self.interval_s = interval_s
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        self._sweeping = asyncio.Lock()

    @property
    def replica_id(self) -> str:
        return str(self.replica.id)

    async def start(self) -> None:
        await self.beat()
        await self.sweep()
        self._task = asyncio.create_task(self._run(), name="replica-heartbeat")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def acquire(self, name: str) -> LeaderLease:
        """``Leadership``: the replica's lease on ``name``, granted after a sweep."""
        lease: LeaderLease = await self.replica.acquire(name)
        await self.sweep()
        return lease

    async def beat(self) -> None:
        adapters = {name: bool(a.connected) for name, a in self.gateway.adapters.items()}
        await self.replica.beat(adapters)

    async def sweep(self) -> None:
        async with self._sweeping:
            now = self._clock()
            await self.jobs.renew_leases(now)
            rows = await self.inbox.orphaned()
            if rows:
                log.warning("replica_adopted_messages", count=len(rows), replica=self.replica_id)
                await self.gateway.recover(rows)
            sends = await self.outbox.requeue_orphans()
            if sends:
                log.warning("replica_requeued_sends", count=sends, replica=self.replica_id)
                self.gateway.wake_delivery()
            requeued, failed = await self.jobs.requeue_orphans(now, max_attempts=self.max_attempts)
            if requeued or failed:
                log.warning(
                    "replica_requeued_jobs", requeued=requeued, failed=failed, replica=self.replica_id
                )

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.beat()
                await self.sweep()
            except Exception:  # loop boundary: the next beat tries again
                log.exception("replica_heartbeat_failed", replica=self.replica_id)
