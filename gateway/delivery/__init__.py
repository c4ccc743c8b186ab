"""Delivery: the durable inbox (what was accepted) and outbox (what is to be sent)."""

from __future__ import annotations

from dataclasses import dataclass

from mnemo.gateway.delivery.inbox import InboxRepository
from mnemo.gateway.delivery.outbox import OutboxRepository
from mnemo.gateway.delivery.streams import StreamLedger


@dataclass(frozen=True, slots=True)
class Ledgers:
    """The two durable ledgers of a message's life: accepted (inbox), answered (outbox)."""

    inbox: InboxRepository
    outbox: OutboxRepository
    # The messages showing replies while they are generated; None: no streaming.
    streams: StreamLedger | None = None
