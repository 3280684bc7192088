"""Wall-clock arithmetic in one zone, the way systemd's C library (glibc) does it.

systemd computes calendar elapses with ``mktime()``/``localtime()``. Where a zone's
UTC offset changes (daylight saving time), ``mktime()`` has to pick an answer for wall
times that do not exist or exist twice, and glibc's answer depends on a guess it keeps
from its previous call. :class:`LocalClock` reproduces that behaviour with
:mod:`zoneinfo` so that our elapses around DST changes are identical to systemd's.

:func:`has_transition` tells whether a zone's offset changes within a span of time;
the calendar search uses plain wall-clock arithmetic (fast) when it does not.
"""

from __future__ import annotations

import functools
from datetime import UTC, date, datetime, timedelta, timezone, tzinfo

__all__ = ["LocalClock", "days_in_month", "has_transition", "local_seconds"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_DAYS = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_DAY = 86_400

# Fields are (year, month 1..12, day, hour, minute, second), as plain ints that may be
# out of range before normalization (month 13 is January of the next year, etc.).
Fields = tuple[int, int, int, int, int, int]


def days_in_month(year: int, month: int) -> int:
    """Number of days of ``month`` (1..12) in ``year`` (proleptic Gregorian)."""
    if month == 2 and year % 4 == 0 and (year % 100 != 0 or year % 400 == 0):
        return 29
    return _DAYS[month]


def local_seconds(year: int, month: int, day: int, hour: int, minute: int, second: int) -> int:
    """Seconds since 1970-01-01 00:00 of a wall time read as if it were UTC.

    Out-of-range fields carry over (day 0 is the last day of the previous month),
    like ``timegm()``.
    """
    year += (month - 1) // 12
    month = (month - 1) % 12 + 1
    days = date(year, month, 1).toordinal() - _EPOCH_ORDINAL + day - 1
    return days * _DAY + hour * 3600 + minute * 60 + second


def split_seconds(t: int) -> tuple[Fields, int]:
    """The UTC fields and weekday (0 = Monday) of ``t`` seconds since the epoch."""
    days, rem = divmod(t, _DAY)
    d = date.fromordinal(days + _EPOCH_ORDINAL)
    hour, rem = divmod(rem, 3600)
    minute, second = divmod(rem, 60)
    return (d.year, d.month, d.day, hour, minute, second), d.weekday()


class LocalClock:
    """``localtime()``/``mktime()`` of glibc for one zone, including the remembered guess.

    glibc's ``mktime()`` starts from the UTC offset its previous call found and probes
    until the wall time converts back. For a wall time that exists twice it therefore
    keeps the offset of the previous call; for a wall time in a gap it oscillates and
    settles on the daylight-saving side (the wall time moved forward by the gap). This
    class keeps the same guess, so a sequence of calls behaves like systemd's.
    """

    __slots__ = ("guess", "zone")

    def __init__(self, zone: tzinfo) -> None:
        self.zone = zone
        # glibc's static ``localtime_offset``: the last result minus the requested wall
        # time read as UTC (minus the UTC offset, for wall times that exist).
        self.guess = 0

    def localtime(self, t: int) -> tuple[Fields, int, int]:
        """Wall fields, weekday and DST flag (0/1) of ``t`` seconds since the epoch."""
        local = (_EPOCH + timedelta(seconds=t)).astimezone(self.zone)
        dst = local.dst()
        fields = (local.year, local.month, local.day, local.hour, local.minute, local.second)
        return fields, local.weekday(), int(bool(dst))

    def mktime(self, fields: Fields, isdst: int) -> tuple[int, Fields, int, int] | None:
        """Like glibc ``mktime()``: (seconds, normalized fields, weekday, DST flag).

        ``isdst`` is -1 (let the zone decide), 0 or 1. Returns ``None`` where glibc
        fails (no answer after its probes, or out of range).
        """
        year, month, day, hour, minute, second = fields
        requested_second = second
        second = min(max(second, 0), 59)  # glibc treats seconds >= 60 as leap seconds
        try:
            wall = local_seconds(year, month, day, hour, minute, second)
        except (ValueError, OverflowError):
            return None
        guess = self.guess
        t0 = wall + guess
        t = t1 = t2 = t0
        previous_dst = 0
        probes = 6
        while True:
            got, wday, got_dst = self._convert(t)
            if got is None:
                return None
            delta = wall - local_seconds(*got)
            if delta == 0:
                break
            if (
                t == t1
                and t != t2
                and (previous_dst <= got_dst if isdst < 0 else bool(isdst) != bool(got_dst))
            ):
                # Oscillating around a gap: glibc settles here (see the class docstring).
                return self._found(t, wall, requested_second, second, got, wday, got_dst)
            probes -= 1
            if probes == 0:
                return None
            t1, t2, t, previous_dst = t2, t, t + delta, got_dst
        if isdst >= 0 and bool(isdst) != bool(got_dst):
            # The wall time exists with the other DST flag: glibc looks for a nearby
            # instant with the requested flag and uses its offset.
            stride = 601_200
            for distance in range(stride, 536_454_000 // 2 + stride, stride):
                for direction in (-1, 1):
                    other = t + distance * direction
                    other_fields, _, other_dst = self._convert(other)
                    if other_fields is None or bool(other_dst) != bool(isdst):
                        continue
                    candidate = other + (wall - local_seconds(*other_fields))
                    got, wday, got_dst = self._convert(candidate)
                    if got is None:
                        return None
                    return self._found(
                        candidate, wall, requested_second, second, got, wday, got_dst
                    )
            return None
        return self._found(t, wall, requested_second, second, got, wday, got_dst)

    def _found(
        self,
        t: int,
        wall: int,
        requested_second: int,
        second: int,
        got: Fields,
        wday: int,
        got_dst: int,
    ) -> tuple[int, Fields, int, int] | None:
        self.guess = t - wall
        if requested_second != second:
            t += requested_second - second
            converted, wday, got_dst = self._convert(t)
            if converted is None:
                return None
            got = converted
        return t, got, wday, got_dst

    def _convert(self, t: int) -> tuple[Fields | None, int, int]:
        try:
            fields, wday, dst = self.localtime(t)
        except (ValueError, OverflowError):
            return None, 0, 0
        return fields, wday, dst


@functools.lru_cache(maxsize=8192)
def _transitions_in_year(zone: tzinfo, year: int) -> tuple[int, ...]:
    """Instants (seconds) at which ``zone``'s UTC offset changes during UTC year ``year``.

    Found by sampling the offset once a day and bisecting each change to the second;
    two changes less than a day apart would be missed (tzdata has none since 1970).
    """
    start = local_seconds(year, 1, 1, 0, 0, 0)
    end = local_seconds(year + 1, 1, 1, 0, 0, 0)

    def offset(t: int) -> timedelta | None:
        return (_EPOCH + timedelta(seconds=t)).astimezone(zone).utcoffset()

    found: list[int] = []
    previous_t, previous = start - 1, offset(start - 1)
    t = start
    while previous_t < end - 1:
        t = min(previous_t + _DAY, end - 1)
        current = offset(t)
        if current != previous:
            low, high = previous_t, t  # offset(low) == previous != offset(high)
            while high - low > 1:
                middle = (low + high) // 2
                if offset(middle) == previous:
                    low = middle
                else:
                    high = middle
            found.append(high)
        previous_t, previous = t, current
    return tuple(found)


def _year_of(t: int) -> int:
    return (_EPOCH + timedelta(seconds=t)).year


def _quiet_interval(zone: tzinfo, t: int) -> tuple[int, int]:
    """The largest known ``(low, high)`` around ``t`` with no offset change in ``(low, high]``.

    Looks at most 5 years back and forth; the bounds are conservative beyond that.
    """
    year = _year_of(t)
    low = local_seconds(year - 5, 1, 1, 0, 0, 0)
    for candidate in range(year, year - 6, -1):
        before = [i for i in _transitions_in_year(zone, candidate) if i <= t]
        if before:
            low = before[-1]
            break
    high = local_seconds(year + 6, 1, 1, 0, 0, 0) - 1
    for candidate in range(year, year + 6):
        after = [i for i in _transitions_in_year(zone, candidate) if i > t]
        if after:
            high = after[0] - 1
            break
    return low, high


_quiet: dict[tzinfo, tuple[int, int]] = {}


def has_transition(zone: tzinfo, low: int, high: int) -> bool:
    """Whether ``zone``'s UTC offset changes at some second in ``(low, high]``.

    Remembers, per zone, the last interval found free of changes, so that successive
    questions about nearby instants cost two comparisons.
    """
    if isinstance(zone, timezone):
        return False
    known = _quiet.get(zone)
    if known is not None and known[0] <= low and high <= known[1]:
        return False
    interval = _quiet_interval(zone, low)
    if len(_quiet) > 256:
        _quiet.clear()
    _quiet[zone] = interval
    return not (interval[0] <= low and high <= interval[1])
