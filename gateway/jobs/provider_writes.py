"""External providers' durable writes as jobs of the worker queue (kind ``provider_write``).

``MemoryManager`` prepares each write (``memory.writes.ProviderWrite``: a turn, a
mirrored memory entry, a session's end) and hands it to the sink installed here; the
queue keeps it in the ``jobs`` table and calls ``MemoryManager.apply_write`` with it,
retried with backoff (or the server's ``Retry-After``), ``worker.max_attempts`` at most,
across restarts. A row is::

    kind        provider_write
    session_id  the session the write came from ('' for an erasure)
    dedupe_key  "<provider>:<write key>"
    payload     {"provider": <name>, "payload": ProviderWrite.to_payload()}

The de-duplication rule lives here: one job per dedupe key at a time (the queue's single
flight), and a key already done is not queued again, so a turn is never sent twice.
Erasure queues ``forget_user`` rows of the same shape itself, inside its own transaction
(``gateway/people/erasure.py``), and a later erasure of the same person is sent again.
An applied write is journaled (``memory/external.journal_entry``), once per dedupe key.
"""

from __future__ import annotations

from mnemo.gateway.jobs.queue import Job, JobQueue, JobRun, JobState
from mnemo.memory.external import journal_entry
from mnemo.memory.journal import JournalRepository
from mnemo.memory.manager import MemoryManager
from mnemo.memory.writes import ProviderWrite

PROVIDER_WRITE = "provider_write"
PROVIDER_WRITE_BACKOFF = (5.0, 30.0, 120.0, 600.0, 1800.0)


def dedupe_key(provider: str, write_key: str) -> str:
    """The job's dedupe key of one provider's write."""
    return f"{provider}:{write_key}"


def register_provider_writes(
    jobs: JobQueue, providers: MemoryManager, journal: JournalRepository | None = None
) -> None:
    """Run ``provider_write`` jobs and route the providers' durable writes into the queue."""

    async def handle(job: Job, run: JobRun) -> None:
        await providers.apply_write(job.payload["provider"], job.payload["payload"])
        if journal is None:
            return
        try:
            write = ProviderWrite.from_payload(job.payload["payload"])
        except ValueError:
            return  # apply_write refused what it could not read
        entry = journal_entry(job.payload["provider"], write)
        if entry is not None:
            await journal.append(entry, dedupe=job.dedupe_key or f"job:{job.id}")

    async def sink(provider: str, write: ProviderWrite) -> None:
        key = dedupe_key(provider, write.key)
        if any(j.state is JobState.DONE for j in await jobs.jobs(dedupe_key=key)):
            return
        payload = {"provider": provider, "payload": write.to_payload()}
        await jobs.enqueue(PROVIDER_WRITE, write.session_id, payload, dedupe_key=key)

    jobs.register(PROVIDER_WRITE, handle, backoff=PROVIDER_WRITE_BACKOFF)
    providers.set_write_sink(sink)
