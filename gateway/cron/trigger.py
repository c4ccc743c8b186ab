"""The APScheduler trigger of a cron job: the fire times ``CronCalendar`` computes.

Imported only where a scheduler runs (``Schedule.trigger``), so ``mnemo cron list``
and ``preview`` never load APScheduler.

APScheduler asks ``get_next_fire_time(previous, now)``: the first time strictly after
the previous run, or — for a job it has just been given — the first at or after
``now``. Its coalescing and misfire rules then work on these times unchanged.
"""

from __future__ import annotations

from datetime import datetime

from apscheduler.triggers.base import BaseTrigger

from mnemo.gateway.cron.calendar import CronCalendar


class CalendarTrigger(BaseTrigger):  # type: ignore[misc]  # APScheduler 3 ships no type hints
    __slots__ = ("calendar",)

    def __init__(self, calendar: CronCalendar) -> None:
        self.calendar = calendar

    def get_next_fire_time(self, previous_fire_time: datetime | None, now: datetime) -> datetime | None:
        if previous_fire_time is not None:
            return self.calendar.next_after(previous_fire_time)
        return self.calendar.next_at_or_after(now)

    def __str__(self) -> str:
        return f"cron[{self.calendar.expr}, {self.calendar.tz.key}]"

    def __repr__(self) -> str:
        return f"<CalendarTrigger ({self.calendar.expr!r}, timezone={self.calendar.tz.key!r})>"
