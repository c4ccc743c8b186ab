"""UpdatePoller's contract: an update is confirmed (by the next getUpdates offset) only
after it was handled; failures never end polling. Driven by a tiny in-memory Bot API
queue with Telegram's offset semantics."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from mnemo.adapters.telegram_polling import UpdatePoller
from mnemo.gateway.errors import PlatformRateLimited, PlatformUnavailable


@dataclass(frozen=True)
class Upd:
    update_id: int


class Updates:
    """getUpdates over a list: ``offset`` drops everything below it, as Telegram does."""

    def __init__(self, ids: Sequence[int]) -> None:
        self.pending = [Upd(i) for i in ids]
        self.calls: list[tuple[int | None, float]] = []
        self.failures: list[Exception] = []

    async def fetch(self, offset: int | None, timeout: float) -> list[Upd]:
        self.calls.append((offset, timeout))
        if self.failures:
            raise self.failures.pop(0)
        if offset is not None:
            self.pending = [u for u in self.pending if u.update_id >= offset]
        if not self.pending:
            await asyncio.sleep(0.01)  # a short "long poll"
        return self.pending[:2]


async def run_until(poller: UpdatePoller, done: asyncio.Event) -> None:
    poller.start()
    try:
        await asyncio.wait_for(done.wait(), 10)
    finally:
        await poller.stop()


async def test_a_batch_whose_handling_failed_is_fetched_again_and_nothing_is_skipped() -> None:
    api = Updates([1, 2, 3])
    handled: list[int] = []
    failed_once = False
    done = asyncio.Event()

    async def handle(batch: Sequence[Upd]) -> None:
        nonlocal failed_once
        if batch[0].update_id == 1 and not failed_once:
            failed_once = True
            raise OSError("disk full")  # e.g. the inbox write failed: not stored
        handled.extend(u.update_id for u in batch)
        if 3 in handled:
            done.set()

    await run_until(UpdatePoller(api.fetch, handle, timeout_s=7, min_backoff_s=0.01), done)
    assert handled == [1, 2, 3]
    offsets = [offset for offset, _ in api.calls]
    assert offsets[:3] == [None, None, 3], "the failed batch was not confirmed"
    assert api.calls[-1] == (4, 0), "stop confirms what was handled with a quick poll"
    assert api.pending == []


async def test_failures_back_off_and_polling_resumes_with_a_quick_poll() -> None:
    api = Updates([5])
    api.failures = [
        PlatformUnavailable("network down"),
        PlatformUnavailable("still down"),
        PlatformRateLimited("flood", 0.01),
    ]
    seen: list[bool] = []
    done = asyncio.Event()
    poller: UpdatePoller

    async def handle(batch: Sequence[Upd]) -> None:
        seen.append(poller.healthy)
        done.set()

    poller = UpdatePoller(api.fetch, handle, timeout_s=7, min_backoff_s=0.01)
    await run_until(poller, done)
    assert [t for _, t in api.calls[:4]] == [7, 0, 0, 0], "after a failure the next poll does not wait"
    assert seen == [True] and poller.healthy
    assert not poller.running


async def test_stop_without_anything_handled_makes_no_extra_call() -> None:
    api = Updates([])
    poller = UpdatePoller(api.fetch, lambda batch: asyncio.sleep(0), timeout_s=7)
    poller.start()
    await asyncio.sleep(0.05)
    calls = len(api.calls)
    await poller.stop()
    await poller.stop()  # idempotent
    assert len(api.calls) == calls and all(offset is None for offset, _ in api.calls)
