"""Which kind of timer a specification is: :func:`parse` (re-exported by ``timers``)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from django_tasks_coord.exceptions import TimerError
from django_tasks_coord.timers.base import Timer, ZoneLike
from django_tasks_coord.timers.calendar import CalendarEvent
from django_tasks_coord.timers.cron import CronExpression
from django_tasks_coord.timers.interval import Interval, OneTime

__all__ = ["parse"]

_ISO_DATETIME = re.compile(r"[0-9]{4}-?[0-9]{2}-?[0-9]{2}[Tt][0-9]")


def parse(spec: str | timedelta | datetime | Timer, *, tz: ZoneLike | None = None) -> Timer:
    """Turn a specification into a :class:`Timer`.

    ``tz`` (an IANA name, ZoneInfo or datetime.timezone) is the zone of wall-clock
    times; it defaults to Django's ``TIME_ZONE`` (UTC without settings).

    How the kind of timer is chosen, in this order:

    1. a ``timedelta`` is an :class:`Interval`; a ``datetime`` is a :class:`OneTime`;
       a :class:`Timer` is returned unchanged (``tz`` must then be omitted);
    2. strings are stripped of surrounding whitespace, then:
    3. ``every ...`` is an :class:`Interval` (``every 30s``, ``every 1h30m``,
       ``every 1d from 2024-01-01T06:00:00+01:00``);
    4. ``@`` followed by a letter is a cron nickname (``@daily``, ``@hourly``...);
       ``@`` followed by anything else is systemd's ``@epoch`` calendar timestamp;
    5. an ISO 8601 date and time joined by ``T`` (``2026-12-01T09:00:00+01:00``) is a
       :class:`OneTime`; without an offset it is read in ``tz``;
    6. five or more whitespace-separated fields are a :class:`CronExpression`
       (calendar events never have more than four);
    7. anything else is a systemd :class:`CalendarEvent` (including the shorthands
       ``hourly``, ``daily``... without ``@``).

    Raises :class:`~django_tasks_coord.exceptions.TimerError` (a ``ValueError``) with a
    message that quotes the specification and points at the offending part.
    """
    if isinstance(spec, Timer):
        if tz is not None:
            raise TimerError(f"{spec!r} is already a timer; tz cannot be applied to it.")
        return spec
    if isinstance(spec, timedelta):
        return Interval(spec, tz=tz)
    if isinstance(spec, datetime):
        return OneTime(spec, tz=tz)
    if not isinstance(spec, str):
        raise TimerError(
            f"A timer specification must be a string, timedelta or datetime, "
            f"not {type(spec).__name__}."
        )
    text = spec.strip()
    if not text:
        raise TimerError("A timer specification must not be empty.")
    if text[:5].lower() == "every" and (len(text) == 5 or text[5].isspace()):
        return Interval.from_string(text, tz=tz)
    if text.startswith("@") and text[1:2].isalpha():
        return CronExpression(text, tz=tz)
    if _ISO_DATETIME.match(text):
        return OneTime(text, tz=tz)
    if len(text.split()) >= 5:
        return CronExpression(text, tz=tz)
    return CalendarEvent(text, tz=tz)
