"""Long polling that confirms an update only after it has been handled.

Telegram's ``getUpdates`` confirms every update below the ``offset`` of the next call.
python-telegram-bot's ``Updater`` moves the offset as soon as it has *queued* a batch,
before any handler ran, so a process killed in between loses those messages. Here the
next call is made only after ``handle`` returned for the whole batch — by then the
gateway has written each message to its durable inbox — so a crash at any point means
the batch is fetched again and the inbox's deduplication (platform + chat + message id)
drops what was already accepted. If ``handle`` raises, the offset stays where it was
and the same batch is fetched again after a backoff: a message is never skipped.

Failures of ``getUpdates`` (already mapped onto ``gateway.errors`` by the caller's
``fetch``) never end the loop: a flood wait sleeps ``retry_after``, anything else backs
off exponentially (``min_backoff_s`` doubling up to ``max_backoff_s``) and retries, so a
network outage, a revoked token fixed later or a second instance that went away all
end with polling resumed. ``healthy`` is False from a failure until the next success
(a short poll, so that it is known at once).

``stop`` cancels the loop (an in-flight long poll is simply abandoned) and then
confirms what was handled with one short ``getUpdates``, so a restart does not fetch
it again; if that call fails the inbox deduplicates the repeat.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, Protocol, TypeVar

from mnemo.gateway.errors import PlatformError, PlatformRateLimited
from mnemo.gateway.logs import get_logger

log = get_logger(__name__)

CONFIRM_TIMEOUT_S = 5.0


class HasUpdateId(Protocol):
    @property
    def update_id(self) -> int: ...


U = TypeVar("U", bound=HasUpdateId)  # the update type: what ``fetch`` returns ``handle`` gets
Fetch = Callable[[int | None, float], Awaitable[Sequence[U]]]  # (offset, long-poll timeout)
Handle = Callable[[Sequence[U]], Awaitable[None]]


class UpdatePoller(Generic[U]):
    def __init__(
        self,
        fetch: Fetch[U],
        handle: Handle[U],
        *,
        timeout_s: float = 25.0,
        min_backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
    ) -> None:
        self._fetch = fetch
        self._handle = handle
        self.timeout_s = timeout_s
        self.min_backoff_s = min_backoff_s
        self.max_backoff_s = max_backoff_s
        self._offset: int | None = None  # first update id not handled yet
        self._confirmed: int | None = None  # the offset Telegram has last been sent
        self._task: asyncio.Task[None] | None = None
        self.healthy = True

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="telegram-polling")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if self._offset is not None and self._offset != self._confirmed:
            try:
                async with asyncio.timeout(CONFIRM_TIMEOUT_S):
                    await self._fetch(self._offset, 0)
            except (PlatformError, TimeoutError) as e:
                log.info("telegram_updates_not_confirmed", offset=self._offset, error=str(e))

    async def _run(self) -> None:
        backoff = self.min_backoff_s
        while True:
            try:
                # After a failure, a quick poll first: ``healthy`` (and with it the
                # adapter's ``connected``, which holds back replies) comes back as soon as
                # Telegram answers, not after a long poll's full timeout.
                updates = await self._fetch(self._offset, self.timeout_s if self.healthy else 0)
            except PlatformRateLimited as e:
                self._failed(e)
                await asyncio.sleep(e.retry_after)
                continue
            except PlatformError as e:
                self._failed(e, retry_in=backoff)
                await asyncio.sleep(backoff)
                backoff = min(self.max_backoff_s, backoff * 2)
                continue
            except Exception as e:  # loop boundary: e.g. an update PTB cannot parse
                log.exception("telegram_poll_error")
                self._failed(e, retry_in=backoff)
                await asyncio.sleep(backoff)
                backoff = min(self.max_backoff_s, backoff * 2)
                continue
            self._confirmed = self._offset
            if not self.healthy:
                log.info("telegram_polling_resumed")
                self.healthy = True
            if not updates:
                backoff = self.min_backoff_s
                continue
            try:
                await self._handle(updates)
            except Exception:  # loop boundary: not handled, so not confirmed; fetched again
                log.exception("telegram_updates_not_handled", first=updates[0].update_id, count=len(updates))
                await asyncio.sleep(backoff)
                backoff = min(self.max_backoff_s, backoff * 2)
                continue
            backoff = self.min_backoff_s
            self._offset = updates[-1].update_id + 1

    def _failed(self, error: Exception, retry_in: float | None = None) -> None:
        if self.healthy:
            log.warning(
                "telegram_polling_failed", error=f"{type(error).__name__}: {error}", retry_in=retry_in
            )
        else:
            log.debug("telegram_polling_failed", error=f"{type(error).__name__}: {error}", retry_in=retry_in)
        self.healthy = False
