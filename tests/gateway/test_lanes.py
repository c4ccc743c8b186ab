"""Lanes: serial within a key, concurrent across keys, debounce bursts, reap idle lanes."""

import asyncio

from mnemo.gateway.inbound.lanes import LaneSet, TurnSlots, default_turn_slots


async def test_serial_within_a_key_and_concurrent_across_keys():
    events: list[tuple[str, str, tuple[int, ...]]] = []
    slow_started = asyncio.Event()
    release = asyncio.Event()

    async def handler(key, batch):
        events.append(("start", key, tuple(batch)))
        if key == "slow":
            slow_started.set()
            await release.wait()
        events.append(("end", key, tuple(batch)))

    lanes = LaneSet(handler, debounce_s=0, idle_s=5)
    lanes.submit("slow", 1)
    await slow_started.wait()
    lanes.submit("slow", 2)
    lanes.submit("fast", 10)
    for _ in range(100):
        if ("end", "fast", (10,)) in events:
            break
        await asyncio.sleep(0.01)
    assert ("end", "fast", (10,)) in events, "a slow chat must not block another"
    assert ("start", "slow", (2,)) not in events, "the second message waits for the first turn"
    release.set()
    await lanes.drain(2)
    slow = [e for e in events if e[1] == "slow"]
    assert slow == [
        ("start", "slow", (1,)),
        ("end", "slow", (1,)),
        ("start", "slow", (2,)),
        ("end", "slow", (2,)),
    ]
    await lanes.stop()


async def test_a_burst_within_the_debounce_window_is_one_turn():
    batches = []

    async def handler(key, batch):
        batches.append(list(batch))

    lanes = LaneSet(handler, debounce_s=0.2, idle_s=5)
    for i in range(3):
        lanes.submit("k", i)
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    await lanes.drain(3)
    assert batches == [[0, 1, 2]]
    await lanes.stop()


async def test_debounce_override_zero_gives_one_turn_per_message():
    batches = []

    async def handler(key, batch):
        batches.append(list(batch))

    lanes = LaneSet(handler, debounce_s=5, idle_s=5, debounce_for=lambda item: 0.0)
    lanes.submit("k", 1)
    lanes.submit("k", 2)
    await asyncio.sleep(0.05)
    await lanes.drain(2)
    assert batches == [[1], [2]]
    await lanes.stop()


async def test_idle_lanes_are_reaped_and_recreated():
    seen = []

    async def handler(key, batch):
        seen.extend(batch)

    lanes = LaneSet(handler, debounce_s=0, idle_s=0.05)
    lanes.submit("k", 1)
    for _ in range(100):
        await asyncio.sleep(0.01)
        if len(lanes) == 0:
            break
    assert len(lanes) == 0
    lanes.submit("k", 2)
    await asyncio.sleep(0.05)
    assert seen == [1, 2]
    await lanes.stop()


async def test_cancel_current_interrupts_the_turn_but_keeps_the_queue():
    started = asyncio.Event()
    done = []

    async def handler(key, batch):
        if batch == [1]:
            started.set()
            await asyncio.sleep(30)
        done.append(batch)

    lanes = LaneSet(handler, debounce_s=0, idle_s=5)
    lanes.submit("k", 1)
    await started.wait()
    lanes.submit("k", 2)
    assert lanes.cancel_current("k")
    await asyncio.sleep(0.05)
    await lanes.drain(2)
    assert done == [[2]]
    assert not lanes.cancel_current("k")
    await lanes.stop()


async def test_a_failing_turn_does_not_kill_the_lane():
    seen = []

    async def handler(key, batch):
        if batch == [1]:
            raise RuntimeError("boom")
        seen.append(batch)

    lanes = LaneSet(handler, debounce_s=0, idle_s=5)
    lanes.submit("k", 1)
    lanes.submit("k", 2)
    await asyncio.sleep(0.05)
    await lanes.drain(2)
    assert seen == [[2]]
    await lanes.stop()


async def test_turn_slots_are_granted_in_arrival_order_and_a_cancelled_waiter_gives_way():
    slots = TurnSlots(1)
    assert await slots.acquire() == 0.0
    granted: list[str] = []

    async def wait(name: str) -> None:
        await slots.acquire()
        granted.append(name)

    tasks = {name: asyncio.create_task(wait(name)) for name in ("a", "b", "c")}
    await asyncio.sleep(0)
    assert slots.waiting == 3 and slots.running == 1
    tasks["b"].cancel()
    await asyncio.gather(tasks["b"], return_exceptions=True)
    assert slots.waiting == 2
    slots.release()
    await tasks["a"]
    slots.release()
    await tasks["c"]
    assert granted == ["a", "c"]
    slots.release()
    assert (slots.running, slots.waiting) == (0, 0)


async def test_a_waiter_cancelled_after_its_grant_passes_the_slot_on():
    slots = TurnSlots(1)
    await slots.acquire()
    first = asyncio.create_task(slots.acquire())
    second = asyncio.create_task(slots.acquire())
    await asyncio.sleep(0)
    slots.release()  # granted to ``first``, which is cancelled before it runs
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    await asyncio.wait_for(second, 1)
    assert (slots.running, slots.waiting) == (1, 0)


async def test_lanes_run_at_most_the_slots_and_a_flooding_key_waits_behind_others():
    started: list[tuple[str, tuple[int, ...]]] = []
    running = 0
    most = 0
    gate = asyncio.Event()

    async def handler(key, batch):
        nonlocal running, most
        started.append((key, tuple(batch)))
        running += 1
        most = max(most, running)
        await gate.wait()
        running -= 1

    lanes = LaneSet(handler, debounce_s=0, idle_s=5, slots=TurnSlots(2))
    for i in range(4):
        lanes.submit("flood", i)
    lanes.submit("x", 100)
    lanes.submit("y", 200)
    try:
        await asyncio.sleep(0.05)
        assert started == [("flood", (0,)), ("x", (100,))] and lanes.slots.waiting == 1
    finally:
        gate.set()
        await lanes.drain(2)
        await lanes.stop()
    assert most == 2
    assert [k for k, _ in started][:4] == ["flood", "x", "y", "flood"]
    assert [b for k, b in started if k == "flood"] == [(0,), (1,), (2,), (3,)]


def test_default_turn_slots_are_the_llm_slots_plus_the_cores():
    assert default_turn_slots(8, cpus=2) == 10
    assert default_turn_slots(1, cpus=1) == 2
