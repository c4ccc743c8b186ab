"""The item a chat's lane carries: an accepted message and its durable inbox row."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mnemo.gateway.events import InboundMessage


@dataclass(frozen=True, slots=True)
class Queued:
    inbox_id: int
    msg: InboundMessage


def messages(batch: Sequence[Queued]) -> list[InboundMessage]:
    return [q.msg for q in batch]
