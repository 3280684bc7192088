"""Next elapse of a normalized calendar specification, identical to systemd's.

systemd (``calendar_spec_next_usec``) searches field by field: it moves the year to the
next allowed one, then the month, the day, the weekday, the hour, the minute and the
second, resetting the smaller fields whenever a larger one moves, and asks
``mktime()`` after every step whether the wall time is still the one it asked for (an
overflow such as day 31 of a 30-day month, or a wall time skipped by DST, makes it
carry on from the normalized time). Two implementations of that same search live
here:

* :meth:`Searcher._search_wall` runs on plain wall-clock arithmetic: exact whenever
  the zone's UTC offset is constant over every instant the search looks at, and fast
  (lookup tables, no zone conversions);
* :meth:`Searcher._search_zoned` asks :class:`~._localtime.LocalClock` (glibc's
  ``mktime`` reproduced) at every step, exactly like systemd; it is used only when the
  zone's offset changes somewhere in that span.

:meth:`Searcher.next_after` picks between them and returns an aware datetime, or
``None`` when the event never elapses again (impossible dates, nothing before the end
of year 2199 — systemd's limit — or systemd's 1000-round safety valve).
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, tzinfo
from typing import NamedTuple

from django_tasks_coord.timers._localtime import (
    Fields,
    LocalClock,
    days_in_month,
    has_transition,
    local_seconds,
    split_seconds,
)

__all__ = ["MAX_YEAR", "MIN_YEAR", "CalendarSpec", "Chain", "Component", "Searcher"]

MIN_YEAR = 1970
MAX_YEAR = 2199
USEC = 1_000_000
# systemd gives up (and the timer never elapses) after this many rounds of its search.
MAX_ITERATIONS = 1000
_DAY = 86_400
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_USEC = timedelta(microseconds=1)
_AFTER_MAX_YEAR = datetime(MAX_YEAR + 1, 1, 2, tzinfo=UTC)

#: (start, stop or -1, repeat or 0); for seconds, all three are in microseconds.
Component = tuple[int, int, int]
#: Components of one field; ``None`` is ``*`` (the seconds chain is never ``None``).
Chain = tuple[Component, ...] | None


class CalendarSpec(NamedTuple):
    """A parsed and normalized calendar event (the fields of systemd's CalendarSpec)."""

    weekdays: int  # bit 0 = Monday ... bit 6 = Sunday; 0 = any day
    year: Chain
    month: Chain
    day: Chain
    end_of_month: bool  # the day chain counts back from the end of the month ("~")
    hour: Chain
    minute: Chain
    usec: tuple[Component, ...]
    utc: bool
    timezone: str | None


def _match(chain: Chain, value: int) -> int | None:
    """Smallest value >= ``value`` produced by ``chain`` (may exceed the field's range).

    ``None`` if no component reaches ``value``; ``value`` itself for ``*``.
    """
    if chain is None:
        return value
    best: int | None = None
    for start, stop, repeat in chain:
        if start >= value:
            candidate = start
        elif repeat > 0:
            candidate = start + repeat * (-((start - value) // repeat))
            if 0 <= stop < candidate:
                continue
        else:
            continue
        if best is None or candidate < best:
            best = candidate
    return best


def _match_end_of_month(chain: Chain, value: int, last: int) -> int | None:
    """Like :func:`_match` for a ``~`` day chain in a month of ``last`` days."""
    assert chain is not None
    best: int | None = None
    for c_start, c_stop, repeat in chain:
        start = last + 1 - c_start
        stop = last + 1 - c_stop if c_stop >= 0 else -1
        if stop > 0:
            start, stop = stop, start
        if start >= value:
            candidate = start
        elif repeat > 0:
            candidate = start + repeat * (-((start - value) // repeat))
            if 0 <= stop < candidate:
                continue
        else:
            continue
        if best is None or candidate < best:
            best = candidate
    return best


def _table(chain: Chain, low: int, high: int) -> tuple[int | None, ...]:
    """``_match(chain, v)`` for every ``v`` in ``low..high``, indexed by ``v - low``."""
    return tuple(_match(chain, value) for value in range(low, high + 1))


def _carry(fields: Fields) -> Fields:
    """Normalize out-of-range fields by calendar arithmetic (``timegm``)."""
    return split_seconds(local_seconds(*fields))[0]


def _settle(raw: Fields, normalized: Fields) -> tuple[int, Fields]:
    """systemd's ``tm_within_bounds`` comparison: (-1/0/1, fields to continue from).

    When normalization changed the fields, the search continues from the normalized
    time with only the field just below the first changed one reset (day to 1,
    hour/minute/second to 0), and with both month and day reset (1 January) when the
    year changed; the other smaller fields keep their normalized values. That is why
    systemd can skip a valid elapse after an overflow (``*:0/7:0`` from 23:58:57 next
    fires at 00:07, not 00:00).

    The day reset on a change of year is systemd's fix for issue #40260 (PR #40266,
    merged in January 2026, after v259): before it, a day repetition running past
    31 December ("day 34" is 3 January) continued from that day of January and
    skipped the days before it, 1 January included. We follow the fix.
    """
    y, mo, d, h, mi, s = normalized
    if y != raw[0]:
        cmp, mo, d = (1 if y > raw[0] else -1), 1, 1
    elif mo != raw[1]:
        cmp, d = (1 if mo > raw[1] else -1), 1
    elif d != raw[2]:
        cmp, h = (1 if d > raw[2] else -1), 0
    elif h != raw[3]:
        cmp, mi = (1 if h > raw[3] else -1), 0
    elif mi != raw[4]:
        cmp, s = (1 if mi > raw[4] else -1), 0
    else:
        cmp = (s > raw[5]) - (s < raw[5])
        return (1 if cmp == 0 else -1 if cmp < 0 else 0), (y, mo, d, h, mi, s)
    return (-1 if cmp < 0 else 0), (y, mo, d, h, mi, s)


class Searcher:
    """Precomputed lookup tables for one :class:`CalendarSpec`, and the two searches."""

    __slots__ = ("_days", "_days_eom", "_hours", "_minutes", "_months", "_years", "spec")

    def __init__(self, spec: CalendarSpec) -> None:
        self.spec = spec
        # From 1969: just after the epoch, the wall clock west of Greenwich is in 1969.
        self._years = None if spec.year is None else _table(spec.year, MIN_YEAR - 1, MAX_YEAR)
        self._months = _table(spec.month, 1, 12)
        self._hours = _table(spec.hour, 0, 23)
        self._minutes = _table(spec.minute, 0, 59)
        self._days: tuple[int | None, ...] = ()
        self._days_eom: dict[int, tuple[int | None, ...]] = {}
        if spec.end_of_month:
            self._days_eom = {
                last: tuple(
                    _match_end_of_month(spec.day, value, last) for value in range(1, last + 1)
                )
                for last in (28, 29, 30, 31)
            }
        else:
            self._days = _table(spec.day, 1, 31)

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
        if _match(spec.year, y) != y:
            return False
        if self._months[mo - 1] != mo or self._hours[h] != h or self._minutes[mi] != mi:
            return False
        if spec.end_of_month:
            if self._days_eom[days_in_month(y, mo)][d - 1] != d:
                return False
        elif self._days[d - 1] != d:
            return False
        value = s * USEC + usec
        return _match(spec.usec, value) == value

    # -- wall-clock search (fast) -----------------------------------------------------

    def _search_wall(
        self, start: Fields, usec: int, probes: list[int]
    ) -> tuple[Fields, int] | None:
        """The search on wall-clock arithmetic (no DST); appends overflow probes."""
        spec = self.spec
        years, months, hours, minutes = self._years, self._months, self._hours, self._minutes
        days, days_eom, weekdays, usec_chain = self._days, self._days_eom, spec.weekdays, spec.usec
        y, mo, d, h, mi, s = start
        for _ in range(MAX_ITERATIONS):
            # Carry fields left out of range by the "+1" steps below.
            if mo > 12 or h > 23 or mi > 59 or s > 59 or (d > 28 and d > days_in_month(y, mo)):
                y, mo, d, h, mi, s = _carry((y, mo, d, h, mi, s))
            # Year.
            if years is not None:
                if y > MAX_YEAR:
                    return None
                k = years[y - MIN_YEAR + 1]
                if k is None:
                    return None
                if k != y:
                    y, mo, d, h, mi, s, usec = k, 1, 1, 0, 0, 0, 0
            if y > MAX_YEAR:
                return None
            # Month.
            k = months[mo - 1]
            if k is None:
                y, mo, d, h, mi, s, usec = y + 1, 1, 1, 0, 0, 0, 0
                continue
            if k != mo:
                mo, d, h, mi, s, usec = k, 1, 0, 0, 0, 0
                if k > 12:
                    y, mo, d, h, mi, s = self._overflow((y, mo, d, h, mi, s), probes)
                    continue
            # Day of month.
            last = days_in_month(y, mo)
            k = days_eom[last][d - 1] if days_eom else days[d - 1]
            if k is None:
                mo, d, h, mi, s, usec = mo + 1, 1, 0, 0, 0, 0
                continue
            if k != d:
                d, h, mi, s, usec = k, 0, 0, 0, 0
                if k > last:
                    y, mo, d, h, mi, s = self._overflow((y, mo, d, h, mi, s), probes)
                    continue
            # Day of week.
            if weekdays and not weekdays >> date(y, mo, d).weekday() & 1:
                d, h, mi, s, usec = d + 1, 0, 0, 0, 0
                continue
            # Hour.
            k = hours[h]
            if k is None:
                d, h, mi, s, usec = d + 1, 0, 0, 0, 0
                continue
            if k != h:
                h, mi, s, usec = k, 0, 0, 0
                if k > 23:
                    y, mo, d, h, mi, s = self._overflow((y, mo, d, h, mi, s), probes)
                    continue
            # Minute.
            k = minutes[mi]
            if k is None:
                h, mi, s, usec = h + 1, 0, 0, 0
                continue
            if k != mi:
                mi, s, usec = k, 0, 0
                if k > 59:
                    y, mo, d, h, mi, s = self._overflow((y, mo, d, h, mi, s), probes)
                    continue
            # Second and microsecond.
            k = _match(usec_chain, s * USEC + usec)
            if k is None:
                mi, s, usec = mi + 1, 0, 0
                continue
            s, usec = divmod(k, USEC)
            if s > 59:
                y, mo, d, h, mi, s = self._overflow((y, mo, d, h, mi, s), probes)
                continue
            return (y, mo, d, h, mi, s), usec
        return None

    @staticmethod
    def _overflow(raw: Fields, probes: list[int]) -> Fields:
        """A value past its field's range: continue from the normalized time (see _settle)."""
        probes.append(local_seconds(*raw))
        return _settle(raw, _carry(raw))[1]

    # -- zoned search (exact around DST changes) --------------------------------------

    def _search_zoned(self, clock: LocalClock, seconds: int, usec: int) -> int | None:
        """The search asking glibc's ``mktime`` (emulated) at every step, like systemd.

        ``isdst`` follows ``struct tm``'s ``tm_isdst`` of systemd's search: -1 (let
        mktime decide) normally, but once the search got stuck behind its start (a wall
        time moved backwards by a DST gap), systemd steps one hour on and keeps
        mktime's own DST flag from then on.
        """
        spec = self.spec
        start, _, isdst = clock.localtime(seconds)
        clock.guess = seconds - local_seconds(*start)
        start_usec = usec
        y, mo, d, h, mi, s = start
        keep_dst = False

        def bounds(raw: Fields, isdst: int) -> tuple[int, Fields, int]:
            # systemd's tm_within_bounds(): 1 unchanged, 0 moved on, -1 error.
            if raw[0] > MAX_YEAR:
                return -1, raw, isdst
            result = clock.mktime(raw, isdst)
            if result is None:
                return -1, raw, isdst
            status, settled = _settle(raw, result[1])
            if status == 0:
                # Continue from the normalized time, with its DST flag (like glibc's tm).
                return 0, settled, result[3]
            return status, raw, isdst

        for _ in range(MAX_ITERATIONS):
            result = clock.mktime((y, mo, d, h, mi, s), isdst)
            if result is not None:
                (y, mo, d, h, mi, s), isdst = result[1], result[3]
            if not keep_dst:
                isdst = -1
            # Year.
            k = _match(spec.year, y)
            if k is None:
                return None
            if k != y:
                y, mo, d, h, mi, s, usec = k, 1, 1, 0, 0, 0, 0
            if bounds((y, mo, d, h, mi, s), isdst)[0] <= 0:
                return None
            # Month.
            k = _match(spec.month, mo)
            if k is not None and k != mo:
                mo, d, h, mi, s, usec = k, 1, 0, 0, 0, 0
            status = -1
            if k is not None:
                status, (y, mo, d, h, mi, s), isdst = bounds((y, mo, d, h, mi, s), isdst)
            if status < 0:
                y, mo, d, h, mi, s, usec = y + 1, 1, 1, 0, 0, 0, 0
                continue
            if status == 0:
                continue
            # Day of month.
            if spec.end_of_month:
                k = self._zoned_end_of_month(clock, (y, mo, d, h, mi, s), isdst)
            else:
                k = _match(spec.day, d)
            if k is not None and k != d:
                d, h, mi, s, usec = k, 0, 0, 0, 0
            status = -1
            if k is not None:
                status, (y, mo, d, h, mi, s), isdst = bounds((y, mo, d, h, mi, s), isdst)
            if status < 0:
                mo, d, h, mi, s, usec = mo + 1, 1, 0, 0, 0, 0
                continue
            if status == 0:
                continue
            # Day of week.
            if spec.weekdays:
                result = clock.mktime((y, mo, d, h, mi, s), isdst)
                if result is None or not spec.weekdays >> result[2] & 1:
                    d, h, mi, s, usec = d + 1, 0, 0, 0, 0
                    continue
            # Hour.
            k = _match(spec.hour, h)
            if k is not None and k != h:
                h, mi, s, usec = k, 0, 0, 0
            status = -1
            if k is not None:
                status, (y, mo, d, h, mi, s), isdst = bounds((y, mo, d, h, mi, s), isdst)
            if status < 0:
                d, h, mi, s, usec = d + 1, 0, 0, 0, 0
                continue
            if status == 0:
                continue
            # Minute.
            k = _match(spec.minute, mi)
            if k is not None and k != mi:
                mi, s, usec = k, 0, 0
            status = -1
            if k is not None:
                status, (y, mo, d, h, mi, s), isdst = bounds((y, mo, d, h, mi, s), isdst)
            if status < 0:
                h, mi, s, usec = h + 1, 0, 0, 0
                continue
            if status == 0:
                continue
            # Second and microsecond.
            k = _match(spec.usec, s * USEC + usec)
            status = -1
            if k is not None:
                s, usec = divmod(k, USEC)
                status, (y, mo, d, h, mi, s), isdst = bounds((y, mo, d, h, mi, s), isdst)
            if status < 0:
                mi, s, usec = mi + 1, 0, 0
                continue
            if status == 0:
                continue
            found = (y, mo, d, h, mi, s)
            if found < start or (found == start and usec < start_usec):
                # Stuck behind the start (DST moved the wall time back): step an hour on.
                keep_dst = True
                h += 1
                continue
            result = clock.mktime(found, isdst)
            if result is None:
                return None
            return result[0] * USEC + usec
        return None

    def _zoned_end_of_month(self, clock: LocalClock, fields: Fields, isdst: int) -> int | None:
        """Day matching for a ``~`` chain, with systemd's mktime calls (they move the guess)."""
        chain = self.spec.day
        assert chain is not None
        y, mo, d, h, mi, s = fields
        month = (mo - 1) % 12 + 1

        def last_but(n: int) -> int:
            result = clock.mktime((y, mo + 1, 1 - n, h, mi, s), isdst)
            if result is None or result[1][1] != month:
                return -1
            return result[1][2]

        best: int | None = None
        for c_start, c_stop, repeat in chain:
            start, stop = last_but(c_start), last_but(c_stop)
            if stop > 0:
                start, stop = stop, start
            if start >= d:
                candidate = start
            elif repeat > 0:
                candidate = start + repeat * (-((start - d) // repeat))
                if 0 <= stop < candidate:
                    continue
            else:
                continue
            if best is None or candidate < best:
                best = candidate
        return best
