"""When does periodic work run next? Timers: calendar events, cron, intervals, one-time.

::

    from django_tasks_coord import timers

    t = timers.parse("Mon..Fri 09:00", tz="Europe/Berlin")
    t.next_after(timezone.now())          # aware datetime, or None when it never fires again
    str(timers.CalendarEvent("Sat,Thu,Mon-Wed,Sat-Sun"))  # 'Mon..Thu,Sat,Sun *-*-* 00:00:00'

Every timer is an immutable :class:`Timer`; ``next_after`` is strictly after its
argument and takes aware datetimes only. See ``docs/timers.md``.

Every name is re-exported here from its module: :mod:`~django_tasks_coord.timers.base`
(:class:`Timer`, zones), :mod:`~django_tasks_coord.timers.parsing` (:func:`parse`),
:mod:`~django_tasks_coord.timers.calendar`, :mod:`~django_tasks_coord.timers.cron` and
:mod:`~django_tasks_coord.timers.interval` (the kinds of timer).
"""

from __future__ import annotations

from django_tasks_coord.exceptions import TimerError
from django_tasks_coord.timers.base import Timer, ZoneLike, default_zone
from django_tasks_coord.timers.calendar import CalendarEvent
from django_tasks_coord.timers.cron import CronExpression
from django_tasks_coord.timers.interval import Interval, OneTime
from django_tasks_coord.timers.parsing import parse

__all__ = [
    "CalendarEvent",
    "CronExpression",
    "Interval",
    "OneTime",
    "Timer",
    "TimerError",
    "ZoneLike",
    "default_zone",
    "parse",
]
