"""Scheduled jobs: the one place they are created, listed, paused, resumed and removed.

``CronJobs`` is the only implementation behind every way of managing jobs — the
``cronjob`` tool, the ``/cron`` command, ``cron.jobs`` in config.yaml and ``mnemo cron``
— so validation and permissions cannot drift apart between them. Running jobs on time
is ``gateway/cron_scheduler.py``'s work; schedule syntax is ``gateway/schedules.py``'s.

Who may do what (``Caller``):

* a chat member sees the jobs of the chat they write in (the same thread, in a forum
  channel) and changes those of a DM, or the ones they created in a group;
* admins (and the operator at the CLI) see and change every job;
* a job created in a chat targets that chat; the run speaks for its creator.

Jobs declared in config.yaml are upserted by their ``id`` at every start: an unchanged
entry keeps its row (and with it a pending or missed run), a changed one is redefined,
an entry deleted from the file is removed. Their removal from chat is refused (it
would come back at the next start); pausing them is allowed.

Every validation error is an ``InvalidJob`` with a message for the person or model who
wrote the request, raised before anything is stored.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from mnemo.gateway.config import CronSettings, Settings
from mnemo.gateway.cron.schedules import (
    Schedule,
    ScheduleKind,
    local_time,
    make_schedule,
    normalize_cron,
    parse_at,
    parse_duration,
    zone,
)
from mnemo.gateway.cron.store import CronJob, CronRepository, JobSource, JobState, JobTarget
from mnemo.gateway.errors import ConfigError, CronError, InvalidJob, JobNotAllowed, JobNotFound
from mnemo.gateway.events import ChatType
from mnemo.gateway.logs import get_logger
from mnemo.memory.errors import InvalidIdentifier
from mnemo.memory.scope import validate_id
from mnemo.memory.sessions import Clock, utc_now
from mnemo.memory.threats import scan

log = get_logger(__name__)

MAX_JOBS_PER_CHAT = 50
# The run of a group job created by the operator (CLI, config.yaml) speaks for nobody.
OPERATOR_USER = "operator"
SCHEDULE_KINDS = ("cron", "every", "at", "in")
_DECLARED_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_DECLARED_KEYS = {"id", "chat", "user", "prompt", "cron", "every", "at", "timezone"}


@dataclass(frozen=True, slots=True)
class Caller:
    """Who asks, and from which chat (None: the operator at the CLI or config.yaml)."""

    source: JobSource
    chat: JobTarget | None = None
    user_id: str | None = None
    is_admin: bool = False

    @classmethod
    def operator(cls, source: JobSource = JobSource.CLI) -> Caller:
        return cls(source, is_admin=True)

    @property
    def name(self) -> str:
        return f"{self.chat.platform}:{self.user_id}" if self.chat is not None else self.source.value

    def sees(self, job: CronJob) -> bool:
        if self.is_admin:
            return True
        c = self.chat
        return c is not None and (job.target.platform, job.target.chat_id, job.target.thread_id) == (
            c.platform,
            c.chat_id,
            c.thread_id,
        )

    def may_change(self, job: CronJob) -> bool:
        if self.is_admin:
            return True
        return self.sees(job) and (job.target.chat_type is ChatType.DM or job.user_id == self.user_id)


def parse_chat(text: str) -> JobTarget:
    """``PLATFORM:CHAT_ID`` (a DM), ``PLATFORM:dm:CHAT_ID`` or
    ``PLATFORM:group:CHAT_ID[:THREAD_ID]``."""
    parts = text.strip().split(":")
    try:
        if len(parts) == 2:
            target = JobTarget(parts[0], parts[1], ChatType.DM)
        elif len(parts) == 3 and parts[1] == "dm":
            target = JobTarget(parts[0], parts[2], ChatType.DM)
        elif len(parts) in (3, 4) and parts[1] == "group":
            target = JobTarget(parts[0], parts[2], ChatType.GROUP, parts[3] if len(parts) == 4 else None)
        else:
            raise InvalidJob(
                f"invalid chat {text!r}: use PLATFORM:CHAT_ID for a DM or PLATFORM:group:CHAT_ID[:THREAD_ID] "
                "for a group (e.g. telegram:123456789, discord:group:1122334455)"
            )
        _check_target(target, None)
    except InvalidIdentifier as e:
        raise InvalidJob(f"invalid chat {text!r}: {e}") from None
    return target


def _check_target(target: JobTarget, user_id: str | None) -> None:
    for kind, value in (
        ("platform", target.platform),
        ("chat", target.chat_id),
        ("thread", target.thread_id),
        ("user", user_id),
    ):
        if value is None:
            continue
        validate_id(kind, value)
        if ":" in value:
            raise InvalidIdentifier(f"{kind} id {value!r} must not contain ':'")


def check_prompt(prompt: str, limit: int) -> str:
    text = prompt.strip()
    if not text:
        raise InvalidJob("the prompt is empty: say what the job should do at each run")
    if len(text) > limit:
        raise InvalidJob(
            f"the prompt has {len(text):,} characters; the limit is {limit:,} (cron.max_prompt_chars)"
        )
    # A job's prompt is stored and replayed as a user turn at every run: the same
    # scan as every other durable text the model (or a chat) can write.
    threat = scan(text)
    if threat is not None:
        raise InvalidJob(f"the prompt was refused ({threat.category}): it {threat.detail}")
    return text


def parse_declared(
    i: int, entry: Mapping[str, Any], settings: CronSettings, default_timezone: str
) -> tuple[str, tuple[JobTarget, str, str, str, str, str]]:
    """One ``cron.jobs`` entry checked and normalised; raises ``ConfigError`` naming it."""
    where = f"cron.jobs[{i}]"
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: expected a mapping with id, chat, prompt and one of cron/every/at")
    unknown = sorted(set(entry) - _DECLARED_KEYS)
    if unknown:
        allowed = ", ".join(sorted(_DECLARED_KEYS))
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)} (allowed: {allowed})")
    job_id = str(entry.get("id", ""))
    if not _DECLARED_ID.match(job_id):
        raise ConfigError(f"{where}: 'id' must be 1-64 letters, digits, '.', '_' or '-' (got {job_id!r})")
    kinds = [k for k in ("cron", "every", "at") if k in entry]
    if len(kinds) != 1:
        raise ConfigError(f"{where} ({job_id}): give exactly one of cron, every or at")
    kind = kinds[0]
    when = str(entry[kind])
    if kind == "at" and re.fullmatch(r"\d{1,2}:\d{2}(:\d{2})?", when.strip()):
        raise ConfigError(
            f"{where} ({job_id}): 'at' needs a date as well (2025-06-01T08:00); use cron for a daily time"
        )
    try:
        target = parse_chat(str(entry.get("chat", "")))
        user = entry.get("user")
        default_user = target.chat_id if target.chat_type is ChatType.DM else OPERATOR_USER
        user_id = str(user) if user is not None else default_user
        _check_target(target, user_id)
        prompt = check_prompt(str(entry.get("prompt", "")), settings.max_prompt_chars)
        tz = str(entry.get("timezone") or default_timezone)
        zone(tz)
    except (InvalidJob, InvalidIdentifier) as e:
        raise ConfigError(f"{where} ({job_id}): {e}") from None
    return job_id, (target, user_id, prompt, kind, when, tz)


def check_declared_jobs(settings: Settings) -> None:
    """Raise one ``ConfigError`` listing every bad ``cron.jobs`` entry, checked by the
    same parser the scheduler uses: the CLI calls it right after loading the settings,
    so ``doctor`` and ``run`` agree."""
    problems = declared_job_problems(settings.cron, settings.cron.timezone or settings.gateway.timezone)
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))


def declared_job_problems(
    settings: CronSettings, default_timezone: str, now: datetime | None = None
) -> list[str]:
    """Every problem in ``cron.jobs`` at once, one line per bad entry (``cron.jobs[i] (id):
    reason``), without a database: what the CLI reports before anything runs.
    An ``at`` time already past is not a problem here (the job may have run); creating
    a new job for it is refused when the jobs are synced."""
    try:
        zone(default_timezone)
    except InvalidJob as e:
        return [f"cron.timezone / gateway.timezone: {e}"]
    now = now or utc_now()
    problems: list[str] = []
    first_at: dict[str, int] = {}
    for i, entry in enumerate(settings.jobs):
        try:
            job_id, (_, _, _, kind, when, tz) = parse_declared(i, entry, settings, default_timezone)
        except ConfigError as e:
            problems.append(str(e))
            continue
        if job_id in first_at:
            problems.append(
                f"cron.jobs[{i}]: id {job_id!r} is used twice (first at cron.jobs[{first_at[job_id]}])"
            )
            continue
        first_at[job_id] = i
        try:
            if kind == "at":
                parse_at(when, zone(tz), now)
            else:
                make_schedule(kind, when, tz, now, min_interval_s=settings.min_interval_s)
        except InvalidJob as e:
            problems.append(f"cron.jobs[{i}] ({job_id}): {e}")
    return problems


class CronJobs:
    def __init__(
        self,
        store: CronRepository,
        settings: CronSettings,
        *,
        default_timezone: str,
        platforms: frozenset[str] | None = None,
        clock: Clock = utc_now,
    ):
        """``platforms``: the platforms a job may target (``Settings.known_platforms``);
        None accepts any (tests of the store alone)."""
        try:
            zone(default_timezone)  # fail at start-up, not at the first job
        except InvalidJob as e:
            raise ConfigError(f"cron.timezone / gateway.timezone: {e}") from None
        self.store = store
        self.settings = settings
        self.default_timezone = default_timezone
        self.platforms = platforms
        self.clock = clock
        self._listeners: list[Callable[[], None]] = []

    def on_change(self, listener: Callable[[], None]) -> None:
        """``listener()`` after every change made through this object (the scheduler
        re-reads at once instead of at its next poll)."""
        self._listeners.append(listener)

    def _changed(self) -> None:
        for listener in self._listeners:
            listener()

    # --- create -----------------------------------------------------------------------
    def check_prompt(self, prompt: str) -> str:
        return check_prompt(prompt, self.settings.max_prompt_chars)

    def schedule(self, kind: str, text: str, timezone: str | None) -> Schedule:
        if kind not in SCHEDULE_KINDS:
            raise InvalidJob(f"unknown schedule kind {kind!r} (use one of: {', '.join(SCHEDULE_KINDS)})")
        return make_schedule(
            kind,
            text,
            timezone or self.default_timezone,
            self.clock(),
            min_interval_s=self.settings.min_interval_s,
        )

    async def create(
        self,
        caller: Caller,
        *,
        kind: str,
        when: str,
        prompt: str,
        timezone: str | None = None,
        target: JobTarget | None = None,
        user_id: str | None = None,
    ) -> CronJob:
        """A new job. From a chat, ``target`` and ``user_id`` are the caller's own chat
        and id; the operator names them (``user_id`` defaults to the chat of a DM)."""
        if caller.chat is not None:
            target, user_id = caller.chat, caller.user_id
        if target is None:
            raise InvalidJob("a job needs a target chat")
        if self.platforms is not None and target.platform not in self.platforms:
            raise InvalidJob(
                f"unknown platform {target.platform!r} in {target}: a job can target "
                f"{', '.join(sorted(self.platforms))}"
            )
        if user_id is None:
            user_id = target.chat_id if target.chat_type is ChatType.DM else OPERATOR_USER
        try:
            _check_target(target, user_id)
        except InvalidIdentifier as e:
            raise InvalidJob(str(e)) from None
        text = self.check_prompt(prompt)
        schedule = self.schedule(kind, when, timezone)
        current = [j for j in await self.store.in_chat(target) if j.state is not JobState.DONE]
        if len(current) >= MAX_JOBS_PER_CHAT:
            raise InvalidJob(f"this chat already has {len(current)} scheduled jobs; remove some first")
        now = self.clock()
        for _ in range(5):
            job = CronJob(
                id=secrets.token_hex(4),
                target=target,
                user_id=user_id,
                source=caller.source,
                created_by=caller.name,
                prompt=text,
                schedule=schedule,
                state=JobState.ACTIVE,
                next_run_at=schedule.next_run(now),
                last_run_at=None,
                last_result=None,
                rev=1,
                created_at=now,
            )
            if await self.store.insert(job):
                log.info(
                    "cron_job_created",
                    job=job.id,
                    target=str(target),
                    schedule=schedule.describe(),
                    by=caller.name,
                )
                self._changed()
                return job
        raise CronError("could not allocate a job id; try again")

    # --- list and change ----------------------------------------------------------------
    async def list(self, caller: Caller) -> list[CronJob]:
        if caller.is_admin or caller.chat is None:
            jobs = await self.store.all()
        else:
            jobs = await self.store.in_chat(caller.chat)
        return [j for j in jobs if caller.sees(j)]

    async def get(self, caller: Caller, job_id: str) -> CronJob:
        job = await self.store.get(job_id.strip())
        if job is None or not caller.sees(job):
            where = "" if caller.chat is None or caller.is_admin else " in this chat"
            raise JobNotFound(f"no scheduled job {job_id!r}{where} (list them to see the ids)")
        return job

    async def _changeable(self, caller: Caller, job_id: str) -> CronJob:
        job = await self.get(caller, job_id)
        if not caller.may_change(job):
            raise JobNotAllowed(
                f"job {job.id} was created by someone else in this chat; only they or an admin may change it"
            )
        return job

    async def pause(self, caller: Caller, job_id: str) -> CronJob:
        job = await self._changeable(caller, job_id)
        if job.state is not JobState.ACTIVE:
            raise InvalidJob(f"job {job.id} is {job.state.value}, not active")
        await self.store.set_state(job.id, JobState.PAUSED, None, self.clock())
        log.info("cron_job_paused", job=job.id, by=caller.name)
        self._changed()
        return await self.get(caller, job.id)

    async def resume(self, caller: Caller, job_id: str) -> CronJob:
        job = await self._changeable(caller, job_id)
        if job.state is not JobState.PAUSED:
            raise InvalidJob(f"job {job.id} is {job.state.value}, not paused")
        now = self.clock()
        # Runs missed while paused are not made up for: the job continues from now.
        next_run = job.schedule.next_run(now)
        if next_run is None:
            raise InvalidJob(
                f"job {job.id} was due {job.schedule.describe()}, which has passed; remove it instead"
            )
        await self.store.set_state(job.id, JobState.ACTIVE, next_run, now, result="resumed")
        log.info("cron_job_resumed", job=job.id, by=caller.name)
        self._changed()
        return await self.get(caller, job.id)

    async def remove(self, caller: Caller, job_id: str) -> CronJob:
        job = await self._changeable(caller, job_id)
        if job.declared and caller.source is not JobSource.CONFIG:
            raise JobNotAllowed(
                f"job {job.id} is declared in config.yaml (cron.jobs); delete it there, or pause it"
            )
        await self.store.delete(job.id)
        log.info("cron_job_removed", job=job.id, by=caller.name)
        self._changed()
        return job

    async def request_run(self, caller: Caller, job_id: str) -> int:
        """Ask for a run now (``mnemo cron run-now``); whichever process takes the
        request runs it (see ``CronScheduler``). Returns the run id."""
        job = await self._changeable(caller, job_id)
        run_id = await self.store.request_run(job.id, self.clock())
        self._changed()
        return run_id

    # --- config.yaml ------------------------------------------------------------------
    async def sync_declared(self, entries: Sequence[Mapping[str, Any]]) -> tuple[int, int, int]:
        """Upsert the ``cron.jobs`` entries by id; remove declared jobs no longer listed.
        Returns (added, redefined, removed). Raises ``ConfigError`` naming the entry."""
        wanted: dict[str, tuple[JobTarget, str, str, str, str, str]] = {}
        for i, entry in enumerate(entries):
            job_id, definition = self._declared(i, entry)
            if job_id in wanted:
                raise ConfigError(f"cron.jobs[{i}]: id {job_id!r} is used twice")
            wanted[job_id] = definition
        existing = {j.id: j for j in await self.store.all()}
        added = redefined = removed = 0
        operator = Caller.operator(JobSource.CONFIG)
        now = self.clock()
        for i, (job_id, (target, user_id, prompt, kind, when, tz)) in enumerate(wanted.items()):
            old = existing.get(job_id)
            if old is not None and not old.declared:
                raise ConfigError(
                    f"cron.jobs[{i}]: id {job_id!r} is taken by a job created with {old.source.value}"
                )
            if old is not None and self._same(old, target, user_id, prompt, kind, when, tz):
                continue
            try:
                schedule = self.schedule(kind, when, tz)
            except InvalidJob as e:
                raise ConfigError(f"cron.jobs[{i}] ({job_id}): {e}") from None
            job = CronJob(
                id=job_id,
                target=target,
                user_id=user_id,
                source=JobSource.CONFIG,
                created_by=operator.name,
                prompt=prompt,
                schedule=schedule,
                state=JobState.ACTIVE,
                next_run_at=schedule.next_run(now),
                last_run_at=None,
                last_result=None,
                rev=1,
                created_at=now,
            )
            if old is None:
                await self.store.insert(job)
                added += 1
            else:
                await self.store.redefine(job, now)
                redefined += 1
        for job in existing.values():
            if job.declared and job.id not in wanted:
                await self.store.delete(job.id)
                removed += 1
        if added or redefined or removed:
            log.info("cron_jobs_declared", added=added, redefined=redefined, removed=removed)
            self._changed()
        return added, redefined, removed

    def _declared(
        self, i: int, entry: Mapping[str, Any]
    ) -> tuple[str, tuple[JobTarget, str, str, str, str, str]]:
        return parse_declared(i, entry, self.settings, self.default_timezone)

    def _same(
        self, job: CronJob, target: JobTarget, user_id: str, prompt: str, kind: str, when: str, tz: str
    ) -> bool:
        s = job.schedule
        if (job.target, job.user_id, job.prompt, s.kind.value, s.timezone) != (
            target,
            user_id,
            prompt,
            kind,
            tz,
        ):
            return False
        try:
            if s.kind is ScheduleKind.CRON:
                return s.value == normalize_cron(when)
            if s.kind is ScheduleKind.EVERY:
                return s.interval == parse_duration(when)
            return s.instant == parse_at(when, zone(tz), self.clock())
        except InvalidJob:
            return False


def job_summary(job: CronJob, *, skipped_runs: int | None = None) -> dict[str, Any]:
    """A job as the tool and ``mnemo cron list --json`` show it; ``skipped_runs``: how
    many runs the budget gate skipped (``CronRunRepository.count_runs``), where known."""
    tz = job.schedule.timezone
    extra = {} if skipped_runs is None else {"skipped_runs": skipped_runs}
    return {
        "id": job.id,
        "chat": str(job.target),
        "user": job.user_id,
        "schedule": job.schedule.describe(),
        "timezone": tz,
        "state": job.state.value,
        "next_run": local_time(job.next_run_at, tz) if job.next_run_at else None,
        "next_run_utc": job.next_run_at.isoformat() if job.next_run_at else None,
        "last_run": local_time(job.last_run_at, tz) if job.last_run_at else None,
        "last_result": job.last_result,
        "source": job.source.value,
        "prompt": job.prompt,
        **extra,
    }


def job_line(job: CronJob, *, with_chat: bool = False, skipped_runs: int = 0) -> str:
    """One line for /cron list and ``mnemo cron list``."""
    when = f"next {local_time(job.next_run_at, job.schedule.timezone)}" if job.next_run_at else "no next run"
    prompt = job.prompt if len(job.prompt) <= 60 else job.prompt[:59] + "…"
    chat = f"{job.target}  " if with_chat else ""
    last = f"  last: {job.last_result}" if job.last_result else ""
    skipped = f"  skipped: {skipped_runs} (budget)" if skipped_runs else ""
    return (
        f"{job.id}  {job.state.value:<6}  {chat}{job.schedule.describe()}  {when}  “{prompt}”{last}{skipped}"
    )
