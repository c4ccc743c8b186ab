"""InboxRepository: insert-or-ignore on (platform, chat, message id), forward-only
states, ``unfinished`` for recovery. (The kill -9 test is in tests/memory/test_inbox.py.)"""

from __future__ import annotations

import pytest

from mnemo.gateway.delivery.inbox import InboxState
from mnemo.memory.errors import StoreError
from tests.contract.conftest import Backend


async def test_accept_stores_the_payload_and_a_redelivery_is_a_no_op(backend: Backend) -> None:
    inbox = backend.inbox
    first = await inbox.accept("telegram", "100", "7", {"text": "hi", "user": {"id": "5"}})
    again = await inbox.accept("telegram", "100", "7", {"text": "changed"})
    assert first is not None and again is None
    assert first.state is InboxState.RECEIVED and first.attempts == 0
    stored = await inbox.get(first.id)
    assert stored is not None and stored.payload == {"text": "hi", "user": {"id": "5"}}
    # Same message id in another chat or on another platform is a different message.
    assert await inbox.accept("telegram", "101", "7", {}) is not None
    assert await inbox.accept("discord", "100", "7", {}) is not None


async def test_states_move_forward_and_attempts_count_processing_starts(backend: Backend) -> None:
    inbox = backend.inbox
    row = await inbox.accept("web", "c", "1", {"text": "x"})
    assert row is not None
    await inbox.mark_processing(row.id)
    await inbox.mark_processing(row.id)  # e.g. re-run after a crash
    await inbox.mark_failed(row.id, "LLM unavailable")
    failed = await inbox.get(row.id)
    assert failed is not None
    assert (failed.state, failed.attempts, failed.error) == (InboxState.FAILED, 2, "LLM unavailable")
    other = await inbox.accept("web", "c", "2", {})
    assert other is not None
    await inbox.mark_processing(other.id)
    await inbox.mark_done(other.id)
    done = await inbox.get(other.id)
    assert done is not None and done.state is InboxState.DONE and done.error is None
    assert await inbox.unfinished() == []


async def test_unfinished_is_received_and_processing_rows_oldest_first(backend: Backend) -> None:
    inbox = backend.inbox
    rows = [await inbox.accept("telegram", "1", str(n), {"n": n}) for n in range(4)]
    assert all(r is not None for r in rows)
    a, b, c, d = (r.id for r in rows if r is not None)
    await inbox.mark_processing(b)
    await inbox.mark_processing(c)
    await inbox.mark_done(c)
    await inbox.mark_failed(d, "boom")
    assert [(r.id, r.state) for r in await inbox.unfinished()] == [
        (a, InboxState.RECEIVED),
        (b, InboxState.PROCESSING),
    ]


async def test_marking_an_unknown_row_is_an_error(backend: Backend) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        await backend.inbox.mark_done(12345)
    assert await backend.inbox.get(12345) is None
