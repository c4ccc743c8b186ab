"""When a cron job runs: parsing and validating schedules, and their APScheduler triggers.

Three kinds, each stored as text so a job reads the same after a restart:

* ``cron``  — a 5-field crontab expression (``0 8 * * 1-5``) or an alias (``@daily``),
  evaluated in the job's time zone (so 08:00 stays 08:00 across daylight saving); its
  fire times, and what happens to a time the clocks skip or repeat, are
  ``calendar.py``'s (cronsim);
* ``every`` — a fixed interval (``30m``, ``2h``, ``1d``) on a grid that starts one
  interval after the job was created;
* ``at``    — one run at an instant (``2025-06-01T08:00``, ``17:30``), also what
  ``in 10m`` becomes.

Datetimes are compared and subtracted in UTC only: Python ignores the offset when both
sides carry the same ``ZoneInfo``, which would make a daylight-saving night look an
hour shorter or longer than it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from mnemo.gateway.cron.calendar import ALIASES, CronCalendar, normalize_cron
from mnemo.gateway.errors import InvalidJob

if TYPE_CHECKING:  # APScheduler is imported where a trigger is built: `mnemo cron list` never needs it
    from apscheduler.triggers.base import BaseTrigger

__all__ = [
    "ALIASES",
    "Schedule",
    "ScheduleKind",
    "cron_trigger",
    "make_schedule",
    "normalize_cron",
    "utc",
    "zone",
]


class ScheduleKind(StrEnum):
    CRON = "cron"
    EVERY = "every"
    AT = "at"


_UNITS = {
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600),
    **dict.fromkeys(("d", "day", "days"), 86400),
    **dict.fromkeys(("w", "week", "weeks"), 604800),
}
_DURATION = re.compile(r"^\s*(?:\d+\s*[a-z]+\s*,?\s*)+$", re.IGNORECASE)
_DURATION_PART = re.compile(r"(\d+)\s*([a-z]+)", re.IGNORECASE)
MAX_DURATION = timedelta(days=3660)
_CLOCK_TIME = re.compile(r"^(\d{1,2}):(\d{2})(?::(\d{2}))?$")

# How far ahead a cron expression's runs are checked against the minimum interval.
# Within a day the pattern of runs is the same on every day it fires, so two days of
# runs (or a week, for sparse expressions) show the shortest gap.
GAP_HORIZON = timedelta(days=8)
GAP_MAX_RUNS = 3000


def utc(dt: datetime) -> datetime:
    if dt.tzinfo is None:
        raise ValueError("naive datetime: mnemo only handles aware datetimes")
    return dt.astimezone(UTC)


def zone(name: str) -> ZoneInfo:
    """The IANA zone ``name``; ``InvalidJob`` naming the problem otherwise."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidJob(
            f"unknown time zone {name!r}: use an IANA name such as Europe/Berlin, America/New_York or UTC"
        ) from None


def parse_duration(text: str) -> timedelta:
    """``90s``, ``15m``, ``2h``, ``1d``, ``1w``, ``1h30m``, ``2 hours`` → timedelta."""
    if not _DURATION.match(text or ""):
        raise InvalidJob(
            f"invalid duration {text!r}: use a number and a unit, such as 90s, 15m, 2h, 1d or 1h30m"
        )
    total = 0
    for amount, unit in _DURATION_PART.findall(text):
        seconds = _UNITS.get(unit.lower())
        if seconds is None:
            raise InvalidJob(f"invalid duration {text!r}: unknown unit {unit!r} (use s, m, h, d or w)")
        total += int(amount) * seconds
    if total <= 0:
        raise InvalidJob(f"invalid duration {text!r}: it must be longer than zero")
    if total > MAX_DURATION.total_seconds():
        raise InvalidJob(f"invalid duration {text!r}: longer than {MAX_DURATION.days} days")
    return timedelta(seconds=total)


def format_duration(td: timedelta) -> str:
    seconds = int(td.total_seconds())
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return " ".join(parts) or "0s"


def cron_trigger(expr: str, tz: ZoneInfo) -> BaseTrigger:
    """The APScheduler trigger of a crontab expression (also the backup schedule's):
    its times are ``CronCalendar``'s. Raises ``InvalidJob``."""
    from mnemo.gateway.cron.trigger import CalendarTrigger

    return CalendarTrigger(CronCalendar.parse(expr, tz))


def parse_at(text: str, tz: ZoneInfo, now: datetime) -> datetime:
    """An instant in UTC from ISO 8601 (a time without offset is in ``tz``) or ``HH:MM``
    (the next such time in ``tz``)."""
    raw = text.strip()
    clock = _CLOCK_TIME.match(raw)
    if clock:
        hour, minute, second = int(clock[1]), int(clock[2]), int(clock[3] or 0)
        if hour > 23 or minute > 59 or second > 59:
            raise InvalidJob(f"invalid time {text!r}")
        local_now = utc(now).astimezone(tz)
        day = local_now.date()
        candidate = datetime.combine(day, time(hour, minute, second), tzinfo=tz)
        if utc(candidate) <= utc(now):
            candidate = datetime.combine(day + timedelta(days=1), time(hour, minute, second), tzinfo=tz)
        return utc(candidate)
    try:
        parsed = datetime.fromisoformat(raw)
    except ValueError:
        raise InvalidJob(
            f"invalid time {text!r}: use ISO 8601 such as 2025-06-01T08:00 (read in {tz.key}) or "
            "2025-06-01T08:00+02:00, or HH:MM for the next such time of day"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=tz)
    return utc(parsed)


