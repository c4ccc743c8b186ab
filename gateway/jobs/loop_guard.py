"""The repeat guard of background work: the same job kind cannot run for the same
session more than ``memory.upkeep.max_runs_without_message`` times without a new user
message in between.

A flush, review, summary or skill review is about what people said; with nothing new
said, running it again can only repeat itself — and a job that (through a bug, a
provider hook or a misconfiguration) enqueues itself again would run for ever, billing
someone each time (peers have burnt millions of tokens that way). A job asks
``admit(run, last_user_id)`` before its first model request: the run is marked with the
session's newest user message id in its checkpoint (persisted: the count survives a
restart), and when ``limit`` finished runs of its kind already carry that id, the job
ends without a request (logged as ``upkeep_loop_stopped``).

Clock-free on purpose: it counts user messages, not minutes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from mnemo.gateway.jobs.store import Job, JobState
from mnemo.gateway.logs import get_logger

log = get_logger(__name__)

MARK = "after_user"  # checkpoint key: the newest user message id when the run began

JobsOf = Callable[[str, str], Awaitable[list[Job]]]  # (session_id, kind) -> jobs


class LoopGuard:
    """``jobs_of`` lists a session's jobs of one kind (``JobQueue.jobs``)."""

    def __init__(self, jobs_of: JobsOf, limit: int) -> None:
        self.jobs_of = jobs_of
        self.limit = limit

    async def admit(self, job: Job, mark: Callable[..., Awaitable[None]], last_user_id: int) -> bool:
        """True: go on (the run is marked through ``mark``, ``JobRun.save``). False:
        ``limit`` runs of this kind already ran after the same user message."""
        if job.checkpoint.get(MARK) == last_user_id:
            return True  # this very run, resumed after a restart
        earlier = [
            j
            for j in await self.jobs_of(job.session_id, job.kind)
            if j.id != job.id and j.state is JobState.DONE and j.checkpoint.get(MARK) == last_user_id
        ]
        if len(earlier) >= self.limit:
            log.warning(
                "upkeep_loop_stopped",
                kind=job.kind,
                session=job.session_id,
                runs=len(earlier),
                limit=self.limit,
            )
            return False
        await mark(**{MARK: last_user_id})
        return True
