"""systemd calendar events (``systemd.time(7)``): :class:`CalendarEvent`.

The accepted syntax, the normalized form (``str(event)``) and the elapses are those of
systemd 252 (``systemd-analyze calendar``), verified against it by the data-driven
tests in ``tests/timers``. See ``docs/timers.md`` for the syntax and the few
documented differences. The parser lives in ``_calendar_syntax``, the search for the
next elapse in ``_calendar_search`` (and ``_calendar_zoned`` around DST changes, both
on ``_calendar_spec``); the normalized form is printed here.
"""

from __future__ import annotations

from collections.abc import Hashable
from datetime import UTC, datetime

from django_tasks_coord.timers._calendar_search import Searcher
from django_tasks_coord.timers._calendar_spec import CalendarSpec, Chain, Component
from django_tasks_coord.timers._calendar_syntax import WEEKDAY_NAMES, parse_calendar_spec
from django_tasks_coord.timers.base import (
    Timer,
    Zone,
    ZoneLike,
    get_zone,
    require_aware,
    zone_name,
)

__all__ = ["CalendarEvent", "CalendarSpec", "format_calendar_spec", "parse_calendar_spec"]

USEC = 1_000_000


def format_calendar_spec(spec: CalendarSpec) -> str:
    """systemd's normalized form of a parsed calendar event."""
    parts = []
    if spec.weekdays:
        parts.append(_format_weekdays(spec.weekdays) + " ")
    parts += [
        _format_chain(spec.year, 4),
        "-",
        _format_chain(spec.month, 2),
        "~" if spec.end_of_month else "-",
        _format_chain(spec.day, 2),
        " ",
        _format_chain(spec.hour, 2),
        ":",
        _format_chain(spec.minute, 2),
        ":",
        _format_chain(spec.usec, 2, USEC),
    ]
    if spec.utc:
        parts.append(" UTC")
    elif spec.timezone:
        parts.append(" " + spec.timezone)
    return "".join(parts)


def _format_weekdays(bits: int) -> str:
    runs: list[str] = []
    day = 0
    while day < 7:
        if not bits >> day & 1:
            day += 1
            continue
        last = day
        while last + 1 < 7 and bits >> (last + 1) & 1:
            last += 1
        first_name, last_name = WEEKDAY_NAMES[day], WEEKDAY_NAMES[last]
        if last == day:
            runs.append(first_name)
        else:
            runs.append(f"{first_name}{'..' if last > day + 1 else ','}{last_name}")
        day = last + 1
    return ",".join(runs)


def _format_chain(chain: Chain, width: int, unit: int = 1) -> str:
    if chain is None or (unit != 1 and (0, -1, USEC) in chain):
        return "*"
    return ",".join(_format_component(c, width, unit) for c in chain)


def _format_component(component: Component, width: int, unit: int) -> str:
    start, stop, repeat = component
    text = f"{start // unit:0{width}d}"
    if start % unit:
        text += f".{start % unit:06d}"
    if stop > 0:
        text += f"..{stop // unit:0{width}d}"
        if stop % unit:
            text += f".{stop % unit:06d}"
    if repeat > 0 and not (stop > 0 and repeat == unit):
        text += f"/{repeat // unit}"
        if repeat % unit:
            text += f".{repeat % unit:06d}"
    return text


def _restore(spec: str, tz: Zone) -> CalendarEvent:
    return CalendarEvent(spec, tz=tz)


class CalendarEvent(Timer):
    """A systemd calendar event such as ``"Mon..Fri *-*-* 09:00:00"`` or ``"daily"``.

    ``tz`` is the zone of wall-clock times (systemd's "local time"); a zone written in
    the event itself (``"... UTC"``, ``"... Europe/Berlin"``) takes precedence. With
    neither, Django's ``TIME_ZONE`` is used (UTC without settings).

    ``str(event)`` is systemd's normalized form; :meth:`next_after` gives the same
    elapses as ``systemd-analyze calendar``, daylight-saving changes included.
    """

    __slots__ = ("_normalized", "_original", "_searcher", "_tz")
    _normalized: str
    _original: str
    _searcher: Searcher
    _tz: Zone

    def __init__(self, spec: str, *, tz: ZoneLike | None = None) -> None:
        parsed = parse_calendar_spec(spec)
        if parsed.utc:
            zone: Zone = UTC
        elif parsed.timezone is not None:
            zone = get_zone(parsed.timezone)
        else:
            zone = get_zone(tz)
        self._init(
            _original=spec,
            _normalized=format_calendar_spec(parsed),
            _searcher=Searcher(parsed),
            _tz=zone,
        )

    @property
    def tz(self) -> Zone:
        """The zone the event is computed in (its own suffix, else the ``tz`` given)."""
        return self._tz

    @property
    def original(self) -> str:
        """The specification as given."""
        return self._original

    @property
    def normalized(self) -> str:
        """systemd's normalized form (the same as ``str(event)``)."""
        return self._normalized

    @property
    def spec(self) -> CalendarSpec:
        """The parsed fields (weekday bits, value chains, ``~``, zone)."""
        return self._searcher.spec

    def next_after(self, dt: datetime) -> datetime | None:
        """The first elapse strictly after ``dt``, as systemd computes it (see the class)."""
        return self._searcher.next_after(require_aware(dt), self._tz)

    def matches(self, dt: datetime) -> bool:
        """Whether the wall-clock time of ``dt`` in :attr:`tz` satisfies every field."""
        local = require_aware(dt).astimezone(self._tz)
        fields = (local.year, local.month, local.day, local.hour, local.minute, local.second)
        return self._searcher.matches(fields, local.microsecond)

    def __str__(self) -> str:
        return self._normalized

    def _key(self) -> Hashable:
        return (self._normalized, zone_name(self._tz))

    def __reduce__(self) -> tuple[object, tuple[str, Zone]]:
        return _restore, (self._normalized, self._tz)
