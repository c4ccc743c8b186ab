"""``/healthz`` and the pipeline's gauges.

``report`` is the body of ``/healthz`` (and of the dashboard's health panel): status
``ok`` when the gateway runs and every adapter is connected, else ``degraded``; queue
depths; the turns running and waiting for a slot, with the oldest wait
(``turns``); the external memory provider's state; how complete session_search's index
is (``search_index``: re-indexing older rows, messages not embedded yet). ``refresh_gauges`` is registered to run
right before each ``/metrics`` scrape; ``count_sent`` counts every delivered reply.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from mnemo.gateway.delivery.outbox import OutboxRow
from mnemo.gateway.inbound.lanes import LaneSet
from mnemo.gateway.inbound.queued import Queued
from mnemo.gateway.metrics import Metrics
from mnemo.gateway.ports import Adapter
from mnemo.gateway.turns.sessions import JobSink
from mnemo.memory.search import IndexStatus


class OutboxCounts(Protocol):
    async def counts(self) -> dict[str, int]:
        """Rows per state."""
        ...


class ProviderHealth(Protocol):
    """The external memory provider's state (``MemoryManager``)."""

    def health(self) -> str | None: ...


class Health:
    def __init__(
        self,
        adapters: Mapping[str, Adapter],
        lanes: LaneSet[Queued],
        outbox: OutboxCounts,
        metrics: Metrics,
        *,
        jobs: JobSink | None,
        providers: ProviderHealth | None,
        running: Callable[[], bool],
        search_index: Callable[[], Awaitable[IndexStatus]] | None = None,
    ) -> None:
        self.adapters = adapters
        self.lanes = lanes
        self.outbox = outbox
        self.metrics = metrics
        self.jobs = jobs
        self.providers = providers
        self.running = running
        self.search_index = search_index

    def count_sent(self, row: OutboxRow) -> None:
        self.metrics.messages_out.labels(row.chat.platform).inc()

    async def refresh_gauges(self) -> None:
        self.metrics.queue_depth.labels("lanes").set(self._queued_messages())
        self.metrics.queue_depth.labels("turns").set(self.lanes.slots.waiting)
        self.metrics.turns_running.set(self.lanes.slots.running)
        counts = await self.outbox.counts()
        self.metrics.queue_depth.labels("outbox").set(counts.get("queued", 0) + counts.get("sending", 0))
        if self.jobs is not None:
            self.metrics.queue_depth.labels("jobs").set(await self.jobs.depth())

    async def report(self) -> dict[str, Any]:
        counts = await self.outbox.counts()
        adapters = {name: a.connected for name, a in self.adapters.items()}
        slots = self.lanes.slots
        body: dict[str, Any] = {
            "status": "ok" if self.running() and all(adapters.values()) else "degraded",
            "adapters": adapters,
            "lanes": len(self.lanes),
            "queued_messages": self._queued_messages(),
            "turns": {
                "running": slots.running,
                "waiting": slots.waiting,
                "slots": slots.size,
                "oldest_wait_s": round(slots.oldest_wait_s(), 3),
            },
            "outbox_pending": counts.get("queued", 0) + counts.get("sending", 0),
            "outbox_failed": counts.get("failed", 0),
        }
        if self.jobs is not None:
            body["jobs_pending"] = await self.jobs.depth()
        provider = self.providers.health() if self.providers is not None else None
        if provider is not None:
            body["provider"] = provider  # ok | degraded (external memory provider)
        if self.search_index is not None:
            # Incomplete is not degraded: searches answer meanwhile, and say so.
            body["search_index"] = (await self.search_index()).as_json()
        return body

    def _queued_messages(self) -> int:
        return sum(self.lanes.queued(k) for k in self.lanes.keys())
