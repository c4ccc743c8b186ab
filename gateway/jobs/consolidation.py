"""Consolidation people approve (``memory.consolidation``, opt-in): on a crontab
schedule in ``gateway.timezone`` (nightly by default), one capped request per memory
file — each person's USER.md and the shared MEMORY.md — looks for duplicates, stale
entries and contradictions and writes **proposals**, never edits.

* **Scheduled** by :class:`ConsolidationSchedule`, a task it owns: at each fire time it
  enqueues one ``consolidate`` job per file with at least
  ``memory.consolidation.min_entries`` entries, keyed by file and day (a restart or a
  second replica does not run it twice).
* **The request** (``Consolidation.consolidate``) goes to the auxiliary model with the
  file's entries as they are now (``memory/consolidation.py``): it has no conversation
  whose cache it could share. It is upkeep, billed to the file's person (shared memory:
  to nobody) and counted against ``memory.upkeep``'s caps and the budgets; at a cap the
  job waits for the reset.
* **Proposals** are journal entries with trust ``proposed`` (``ProposalRepository``),
  made for the file's person (shared memory: for the admins, speaker ``shared``). A
  suggestion rejected before, or already waiting, is not proposed again. Accepting one
  (``/memory proposals accept``, ``mnemo memory proposals accept``) writes through the
  file's scanned, bounded write path like any other write.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from mnemo.gateway.budgets.charge import Charge, RequestKind
from mnemo.gateway.budgets.ledger import BudgetRepository
from mnemo.gateway.budgets.upkeep import Upkeep
from mnemo.gateway.config import Settings
from mnemo.gateway.cron.calendar import CronCalendar
from mnemo.gateway.jobs.queue import DEFAULT_BACKOFF, Job, JobQueue, JobRun
from mnemo.gateway.llm.client import LLMClient
from mnemo.gateway.logs import get_logger
from mnemo.memory.consolidation import (
    CONSOLIDATION_SYSTEM,
    Suggestion,
    consolidation_prompt,
    parse_suggestions,
)
from mnemo.memory.errors import InvalidIdentifier
from mnemo.memory.journal import SHARED, Actor, Entry, Layer, NewEntry, ProposalRepository, Provenance, Trust
from mnemo.memory.journal_undo import document
from mnemo.memory.ports import CuratedDocument, CuratedRepository
from mnemo.memory.scope import UserRef

log = get_logger(__name__)

CONSOLIDATE = "consolidate"
MAX_TOKENS = 2048


def job_session(target: str) -> str:
    """The queue's key of a file's consolidation (it belongs to no conversation)."""
    return f"memory:{target}"


class Consolidation:
    """Collaborators: the LLM client, the curated ``files``, the ``proposals`` store, the
    budget ledger (spend of a request that has no session) and ``upkeep`` (its caps)."""

    def __init__(
        self,
        settings: Settings,
        *,
        llm: LLMClient,
        files: CuratedRepository,
        proposals: ProposalRepository,
        ledger: BudgetRepository,
        upkeep: Upkeep | None = None,
    ) -> None:
        self.settings = settings
        self.llm = llm
        self.files = files
        self.proposals = proposals
        self.ledger = ledger
        self.upkeep = upkeep

    def register(self, queue: JobQueue) -> None:
        queue.register(CONSOLIDATE, self.consolidate, backoff=DEFAULT_BACKOFF)

    async def enqueue_all(self, queue: JobQueue, targets: Sequence[str], day: str) -> int:
        """One job per file with enough entries (``SHARED`` or a PLATFORM:ID)."""
        n = 0
        for target in targets:
            try:
                file = document(self.files, target)
            except InvalidIdentifier:
                continue
            entries = (await asyncio.to_thread(file.load)).entries
            if len(entries) < self.settings.memory.consolidation.min_entries:
                continue
            key = f"{CONSOLIDATE}:{target}:{day}"
            if await queue.jobs(dedupe_key=key):
                continue  # this file's run of that day is queued or done already
            await queue.enqueue(CONSOLIDATE, job_session(target), {"target": target}, dedupe_key=key)
            n += 1
        return n

    async def consolidate(self, job: Job, run: JobRun) -> None:
        if run.checkpoint.get("proposed") is not None:
            return  # done before a restart: never ask twice
        target = str(job.payload.get("target") or "")
        try:
            file = document(self.files, target)
        except InvalidIdentifier:
            log.warning("consolidation_bad_target", target=target)
            return
        entries = list((await asyncio.to_thread(file.load)).entries)
        if len(entries) < self.settings.memory.consolidation.min_entries:
            return
        speaker = target  # whose proposals they are: the person, or "shared" for admins
        rejected = [_suggestion(e) for e in await self.proposals.rejected([speaker])]
        waiting = {_suggestion(e).key for e in await self.proposals.proposals([speaker])}
        payer = None if target == SHARED else UserRef.parse(target)
        text = await self._ask(job.session_id, payer, file, entries, rejected)
        known = {s.key for s in rejected} | waiting
        made = 0
        for s in parse_suggestions(text, entries, max_chars=file.limit):
            if s.key in known:
                continue
            by = Provenance(Actor.job("consolidation"), Trust.PROPOSED, speaker=speaker)
            await self.proposals.propose(
                NewEntry(Layer.CURATED, file.owner, s.op, s.old, s.new, by, note=s.why)
            )
            made += 1
        await run.save(proposed=made)
        log.info("consolidation_proposed", target=target, entries=len(entries), proposals=made)

    async def _ask(
        self,
        key: str,
        payer: UserRef | None,
        file: CuratedDocument,
        entries: Sequence[str],
        rejected: Sequence[Suggestion],
    ) -> str:
        whose = "the shared notes (MEMORY.md)" if payer is None else "one person's profile (USER.md)"
        kind = RequestKind.CONSOLIDATION
        if self.upkeep is not None:
            await self.upkeep.before_request(key, kind)
        response = await self.llm.create(
            system=CONSOLIDATION_SYSTEM,
            messages=[
                {"role": "user", "content": consolidation_prompt(entries, whose=whose, rejected=rejected)}
            ],
            charge=Charge(kind, payer),
            model=self.settings.llm.aux_model,
            max_tokens=MAX_TOKENS,
            cache=False,
        )
        who = None if payer is None else str(payer)
        await self.ledger.record_spend(who, response.usage)  # no session to count it on
        if self.upkeep is not None:
            await self.upkeep.record(key, kind, payer, response.usage)
        return response.text


def _suggestion(entry: Entry) -> Suggestion:
    return Suggestion(entry.op, entry.old or "", entry.new, entry.note or "")


class ConsolidationSchedule:
    """Enqueues the consolidation jobs at each fire time of ``schedule`` (a task it
    owns; ``start``/``stop`` idempotent). ``targets`` lists the files to look at now
    (every person with a profile, and ``SHARED``); ``clock`` and ``sleep`` are injected
    so a test crosses a fire time without waiting."""

    def __init__(
        self,
        consolidation: Consolidation,
        queue: JobQueue,
        targets: Callable[[], Awaitable[list[str]]],
        *,
        timezone: str,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.consolidation = consolidation
        self.queue = queue
        self.targets = targets
        self.tz = ZoneInfo(timezone)
        self.calendar = CronCalendar.parse(consolidation.settings.memory.consolidation.schedule, self.tz)
        self.clock = clock
        self.sleep = sleep
        self._task: asyncio.Task[None] | None = None

    def next_run(self) -> datetime:
        return next(self.calendar.times(self.clock()))

    async def run_once(self, at: datetime) -> int:
        """The jobs of the fire time ``at``."""
        day = at.astimezone(self.tz).date().isoformat()
        n = await self.consolidation.enqueue_all(self.queue, await self.targets(), day)
        log.info("consolidation_scheduled", jobs=n, day=day)
        return n

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="consolidation-schedule")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            at = self.next_run()
            await self.sleep(max(0.0, (at - self.clock()).total_seconds()))
            try:
                await self.run_once(at)
            except Exception as e:  # loop boundary: the next fire time tries again
                log.warning("consolidation_schedule_failed", error=f"{type(e).__name__}: {e}")
