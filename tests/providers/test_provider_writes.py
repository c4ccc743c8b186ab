"""The durable write path shared by external providers (``gateway/jobs/provider_writes.py``):
the job queue honours a provider's Retry-After, gives up after worker.max_attempts with
the error, a write key already done is never queued again, and a provider write neither
waits for its session's running job nor holds it."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from mnemo.gateway.jobs.provider_writes import PROVIDER_WRITE, register_provider_writes
from mnemo.memory.durable import RetryLater
from mnemo.memory.external import ExternalProvider
from mnemo.memory.manager import MemoryManager
from mnemo.memory.provider import Availability, ProviderContext
from mnemo.memory.provider_scope import ProviderScope
from mnemo.memory.scope import AgentContext, UserRef
from mnemo.memory.writes import LegacyWrite, ProviderWrite, SyncTurn
from tests.gateway.test_worker import Clock, make_queue, until


class Flaky(ExternalProvider[None]):
    """A provider whose API answers from a script: 'retry:<s>', 'boom', or 'ok'."""

    name = "flaky"
    description = "test"

    def __init__(self) -> None:
        super().__init__()
        self.script: list[str] = []
        self.sent: list[ProviderWrite] = []
        self.hold: threading.Event | None = None  # set: the API answers
        self.holding = False

    def is_available(self, home, config):
        return Availability(True)

    def get_config_schema(self):
        return ()

    def recall(self, query, scope):
        return []

    def send(self, write: ProviderWrite) -> None:
        if self.hold is not None:
            self.holding = True
            self.hold.wait(10)
        step = self.script.pop(0) if self.script else "ok"
        if step.startswith("retry:"):
            raise RetryLater("429", float(step.split(":")[1]))
        if step == "boom":
            raise RuntimeError("server exploded")
        self.sent.append(write)

    def forget(self, scope: ProviderScope) -> None:
        raise AssertionError("not in these tests")

    def apply_legacy(self, operation: LegacyWrite, write: ProviderWrite) -> None:
        raise AssertionError("not in these tests")


def ctx(home: Path, user: str = "telegram:1", session: str = "s1") -> ProviderContext:
    return ProviderContext(
        session, "telegram:dm:1", "telegram", UserRef.parse(user), AgentContext.PRIMARY, home
    )


async def started(provider: Flaky, home: Path) -> MemoryManager:
    manager = MemoryManager(home)
    manager.add_provider(provider, {})
    await manager.start()
    return manager


async def test_retry_after_is_honoured_then_the_write_lands_once(db, tmp_path: Path) -> None:
    clock = Clock()
    queue = make_queue(db, clock, max_attempts=3)
    provider = Flaky()
    provider.script = ["retry:42"]
    manager = await started(provider, tmp_path)
    register_provider_writes(queue, manager)
    async with queue:
        manager.sync_turn("hello", "hi", ctx(tmp_path))
        await manager.pending()
        [job] = await queue.jobs(kind=PROVIDER_WRITE)
        await until(lambda: _queued_with_error(queue, job.id))
        assert (await queue.get(job.id)).not_before == clock() + 42  # not the 5 s of the schedule
        clock.now += 42
        queue.wake()
        await until(lambda: _is(queue, job.id, "done"))
        assert [(w.operation, w.scope.user_id) for w in provider.sent] == [
            (SyncTurn("hello", "hi"), "telegram:1")
        ]
        manager.sync_turn("hello", "hi", ctx(tmp_path))  # the same turn again
        await manager.pending()
        assert len(await queue.jobs(kind=PROVIDER_WRITE)) == 1 and len(provider.sent) == 1
    await manager.shutdown()


async def test_bounded_attempts_then_failed_with_the_error(db, tmp_path: Path) -> None:
    clock = Clock()
    queue = make_queue(db, clock, max_attempts=2)
    provider = Flaky()
    provider.script = ["boom", "boom"]
    manager = await started(provider, tmp_path)
    register_provider_writes(queue, manager)
    async with queue:
        manager.sync_turn("bye", "ok", ctx(tmp_path))
        await manager.pending()
        [job] = await queue.jobs(kind=PROVIDER_WRITE)
        await until(lambda: _queued_with_error(queue, job.id))
        clock.now += 3600
        queue.wake()
        await until(lambda: _is(queue, job.id, "failed"))
        assert "server exploded" in (await queue.get(job.id)).error
        assert "1 failed" in await queue.status_line()
        assert provider.sent == []
    await manager.shutdown()


async def test_a_write_is_a_job_of_its_session_keyed_by_provider_and_write(db, tmp_path: Path) -> None:
    queue = make_queue(db, Clock())
    provider = Flaky()
    manager = await started(provider, tmp_path)
    register_provider_writes(queue, manager)
    manager.sync_turn("hello", "hi", ctx(tmp_path, session="s7"))
    manager.sync_turn("again", "hi", ctx(tmp_path, session="s7"))
    await manager.pending()
    jobs = await queue.jobs(kind=PROVIDER_WRITE)
    prepared = [
        provider.prepare_write(SyncTurn(u, "hi"), ctx(tmp_path, session="s7")) for u in ("hello", "again")
    ]
    # Both writes are queued, each under its own key (in whichever order they were handed over).
    assert sorted((j.session_id, j.dedupe_key) for j in jobs) == sorted(
        ("s7", f"flaky:{w.key}") for w in prepared
    )
    by_key = {j.dedupe_key: j.payload for j in jobs}
    assert [by_key[f"flaky:{w.key}"] for w in prepared] == [
        {"provider": "flaky", "payload": w.to_payload()} for w in prepared
    ]
    assert [j.id for j in await queue.jobs(session_id="s7")] == [j.id for j in jobs]
    await manager.shutdown()


async def test_a_write_neither_waits_for_nor_holds_its_sessions_running_job(db, tmp_path: Path) -> None:
    queue = make_queue(db, Clock(), concurrency=3)
    provider = Flaky()
    manager = await started(provider, tmp_path)
    register_provider_writes(queue, manager)
    release = asyncio.Event()
    compressions: list[int] = []

    async def compress(job, run) -> None:  # the session's own work, running for a while
        compressions.append(job.id)
        await release.wait()

    queue.register("compress", compress)
    async with queue:
        await queue.enqueue("compress", "s1")
        await until(lambda: _true(compressions))
        manager.sync_turn("hello", "hi", ctx(tmp_path, session="s1"))
        await manager.pending()
        await until(lambda: _true(provider.sent))  # sent while s1's compression runs
        release.set()
        await queue.wait_idle()

        provider.hold = threading.Event()  # the provider hangs on the next write of s1 ...
        manager.sync_turn("later", "hi", ctx(tmp_path, session="s1"))
        await manager.pending()
        await until(lambda: _true([provider.holding]))
        await queue.enqueue("compress", "s1")
        await until(lambda: _true(compressions[1:]))  # ... and s1's next job runs meanwhile
        provider.hold.set()
        await queue.wait_idle()
    assert [w.operation for w in provider.sent] == [SyncTurn("hello", "hi"), SyncTurn("later", "hi")]
    await manager.shutdown()


async def _true(items: list) -> bool:
    return all(items) and bool(items)


async def _is(queue, job_id: int, state: str) -> bool:
    return (await queue.get(job_id)).state == state


async def _queued_with_error(queue, job_id: int) -> bool:
    job = await queue.get(job_id)
    return job.state == "queued" and job.error is not None
