"""Next elapse of a normalized calendar specification, identical to systemd's.

systemd (``calendar_spec_next_usec``) searches field by field: it moves the year to the
next allowed one, then the month, the day, the weekday, the hour, the minute and the
second, resetting the smaller fields whenever a larger one moves, and asks
``mktime()`` after every step whether the wall time is still the one it asked for (an
overflow such as day 31 of a 30-day month, or a wall time skipped by DST, makes it
carry on from the normalized time). Two implementations of that same search:

* :meth:`Searcher._search_wall`, here, runs on plain wall-clock arithmetic: exact
  whenever the zone's UTC offset is constant over every instant the search looks at,
  and fast (lookup tables, no zone conversions);
* :class:`~._calendar_zoned.ZonedSearch` asks :class:`~._localtime.LocalClock`
  (glibc's ``mktime`` reproduced) at every step, exactly like systemd; it is used only
  when the zone's offset changes somewhere in that span.

:meth:`Searcher.next_after` picks between them and returns an aware datetime, or
``None`` when the event never elapses again (impossible dates, nothing before the end
of year 2199 — systemd's limit — or systemd's 1000-round safety valve). The
specification and the field matching both searches share are in ``_calendar_spec``.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, tzinfo

from django_tasks_coord.timers import _calendar_spec
from django_tasks_coord.timers._calendar_spec import (
    MAX_ITERATIONS,
    MAX_YEAR,
    MIN_YEAR,
    USEC,
    CalendarSpec,
    carry,
    match,
    match_end_of_month,
    table,
)
from django_tasks_coord.timers._calendar_zoned import ZonedSearch
from django_tasks_coord.timers._localtime import (
    Fields,
    LocalClock,
    days_in_month,
    has_transition,
    local_seconds,
)

__all__ = ["Searcher"]

_DAY = 86_400
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_USEC = timedelta(microseconds=1)
_AFTER_MAX_YEAR = datetime(MAX_YEAR + 1, 1, 2, tzinfo=UTC)

#: (fields, microsecond, whether every field matched) after some steps of a round of
#: the wall-clock search; not matched: the next round starts from those fields.
_WallStep = tuple[Fields, int, bool]


class Searcher:
    """Precomputed lookup tables for one :class:`CalendarSpec`, and the two searches."""

    __slots__ = ("_days", "_days_eom", "_hours", "_minutes", "_months", "_years", "spec")

    def __init__(self, spec: CalendarSpec) -> None:
        self.spec = spec
        # From 1969: just after the epoch, the wall clock west of Greenwich is in 1969.
        self._years = None if spec.year is None else table(spec.year, MIN_YEAR - 1, MAX_YEAR)
        self._months = table(spec.month, 1, 12)
        self._hours = table(spec.hour, 0, 23)
        self._minutes = table(spec.minute, 0, 59)
        self._days: tuple[int | None, ...] = ()
        self._days_eom: dict[int, tuple[int | None, ...]] = {}
        if spec.end_of_month:
            self._days_eom = {
                last: tuple(
                    match_end_of_month(spec.day, value, last) for value in range(1, last + 1)
                )
                for last in (28, 29, 30, 31)
            }
        else:
            self._days = table(spec.day, 1, 31)

    # -- public ---------------------------------------------------------------------

    def next_after(self, dt: datetime, zone: tzinfo) -> datetime | None:
        """The first elapse strictly after the aware ``dt``, as a datetime in ``zone``."""
        if self.spec.utc:
            zone = UTC
        if dt < _EPOCH:
            dt = _EPOCH - _ONE_USEC
        elif dt >= _AFTER_MAX_YEAR:
            return None
        local = dt.astimezone(zone)
        usec = local.microsecond + 1
        if usec < USEC:
            # One microsecond later is within the same second, hence the same offset.
            start: Fields = (
                local.year, local.month, local.day, local.hour, local.minute, local.second
            )  # fmt: skip
        else:
            local = (dt + _ONE_USEC).astimezone(zone)
            start = (local.year, local.month, local.day, local.hour, local.minute, local.second)
            usec = 0
        if start[0] > MAX_YEAR:
            return None
        utcoffset = local.utcoffset()
        assert utcoffset is not None
        offset = -(utcoffset.days * _DAY + utcoffset.seconds)  # seconds to add to wall time
        probes: list[int] = []
        found = self._search_wall(start, usec, probes)
        if found is None:
            # The zoned search only ever finds wall times the plain one also matches.
            return None
        wall, found_usec = found
        end = local_seconds(*wall)
        if self.spec.end_of_month:
            # The "~" arithmetic also looks at the end of the answer's month.
            end = local_seconds(wall[0], wall[1] + 1, 3, 0, 0, 0)
        if probes:
            # Overflow probes (day 41 of February...) may lie beyond the answer; systemd
            # asks mktime about them too, and carries their DST flag on.
            end = max(end, *probes)
        begin = local_seconds(*start) + offset
        if not has_transition(zone, begin - _DAY, end + offset + _DAY):
            # The UTC offset is the same everywhere the search looked: plain wall-clock
            # arithmetic is exactly what systemd's mktime-based search computes.
            return datetime(*wall, found_usec, tzinfo=zone)
        found_at = self._search_zoned(LocalClock(zone), begin, usec)
        if found_at is None:
            return None
        return (_EPOCH + timedelta(microseconds=found_at)).astimezone(zone)

    def next_usec(self, after: int, zone: tzinfo) -> int | None:
        """Like :meth:`next_after`, in microseconds since the epoch."""
        found = self.next_after(_EPOCH + timedelta(microseconds=after), zone)
        return None if found is None else (found - _EPOCH) // _ONE_USEC

    def matches(self, fields: Fields, usec: int) -> bool:
        """Whether the wall time ``fields`` + ``usec`` satisfies every field of the spec."""
        y, mo, d, h, mi, s = fields
        spec = self.spec
        if spec.weekdays and not spec.weekdays >> date(y, mo, d).weekday() & 1:
            return False
        if match(spec.year, y) != y:
            return False
        if self._months[mo - 1] != mo or self._hours[h] != h or self._minutes[mi] != mi:
            return False
        if spec.end_of_month:
            if self._days_eom[days_in_month(y, mo)][d - 1] != d:
                return False
        elif self._days[d - 1] != d:
            return False
        value = s * USEC + usec
        return match(spec.usec, value) == value

    # -- wall-clock search (fast) -----------------------------------------------------

    # -- wall-clock search (fast) -----------------------------------------------------

    def _search_wall(
        self, start: Fields, usec: int, probes: list[int]
    ) -> tuple[Fields, int] | None:
        """The search on wall-clock arithmetic (no DST); appends overflow probes.

        Each round moves the date (:meth:`_wall_date`), then the time of day
        (:meth:`_wall_time`), to their next allowed values; a field without an allowed
        value left, or moved past its range, starts the next round.
        """
        fields = start
        for _ in range(MAX_ITERATIONS):
            y, mo, d, h, mi, s = fields
            # Carry fields left out of range by the "+1" steps.
            if mo > 12 or h > 23 or mi > 59 or s > 59 or (d > 28 and d > days_in_month(y, mo)):
                fields = carry(fields)
            step = self._wall_date(fields, usec, probes)
            if step is None:
                return None
            fields, usec, matched = step
            if matched:
                fields, usec, matched = self._wall_time(fields, usec, probes)
                if matched:
                    return fields, usec
        return None

    def _wall_date(self, fields: Fields, usec: int, probes: list[int]) -> _WallStep | None:
        """Year, month, day and weekday of one round; None: no elapse is left."""
        y, mo, d, h, mi, s = fields
        # Year.
        if self._years is not None:
            if y > MAX_YEAR:
                return None
            k = self._years[y - MIN_YEAR + 1]
            if k is None:
                return None
            if k != y:
                y, mo, d, h, mi, s, usec = k, 1, 1, 0, 0, 0, 0
        if y > MAX_YEAR:
            return None
        # Month.
        k = self._months[mo - 1]
        if k is None:
            return (y + 1, 1, 1, 0, 0, 0), 0, False
        if k != mo:
            mo, d, h, mi, s, usec = k, 1, 0, 0, 0, 0
            if k > 12:
                return self._overflow((y, mo, d, h, mi, s), probes), usec, False
        # Day of month.
        last = days_in_month(y, mo)
        k = self._days_eom[last][d - 1] if self._days_eom else self._days[d - 1]
        if k is None:
            return (y, mo + 1, 1, 0, 0, 0), 0, False
        if k != d:
            d, h, mi, s, usec = k, 0, 0, 0, 0
            if k > last:
                return self._overflow((y, mo, d, h, mi, s), probes), usec, False
        # Day of week.
        weekdays = self.spec.weekdays
        if weekdays and not weekdays >> date(y, mo, d).weekday() & 1:
            return (y, mo, d + 1, 0, 0, 0), 0, False
        return (y, mo, d, h, mi, s), usec, True

    def _wall_time(self, fields: Fields, usec: int, probes: list[int]) -> _WallStep:
        """Hour, minute, second and microsecond of one round (the date matched)."""
        y, mo, d, h, mi, s = fields
        # Hour.
        k = self._hours[h]
        if k is None:
            return (y, mo, d + 1, 0, 0, 0), 0, False
        if k != h:
            h, mi, s, usec = k, 0, 0, 0
            if k > 23:
                return self._overflow((y, mo, d, h, mi, s), probes), usec, False
        # Minute.
        k = self._minutes[mi]
        if k is None:
            return (y, mo, d, h + 1, 0, 0), 0, False
        if k != mi:
            mi, s, usec = k, 0, 0
            if k > 59:
                return self._overflow((y, mo, d, h, mi, s), probes), usec, False
        # Second and microsecond.
        k = match(self.spec.usec, s * USEC + usec)
        if k is None:
            return (y, mo, d, h, mi + 1, 0), 0, False
        s, usec = divmod(k, USEC)
        if s > 59:
            return self._overflow((y, mo, d, h, mi, s), probes), usec, False
        return (y, mo, d, h, mi, s), usec, True

    @staticmethod
    def _overflow(raw: Fields, probes: list[int]) -> Fields:
        """A value past its field's range: continue from the normalized time (see settle)."""
        probes.append(local_seconds(*raw))
        # Looked up at each call, like every use of settle: tests put systemd's old one back.
        return _calendar_spec.settle(raw, carry(raw))[1]

    # -- zoned search (exact around DST changes) --------------------------------------

    def _search_zoned(self, clock: LocalClock, seconds: int, usec: int) -> int | None:
        """systemd's search step by step on ``clock`` (:class:`ZonedSearch`), in microseconds."""
        return ZonedSearch(self.spec, clock).run(seconds, usec)
