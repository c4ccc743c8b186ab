"""Per-session lanes: serial within a session key, concurrent across keys.

A lane is one asyncio worker that owns one session key. It waits for the first item,
then keeps collecting for a short debounce window (a burst becomes one turn; the window
restarts with each new item, bounded by ``max_wait``), hands the batch to the handler,
and repeats. Items arriving while a turn runs wait for the next turn. A lane with
nothing to do for ``idle_s`` exits and is removed; the next item creates a new one.

``cancel_current`` interrupts the running turn of a lane (``/stop``) without dropping
what is queued behind it. All tasks are owned by the ``LaneSet`` and awaited on stop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Generic, TypeVar

from mnemo.gateway.logs import get_logger

log = get_logger(__name__)

T = TypeVar("T")
Handler = Callable[[str, Sequence[T]], Coroutine[Any, Any, None]]


class _Lane(Generic[T]):
    def __init__(self, key: str) -> None:
        self.key = key
        self.queue: asyncio.Queue[T] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None
        self.turn: asyncio.Task[None] | None = None
        self.busy = False


class LaneSet(Generic[T]):
    def __init__(
        self,
        handler: Handler[T],
        *,
        debounce_s: float = 0.6,
        idle_s: float = 300.0,
        max_batch: int = 20,
        debounce_for: Callable[[T], float | None] | None = None,
    ) -> None:
        self._handler = handler
        self._debounce_s = debounce_s
        self._idle_s = idle_s
        self._max_batch = max_batch
        self._debounce_for = debounce_for
        self._lanes: dict[str, _Lane[T]] = {}
        self._closing = False

    def __len__(self) -> int:
        return len(self._lanes)

    def keys(self) -> list[str]:
        return list(self._lanes)

    def busy(self, key: str) -> bool:
        lane = self._lanes.get(key)
        return lane is not None and (lane.busy or not lane.queue.empty())

    def queued(self, key: str) -> int:
        lane = self._lanes.get(key)
        return lane.queue.qsize() if lane else 0

    def submit(self, key: str, item: T) -> None:
        if self._closing:
            raise RuntimeError("lanes are stopping")
        lane = self._lanes.get(key)
        if lane is None or lane.task is None or lane.task.done():
            lane = _Lane(key)
            self._lanes[key] = lane
            lane.task = asyncio.create_task(self._run(lane), name=f"lane:{key}")
        lane.queue.put_nowait(item)

    def cancel_current(self, key: str) -> bool:
        lane = self._lanes.get(key)
        if lane is None or lane.turn is None or lane.turn.done():
            return False
        lane.turn.cancel()
        return True

    def _window(self, item: T) -> float:
        if self._debounce_for is not None:
            override = self._debounce_for(item)
            if override is not None:
                return override
        return self._debounce_s

    async def _collect(self, lane: _Lane[T], first: T) -> list[T]:
        batch = [first]
        window = self._window(first)
        if window <= 0:
            return batch
        loop = asyncio.get_running_loop()
        deadline = loop.time() + window * 5  # a steady stream still gets answered
        while len(batch) < self._max_batch:
            timeout = min(window, deadline - loop.time())
            if timeout <= 0:
                break
            try:
                async with asyncio.timeout(timeout):
                    batch.append(await lane.queue.get())
            except TimeoutError:
                break
        return batch

    async def _run(self, lane: _Lane[T]) -> None:
        try:
            while True:
                try:
                    # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow the
                    # cancel of stop() when an item arrives at the same moment.
                    async with asyncio.timeout(self._idle_s):
                        first = await lane.queue.get()
                except TimeoutError:
                    if lane.queue.empty():
                        return
                    continue
                lane.busy = True
                try:
                    batch = await self._collect(lane, first)
                    lane.turn = asyncio.create_task(self._handler(lane.key, batch), name=f"turn:{lane.key}")
                    try:
                        await asyncio.shield(lane.turn)
                    except asyncio.CancelledError:
                        if lane.turn.cancelled() and not self._closing:
                            log.info("turn_cancelled", lane=lane.key)
                            continue
                        lane.turn.cancel()
                        raise
                    except Exception:  # loop boundary: one bad turn must not kill the lane
                        log.exception("lane_turn_failed", lane=lane.key)
                finally:
                    lane.busy = False
                    lane.turn = None
        finally:
            if self._lanes.get(lane.key) is lane:
                del self._lanes[lane.key]

    async def drain(self, timeout: float) -> None:
        """Wait (bounded) for queued and running turns to finish."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while any(self.busy(k) for k in list(self._lanes)) and loop.time() < deadline:
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        self._closing = True
        tasks = [lane.task for lane in self._lanes.values() if lane.task is not None]
        for lane in self._lanes.values():
            if lane.turn is not None:
                lane.turn.cancel()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._lanes.clear()