def local_time(dt: datetime, tz_name: str) -> str:
    local = utc(dt).astimezone(zone(tz_name))
    return local.strftime("%a %Y-%m-%d %H:%M:%S %Z" if local.second else "%a %Y-%m-%d %H:%M %Z")


@dataclass(frozen=True, slots=True)
class Schedule:
    """A validated schedule. ``value``: the crontab expression (``cron``), whole seconds
    (``every``) or an ISO 8601 UTC instant (``at``). ``start`` is the first run of an
    ``every`` schedule, the origin of its grid."""

    kind: ScheduleKind
    value: str
    timezone: str
    start: datetime | None = None

    @property
    def recurring(self) -> bool:
        return self.kind is not ScheduleKind.AT

    @property
    def interval(self) -> timedelta:
        return timedelta(seconds=int(self.value))

    @property
    def instant(self) -> datetime:
        return datetime.fromisoformat(self.value)

    def trigger(self) -> BaseTrigger:
        from apscheduler.triggers.date import DateTrigger
        from apscheduler.triggers.interval import IntervalTrigger

        tz = zone(self.timezone)
        if self.kind is ScheduleKind.CRON:
            return cron_trigger(self.value, tz)
        if self.kind is ScheduleKind.EVERY:
            assert self.start is not None, "an interval schedule has a start"
            return IntervalTrigger(seconds=int(self.value), start_date=self.start, timezone=tz)
        return DateTrigger(run_date=self.instant, timezone=tz)

    @property
    def calendar(self) -> CronCalendar:
        """A ``cron`` schedule's fire times (``calendar.py``)."""
        assert self.kind is ScheduleKind.CRON, "only a cron schedule has a calendar"
        return CronCalendar.parse(self.value, zone(self.timezone))

    def next_run(self, now: datetime) -> datetime | None:
        """The first run at or after ``now`` (UTC), None when there is none."""
        if self.kind is ScheduleKind.AT:  # a DateTrigger answers with its date even when past
            return self.instant if self.instant >= utc(now) else None
        if self.kind is ScheduleKind.CRON:
            fire = self.calendar.next_at_or_after(utc(now))
            return None if fire is None else utc(fire)
        fire = self.trigger().get_next_fire_time(None, utc(now))
        return None if fire is None else utc(fire)

    def describe(self) -> str:
        if self.kind is ScheduleKind.CRON:
            return f"cron '{self.value}' ({self.timezone})"
        if self.kind is ScheduleKind.EVERY:
            return f"every {format_duration(self.interval)}"
        return f"once at {local_time(self.instant, self.timezone)}"


def make_schedule(kind: str, text: str, tz_name: str, now: datetime, *, min_interval_s: int) -> Schedule:
    """Validate a schedule as a user wrote it. ``kind``: cron, every, at or in.

    Raises ``InvalidJob`` with a message meant for the person (or model) who wrote it.
    """
    tz = zone(tz_name)
    now = utc(now)
    minimum = timedelta(seconds=min_interval_s)
    if kind == "cron":
        calendar = CronCalendar.parse(text, tz)
        if calendar.next_at_or_after(now) is None:
            raise InvalidJob(f"cron expression {text!r} never runs")
        gap = calendar.shortest_gap(now, minimum, GAP_HORIZON, GAP_MAX_RUNS)
        if gap is not None and gap < minimum:
            raise InvalidJob(
                f"cron expression {text!r} runs as often as every {format_duration(gap)}; recurring jobs "
                f"may run at most once every {format_duration(minimum)} (cron.min_interval_s)"
            )
        return Schedule(ScheduleKind.CRON, calendar.expr, tz.key)
    if kind == "every":
        interval = parse_duration(text)
        if interval < minimum:
            raise InvalidJob(
                f"every {format_duration(interval)} is too frequent: recurring jobs may run at most once "
                f"every {format_duration(minimum)} (cron.min_interval_s); for a single run use 'in'"
            )
        return Schedule(ScheduleKind.EVERY, str(int(interval.total_seconds())), tz.key, start=now + interval)
    if kind == "in":
        return Schedule(ScheduleKind.AT, (now + parse_duration(text)).isoformat(), tz.key)
    if kind == "at":
        instant = parse_at(text, tz, now)
        if instant <= now:
            raise InvalidJob(
                f"{text!r} is in the past (it is now {now.astimezone(tz):%Y-%m-%d %H:%M %Z}); "
                "a one-off job needs a future time"
            )
        return Schedule(ScheduleKind.AT, instant.isoformat(), tz.key)
    raise InvalidJob(f"unknown schedule kind {kind!r} (use cron, every, at or in)")
