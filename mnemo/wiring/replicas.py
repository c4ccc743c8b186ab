"""This process among replicas. On PostgreSQL: heartbeats, takeover of a dead
replica's work, and the leader locks adapters poll under (``gateway/replicas.py``).
On SQLite one process owns the store, so it is the sole leader."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass

from mnemo.gateway.config import Settings
from mnemo.gateway.inbound.pipeline import Gateway
from mnemo.gateway.ports import Adapter, Leadership, SoleLeadership, UsesLeadership
from mnemo.gateway.replicas import ReplicaMonitor
from mnemo.gateway.storage import StorageBackend


@dataclass(frozen=True)
class Replicas:
    monitor: ReplicaMonitor | None  # None on SQLite
    replica_id: str  # shown in /healthz


async def join_replicas(
    stack: AsyncExitStack,
    settings: Settings,
    backend: StorageBackend,
    gateway: Gateway,
    adapters: Sequence[Adapter],
) -> Replicas:
    leadership: Leadership = SoleLeadership()
    replica_id = f"{socket.gethostname()}:{os.getpid()}"
    monitor = None
    if backend.replica is not None:
        from mnemo.gateway.storage_pg.heartbeats import HEARTBEAT_S

        monitor = ReplicaMonitor(
            backend.replica,
            gateway=gateway,
            inbox=backend.inbox,
            outbox=backend.outbox,
            jobs=backend.jobs,
            max_attempts=settings.worker.max_attempts,
            interval_s=HEARTBEAT_S,
        )
        await monitor.start()
        stack.push_async_callback(monitor.stop)
        leadership, replica_id = monitor, monitor.replica_id
    for adapter in adapters:
        if isinstance(adapter, UsesLeadership):
            adapter.use_leadership(leadership)
    return Replicas(monitor, replica_id)
