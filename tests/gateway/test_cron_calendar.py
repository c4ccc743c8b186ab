"""Cron fire times across daylight-saving changes (gateway/cron/calendar.py).

The property test walks every minute around real transitions of eight zones, north
and south, with whole- and half-hour shifts and changes at midnight, and compares the
calendar with a reference written here from the rules in calendar.py's docstring:

* a job at fixed times of day (neither minute nor hour starts with ``*``) runs once per
  matching wall-clock time; a time the clocks skip runs at the first minute after the
  gap (once, however many fell inside), a time they repeat at its first occurrence;
* any other job runs at every real minute whose local reading matches.

The fixed cases below are the ones APScheduler 3.11's cron trigger got wrong (issue 26).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mnemo.gateway.cron.calendar import CronCalendar
from mnemo.gateway.cron.schedules import Schedule, ScheduleKind, make_schedule
from mnemo.gateway.errors import InvalidJob
from tests.gateway.test_cron_schedules import crontab_matcher

ZONES = (
    "Europe/Berlin",  # north, 02:00 -> 03:00 and back
    "America/New_York",  # north, 02:00 local
    "Europe/London",  # north, 01:00 local
    "Australia/Sydney",  # south: forward in October, back in April
    "Pacific/Auckland",  # south
    "America/Santiago",  # south, changes at midnight (00:00 does not exist)
    "Australia/Lord_Howe",  # south, a half-hour shift
    "America/Havana",  # north, changes at midnight (00:00-01:00 repeats)
)
MINUTE = timedelta(minutes=1)


@cache
def transitions(zone: str) -> tuple[datetime, ...]:
    """The instants (UTC) its offset changed in 2026-2028."""
    tz = ZoneInfo(zone)
    out, t = [], datetime(2026, 1, 1, tzinfo=UTC)
    offset = t.astimezone(tz).utcoffset()
    while t < datetime(2029, 1, 1, tzinfo=UTC):
        t += timedelta(minutes=30)
        now = t.astimezone(tz).utcoffset()
        if now != offset:
            out.append(t)
            offset = now
    return tuple(out)


def _real(wall: datetime, tz: ZoneInfo) -> bool:
    return wall.replace(tzinfo=tz).astimezone(UTC).astimezone(tz).replace(tzinfo=None) == wall


def reference(expr: str, tz: ZoneInfo, start: datetime, end: datetime) -> list[datetime]:
    """Fire times in (start, end], by brute force, minute by minute."""
    matches = crontab_matcher(expr)
    minute, hour = expr.split()[:2]
    if minute.startswith("*") or hour.startswith("*"):
        out, t = [], start.replace(second=0, microsecond=0) + MINUTE
        while t <= end:
            if matches(t.astimezone(tz).replace(tzinfo=None)):
                out.append(t)
            t += MINUTE
        return out
    fires: set[datetime] = set()
    wall = (start - timedelta(days=1)).astimezone(tz).replace(tzinfo=None, second=0, microsecond=0)
    last = (end + timedelta(days=1)).astimezone(tz).replace(tzinfo=None)
    while wall <= last:
        if matches(wall):
            real = wall
            while not _real(real, tz):  # skipped by the clocks: the first minute after
                real += MINUTE
            fires.add(real.replace(tzinfo=tz, fold=0).astimezone(UTC))  # fold 0: first occurrence
        wall += MINUTE
    return sorted(t for t in fires if start < t <= end)


def calendar_times(expr: str, tz: ZoneInfo, start: datetime, end: datetime) -> list[datetime]:
    out = []
    for fire in CronCalendar.parse(expr, tz).times(start):
        if fire.astimezone(UTC) > end:
            break
        out.append(fire.astimezone(UTC))
    return out


crontabs = st.tuples(
    st.sampled_from(["0", "30", "15,45", "*/20", "*/30", "5-10/5", "59", "0,1,2"]),
    st.sampled_from(["*", "0", "1", "2", "3", "23", "0-3", "*/2", "2,3", "22-23", "1-4/3", "0,12"]),
    st.sampled_from(["*", "*", "*", "1", "1,15", "*/10", "25-31"]),
    st.sampled_from(["*", "*", "*", "3,4,9,10", "1-6"]),
    st.sampled_from(["*", "*", "0", "1-5", "6,0", "7", "sun", "*/2"]),
).map(" ".join)


@settings(max_examples=250, deadline=None)
@given(
    zone=st.sampled_from(ZONES),
    which=st.integers(0, 5),
    expr=crontabs,
    offset_minutes=st.integers(-36 * 60, 12 * 60),
)
def test_fire_times_match_the_reference_across_daylight_saving(
    zone: str, which: int, expr: str, offset_minutes: int
) -> None:
    tz = ZoneInfo(zone)
    change = transitions(zone)[which % len(transitions(zone))]
    start = change + timedelta(minutes=offset_minutes, seconds=offset_minutes % 7)
    end = start + timedelta(days=2)
    assert calendar_times(expr, tz, start, end) == reference(expr, tz, start, end)


def test_the_reference_sees_real_transitions_in_every_zone() -> None:
    for zone in ZONES:
        assert len(transitions(zone)) >= 4, zone  # two a year: the property test crosses real ones


def _next(expr: str, zone: str, start: datetime, n: int) -> list[str]:
    out, t = [], start
    cal = CronCalendar.parse(expr, ZoneInfo(zone))
    for _ in range(n):
        fire = cal.next_after(t)
        assert fire is not None
        out.append(fire.isoformat())
        t = fire
    return out


# --- the cases APScheduler 3.11 got wrong (before -> after in the comments) ----------


def test_monthly_just_after_midnight_in_berlin_does_not_skip_april() -> None:
    # before: 1 March -> 1 May
    assert _next("5 0 1 * *", "Europe/Berlin", datetime(2027, 2, 15, tzinfo=UTC), 3) == [
        "2027-03-01T00:05:00+01:00",
        "2027-04-01T00:05:00+02:00",
        "2027-05-01T00:05:00+02:00",
    ]


def test_a_daily_half_past_midnight_runs_every_day_across_the_change() -> None:
    # before: 28 March -> 30 March 2027 (the day after the change was skipped)
    assert _next("30 0 * * *", "Europe/Berlin", datetime(2027, 3, 26, tzinfo=UTC), 4) == [
        "2027-03-27T00:30:00+01:00",
        "2027-03-28T00:30:00+01:00",
        "2027-03-29T00:30:00+02:00",
        "2027-03-30T00:30:00+02:00",
    ]


def test_new_year_in_sydney_every_year() -> None:
    # before: 2028 was the first run after June 2026 (2027 skipped)
    assert _next("0 0 1 1 *", "Australia/Sydney", datetime(2026, 6, 1, tzinfo=UTC), 2) == [
        "2027-01-01T00:00:00+11:00",
        "2028-01-01T00:00:00+11:00",
    ]


def test_a_time_the_clocks_skip_runs_right_after_the_gap_once() -> None:
    # before: 02:30+01:00, a time that does not exist (03:30 CEST)
    assert _next("0,30 2 * * *", "Europe/Berlin", datetime(2027, 3, 27, 12, tzinfo=UTC), 3) == [
        "2027-03-28T03:00:00+02:00",
        "2027-03-29T02:00:00+02:00",
        "2027-03-29T02:30:00+02:00",
    ]
    # half-hour shift: Lord Howe goes from 02:00 to 02:30
    assert _next("15 2 * * *", "Australia/Lord_Howe", datetime(2027, 10, 2, tzinfo=UTC), 1) == [
        "2027-10-03T02:30:00+11:00"
    ]


def test_a_time_the_clocks_repeat_runs_once_at_its_first_occurrence() -> None:
    # before: twice, 02:30+02:00 and 02:30+01:00
    assert _next("30 2 * * *", "Europe/Berlin", datetime(2027, 10, 30, 12, tzinfo=UTC), 2) == [
        "2027-10-31T02:30:00+02:00",
        "2027-11-01T02:30:00+01:00",
    ]
    # read from inside the repeated hour, the next run is tomorrow's
    inside = datetime(2027, 10, 31, 1, 10, tzinfo=UTC)  # 02:10+01:00, the second pass
    assert _next("30 2 * * *", "Europe/Berlin", inside, 1) == ["2027-11-01T02:30:00+01:00"]


def test_a_job_by_the_quarter_hour_runs_on_real_time() -> None:
    repeated = _next("*/30 * * * *", "Europe/Berlin", datetime(2027, 10, 30, 23, 50, tzinfo=UTC), 4)
    assert repeated == [
        "2027-10-31T02:00:00+02:00",
        "2027-10-31T02:30:00+02:00",
        "2027-10-31T02:00:00+01:00",
        "2027-10-31T02:30:00+01:00",
    ]
    skipped = _next("*/30 * * * *", "Europe/Berlin", datetime(2027, 3, 28, 0, 15, tzinfo=UTC), 2)
    assert skipped == ["2027-03-28T01:30:00+01:00", "2027-03-28T03:00:00+02:00"]


def test_a_half_hour_shift_leaves_the_next_days_hour_whole() -> None:
    # cronsim handed an aware datetime ran this at 00:40 only on 6 April 2026 (Lord Howe
    # falls back from 02:00 to 01:30 the day before)
    assert _next("*/20 0 * * *", "Australia/Lord_Howe", datetime(2026, 4, 4, 15, tzinfo=UTC), 3) == [
        "2026-04-06T00:00:00+10:30",
        "2026-04-06T00:20:00+10:30",
        "2026-04-06T00:40:00+10:30",
    ]


def test_the_scheduler_trigger_follows_the_calendar() -> None:
    """APScheduler computes each next run from the previous one with this trigger."""
    schedule = make_schedule(
        "cron", "5 0 1 * *", "Europe/Berlin", datetime(2027, 2, 15, tzinfo=UTC), min_interval_s=60
    )
    trigger = schedule.trigger()
    first = trigger.get_next_fire_time(None, datetime(2027, 2, 15, tzinfo=UTC))
    second = trigger.get_next_fire_time(first, first)
    assert [first.isoformat(), second.isoformat()] == [
        "2027-03-01T00:05:00+01:00",
        "2027-04-01T00:05:00+02:00",
    ]
    # a job handed over exactly at a fire time runs at that time
    assert trigger.get_next_fire_time(None, first) == first
    assert Schedule(ScheduleKind.CRON, "5 0 1 * *", "Europe/Berlin").next_run(first) == first


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("0 0 30 2 *", "never runs: no month in '2' has day '30'"),
        ("60 * * * *", "bad minute field '60'"),
        ("0 8 * 13 *", "bad month field '13'"),
        ("0 8 * * mon-", "bad day-of-week field 'mon-'"),
        ("0 8 * *", "expected 5 fields"),
        ("", "expected 5 fields"),
    ],
)
def test_bad_expressions_name_the_field(expr: str, message: str) -> None:
    with pytest.raises(InvalidJob, match=message.replace("(", r"\(")):
        CronCalendar.parse(expr, ZoneInfo("UTC"))
