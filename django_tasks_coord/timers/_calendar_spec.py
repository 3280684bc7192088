"""A normalized calendar event, and matching its fields one at a time.

The pieces both searches for the next elapse (``_calendar_search``, wall-clock
arithmetic; ``_calendar_zoned``, emulated ``mktime``) are made of: the normalized
specification (:class:`CalendarSpec`, what ``_calendar_syntax`` produces), the next
allowed value of one field (:func:`match`), and how systemd carries on after a value
past its field's range (:func:`carry`, :func:`settle`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from django_tasks_coord.timers._localtime import Fields, local_seconds, split_seconds

__all__ = [
    "MAX_ITERATIONS",
    "MAX_YEAR",
    "MIN_YEAR",
    "USEC",
    "CalendarSpec",
    "Chain",
    "Component",
    "carry",
    "match",
    "match_end_of_month",
    "settle",
    "table",
]

MIN_YEAR = 1970
MAX_YEAR = 2199
USEC = 1_000_000
# systemd gives up (and the timer never elapses) after this many rounds of its search.
MAX_ITERATIONS = 1000

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


def match(chain: Chain, value: int) -> int | None:
    """Smallest value >= ``value`` produced by ``chain`` (may exceed the field's range).

    ``None`` if no component reaches ``value``; ``value`` itself for ``*``.
    """
    if chain is None:
        return value
    return earliest(chain, value)


def earliest(components: Iterable[Component], value: int) -> int | None:
    """Smallest value >= ``value`` that one of ``components`` (``start``, ``stop``,
    ``repeat``; ``stop`` < 0: no stop) produces; ``None`` if none reaches it."""
    best: int | None = None
    for start, stop, repeat in components:
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


def from_month_end(chain: Chain, day: Callable[[int], int]) -> Iterator[Component]:
    """The components of a ``~`` day chain as days of the month: ``day(n)`` is the day ``n``
    days before the month's last (< 0: no such day); a range is turned around."""
    assert chain is not None
    for c_start, c_stop, repeat in chain:
        start, stop = day(c_start), day(c_stop)
        if stop > 0:
            start, stop = stop, start
        yield start, stop, repeat


def match_end_of_month(chain: Chain, value: int, last: int) -> int | None:
    """Like :func:`match` for a ``~`` day chain in a month of ``last`` days."""
    return earliest(from_month_end(chain, lambda n: last + 1 - n if n >= 0 else -1), value)


def table(chain: Chain, low: int, high: int) -> tuple[int | None, ...]:
    """``match(chain, v)`` for every ``v`` in ``low..high``, indexed by ``v - low``."""
    return tuple(match(chain, value) for value in range(low, high + 1))


def carry(fields: Fields) -> Fields:
    """Normalize out-of-range fields by calendar arithmetic (``timegm``)."""
    return split_seconds(local_seconds(*fields))[0]


def settle(raw: Fields, normalized: Fields) -> tuple[int, Fields]:
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
