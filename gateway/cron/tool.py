"""The ``cronjob`` tool and the ``/cron`` command: two faces of ``gateway.cron.CronJobs``.

Both act for the chat they are used in: a job they create targets that chat (and
thread) and speaks for the person who created it; what they list and change is what
``Caller`` allows (the chat's own jobs; admins everything). The tool is offered in
primary turns only — never inside a cron run, so a scheduled job cannot schedule more
jobs — and never takes a target chat from its arguments.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mnemo.gateway.cron.service import SCHEDULE_KINDS, Caller, CronJobs, job_line, job_summary
from mnemo.gateway.cron.store import CronJob, JobSource, JobTarget
from mnemo.gateway.errors import CronError
from mnemo.gateway.events import ChatType
from mnemo.gateway.turns.tools import Tool, TurnContext
from mnemo.memory.scope import AgentContext

if TYPE_CHECKING:
    from mnemo.gateway.commands import CommandCall

CRONJOB_TOOL_SCHEMA: dict[str, Any] = {
    "name": "cronjob",
    "description": (
        "Schedule tasks that you run later on your own, without the user present, and whose result is "
        "posted to this chat. Use it when the user asks for a reminder, a recurring summary or a check "
        "at some time ('every weekday at 8:00 …', 'in 20 minutes remind me …').\n"
        "ACTIONS: 'create' (prompt and exactly one of cron / every / at / in; optional timezone), "
        "'list', 'pause', 'resume', 'remove' (job_id).\n"
        "SCHEDULES: cron = a 5-field crontab expression 'minute hour day-of-month month day-of-week' "
        "(e.g. '0 8 * * 1-5' = weekdays 08:00; Sunday is 0); every = an interval such as '2h' or '1d'; "
        "at = an ISO 8601 time ('2025-06-01T08:00') or 'HH:MM' for the next such time; in = a delay "
        "such as '20m'. Times are read in the job's time zone (the bot's default unless given).\n"
        "PROMPT: the instruction you will receive at each run, self-contained (the run starts a fresh "
        "conversation that only sees your memory), e.g. 'Remind the user to stretch.' At run time, "
        "answer exactly [SILENT] when there is nothing worth sending.\n"
        "The result shows the job id and its next run: tell the user when it will run."
    ),
    "input_schema": {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ["create", "list", "pause", "resume", "remove"]},
            "prompt": {"type": "string", "description": "create: what to do at each run."},
            "cron": {"type": "string", "description": "create: 5-field crontab expression."},
            "every": {"type": "string", "description": "create: repeat interval, e.g. '30m', '2h', '1d'."},
            "at": {"type": "string", "description": "create: one run at this time (ISO 8601, or HH:MM)."},
            "in": {"type": "string", "description": "create: one run after this delay, e.g. '20m'."},
            "timezone": {"type": "string", "description": "create: IANA time zone, e.g. 'Europe/Berlin'."},
            "job_id": {"type": "string", "description": "pause / resume / remove: the job's id."},
        },
        "required": ["action"],
        "additionalProperties": False,
    },
}


def _target(platform: str, chat_id: str, is_dm: bool, thread_id: str | None) -> JobTarget:
    return JobTarget(platform, chat_id, ChatType.DM if is_dm else ChatType.GROUP, thread_id)


def turn_caller(ctx: TurnContext) -> Caller:
    user_id = ctx.speaker.user_id if ctx.speaker is not None else None
    return Caller(
        JobSource.TOOL, _target(ctx.platform, ctx.chat_id, ctx.is_dm, ctx.thread_id), user_id, ctx.is_admin
    )


def cronjob_tool(jobs: CronJobs) -> Tool:
    async def handler(args: Mapping[str, Any], ctx: TurnContext) -> dict[str, Any]:
        caller = turn_caller(ctx)
        action = args["action"]
        try:
            if action == "create":
                kinds = [k for k in SCHEDULE_KINDS if args.get(k)]
                if len(kinds) != 1:
                    return {"success": False, "error": "give exactly one of cron, every, at or in"}
                job = await jobs.create(
                    caller,
                    kind=kinds[0],
                    when=str(args[kinds[0]]),
                    prompt=str(args.get("prompt") or ""),
                    timezone=args.get("timezone") or None,
                )
                return {"success": True, "created": job_summary(job)}
            if action == "list":
                listed = await jobs.list(caller)
                return {"success": True, "count": len(listed), "jobs": [job_summary(j) for j in listed]}
            job_id = str(args.get("job_id") or "").strip()
            if not job_id:
                return {
                    "success": False,
                    "error": f"'{action}' needs job_id (use action 'list' to see the ids)",
                }
            changed = await _change(jobs, caller, action, job_id)
            return {"success": True, action + "d": job_summary(changed)}
        except CronError as e:
            return {"success": False, "error": str(e)}

    return Tool("cronjob", CRONJOB_TOOL_SCHEMA, handler, contexts=frozenset({AgentContext.PRIMARY}))


async def _change(jobs: CronJobs, caller: Caller, action: str, job_id: str) -> CronJob:
    if action == "pause":
        return await jobs.pause(caller, job_id)
    if action == "resume":
        return await jobs.resume(caller, job_id)
    return await jobs.remove(caller, job_id)


# --- /cron -----------------------------------------------------------------------------

CRON_USAGE = (
    "Usage:\n"
    "/cron list\n"
    "/cron add every 2h PROMPT\n"
    "/cron add cron 0 8 * * 1-5 PROMPT   (5 fields, or @daily; Sunday is 0)\n"
    "/cron add at 2025-06-01T08:00 PROMPT   (or at 17:30)\n"
    "/cron add in 20m PROMPT\n"
    "  optional time zone (after the schedule, or at the end): tz=Europe/Berlin\n"
    "/cron pause ID · /cron resume ID · /cron remove ID"
)


# A word that can only be a crontab field (digits, * / , - ?), never a prompt's first word.
_CRON_FIELD = re.compile(r"[\d*?/,\-]+")


def _take(text: str, n: int) -> tuple[str, str]:
    """The first ``n`` words of ``text`` and the rest as written."""
    parts = text.split(None, n)
    if len(parts) < n:
        raise ValueError(CRON_USAGE)
    return " ".join(parts[:n]), parts[n] if len(parts) > n else ""


def parse_add(args: str) -> tuple[str, str, str | None, str]:
    """``KIND SCHEDULE [tz=ZONE] PROMPT`` → (kind, schedule, zone, prompt). A cron
    schedule is five fields, an @alias, or quoted. ``tz=ZONE`` is also read first
    (before KIND) or last (after the prompt), where people put it too: it is never
    part of the prompt."""
    words = args.split()
    outer = None
    if words and words[0].lower().startswith("tz="):
        outer, args = words[0][3:], args.strip()[len(words[0]) :]
    elif len(words) > 1 and words[-1].lower().startswith("tz="):
        outer, args = words[-1][3:], args.rstrip()[: -len(words[-1])]
    kind, when, tz, prompt = _parse_add(args)
    if outer is not None and tz is not None:
        raise ValueError("tz= is given twice: give the time zone once")
    if outer is not None and not outer:
        raise ValueError("tz= needs a zone, e.g. tz=Europe/Lisbon")
    return kind, when, tz if outer is None else outer, prompt


def _parse_add(args: str) -> tuple[str, str, str | None, str]:
    kind, rest = _take(args.strip(), 1)
    kind = kind.lower()
    if kind not in SCHEDULE_KINDS or not rest.strip():
        raise ValueError(CRON_USAGE)
    rest = rest.strip()
    if kind == "cron" and rest[0] in "\"'":
        end = rest.find(rest[0], 1)
        if end < 0:
            raise ValueError("the cron expression's quote is not closed")
        when, rest = rest[1:end], rest[end + 1 :]
    else:
        when, rest = _take(rest, 5 if kind == "cron" and not rest.startswith("@") else 1)
        following = rest.split(None, 1)[0] if rest.strip() else ""
        if kind == "cron" and not when.startswith("@") and _CRON_FIELD.fullmatch(following):
            # Six fields (seconds or a year, as some crons have): taking five would make
            # the sixth the start of the prompt and run a different schedule.
            raise ValueError(
                f"“{when} {following}” has more than 5 fields: mnemo reads crontab's five "
                "(minute hour day-of-month month day-of-week). Quote the expression if the prompt "
                'really starts with that word: /cron add cron "0 8 * * 1-5" PROMPT'
            )
    tz = None
    first, remainder = _take(rest, 1) if rest.strip() else ("", "")
    if first.lower().startswith("tz="):
        tz, rest = first[3:], remainder
    return kind, when, tz, rest.strip()


class CronCommand:
    """The handler of ``/cron`` (added to the command registry by the app)."""

    def __init__(self, jobs: CronJobs) -> None:
        self.jobs = jobs

    async def __call__(self, call: CommandCall) -> str:
        msg, args, admin = call.msg, call.args, call.admin
        caller = Caller(
            JobSource.COMMAND,
            _target(msg.platform, msg.chat_id, msg.is_dm, msg.thread_id),
            msg.user_id,
            admin,
        )
        verb, _, rest = args.strip().partition(" ")
        verb = verb.lower() or "list"
        try:
            if verb == "list":
                listed = await self.jobs.list(caller)
                if not listed:
                    return "No scheduled jobs here.\n" + CRON_USAGE
                return "\n".join(job_line(j, with_chat=admin) for j in listed)
            if verb == "add":
                try:
                    kind, when, tz, prompt = parse_add(rest)
                except ValueError as e:
                    return str(e)
                job = await self.jobs.create(caller, kind=kind, when=when, prompt=prompt, timezone=tz)
                return f"Scheduled {job.id}: {job.schedule.describe()}.\n{job_line(job)}"
            if verb in ("pause", "resume", "remove") and rest.strip():
                job = await _change(self.jobs, caller, verb, rest.strip())
                done = {"pause": "Paused", "resume": "Resumed", "remove": "Removed"}[verb]
                return f"{done} {job.id}." + ("" if verb == "remove" else f"\n{job_line(job)}")
        except CronError as e:
            return f"Sorry: {e}"
        return CRON_USAGE
