"""Schedule parsing and validation (gateway/schedules.py), with a fixed clock.

The crontab property test compares the trigger mnemo hands APScheduler with a plain
crontab matcher written from the crontab manual, minute by minute, in UTC: weekday
numbers (0 and 7 are Sunday) and day-of-month OR day-of-week as cron reads them.
Daylight saving is test_cron_calendar.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mnemo.gateway.cron.schedules import (
    Schedule,
    ScheduleKind,
    cron_trigger,
    format_duration,
    make_schedule,
    parse_duration,
    utc,
)
from mnemo.gateway.errors import InvalidJob

NOW = datetime(2025, 3, 29, 12, 0, tzinfo=UTC)  # a Saturday; Europe/Berlin moves to CEST that night
BERLIN = ZoneInfo("Europe/Berlin")


def schedule(
    kind: str, text: str, tz: str = "UTC", now: datetime = NOW, min_interval_s: int = 60
) -> Schedule:
    return make_schedule(kind, text, tz, now, min_interval_s=min_interval_s)


def runs(s: Schedule, n: int, now: datetime = NOW) -> list[datetime]:
    trigger = s.trigger()
    out, prev = [], trigger.get_next_fire_time(None, now)
    while prev is not None and len(out) < n:
        out.append(prev)
        prev = trigger.get_next_fire_time(prev, prev)
    return out


# --- crontab semantics -------------------------------------------------------------


def _expand(field: str, low: int, high: int, names: tuple[str, ...] = ()) -> set[int]:
    values: set[int] = set()
    for item in field.split(","):
        span, _, step = item.partition("/")
        if span == "*":
            a, b = low, high
        elif "-" in span:
            x, y = span.split("-")
            a, b = (names.index(x) if x in names else int(x)), (names.index(y) if y in names else int(y))
        else:
            a = names.index(span) if span in names else int(span)
            b = high if step else a
        values.update(range(a, b + 1, int(step or 1)))
    return values


def crontab_matcher(expr: str) -> Callable[[datetime], bool]:
    """crontab(5): a minute matches when minute, hour and month match, and the day does —
    where, if both day fields are restricted (do not start with '*'), either may match."""
    minute, hour, dom, month, dow = expr.split()
    minutes, hours, months = _expand(minute, 0, 59), _expand(hour, 0, 23), _expand(month, 1, 12)
    doms = _expand(dom, 1, 31)
    days = {d % 7 for d in _expand(dow, 0, 7, ("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
    either = not dom.startswith("*") and not dow.startswith("*")

    def matches(t: datetime) -> bool:
        if t.minute not in minutes or t.hour not in hours or t.month not in months:
            return False
        in_dom, in_dow = t.day in doms, (t.weekday() + 1) % 7 in days  # crontab: Sunday 0
        return (in_dom or in_dow) if either else (in_dom and in_dow)

    return matches


crontabs = st.tuples(
    st.sampled_from(["0", "30", "0,30", "15,45", "*/30", "5-10/5"]),
    st.sampled_from(["*", "8", "8-10", "*/6", "0,12", "22-23"]),
    st.sampled_from(["*", "1", "1,15", "10-20", "*/10", "31"]),
    st.sampled_from(["*", "1-6", "*/2", "11,12", "3"]),
    st.sampled_from(["*", "0", "1-5", "0,6", "7", "5-7", "*/2", "mon-fri", "sun", "1/2", "sat,sun"]),
).map(" ".join)


@settings(max_examples=40, deadline=None)
@given(expr=crontabs, start_minutes=st.integers(0, 3 * 365 * 24 * 60))
def test_cron_expressions_fire_exactly_when_crontab_would(expr: str, start_minutes: int) -> None:
    start = datetime(2024, 1, 1, tzinfo=UTC) + timedelta(minutes=start_minutes)
    end = start + timedelta(days=9)
    trigger = cron_trigger(expr, ZoneInfo("UTC"))
    fired, t = [], trigger.get_next_fire_time(None, start)
    while t is not None and t < end:
        fired.append(utc(t))
        t = trigger.get_next_fire_time(t, t)
    matches = crontab_matcher(expr)
    expected = [m for m in (start + timedelta(minutes=i) for i in range(9 * 24 * 60)) if matches(m)]
    assert fired == expected


def test_weekday_numbers_are_crontabs_sunday_zero_not_apschedulers_monday_zero() -> None:
    weekdays = runs(schedule("cron", "0 8 * * 1-5"), 5)
    assert [d.strftime("%a") for d in weekdays] == ["Mon", "Tue", "Wed", "Thu", "Fri"]
    assert runs(schedule("cron", "0 8 * * 0"), 1)[0].strftime("%a") == "Sun"
    assert runs(schedule("cron", "0 8 * * 7"), 1)[0].strftime("%a") == "Sun"


def test_day_of_month_or_day_of_week_as_in_crontab() -> None:
    days = [
        d.date().isoformat()
        for d in runs(schedule("cron", "0 8 1 * 1"), 4, datetime(2025, 3, 25, tzinfo=UTC))
    ]
    assert days == ["2025-03-31", "2025-04-01", "2025-04-07", "2025-04-14"]  # Mondays and the 1st


def test_a_daily_time_stays_local_across_daylight_saving() -> None:
    daily = schedule("cron", "0 8 * * *", "Europe/Berlin")
    first, second = runs(daily, 2)
    assert first == datetime(2025, 3, 30, 6, 0, tzinfo=UTC)  # 08:00 CEST, the morning after the change
    assert second == datetime(2025, 3, 31, 6, 0, tzinfo=UTC)
    assert [r.astimezone(BERLIN).hour for r in runs(daily, 3, datetime(2025, 3, 28, tzinfo=UTC))] == [8, 8, 8]


def test_aliases() -> None:
    assert schedule("cron", "@daily").value == "0 0 * * *"
    assert runs(schedule("cron", "@weekly"), 1)[0] == datetime(2025, 3, 30, 0, 0, tzinfo=UTC)


# --- intervals, one-offs ------------------------------------------------------------


def test_every_starts_one_interval_after_creation_and_keeps_its_grid() -> None:
    every = schedule("every", "2h")
    assert every.start == NOW + timedelta(hours=2)
    assert runs(every, 3) == [NOW + timedelta(hours=h) for h in (2, 4, 6)]
    # Resumed later: the next run is the next point of the same grid.
    assert every.next_run(NOW + timedelta(hours=5)) == NOW + timedelta(hours=6)


def test_in_and_at_are_one_offs() -> None:
    assert schedule("in", "3s").instant == NOW + timedelta(seconds=3)  # short one-offs are fine
    at = schedule("at", "2025-04-01T09:30", "Europe/Berlin")
    assert at.instant == datetime(2025, 4, 1, 7, 30, tzinfo=UTC)
    assert runs(at, 5) == [at.instant]
    assert schedule("at", "2025-04-01T09:30+00:00", "Europe/Berlin").instant == datetime(
        2025, 4, 1, 9, 30, tzinfo=UTC
    )


def test_a_time_of_day_means_the_next_such_time() -> None:
    assert schedule("at", "13:15").instant == datetime(2025, 3, 29, 13, 15, tzinfo=UTC)
    assert schedule("at", "11:00").instant == datetime(2025, 3, 30, 11, 0, tzinfo=UTC)
    assert schedule("at", "08:00", "Europe/Berlin").instant == datetime(2025, 3, 30, 6, 0, tzinfo=UTC)


def test_describe() -> None:
    assert schedule("every", "90m").describe() == "every 1h 30m"
    assert (
        schedule("cron", "0  8 * *  1-5", "Europe/Berlin").describe() == "cron '0 8 * * 1-5' (Europe/Berlin)"
    )
    assert (
        schedule("at", "2025-04-01T09:30", "Europe/Berlin").describe() == "once at Tue 2025-04-01 09:30 CEST"
    )


# --- validation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "text", "tz", "message"),
    [
        ("cron", "61 * * * *", "UTC", "invalid cron expression"),
        ("cron", "0 8 * *", "UTC", "expected 5 fields"),
        ("cron", "0 8 * * 8", "UTC", r"bad day-of-week field '8' \(allowed: 0-7 or sun-sat"),
        ("cron", "0 8 * * fri-mon", "UTC", "bad day-of-week field 'fri-mon'.*low to high"),
        ("cron", "0 25 * * *", "UTC", r"bad hour field '25' \(allowed: 0-23\)"),
        ("cron", "0 0 30 2 *", "UTC", "never runs"),
        ("cron", "*/5 * * * *", "UTC", "runs as often as every 5m"),
        ("every", "30s", "UTC", "too frequent"),
        ("every", "soon", "UTC", "invalid duration"),
        ("every", "5 parsecs", "UTC", "unknown unit"),
        ("in", "0m", "UTC", "longer than zero"),
        ("in", "600w", "UTC", "longer than 3660 days"),
        ("at", "2025-03-29T11:59", "UTC", "in the past"),
        ("at", "next tuesday", "UTC", "invalid time"),
        ("at", "2025-04-01T09:30", "Europe/Berln", "unknown time zone"),
        ("cron", "0 8 * * *", "Not/AZone", "unknown time zone"),
    ],
)
def test_invalid_schedules_are_clear_errors(kind: str, text: str, tz: str, message: str) -> None:
    with pytest.raises(InvalidJob, match=message):
        schedule(kind, text, tz, min_interval_s=600 if "*/5" in text else 60)


def test_the_minimum_interval_applies_to_the_shortest_gap_of_a_cron_expression() -> None:
    assert schedule("cron", "* * * * *").kind is ScheduleKind.CRON  # every minute = the default minimum
    with pytest.raises(InvalidJob, match="every 1m"):
        schedule("cron", "0,1 9 * * *", min_interval_s=120)  # two runs a minute apart, once a day
    with pytest.raises(InvalidJob, match="every 1m"):
        schedule("cron", "0,59 0,23 * * *", min_interval_s=120)  # 23:59 then 00:00 the next day
    assert schedule("cron", "0 9,21 * * *", min_interval_s=12 * 3600).value == "0 9,21 * * *"


@given(
    parts=st.lists(
        st.tuples(st.integers(1, 120), st.sampled_from(["s", "m", "h", "d", "w", " minutes", "hr"])),
        min_size=1,
        max_size=4,
    )
)
def test_durations_add_up(parts: list[tuple[int, str]]) -> None:
    size = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, " minutes": 60, "hr": 3600}
    text = "".join(f"{n}{unit}" for n, unit in parts)
    total = sum(n * size[unit] for n, unit in parts)
    assert parse_duration(text) == timedelta(seconds=total)
    assert parse_duration(format_duration(timedelta(seconds=total))) == timedelta(seconds=total)
