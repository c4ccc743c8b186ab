"""The durable write path shared by external providers: the job queue honours a
provider's Retry-After, gives up after worker.max_attempts with the error, and a write
key already done is never queued again."""

from __future__ import annotations

from pathlib import Path

from mnemo.app import PROVIDER_WRITE, register_provider_writes
from mnemo.memory.durable import DurableWrites, RetryLater
from mnemo.memory.manager import MemoryManager
from mnemo.memory.provider import Availability, MemoryProvider, ProviderContext, Recall
from mnemo.memory.scope import AgentContext, UserRef
from tests.gateway.test_worker import Clock, make_queue, until


class Flaky(DurableWrites, MemoryProvider):
    """A provider whose API answers from a script: 'retry:<s>', 'boom', or 'ok'."""

    name = "flaky"
    description = "test"

    def __init__(self) -> None:
        self.script: list[str] = []
        self.sent: list[dict] = []

    def is_available(self, home, config):
        return Availability(True)

    def initialize(self, home, config):
        pass

    def prefetch(self, query, ctx):
        return Recall("")

    def get_tool_schemas(self):
        return ()

    def handle_tool_call(self, name, args, ctx):
        return "{}"

    def prepare_write(self, op, data, ctx):
        return {"op": op, "key": f"{op}-{ctx.session_id}-{data['user']}", "user": str(ctx.user)}

    def apply_write(self, payload):
        step = self.script.pop(0) if self.script else "ok"
        if step.startswith("retry:"):
            raise RetryLater("429", float(step.split(":")[1]))
        if step == "boom":
            raise RuntimeError("server exploded")
        self.sent.append(dict(payload))


def ctx(home: Path, user: str = "telegram:1") -> ProviderContext:
    return ProviderContext("s1", "telegram:dm:1", "telegram", UserRef.parse(user), AgentContext.PRIMARY, home)


async def test_retry_after_is_honoured_then_the_write_lands_once(db, tmp_path: Path) -> None:
    clock = Clock()
    queue = make_queue(db, clock, max_attempts=3)
    provider = Flaky()
    provider.script = ["retry:42"]
    manager = MemoryManager(tmp_path)
    manager.add_provider(provider, {})
    await manager.start()
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
        assert [p["user"] for p in provider.sent] == ["telegram:1"]
        manager.sync_turn("hello", "hi", ctx(tmp_path))  # the same turn again
        await manager.pending()
        assert len(await queue.jobs(kind=PROVIDER_WRITE)) == 1 and len(provider.sent) == 1
    await manager.shutdown()


async def test_bounded_attempts_then_failed_with_the_error(db, tmp_path: Path) -> None:
    clock = Clock()
    queue = make_queue(db, clock, max_attempts=2)
    provider = Flaky()
    provider.script = ["boom", "boom"]
    manager = MemoryManager(tmp_path)
    manager.add_provider(provider, {})
    await manager.start()
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


async def _is(queue, job_id: int, state: str) -> bool:
    return (await queue.get(job_id)).state == state


async def _queued_with_error(queue, job_id: int) -> bool:
    job = await queue.get(job_id)
    return job.state == "queued" and job.error is not None
