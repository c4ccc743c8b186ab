"""``mnemo cron``: add, list, pause, resume, remove and run scheduled jobs from a shell.

Every action goes through ``gateway.cron.CronJobs`` — the object behind the ``cronjob``
tool, ``/cron`` and ``cron.jobs`` in config.yaml — as the operator (who sees every
job). The CLI writes the configured backend (state.db, or database.url's PostgreSQL); a
running gateway re-reads ``cron_jobs`` every ``cron.poll_s`` seconds (2 by default) and
picks the change up without a restart.

``run-now`` asks for a run in the database. A running gateway takes the request at its
next poll and runs the job; the command waits for the outcome. If no process takes it
within two polls, the command takes it itself: it opens a minimal app in this process
(no adapters, no scheduler), runs the job through the same pipeline, and leaves the
result in the durable outbox, which the gateway delivers when it next runs.

``--chat`` is ``PLATFORM:CHAT_ID`` for a DM (the run speaks for the chat's user, whose
profile it may read — ``--user`` when the user id differs from the chat id, as for a
Discord DM channel) or ``PLATFORM:group:CHAT_ID[:THREAD_ID]`` for a group channel or
thread.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from mnemo.cli.main import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, CommandError
from mnemo.cli.terminal import spinner
from mnemo.gateway.config import Settings
from mnemo.gateway.cron.service import Caller, CronJobs, job_line, job_summary, parse_chat
from mnemo.gateway.cron.store import Claimed, CronJob, CronRepository, CronRun, RunState
from mnemo.gateway.errors import InvalidJob, JobNotAllowed, JobNotFound
from mnemo.gateway.storage import open_backend
from mnemo.memory.errors import StoreError
from mnemo.memory.sessions import utc_now

T = TypeVar("T")
OPERATOR = Caller.operator()
_DONE_OK = {RunState.DELIVERED, RunState.SILENT}

CHAT_HELP = (
    "PLATFORM:CHAT_ID for a DM (e.g. telegram:123456789), "
    "PLATFORM:group:CHAT_ID[:THREAD_ID] for a group channel or thread (e.g. discord:group:112233:445566)"
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "cron",
        help="scheduled jobs: add, list, pause, resume, remove, run-now, preview",
        description="Manage scheduled jobs ($MNEMO_HOME/state.db, or database.url's PostgreSQL). "
        "A running gateway picks changes up within cron.poll_s seconds.",
    )
    sub = parser.add_subparsers(dest="cron_command", metavar="ACTION", required=True)
    # preview reads no database: it only needs the configured default time zone

    add = sub.add_parser("add", help="schedule a job", description="Schedule a job. --chat: " + CHAT_HELP)
    add.add_argument("--chat", required=True, metavar="PLATFORM:CHAT_ID", help=CHAT_HELP)
    add.add_argument(
        "--user",
        metavar="USER_ID",
        help="the user the run speaks for (default: the chat id of a DM; nobody in a group)",
    )
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", metavar="EXPR", help="5-field crontab expression, e.g. '0 8 * * 1-5'")
    when.add_argument("--every", metavar="DURATION", help="repeat interval, e.g. 30m, 2h, 1d")
    when.add_argument("--at", metavar="ISO_TIME", help="one run at this time, e.g. 2025-06-01T08:00 or 17:30")
    when.add_argument("--in", dest="in_", metavar="DURATION", help="one run after this delay, e.g. 20m")
    add.add_argument(
        "--tz", metavar="ZONE", help="IANA time zone (default: cron.timezone / gateway.timezone)"
    )
    add.add_argument("prompt", nargs="+", metavar="PROMPT", help="what the job does at each run")
    add.set_defaults(handler=_add)

    ls = sub.add_parser("list", help="every job, oldest first")
    ls.add_argument("--json", action="store_true", help="one JSON object per line")
    ls.set_defaults(handler=_list)

    for verb, text in (
        ("pause", "stop running a job until resumed"),
        ("resume", "run a paused job again"),
        ("remove", "delete a job"),
    ):
        p = sub.add_parser(verb, help=text)
        p.add_argument("job_id", metavar="ID")
        p.set_defaults(handler=_change, verb=verb)

    run = sub.add_parser("run-now", help="run a job now, through the running gateway or in this process")
    run.add_argument("job_id", metavar="ID")
    run.add_argument(
        "--wait",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="how long to wait for a run the gateway took (default 300)",
    )
    run.set_defaults(handler=_run_now)

    preview = sub.add_parser(
        "preview",
        help="the next fire times of a cron expression",
        description="Print the next fire times of a 5-field cron expression, computed as the "
        "scheduler computes them (daylight saving included: a time the clocks skip runs at the "
        "first minute after the gap, a time they repeat runs once).",
    )
    preview.add_argument(
        "expr", metavar="EXPR", help="5-field crontab expression or alias, e.g. '0 8 * * 1-5'"
    )
    preview.add_argument(
        "--tz", metavar="ZONE", help="IANA time zone (default: cron.timezone / gateway.timezone)"
    )
    preview.add_argument(
        "--from",
        dest="start",
        metavar="ISO-8601",
        help="the first time that may fire (default: now); without an offset it is read in --tz",
    )
    preview.add_argument(
        "--count", type=int, default=5, metavar="N", help=f"how many times (1-{PREVIEW_MAX}, default 5)"
    )
    preview.add_argument("--json", action="store_true", help='{"times": ["2027-03-01T00:05:00+01:00", …]}')
    preview.set_defaults(handler=_preview)


def _jobs(settings: Settings, store: CronRepository) -> CronJobs:
    return CronJobs(
        store,
        settings.cron,
        default_timezone=settings.cron.timezone or settings.gateway.timezone,
        platforms=settings.known_platforms,
    )


def _with_jobs(settings: Settings, body: Callable[[CronJobs], Awaitable[T]]) -> T:
    """``body`` on the jobs of the configured backend (state.db, or database.url's
    PostgreSQL, where every replica's scheduler sees the change)."""

    async def main() -> T:
        try:
            backend = await open_backend(settings)
        except StoreError as e:
            raise CommandError(str(e), EXIT_REFUSED) from e
        try:
            jobs = _jobs(settings, backend.cron)
            await jobs.sync_declared(settings.cron.jobs)
            return await body(jobs)
        except InvalidJob as e:
            raise CommandError(str(e), EXIT_USAGE) from e
        except (JobNotFound, JobNotAllowed, StoreError) as e:
            raise CommandError(str(e), EXIT_REFUSED) from e
        finally:
            await backend.close()

    return asyncio.run(main())


def _add(args: argparse.Namespace, settings: Settings) -> int:
    kind, when = next(
        (k, v)
        for k, v in (("cron", args.cron), ("every", args.every), ("at", args.at), ("in", args.in_))
        if v is not None
    )

    from mnemo.adapters.terminal import printable

    async def body(jobs: CronJobs) -> int:
        job = await jobs.create(
            OPERATOR,
            kind=kind,
            when=when,
            prompt=" ".join(args.prompt),
            timezone=args.tz,
            target=parse_chat(args.chat),
            user_id=args.user,
        )
        print(printable(job_line(job, with_chat=True)))
        return EXIT_OK

    return _with_jobs(settings, body)


def _list(args: argparse.Namespace, settings: Settings) -> int:
    from mnemo.adapters.terminal import printable, printable_json

    async def body(jobs: CronJobs) -> tuple[list[CronJob], dict[str, int]]:
        return await jobs.list(OPERATOR), await jobs.store.count_runs(RunState.SKIPPED)

    jobs, skipped = _with_jobs(settings, body)
    for job in jobs:
        n = skipped.get(job.id, 0)
        print(
            printable_json(json.dumps(job_summary(job, skipped_runs=n), ensure_ascii=False))
            if args.json
            else printable(job_line(job, with_chat=True, skipped_runs=n))
        )
    if not jobs and not args.json:
        print("no scheduled jobs", file=sys.stderr)
    return EXIT_OK


def _change(args: argparse.Namespace, settings: Settings) -> int:
    async def body(jobs: CronJobs) -> int:
        action = {"pause": jobs.pause, "resume": jobs.resume, "remove": jobs.remove}[args.verb]
        job = await action(OPERATOR, args.job_id)
        print(f"{args.verb}d {job.id}" if args.verb != "remove" else f"removed {job.id}")
        return EXIT_OK

    return _with_jobs(settings, body)


# --- preview ---------------------------------------------------------------------------

PREVIEW_MAX = 1000


def _preview(args: argparse.Namespace, settings: Settings) -> int:
    from mnemo.gateway.cron.calendar import CronCalendar
    from mnemo.gateway.cron.schedules import zone

    if not 1 <= args.count <= PREVIEW_MAX:
        raise CommandError(f"--count must be between 1 and {PREVIEW_MAX} (got {args.count})", EXIT_USAGE)
    try:
        tz = zone(args.tz or settings.cron.timezone or settings.gateway.timezone)
        calendar = CronCalendar.parse(args.expr, tz)
    except InvalidJob as e:
        raise CommandError(str(e), EXIT_USAGE) from e
    start = utc_now()
    if args.start is not None:
        try:
            start = datetime.fromisoformat(args.start.strip())
        except ValueError:
            raise CommandError(
                f"invalid --from {args.start!r}: use ISO 8601 such as 2027-03-01T00:00 (read in {tz.key}) "
                "or 2027-03-01T00:00+01:00",
                EXIT_USAGE,
            ) from None
        if start.tzinfo is None:
            start = start.replace(tzinfo=tz)
    times = list(itertools.islice(calendar.times(start - timedelta(microseconds=1)), args.count))
    if args.json:
        print(json.dumps({"times": [t.isoformat() for t in times]}))
    else:
        for t in times:
            print(f"{t.isoformat()}  {t:%a %d %b %Y %H:%M} {t.tzname()}")
    if len(times) < args.count:
        print(f"no run after {times[-1].isoformat() if times else 'that'} within 50 years", file=sys.stderr)
    return EXIT_OK


# --- run-now ---------------------------------------------------------------------------


async def _poll_run(
    store: CronRepository, run_id: int, until: Callable[[CronRun], bool], timeout: float
) -> CronRun:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        run = await store.get_run(run_id)
        if run is None:
            raise CommandError(f"run {run_id} disappeared (was its job removed?)")
        if until(run) or loop.time() >= deadline:
            return run
        await asyncio.sleep(0.2)


def _report(run: CronRun, where: str) -> int:
    if run.state in (RunState.REQUESTED, RunState.RUNNING):
        print(f"run {run.id} is still running {where}; see `mnemo cron list` for its result")
        return EXIT_OK
    detail = f": {run.detail}" if run.detail else ""
    print(f"run {run.id} {where}: {run.state.value}{detail}")
    return EXIT_OK if run.state in _DONE_OK else EXIT_REFUSED


def _run_now(args: argparse.Namespace, settings: Settings) -> int:
    from mnemo.profile_lock import try_hold

    # The minimal app of _run_here starts a gateway, which takes over the inbox, outbox
    # and job rows a dead process left. Only with the profile lock held is no live
    # `mnemo run`/`chat` their owner; while one holds it, the run is left to it.
    with try_hold(settings.home) as alone:
        return _run_now_as(args, settings, may_run_here=alone)


def _run_now_as(args: argparse.Namespace, settings: Settings, *, may_run_here: bool) -> int:
    takeover_s = 2 * settings.cron.poll_s + 1.0

    async def request(jobs: CronJobs) -> Claimed | CronRun:
        run_id = await jobs.request_run(OPERATOR, args.job_id)
        run = await _poll_run(jobs.store, run_id, lambda r: r.state is not RunState.REQUESTED, takeover_s)
        if run.state is RunState.REQUESTED and may_run_here:
            claimed = await jobs.store.claim_run(run_id, RunState.REQUESTED, None, utc_now(), os.getpid())
            if claimed is not None:
                return claimed  # no gateway took it: run it here
        return await _poll_run(
            jobs.store, run_id, lambda r: r.state not in (RunState.REQUESTED, RunState.RUNNING), args.wait
        )

    with spinner(f"waiting for a gateway to run {args.job_id}"):
        outcome = _with_jobs(settings, request)
    if isinstance(outcome, CronRun):
        return _report(outcome, "ran in the running gateway")
    print("no gateway took the run; running it in this process", file=sys.stderr)
    with spinner(f"running {args.job_id}"):
        state = asyncio.run(_run_here(settings, outcome))
    if state is RunState.DELIVERED:
        print(
            f"run {outcome.run_id}: delivered to the outbox for {outcome.job.target}; it is sent when the "
            "gateway runs (at once if it is running)"
        )
    else:
        print(f"run {outcome.run_id}: {state.value}")
    return EXIT_OK if state in _DONE_OK else EXIT_REFUSED


async def _run_here(settings: Settings, claimed: Claimed) -> RunState:
    from mnemo.app import open_app

    async with open_app(settings, scheduler=False) as app:
        assert app.cron_runner is not None
        return await app.cron_runner.run(claimed)
