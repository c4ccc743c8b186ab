"""Per-session lanes: serial within a session key, concurrent across keys.

A lane is one asyncio worker that owns one session key. It waits for the first item,
then keeps collecting for a short debounce window (a burst becomes one turn; the window
restarts with each new item, bounded by ``max_wait``), hands the batch to the handler,
and repeats. Items arriving while a turn runs wait for the next turn. A lane with
nothing to do for ``idle_s`` exits and is removed; the next item creates a new one.

``cancel_current`` interrupts the running turn of a lane (``/stop``) without dropping
what is queued behind it. All tasks are owned by the ``LaneSet`` and awaited on stop.

Bounded and fair. At most ``TurnSlots.size`` turns run at once
(``gateway.max_concurrent_turns``): a lane with a batch waits for a slot, and slots are
granted in the order lanes asked for them, whatever their chat. So a backlog (a
thousand chats writing at once, the inbox recovered after an outage) is answered at
the pace the bot can sustain from the first second instead of starting every turn at
once, and a chat that floods the bot holds one slot at most: after each of its turns it
asks again behind everyone who asked meanwhile, so another chat's first reply waits
for one of its turns at most. Messages that reach a lane while it waits for its slot
join the batch when the chat debounces (the turn has not started); the lane keeps each
chat's order.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Generic, TypeVar

from mnemo.gateway.logs import get_logger

log = get_logger(__name__)

T = TypeVar("T")
Handler = Callable[[str, Sequence[T]], Coroutine[Any, Any, None]]


def default_turn_slots(llm_concurrency: int, cpus: int | None = None) -> int:
    """``gateway.max_concurrent_turns`` when unset: every LLM request slot busy, plus a
    turn per core doing its non-LLM work (storage, session start, tools) meanwhile."""
    return llm_concurrency + (cpus if cpus is not None else os.cpu_count() or 1)


class TurnSlots:
    """At most ``size`` turns at once, granted first come, first served.

    ``acquire`` returns how long the caller waited; every grant is paired with one
    ``release``. A waiter cancelled after its grant hands the slot back itself."""

    def __init__(self, size: int, *, on_wait: Callable[[float], None] | None = None) -> None:
        if size < 1:
            raise ValueError("a turn needs at least one slot")
        self.size = size
        self.running = 0
        self._waiters: deque[tuple[asyncio.Future[None], float]] = deque()
        self._on_wait = on_wait

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def oldest_wait_s(self) -> float:
        """How long the first waiter has waited so far (0 when nobody waits)."""
        if not self._waiters:
            return 0.0
        return asyncio.get_running_loop().time() - self._waiters[0][1]

    async def acquire(self) -> float:
        loop = asyncio.get_running_loop()
        if self.running < self.size and not self._waiters:
            self.running += 1
            self._waited(0.0)
            return 0.0
        since = loop.time()
        fut: asyncio.Future[None] = loop.create_future()
        entry = (fut, since)
        self._waiters.append(entry)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # granted, but the waiter is gone: pass the slot on
            elif entry in self._waiters:
                self._waiters.remove(entry)
            raise
        waited = loop.time() - since
        self._waited(waited)
        return waited

    def release(self) -> None:
        # The slot goes straight to the first waiter: ``running`` does not change.
        while self._waiters:
            fut, _ = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self.running -= 1

    def _waited(self, seconds: float) -> None:
        if self._on_wait is not None:
            self._on_wait(seconds)


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
        slots: TurnSlots | None = None,
    ) -> None:
        self._handler = handler
        # Unbounded unless given: tests of one lane need no gate.
        self.slots = slots or TurnSlots(1 << 30)
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
                granted = False
                try:
                    batch = await self._collect(lane, first)
                    await self.slots.acquire()
                    granted = True
                    if self._window(first) > 0:  # arrived while it waited: one debounced batch
                        while len(batch) < self._max_batch and not lane.queue.empty():
                            batch.append(lane.queue.get_nowait())
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
                    if granted:
                        self.slots.release()
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
