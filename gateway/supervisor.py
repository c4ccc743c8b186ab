"""Supervised adapter start: a platform that cannot be reached at boot is retried in
the background while the rest of the bot runs.

``AdapterSupervisor.start`` makes the first attempt of every adapter concurrently and
returns when each has either started or failed. An adapter's ``start`` tells the two
kinds of failure apart (see ``gateway.ports``):

* ``StartupError`` — a configuration error (no token, a token the platform rejects,
  a webhook without a secret): restarting cannot fix it. At the first attempt it
  propagates, so ``mnemo run`` exits 2 before it announces itself; later (the network
  came back and the platform then refused the token) it is kept in ``failure()``,
  which ``mnemo run`` waits on beside its stop signal.
* ``PlatformError`` (unreachable, 5xx, rate limited) — transient: the adapter is
  started again after a jittered exponential backoff (``min_backoff_s`` doubling up to
  ``max_backoff_s``, each wait drawn from the upper half of the step so that replicas
  booting together do not retry in step). Every failed attempt is logged once, with
  its reason and the next delay. Meanwhile the adapter reports ``connected`` False, so
  ``/healthz`` says "degraded" and the outbox holds its replies; the web chat, cron and
  the other adapters run as usual.

The retry tasks belong to the supervisor; ``stop`` cancels them (a SIGTERM during the
backoff or during an attempt ends at once; an adapter's ``start`` cleans up after
itself when cancelled). Stopping the adapters themselves stays with the caller's exit
stack.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence

from mnemo.gateway.errors import PlatformError, PlatformRateLimited, StartupError
from mnemo.gateway.logs import get_logger
from mnemo.gateway.ports import Adapter

log = get_logger(__name__)

Sleep = Callable[[float], Awaitable[None]]
Begin = Callable[[Adapter], Awaitable[None]]  # one attempt: e.g. ``adapter.start(sink, commands)``


def backoff_delays(
    min_s: float, max_s: float, rng: Callable[[], float] = random.random
) -> Callable[[int], float]:
    """The wait before retry ``n`` (1-based): a random point in the upper half of
    ``min(max_s, min_s * 2**(n-1))``, so never below half the step and never above ``max_s``."""

    def delay(n: int) -> float:
        step = min(max_s, min_s * 2.0 ** min(n - 1, 32))
        return step / 2 + rng() * step / 2

    return delay


class AdapterSupervisor:
    def __init__(
        self,
        *,
        min_backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        sleep: Sleep = asyncio.sleep,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self._delay = backoff_delays(min_backoff_s, max_backoff_s, rng)
        self._sleep = sleep
        self._tasks: set[asyncio.Task[None]] = set()
        self._failed: asyncio.Future[StartupError] | None = None

    async def start(self, adapters: Sequence[Adapter], begin: Begin) -> None:
        """First attempt of every adapter; raises the first ``StartupError`` (after
        stopping whatever did start — the caller's stack stops the rest)."""
        self._failed = asyncio.get_running_loop().create_future()
        results = await asyncio.gather(
            *(self._attempt(a, begin, 1) for a in adapters), return_exceptions=True
        )
        waits: list[float | None] = []
        for result in results:
            if isinstance(result, BaseException):
                raise result
            waits.append(result)
        for adapter, wait in zip(adapters, waits, strict=True):
            if wait is not None:
                task = asyncio.create_task(self._retry(adapter, begin, wait), name=f"start-{adapter.name}")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def failure(self) -> StartupError:
        """Returns when a background attempt met a configuration error; never otherwise."""
        if self._failed is None:
            raise RuntimeError("AdapterSupervisor.failure() before start()")
        return await asyncio.shield(self._failed)

    async def stop(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._failed is not None and not self._failed.done():
            self._failed.cancel()

    async def _attempt(self, adapter: Adapter, begin: Begin, n: int) -> float | None:
        """None when started; after a transient failure (logged) the wait before the
        next attempt. Raises ``StartupError``."""
        try:
            await begin(adapter)
        except PlatformError as e:
            wait = e.retry_after if isinstance(e, PlatformRateLimited) else self._delay(n)
            log.warning(
                "adapter_start_failed", adapter=adapter.name, attempt=n, error=str(e), retry_in=round(wait, 2)
            )
            return wait
        log.info("adapter_started", adapter=adapter.name, attempt=n)
        return None

    async def _retry(self, adapter: Adapter, begin: Begin, wait: float) -> None:
        n = 1
        while True:
            await self._sleep(wait)
            n += 1
            try:
                next_wait = await self._attempt(adapter, begin, n)
                if next_wait is None:
                    return
                wait = next_wait
            except StartupError as e:
                log.error("adapter_refused", adapter=adapter.name, error=str(e))
                if self._failed is not None and not self._failed.done():
                    self._failed.set_result(e)
                return
            except Exception:  # loop boundary: a bug in one adapter's start must not end its retries
                log.exception("adapter_start_error", adapter=adapter.name, attempt=n)
                wait = self._delay(n)
