"""Lanes: serial within a key, concurrent across keys, debounce bursts, reap idle lanes."""

import asyncio

from mnemo.gateway.inbound.lanes import LaneSet


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
