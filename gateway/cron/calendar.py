"""When a crontab expression fires, on the calendar of its time zone.

APScheduler 3.x's cron trigger skips runs around the spring daylight-saving change
(``5 0 1 * *`` in Europe/Berlin went from 1 March to 1 May), so the fire times are
computed here and APScheduler only runs them (``trigger.py`` hands it these times).
``cronsim`` finds the wall-clock times that match the expression — it is given naive
datetimes, so it matches fields and nothing else — and this module turns each into
the instant(s) it means by the rules below. (cronsim's own daylight-saving handling,
given an aware datetime, skipped runs in zones with a half-hour shift; the property
test found it.)

The expression is read as Debian's cron reads it (cronsim's aim): 5 fields; weekday 0
and 7 are Sunday; when both day fields are restricted (neither starts with ``*``) a
day matching either runs; names (``mon``, ``jan``) and cronsim's extras (``L``,
``LW``, ``mon#2``, ``5L``) are accepted.

Daylight saving, for a job at a fixed time of day (neither the minute nor the hour
field starts with ``*``: ``30 2 * * *``, ``0 9-17 * * 1-5``):

* a time that does not exist that day (the spring gap, 02:00-03:00 in Berlin) runs at
  the first minute after the gap (03:00), once however many of its times fell inside;
* a time that exists twice (the autumn repeat) runs once, at its first occurrence.

A job with ``*`` in its minute or hour field (``*/15 * * * *``, ``0 * * * *``) runs on
real time: every quarter hour that passes, so twice through a repeated hour and not
at all in a missing one. Both rules are pinned by a property test against a
minute-by-minute matcher in several zones (``tests/gateway/test_cron_calendar.py``).

Datetimes are compared in UTC only (Python ignores the offset when both sides carry
the same ``ZoneInfo``).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError

from mnemo.gateway.errors import InvalidJob

ALIASES = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}

_FIELDS = ("minute", "hour", "day-of-month", "month", "day-of-week")
_ALLOWED = {
    "minute": "0-59",
    "hour": "0-23",
    "day-of-month": "1-31, L or LW",
    "month": "1-12 or jan-dec",
    "day-of-week": "0-7 or sun-sat, 0 and 7 being Sunday",
}
_EXAMPLE = "e.g. '0 8 * * 1-5' for weekdays at 08:00"
# More than any daylight-saving shift (2 h at most, Antarctica/Troll): two wall-clock
# times further apart than this are in the same order as their instants.
MAX_SHIFT = timedelta(hours=3)


def normalize_cron(expr: str) -> str:
    text = " ".join(expr.split())
    return ALIASES.get(text.lower(), text)


def _utc(dt: datetime) -> datetime:
    if dt.tzinfo is None:
        raise ValueError("naive datetime: mnemo only handles aware datetimes")
    return dt.astimezone(UTC)


@dataclass(frozen=True, slots=True)
class CronCalendar:
    """A validated crontab expression in a time zone. Build with ``CronCalendar.parse``."""

    expr: str
    tz: ZoneInfo

    @classmethod
    def parse(cls, expr: str, tz: ZoneInfo) -> CronCalendar:
        """Raises ``InvalidJob`` naming the field at fault, or saying it never runs."""
        text = normalize_cron(expr)
        fields = text.split(" ") if text else []
        if len(fields) != 5:
            raise InvalidJob(
                f"invalid cron expression {expr!r}: expected 5 fields (minute hour day-of-month month "
                f"day-of-week), {_EXAMPLE}; got {len(fields)}"
            )
        try:
            CronSim(text, datetime(2000, 1, 1))
        except CronSimError as e:
            raise InvalidJob(_explain(expr, fields, e)) from None
        calendar = cls(text, tz)
        if calendar.next_after(datetime(2000, 1, 1, tzinfo=UTC)) is None:
            raise InvalidJob(f"cron expression {expr!r} never runs")
        return calendar

    @property
    def fixed_time(self) -> bool:
        """A job at fixed times of day: the daylight-saving rules of the docstring apply."""
        minute, hour = self.expr.split(" ")[:2]
        return not minute.startswith("*") and not hour.startswith("*")

    def times(self, after: datetime) -> Iterator[datetime]:
        """Fire times strictly after ``after``, ascending, aware in ``tz``; ends after the
        last one (cronsim looks 50 years ahead from each match)."""
        start = _utc(after)
        # Wall-clock matches from a little before ``after``: a match more than
        # MAX_SHIFT earlier on the wall clock is an earlier instant too.
        wall = start.astimezone(self.tz).replace(tzinfo=None, microsecond=0) - MAX_SHIFT
        matches = CronSim(self.expr, wall)  # naive: cronsim matches fields, nothing else
        instants = self._fixed(matches) if self.fixed_time else self._real_time(matches)
        for fire in instants:
            if fire > start:
                yield fire.astimezone(self.tz)

    def _fixed(self, matches: Iterator[datetime]) -> Iterator[datetime]:
        """A fixed-time job: each matching wall-clock time once (docstring)."""
        last: datetime | None = None
        for wall in matches:
            if _exists(wall, self.tz):
                fire = wall.replace(tzinfo=self.tz, fold=0).astimezone(UTC)  # fold 0: the first pass
            else:
                fire = _after_gap(wall, self.tz)
            if last is None or fire > last:  # several times in one gap run once
                last = fire
                yield fire

    def _real_time(self, matches: Iterator[datetime]) -> Iterator[datetime]:
        """Any other job: every instant whose wall-clock reading matches, in time order.
        A repeated hour's second pass comes after later wall-clock times of the first
        pass, so instants wait in a heap until no later match can come before them."""
        pending: list[tuple[datetime, datetime]] = []  # (instant, its wall-clock time)
        for wall in matches:
            while pending and pending[0][1] + MAX_SHIFT < wall:
                yield heapq.heappop(pending)[0]
            if _exists(wall, self.tz):  # a repeated time is two instants, a skipped one none
                for instant in {wall.replace(tzinfo=self.tz, fold=f).astimezone(UTC) for f in (0, 1)}:
                    heapq.heappush(pending, (instant, wall))
        while pending:
            yield heapq.heappop(pending)[0]

    def next_after(self, after: datetime) -> datetime | None:
        return next(self.times(after), None)

    def next_at_or_after(self, when: datetime) -> datetime | None:
        return self.next_after(when - timedelta(microseconds=1))

    def shortest_gap(
        self, start: datetime, floor: timedelta, horizon: timedelta, max_runs: int
    ) -> timedelta | None:
        """The shortest time between two runs after ``start`` (within ``horizon`` and
        ``max_runs`` runs), or the first gap found below ``floor``; None if it runs
        fewer than twice."""
        prev: datetime | None = None
        best: timedelta | None = None
        end = _utc(start) + horizon
        for n, fire in enumerate(self.times(start - timedelta(microseconds=1))):
            if prev is not None:
                gap = _utc(fire) - _utc(prev)
                if best is None or gap < best:
                    best = gap
                    if best < floor:
                        break
            if _utc(fire) > end or n >= max_runs:
                break
            prev = fire
        return best


def _exists(wall: datetime, tz: ZoneInfo) -> bool:
    """False for a wall-clock time the clocks skip in ``tz`` (the spring gap)."""
    return wall.replace(tzinfo=tz).astimezone(UTC).astimezone(tz).replace(tzinfo=None) == wall


def _after_gap(wall: datetime, tz: ZoneInfo) -> datetime:
    """The first minute after the gap that swallowed ``wall``, as an instant (UTC)."""
    for _ in range(24 * 60):
        wall += timedelta(minutes=1)
        if _exists(wall, tz):
            return wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    raise AssertionError(f"no gap in {tz.key} lasts a day")  # pragma: no cover


def _explain(expr: str, fields: list[str], error: CronSimError) -> str:
    """cronsim says "Bad hour": name the field, what it holds and what it may hold."""
    message = str(error)
    for i, name in enumerate(_FIELDS):
        if message.lower() == f"bad {name}":
            if name == "day-of-month" and _field_alone_is_valid(fields[2]):
                return f"cron expression {expr!r} never runs: no month in {fields[3]!r} has day {fields[2]!r}"
            ranges = "; a range goes from low to high" if "-" in fields[i] else ""
            allowed = f"(allowed: {_ALLOWED[name]}{ranges})"
            return f"invalid cron expression {expr!r}: bad {name} field {fields[i]!r} {allowed}"
    return f"invalid cron expression {expr!r}: {message}; {_EXAMPLE}"


def _field_alone_is_valid(dom: str) -> bool:
    try:
        CronSim(f"0 0 {dom} * *", datetime(2000, 1, 1))
    except CronSimError:
        return False
    return True
