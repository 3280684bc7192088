"""systemd's search for the next elapse, step by step, asking ``mktime`` after every step.

``calendar_spec_next_usec`` moves the year to the next allowed one, then the month, the
day, the weekday, the hour, the minute and the second, resetting the smaller fields
whenever a larger one moves, and asks ``mktime()`` after every step whether the wall
time is still the one it asked for (``tm_within_bounds``). :class:`ZonedSearch` does
the same with :class:`~django_tasks_coord.timers._localtime.LocalClock` (glibc's
``mktime`` reproduced), so it is exact around DST changes; ``_calendar_search`` uses it
only when the zone's offset changes somewhere in the span it searches.
"""

from __future__ import annotations

from django_tasks_coord.timers import _calendar_spec
from django_tasks_coord.timers._calendar_spec import (
    MAX_ITERATIONS,
    MAX_YEAR,
    MIN_YEAR,
    USEC,
    CalendarSpec,
    Chain,
    earliest,
    from_month_end,
    match,
)
from django_tasks_coord.timers._localtime import Fields, LocalClock, local_seconds

__all__ = ["ZonedSearch"]

#: The first value of each field (year, month, day, hour, minute, second).
_FIRST: Fields = (MIN_YEAR, 1, 1, 0, 0, 0)

#: (whether every field matched, the fields, microsecond, DST flag) after some steps;
#: not matched: the round starts over from those fields.
Step = tuple[bool, Fields, int, int]


def _reset(fields: Fields, index: int, value: int) -> Fields:
    """``fields`` with field ``index`` set to ``value`` and every smaller field at its first."""
    return (*fields[:index], value, *_FIRST[index + 1 :])  # type: ignore[return-value]


class ZonedSearch:
    """The search for one :class:`CalendarSpec` on one clock (whose guess it moves)."""

    __slots__ = ("clock", "spec")

    def __init__(self, spec: CalendarSpec, clock: LocalClock) -> None:
        self.spec = spec
        self.clock = clock

    def run(self, seconds: int, usec: int) -> int | None:
        """The first elapse at or after ``seconds`` + ``usec`` (since the epoch), in microseconds.

        ``isdst`` follows ``struct tm``'s ``tm_isdst`` of systemd's search: -1 (let
        mktime decide) normally, but once the search got stuck behind its start (a wall
        time moved backwards by a DST gap), systemd steps one hour on and keeps
        mktime's own DST flag from then on.
        """
        clock = self.clock
        start, _, isdst = clock.localtime(seconds)
        clock.guess = seconds - local_seconds(*start)
        start_usec = usec
        fields = start
        keep_dst = False
        for _ in range(MAX_ITERATIONS):
            result = clock.mktime(fields, isdst)
            if result is not None:
                fields, isdst = result[1], result[3]
            if not keep_dst:
                isdst = -1
            # Year.
            k = match(self.spec.year, fields[0])
            if k is None:
                return None
            if k != fields[0]:
                fields, usec = _reset(fields, 0, k), 0
            if self._bounds(fields, isdst)[0] <= 0:
                return None
            matched, fields, usec, isdst = self._below_year(fields, usec, isdst)
            if not matched:
                continue
            if fields < start or (fields == start and usec < start_usec):
                # Stuck behind the start (DST moved the wall time back): step an hour on.
                keep_dst = True
                fields = (*fields[:3], fields[3] + 1, *fields[4:])
                continue
            result = clock.mktime(fields, isdst)
            if result is None:
                return None
            return result[0] * USEC + usec
        return None

    def _below_year(self, fields: Fields, usec: int, isdst: int) -> Step:
        """One round's steps after the year: month, day, weekday, hour, minute, second."""
        spec = self.spec
        matched, fields, usec, isdst = self._step(1, spec.month, fields, usec, isdst)
        if not matched:
            return False, fields, usec, isdst
        end_of_month = spec.end_of_month
        day = self._end_of_month(fields, isdst) if end_of_month else match(spec.day, fields[2])
        matched, fields, usec, isdst = self._move(2, day, fields, usec, isdst)
        if not matched:
            return False, fields, usec, isdst
        if spec.weekdays:
            result = self.clock.mktime(fields, isdst)
            if result is None or not spec.weekdays >> result[2] & 1:
                return False, _reset(fields, 2, fields[2] + 1), 0, isdst
        matched, fields, usec, isdst = self._step(3, spec.hour, fields, usec, isdst)
        if not matched:
            return False, fields, usec, isdst
        matched, fields, usec, isdst = self._step(4, spec.minute, fields, usec, isdst)
        if not matched:
            return False, fields, usec, isdst
        return self._second(fields, usec, isdst)

    def _step(self, index: int, chain: Chain, fields: Fields, usec: int, isdst: int) -> Step:
        """Move field ``index`` (month, hour or minute) to its next value in ``chain``."""
        return self._move(index, match(chain, fields[index]), fields, usec, isdst)

    def _move(self, index: int, k: int | None, fields: Fields, usec: int, isdst: int) -> Step:
        """Move field ``index`` to ``k``, its next allowed value (None: none is left).

        With no value left, or if ``mktime`` refuses the result, the next round starts
        from the next value of the larger field; if ``mktime`` normalized the time, from
        the normalized time.
        """
        if k is not None and k != fields[index]:
            fields, usec = _reset(fields, index, k), 0
        status = -1
        if k is not None:
            status, fields, isdst = self._bounds(fields, isdst)
        if status < 0:
            return False, _reset(fields, index - 1, fields[index - 1] + 1), 0, isdst
        return status > 0, fields, usec, isdst

    def _second(self, fields: Fields, usec: int, isdst: int) -> Step:
        """The last step: second and microsecond, from the one microsecond chain."""
        k = match(self.spec.usec, fields[5] * USEC + usec)
        status = -1
        if k is not None:
            second, usec = divmod(k, USEC)
            fields = (*fields[:5], second)
            status, fields, isdst = self._bounds(fields, isdst)
        if status < 0:
            return False, _reset(fields, 4, fields[4] + 1), 0, isdst
        return status > 0, fields, usec, isdst

    def _bounds(self, raw: Fields, isdst: int) -> tuple[int, Fields, int]:
        """systemd's ``tm_within_bounds()``: 1 unchanged, 0 moved on, -1 error.

        Moved on: continue from the normalized time, with its DST flag (like glibc's tm).
        """
        if raw[0] > MAX_YEAR:
            return -1, raw, isdst
        result = self.clock.mktime(raw, isdst)
        if result is None:
            return -1, raw, isdst
        # Looked up at each call, like every use of settle: tests put systemd's old one back.
        status, settled = _calendar_spec.settle(raw, result[1])
        if status == 0:
            return 0, settled, result[3]
        return status, raw, isdst

    def _end_of_month(self, fields: Fields, isdst: int) -> int | None:
        """Day matching for a ``~`` chain, with systemd's mktime calls (they move the guess)."""
        chain = self.spec.day
        assert chain is not None
        y, mo, d, h, mi, s = fields
        month = (mo - 1) % 12 + 1

        def last_but(n: int) -> int:
            result = self.clock.mktime((y, mo + 1, 1 - n, h, mi, s), isdst)
            if result is None or result[1][1] != month:
                return -1
            return result[1][2]

        return earliest(from_month_end(chain, last_but), d)
