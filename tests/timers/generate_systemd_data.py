#!/usr/bin/env python3
"""Generate the systemd oracle data used by ``tests/timers`` (run by hand, commit the output).

Usage (on a machine with systemd 252 or later)::

    python tests/timers/generate_systemd_data.py            # write the data files
    python tests/timers/generate_systemd_data.py --compare 5000 [--seed N] [--new-year]

The first form writes ``tests/timers/data/calendar_*.json``. The tests only read those
files; they never need systemd. ``--compare`` writes nothing: it runs that many random
events (half of them from base times near DST changes in 17 zones) through systemd's
library (corrected for systemd#40260, below) and through ``django_tasks_coord.timers``
and reports every difference; with ``--new-year``, events with day repetitions from
base times in December.

How the data is made:

* Every calendar event is run through ``systemd-analyze calendar --iterations=N
  --base-time=@SECONDS`` with ``TZ`` set to the zone of the case. That is the oracle:
  it gives validity, the normalized form and the next elapses.
* ``systemd-analyze`` prints elapses to the second only, so each case is also run
  through the very library ``systemd-analyze`` uses (``libsystemd-shared``, via
  ctypes: ``calendar_spec_from_string``/``_to_string``/``_next_usec``) to get the
  microseconds. The two must agree (validity, normalized form, elapses to the
  second); the script stops on any disagreement.
* systemd 252 has a bug that we do not reproduce (systemd issue #40260, fixed by PR
  #40266, merged after v259): when a day repetition runs past the end of December
  ("day 34" of December is 3 January), the search went on from that day of January
  instead of from 1 January, skipping the days before it. The oracle's output is
  corrected for it (see ``Correction40260``); corrected cases carry
  ``"corrected": "systemd#40260"`` and systemd's own elapses as ``"uncorrected"``.
* Cases: a curated list covering every construct of systemd.time(7) (weekdays,
  ranges, repetitions, two-digit years, ``~``, fractional seconds, shorthands,
  ``@epoch``, time-zone suffixes, impossible dates) and curated invalid events; DST
  cases (specs near the changes, several base times around each 2024/2025 change in
  three northern and four southern zones); and random events from a small grammar
  with random mutations (fixed seed), valid and invalid alike.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import glob
import json
import os
import random
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from zoneinfo import ZoneInfo

DATA = Path(__file__).resolve().parent / "data"
SEED = 20240601
ITERATIONS = 10
BASE_DEFAULT = datetime(2024, 1, 1, tzinfo=UTC)

NORTH = ["Europe/Berlin", "America/New_York", "Europe/London"]
SOUTH = ["Australia/Sydney", "America/Santiago", "Pacific/Auckland", "Australia/Lord_Howe"]
OTHER = ["UTC", "Asia/Tokyo", "Asia/Kolkata", "America/St_Johns"]
ZONES = NORTH + SOUTH + OTHER
SUFFIX_ZONES = ["UTC", "utc", "Europe/Berlin", "America/New_York", "Asia/Kolkata",
                "Pacific/Auckland", "Etc/GMT+5", "Australia/Lord_Howe"]  # fmt: skip

CURATED = [
    # systemd.time(7) examples
    "Sat,Thu,Mon..Wed,Sat..Sun", "Mon,Sun 12-*-* 2,1:23", "Wed *-1", "Wed..Wed,Wed *-1",
    "Wed, 17:48", "Wed..Sat,Tue 12-10-15 1:2:3", "*-*-7 0:0:0", "10-15", "monday *-12-* 17:00",
    "Mon,Fri *-*-3,1,2 *:30:45", "12,14,13,12:20,10,30", "12..14:10,20,30",
    "mon,fri *-1/2-1,3 *:30:45", "03-05 08:05:40", "08:05:40", "05:40",
    "Sat,Sun 12-05 08:05:40", "Sat,Sun 08:05:40", "2003-03-05 05:40",
    "05:40:23.4200004/3.1700005", "2003-02..04-05", "2003-03-05 05:40 UTC", "2003-03-05",
    "03-05", "hourly", "daily", "daily UTC", "monthly", "weekly", "weekly Pacific/Auckland",
    "yearly", "annually", "*:2/3", "Thu,Fri 2012-*-1,5 11:12:13",
    # weekdays
    "Mon..Fri", "Mon-Fri", "Sat,Sun", "Sat,Thu,Mon-Wed,Sat-Sun", "Mon..Fri 09:00",
    "Monday..Wednesday 12:00", "SUNDAY", "sun", "Mon,", "Fri-Sun 10:00", "mon..sun",
    "Tue,Thu 06:30", "Mon,Wed,Fri,Sun 23:59:59", "Sat..Sun,Mon", "Thu..Fri,Tue..Wed",
    "Fri *-*-13", "Mon *-*-1..7 09:00", "Sun *-*-1..7 4:00",
    # dates: lists, ranges, repetitions, two-digit years
    "2024-*-*", "2024..2026-02-29", "*-02-29", "Mon *-02-29", "*-*-1/7", "*-*-1..31/10",
    "*-1..12/3-1", "*-*-1/30", "*-*-2/30", "*-10/3-01", "*-*-31", "*-2,4,6-30", "*-12-25 00:00",
    "2022..2030/2-01-01", "2024/3-*-01", "70-01-01", "99-12-31", "00-01-01", "69-06-*",
    "12-10-15", "24-02-29 12:00", "2199-12-31 23:59:59", "2199-*-* 12:00",
    "2024-01..06/2-10..20/5 08:00", "*-*-* 12:00", "1..3:00", "*-*-* 0/5:00",
    # impossible dates
    "*-02-30", "*-04-31", "2023-02-29", "Mon 2024-01-02", "*-02-31 00:00 UTC",
    # end of month
    "*-02~01", "*-02~03", "Mon *-05~07/1", "*-*~01", "*-*~1..7", "*-*~05/2", "*-*~28",
    "Fri *-*~7/1 12:00", "*-*~03..01", "*-*~01,15", "02~01", "2024-*~01", "*-*~1..7/3",
    "Sun *-03~07/1 01:30",
    # times, seconds, fractions
    "*:0/5", "*:*:0/7", "*:0/7:0", "*:*:0/0.25", "*:*:1.5", "*:*:0..59/15", "*:*:10..20",
    "*:*:59.999999", "*:*:5.123456/10.5", "*:*:00.5/0.5", "*:00:0.0000005",
    "12:00:00.1234567", "*:*:*", "*:*:0/1,5.5", "*:*:1..2.5/0.5", "00..12/3:15,45",
    "*-*-* *:*:30", "*:59:59.999999",
    # shorthands
    "minutely", "quarterly", "semiannually", "semi-annually", "biannually", "bi-annually",
    "anually", "HOURLY", "Daily", "monthly UTC", "yearly Europe/Berlin",
    # @epoch
    "@0", "@1700000000", "@ 60", "Tue @1700000000", "@1700000000 UTC", "@+86400",
    "@1700000000 Europe/Berlin", "@7258118399",
    # zones
    "*-*-* 12:00 Asia/Kolkata", "*-*-* 09:00 America/New_York", "Mon..Fri 09:00 Europe/Berlin",
    "Mon..Fri 09:00 utc", "*-*-* 00:00:00 Etc/GMT+5", "*-*-* 02:30 Europe/Berlin",
    "*-*-* 02:30 Australia/Lord_Howe", "hourly America/Santiago", "*:0/30 Pacific/Auckland",
]  # fmt: skip

INVALID = [
    "*:50/10", "Fri..Mon", "*-*-* 00:00 Z", "", " ", "*/5", "*:*/5", "Mon..Wed..Fri",
    "Mon-Wed-Fri", "Mon,,Tue", "Mon..", "Mon.", "Mond", "Mon*", "*-*-* *:*:*.5",
    "*:*:59.9999995", "*:*:0/0.0000001", "*:*:05..05", "*:*:5.5..6", "*-02~01/1",
    "@7258118400", "@-1", "@", "@x", "@1 2", "@1 10:00", "1..3", "24:00", "*:60", "*:*:60",
    "13-01", "*-13-01", "*-*-32", "*-*-0", "*-*~29", "*-*~0", "1969-01-01", "2200-01-01",
    "100-01-01", "*-*-* 00:00 Mars/Olympus", "*-*-* 00:00 Europe", "*-*-* 00:00 europe/berlin",
    "daily  UTC", " daily", "daily ", "Mon, Tue", "Mon 12", "12:", ":30", "1:2:3:4",
    "*-*-*-*", "2024-01-01-01", "*~*~*", "01~01~01", "5..1:00", "*:10..5", "0/0:00",
    "1,2,,3:00", "1.5:00", "Mon 10:00 UTC UTC", "~01", "12~10-15", "Jan 1", "tomorrow",
    "now", "every 5m", "0 9 * * 1-5", "@daily", "*:*:0/60", "*-*-* 0/24:00", "*-*-1/31",
    "*-1/12-01", "*-*~01/1", "*-*~28/28", "Mon..Fri 9", "*-*-* 9:", "09:00 Z", "09:00 EST5",
    "Mon 09:00 Europe//Berlin", "Mon 09:00 /etc/localtime", "*:*:1..1.5", "1..1..2:00",
    "1/2/3:00", "Mon\t09:00", "Mon 09:00\n", "*:*:0.", "*:*:.5", "12:00:00.", "-1:00",
    "+1:00", "1e3:00", "0x10:00", "\uff11\uff12:00",
]  # fmt: skip

# Day repetitions across the new year (systemd#40260, see Correction40260): (spec, zone,
# base, number of elapses). The first ten are affected; the last six cross the new year
# too, but the bug does not change them (a range stops at its end, a repetition reaching
# 32 December, no January, an hour running past 31 December, a "~" day whose January
# values all lie after the overflow day, the year 2199).
YEAR_BOUNDARY = [
    ("*-*-1/11 23:00:00", "Europe/Berlin", datetime(2025, 10, 31, 23, tzinfo=UTC), 10),
    ("*-*-1/7 09:00", "UTC", datetime(2027, 12, 20, tzinfo=UTC), 14),
    ("*-*-1/7", "Australia/Sydney", datetime(2024, 12, 20, tzinfo=UTC), 10),
    ("*-*-1/7", "Pacific/Auckland", datetime(2025, 12, 25, 12, tzinfo=UTC), 10),
    ("*-1/11-1/9", "UTC", datetime(2025, 12, 20, tzinfo=UTC), 8),
    ("*-1/11-1/9", "America/New_York", datetime(2023, 12, 25, tzinfo=UTC), 8),
    ("Thu *-*-1/7", "UTC", datetime(2025, 12, 1, tzinfo=UTC), 6),
    ("*-*~25/20", "UTC", datetime(2025, 12, 20, tzinfo=UTC), 6),
    ("*-*-2..20/9,1/11 06:30", "Asia/Tokyo", datetime(2025, 12, 15, tzinfo=UTC), 10),
    ("2027..2028-*-1/9 12:00", "UTC", datetime(2027, 12, 20, tzinfo=UTC), 12),
    ("*-*-1..31/11", "UTC", datetime(2025, 12, 20, tzinfo=UTC), 4),
    ("*-*-2/10", "Europe/London", datetime(2025, 12, 20, tzinfo=UTC), 4),
    ("*-12-1/7", "UTC", datetime(2025, 12, 20, tzinfo=UTC), 4),
    ("*-*-1/30 0/7:00", "UTC", datetime(2025, 12, 31, 20, tzinfo=UTC), 4),
    ("*-*~07/5", "UTC", datetime(2025, 12, 20, tzinfo=UTC), 4),
    ("*-*-1/7", "UTC", datetime(2199, 12, 20, tzinfo=UTC), 3),
]  # fmt: skip

DST_SPECS = [
    "*:0/15", "*:0/30", "hourly", "minutely", "*:*:0/20", "daily", "*-*-* 02:30",
    "*-*-* 02:00", "*-*-* 01:30", "*-*-* 03:00", "*-*-* 00:00", "*-*-* 00:30", "*-*-* 23:30",
    "*-*-* 01..03:00,30", "*:0/7:0", "Sun *-*-* 02:30", "*-*-* 02:30 UTC", "*-*~01 02:30",
    "Sun *-*~07 01:30", "*-*-* 02:15:30.5", "*-*-* 01,02:45",
]  # fmt: skip


# -- random events ------------------------------------------------------------------------

_DAYS = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
_LONG = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def _day_name(rng: random.Random, number: int) -> str:
    name = (_DAYS if rng.random() < 0.8 else _LONG)[number]
    return rng.choice([name, name.lower(), name.upper()]) if rng.random() < 0.2 else name


def _weekdays(rng: random.Random) -> str:
    items = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        if rng.random() < 0.4:
            a, b = (
                sorted(rng.sample(range(7), 2)) if rng.random() < 0.9 else rng.sample(range(7), 2)
            )
            separator = rng.choice(["..", "..", "-"])
            items.append(f"{_day_name(rng, a)}{separator}{_day_name(rng, b)}")
        else:
            items.append(_day_name(rng, rng.randrange(7)))
    return ",".join(items)


def _number(rng: random.Random, low: int, high: int, width: int) -> str:
    value = rng.randint(low, high)
    text = str(value)
    return text.zfill(width) if rng.random() < 0.5 else text


def _component(rng: random.Random, low: int, high: int, width: int, seconds: bool) -> str:
    def value(lo: int = low, hi: int = high) -> str:
        text = _number(rng, lo, hi, width)
        if seconds and rng.random() < 0.3:
            text += "." + str(rng.randint(0, 999999999))[: rng.randint(1, 8)]
        return text

    kind = rng.random()
    if kind < 0.45:
        return value()
    if kind < 0.65:
        start = rng.randint(low, high)
        return f"{value(start, start)}/{rng.randint(1, max(1, (high - low) // 2))}" + (
            f".{rng.randint(0, 99)}" if seconds and rng.random() < 0.3 else ""
        )
    a, b = sorted((rng.randint(low, high), rng.randint(low, high)))
    text = f"{value(a, a)}..{value(b, b)}"
    if rng.random() < 0.5:
        text += f"/{rng.randint(1, max(1, (b - a) or 1))}"
    return text


def _chain(rng: random.Random, low: int, high: int, width: int, seconds: bool = False) -> str:
    if rng.random() < 0.35:
        return "*"
    return ",".join(
        _component(rng, low, high, width, seconds) for _ in range(rng.choice([1, 1, 2, 3]))
    )


def random_event(rng: random.Random) -> str:
    """A random calendar event from a small grammar; most are valid."""
    roll = rng.random()
    if roll < 0.04:
        return rng.choice(["minutely", "hourly", "daily", "weekly", "monthly", "yearly",
                           "quarterly", "semiannually"]) + (
            f" {rng.choice(SUFFIX_ZONES)}" if rng.random() < 0.3 else "")  # fmt: skip
    if roll < 0.06:
        return f"@{rng.randint(0, 7258118399)}"
    parts = []
    if rng.random() < 0.35:
        parts.append(_weekdays(rng))
    if rng.random() < 0.75:
        eom = rng.random() < 0.15
        month = _chain(rng, 1, 12, 2)
        day = _chain(rng, 1, 28 if eom else 31, 2)
        sep = "~" if eom else "-"
        if rng.random() < 0.6:
            year = _chain(rng, 2020, 2040, 4) if rng.random() < 0.8 else _chain(rng, 20, 40, 2)
            parts.append(f"{year}-{month}{sep}{day}")
        else:
            parts.append(f"{month}{sep}{day}")
    if rng.random() < 0.85:
        time = f"{_chain(rng, 0, 23, 2)}:{_chain(rng, 0, 59, 2)}"
        if rng.random() < 0.6:
            time += f":{_chain(rng, 0, 59, 2, seconds=True)}"
        parts.append(time)
    if not parts:
        parts.append("*-*-*")
    if rng.random() < 0.15:
        parts.append(rng.choice(SUFFIX_ZONES))
    return " ".join(parts)


def mutate(rng: random.Random, text: str) -> str:
    """A random small edit (insert, delete or replace one character)."""
    alphabet = "0123456789*-~:.,/ @MonFriUTC"
    position = rng.randint(0, len(text))
    action = rng.random()
    if action < 0.4 or not text:
        return text[:position] + rng.choice(alphabet) + text[position:]
    position = min(position, len(text) - 1)
    if action < 0.7:
        return text[:position] + text[position + 1 :]
    return text[:position] + rng.choice(alphabet) + text[position + 1 :]


# -- the oracle ------------------------------------------------------------------------------

MAX_YEAR = 2199  # systemd's: nothing elapses after the end of that year


def _field(text: str) -> list[tuple[int, int, int]] | None:
    """A month or day field of systemd's normalized form: [(start, stop or -1, repeat)].

    ``None`` for ``*``; a range without a repetition repeats by 1.
    """
    if text == "*":
        return None
    components = []
    for item in text.split(","):
        value, _, repeat = item.partition("/")
        start, _, stop = value.partition("..")
        step = int(repeat) if repeat else (1 if stop else 0)
        components.append((int(start), int(stop) if stop else -1, step))
    return components


def _first_match(chain: list[tuple[int, int, int]], value: int) -> int | None:
    """systemd's find_matching_component(): the smallest value >= ``value`` (may overflow)."""
    best = None
    for start, stop, repeat in chain:
        if start >= value:
            candidate = start
        elif repeat > 0:
            candidate = start + repeat * -((start - value) // repeat)
            if 0 <= stop < candidate:
                continue
        else:
            continue
        best = candidate if best is None else min(best, candidate)
    return best


class CannotCorrect(Exception):
    """The correction's premises do not hold for this search (see Correction40260)."""


class Correction40260:
    """systemd issue #40260, fixed by PR #40266, corrected in systemd 252's output.

    The bug. systemd's search (``find_next()`` in ``src/shared/calendarspec.c``) moves
    field by field and, when a field's next value is out of range, lets ``mktime()``
    normalize it and goes on from the normalized time (``tm_within_bounds()``). If the
    *year* changed, systemd before the fix resets the month to January but keeps the day:
    a day repetition past the end of December ("day 34" is 3 January) goes on from
    3 January and skips 1 and 2 January. PR #40266 also resets the day to 1.

    The criterion. Only one way into a new year leaves the day at 2 or more: the day
    field's next value in December is 33 or more. So a spec can be affected only if
    December is in its month field and, in December (31 days; for ``~`` values counted
    from its end), its day field's next value from day 31 exists and is >= 33 (an open
    repetition such as ``1/11``, days 1, 12, 23, 34; never a range ``a..b/r``, which
    stops at ``b``). Then day 31 never matches, so no hour, minute or second of
    31 December can carry the search over either: every way such a search enters a
    new year (year or month field, no further day value, the buggy day overflow)
    lands, in the fixed search, on 1 January 00:00:00.000000 of that year, exactly
    where a search started from the year's first microsecond begins. Hence the
    correction: for an affected spec, when systemd's next elapse lies in a later
    local year than the search's start, the corrected next elapse is the corrected
    next elapse after the last microsecond of the start's year, asked of systemd
    again. Everything else is systemd's answer as it is.

    Two premises are checked, and the case is refused (``CannotCorrect``) where they
    fail: the zone's UTC offset does not change within two days of the new year (or
    ``mktime()`` could move 1 January itself), and systemd did not give up (EDEADLK)
    during an affected search (its 1000-round count would differ in the fixed search).
    """

    def __init__(self, normalized: str, zone: str) -> None:
        tokens = normalized.split()
        time_at = next(i for i, token in enumerate(tokens) if ":" in token)
        date = tokens[time_at - 1]
        suffix = tokens[time_at + 1 :]
        self.zone = ZoneInfo(suffix[0] if suffix else zone)
        if "~" in date:
            head, day = date.split("~")
        else:
            head, day = date.rsplit("-", 1)
        months, days = _field(head.split("-")[-1]), _field(day)
        self.affected = False
        if days is not None and (months is None or _first_match(months, 12) == 12):
            if "~" in date:
                # find_end_of_month() in December: day c of "~c" is 32 - c; no stop is -1.
                days = [
                    (min(a, b), max(a, b), r) if b > 0 else (a, b, r)
                    for a, b, r in ((32 - c, 32 - e if e >= 0 else -1, r) for c, e, r in days)
                ]
            after = _first_match(days, 31)
            self.affected = after is not None and after >= 33

    def next(self, raw: Callable[[int], tuple[int, int]], current: int) -> tuple[int, int]:
        """(next elapse in µs, 0) or (0, errno), as systemd with PR #40266 answers."""
        while True:
            found, error = raw(current)
            if not self.affected:
                return found, error
            year = self._local(current + 1).year
            boundary = self._new_year(year + 1)
            if error == 0 and found < boundary:
                return found, 0
            if error not in (0, errno.ENOENT):
                raise CannotCorrect(f"systemd failed ({error_name(error)}) on an affected search")
            if year + 1 > MAX_YEAR:
                return 0, errno.ENOENT
            current = boundary - 1

    def _local(self, usec: int) -> datetime:
        epoch = datetime(1970, 1, 1, tzinfo=UTC)
        return (epoch + timedelta(microseconds=usec)).astimezone(self.zone)

    def _new_year(self, year: int) -> int:
        """1 January 00:00 of ``year`` in the zone, in µs since the epoch."""
        moment = datetime(year, 1, 1, tzinfo=self.zone)
        offsets = {(moment + timedelta(hours=h)).utcoffset() for h in range(-48, 49)}
        if len(offsets) != 1:
            raise CannotCorrect(f"{self.zone} changes its offset near {moment}")
        return int(moment.timestamp()) * 1_000_000


class Oracle:
    """systemd-analyze, cross-checked with libsystemd-shared for microseconds."""

    def __init__(self) -> None:
        version = subprocess.run(
            ["systemd-analyze", "--version"], capture_output=True, text=True, check=True
        ).stdout.splitlines()[0]
        self.version = version
        paths = sorted(glob.glob("/usr/lib/*/systemd/libsystemd-shared-*.so"))
        paths += sorted(glob.glob("/usr/lib/systemd/libsystemd-shared-*.so"))
        if not paths:
            sys.exit("libsystemd-shared-*.so not found")
        lib = ctypes.CDLL(paths[-1])
        lib.calendar_spec_from_string.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
        lib.calendar_spec_to_string.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_char_p)]
        lib.calendar_spec_next_usec.argtypes = [
            ctypes.c_void_p, ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64)
        ]  # fmt: skip
        lib.calendar_spec_free.argtypes = [ctypes.c_void_p]
        self.lib = lib
        self.libc = ctypes.CDLL("libc.so.6")
        self.zone = ""

    def library(
        self, spec: str, zone: str, base: int, count: int, *, corrected: bool = False
    ) -> tuple[str | None, list[int], int]:
        """(normalized form, elapses in µs, errno that stopped the iteration or 0).

        ``corrected``: with systemd#40260 corrected (see :class:`Correction40260`).
        """
        if zone != self.zone:
            os.environ["TZ"] = zone
            self.libc.tzset()
            self.zone = zone
        handle = ctypes.c_void_p()
        if self.lib.calendar_spec_from_string(spec.encode(), ctypes.byref(handle)) < 0:
            return None, [], 0
        text = ctypes.c_char_p()
        if self.lib.calendar_spec_to_string(handle, ctypes.byref(text)) < 0:
            sys.exit(f"cannot format {spec!r}")
        assert text.value is not None
        normalized = text.value.decode()

        def raw(after: int) -> tuple[int, int]:
            found = ctypes.c_uint64()
            result = self.lib.calendar_spec_next_usec(handle, after, ctypes.byref(found))
            return (0, -result) if result < 0 else (found.value, 0)

        next_elapse = partial(Correction40260(normalized, zone).next, raw) if corrected else raw
        elapses: list[int] = []
        current = base
        error = 0
        try:
            for _ in range(count):
                current, error = next_elapse(current)
                if error:
                    break
                elapses.append(current)
        finally:
            self.lib.calendar_spec_free(handle)
        return normalized, elapses, error

    def analyze(self, spec: str, zone: str, base: int, count: int) -> tuple[str | None, list[int]]:
        """(normalized form, elapses to the second) as printed by systemd-analyze."""
        seconds, micro = divmod(base, 1_000_000)
        process = subprocess.run(
            ["systemd-analyze", "calendar", f"--iterations={count}",
             f"--base-time=@{seconds}.{micro:06d}", "--", spec],
            capture_output=True, text=True, env={**os.environ, "TZ": zone}, check=False,
        )  # fmt: skip
        if process.returncode != 0 and "Failed to parse" in process.stderr:
            return None, []
        if process.returncode != 0 and "Failed to determine next elapse" in process.stderr:
            return "<error>", []
        if process.returncode != 0:
            sys.exit(f"systemd-analyze failed for {spec!r} in {zone}: {process.stderr}")
        normalized = None
        lines: list[tuple[str, str]] = []
        for line in process.stdout.splitlines():
            label, _, value = line.strip().partition(": ")
            if label == "Normalized form":
                normalized = value
            elif label in ("Next elapse", "(in UTC)") or label.startswith("Iter."):
                lines.append((label, value))
        elapses: list[int] = []
        for index, (label, value) in enumerate(lines):
            if value == "never":
                break
            if label != "(in UTC)" and index + 1 < len(lines) and lines[index + 1][0] == "(in UTC)":
                continue  # the local rendering; use the UTC line that follows
            moment = datetime.strptime(value, "%a %Y-%m-%d %H:%M:%S UTC").replace(tzinfo=UTC)
            elapses.append(int(moment.timestamp()))
        return normalized, elapses

    def case(
        self, spec: str, zone: str, base: datetime, count: int = ITERATIONS
    ) -> dict[str, object]:
        base_usec = (base - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
        asked = count
        lib_normalized, lib_elapses, error = self.library(spec, zone, base_usec, count)
        if error not in (0, errno.ENOENT):
            # systemd gave up (e.g. EDEADLK, "Infinite loop in calendar calculation"): it
            # prints nothing for the event then, so check the elapses before the failure
            # and that asking for one more fails.
            failed = self.analyze(spec, zone, base_usec, len(lib_elapses) + 1)
            if failed != ("<error>", []):
                sys.exit(f"systemd-analyze did not fail on {spec!r} in {zone}: {failed}")
            count = len(lib_elapses)
        normalized, elapses = self.analyze(spec, zone, base_usec, count)
        if (normalized, elapses) != (lib_normalized, [e // 1_000_000 for e in lib_elapses]):
            sys.exit(
                f"systemd-analyze and libsystemd-shared disagree on {spec!r} in {zone} from "
                f"{base}: {normalized!r} {elapses} / {lib_normalized!r} {lib_elapses}"
            )
        result: dict[str, object] = {"spec": spec, "zone": zone, "base": iso(base_usec)}
        if normalized is None:
            result["valid"] = False
            return result
        try:
            fixed = self.library(spec, zone, base_usec, asked, corrected=True)[1:]
        except CannotCorrect as problem:
            sys.exit(f"cannot correct {spec!r} in {zone} from {base} for systemd#40260: {problem}")
        result.update(valid=True, normalized=normalized, elapses=[iso(e) for e in fixed[0]])
        if fixed[1]:
            # Fewer elapses than asked: "never" (ENOENT) or systemd gave up (EDEADLK...).
            result["then"] = error_name(fixed[1])
        if fixed != (lib_elapses, error):
            result["corrected"] = "systemd#40260"
            result["uncorrected"] = [iso(e) for e in lib_elapses]
            if error:
                result["uncorrected_then"] = error_name(error)
        return result


def error_name(error: int) -> str:
    """ENOENT, EDEADLK... (``errno.errorcode`` says EDEADLOCK, its alias on Linux)."""
    return "EDEADLK" if error == errno.EDEADLK else errno.errorcode[error]


def iso(usec: int) -> str:
    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=usec)
    return moment.isoformat().replace("+00:00", "Z")


def transitions(zone: str, years: range) -> list[datetime]:
    """UTC instants at which ``zone`` changes its offset during ``years``."""
    tz = ZoneInfo(zone)
    found = []
    moment = datetime(years.start, 1, 1, tzinfo=UTC)
    end = datetime(years.stop, 1, 1, tzinfo=UTC)
    step = timedelta(hours=1)
    previous = moment.astimezone(tz).utcoffset()
    while moment < end:
        moment += step
        offset = moment.astimezone(tz).utcoffset()
        if offset != previous:
            found.append(moment)
        previous = offset
    return found


def write(name: str, oracle: Oracle, cases: list[dict[str, object]]) -> None:
    DATA.mkdir(exist_ok=True)
    tzdata = Path("/usr/share/zoneinfo/tzdata.zi")
    version = (
        tzdata.read_text().splitlines()[0].removeprefix("# version ") if tzdata.exists() else "?"
    )
    header = {
        "generator": "tests/timers/generate_systemd_data.py",
        "systemd": oracle.version,
        "tzdata": version,
    }
    lines = [json.dumps(case, ensure_ascii=False) for case in cases]
    path = DATA / name
    path.write_text(json.dumps(header)[:-1] + ', "cases": [\n' + ",\n".join(lines) + "\n]}\n")
    valid = sum(1 for case in cases if case["valid"])
    print(f"{path.relative_to(DATA.parent.parent.parent)}: {len(cases)} cases ({valid} valid)")


COMPARE_ZONES = [*ZONES, "Europe/Moscow", "Pacific/Apia", "Asia/Tehran", "America/Sao_Paulo",
                 "Africa/Casablanca", "America/Havana", "Asia/Gaza", "Antarctica/Troll",
                 "Pacific/Chatham"]  # fmt: skip


def new_year_event(rng: random.Random) -> str:
    """A random event with a day repetition, for searches across the new year (#40260)."""
    start = rng.randint(1, 30)
    day = f"{start}/{rng.randint(1, 31 - start)}"
    if rng.random() < 0.3:
        day += "," + _component(rng, 1, 31, 2, False)
    sep = "~" if rng.random() < 0.2 and start <= 28 else "-"
    month = rng.choice(["*", "*", "12,1", "1/11", "12", "11..12", "1..12/2", "2/5"])
    year = rng.choice(["*", "*", "*", "2027..2028", "2024..2032/4"])
    time = rng.choice(["00:00", "23:59:59.5", "12:30", "0/7:00", "*:0/20"])
    parts = [f"{year}-{month}{sep}{day}", time]
    if rng.random() < 0.2:
        parts.insert(0, _weekdays(rng))
    return " ".join(parts)


def compare(oracle: Oracle, count: int, seed: int, new_year: bool = False) -> None:
    """Differential test against our implementation (see the module docstring).

    ``new_year``: day repetitions from base times in December instead (systemd#40260).
    """
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from django_tasks_coord.exceptions import TimerError
    from django_tasks_coord.timers import CalendarEvent

    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    one = timedelta(microseconds=1)
    rng = random.Random(seed)
    changes = {zone: transitions(zone, range(2010, 2027)) for zone in COMPARE_ZONES}
    differences = 0
    corrected = skipped = 0
    for index in range(count):
        spec = random_event(rng) if rng.random() < 0.7 else rng.choice(DST_SPECS)
        if rng.random() < 0.2:
            spec = mutate(rng, spec)
        zone = rng.choice(COMPARE_ZONES)
        if new_year:
            spec = new_year_event(rng)
            base = datetime(rng.randint(1990, 2199), 12, 1, tzinfo=UTC) + timedelta(
                seconds=rng.randint(-40 * 86400, 31 * 86400)
            )
        elif index % 2 and changes[zone]:
            base = rng.choice(changes[zone]) + timedelta(seconds=rng.randint(-2 * 86400, 3 * 3600))
        else:
            base = datetime(2000, 1, 1, tzinfo=UTC) + timedelta(seconds=rng.randint(0, 10**9))
        base_usec = (base - epoch) // one + rng.choice([0, 0, 500_000])
        try:
            expected = oracle.library(spec, zone, base_usec, ITERATIONS, corrected=True)[:2]
        except CannotCorrect:
            skipped += 1
            continue
        if expected != oracle.library(spec, zone, base_usec, ITERATIONS)[:2]:
            corrected += 1
        try:
            event = CalendarEvent(spec, tz=zone)
        except TimerError:
            found: tuple[str | None, list[int]] = (None, [])
        else:
            elapses, current = [], epoch + one * base_usec
            for _ in range(ITERATIONS):
                following = event.next_after(current)
                if following is None:
                    break
                elapses.append((following - epoch) // one)
                current = following
            found = (str(event), elapses)
        if found != expected:
            differences += 1
            print(f"DIFFERENT {spec!r} in {zone} after {iso(base_usec)}")
            print(f"  systemd: {expected[0]!r} {[iso(e) for e in expected[1]]}")
            print(f"  ours:    {found[0]!r} {[iso(e) for e in found[1]]}")
    print(
        f"{count} events compared, {differences} different; {corrected} corrected for "
        f"systemd#40260, {skipped} skipped (the correction's premises do not hold)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--random", type=int, default=700, help="number of random events")
    parser.add_argument("--compare", type=int, help="compare N random events, write nothing")
    parser.add_argument("--seed", type=int, default=1, help="seed for --compare")
    parser.add_argument(
        "--new-year", action="store_true", help="--compare day repetitions across new year"
    )
    args = parser.parse_args()
    oracle = Oracle()
    if args.compare:
        compare(oracle, args.compare, args.seed, args.new_year)
        return
    rng = random.Random(SEED)
    bases = [BASE_DEFAULT, datetime(2024, 2, 27, 22, 30, tzinfo=UTC),
             datetime(2025, 12, 31, 23, 59, 59, 500000, tzinfo=UTC),
             datetime(2023, 6, 15, 12, 0, 0, 123456, tzinfo=UTC)]  # fmt: skip

    curated = []
    for index, spec in enumerate(CURATED):
        curated.append(oracle.case(spec, "UTC", BASE_DEFAULT))
        curated.append(oracle.case(spec, ZONES[index % len(ZONES)], bases[index % len(bases)]))
    for spec in INVALID:
        curated.append(oracle.case(spec, "UTC", BASE_DEFAULT))
    # systemd gives up ("Infinite loop in calendar calculation", EDEADLK) on these.
    for spec, zone in [("*-02-13/14 00:00:00", "America/New_York"),
                       ("Sun *-03~07/1 01:30", "Europe/London")]:  # fmt: skip
        curated.append(oracle.case(spec, zone, BASE_DEFAULT))
    for spec, zone, base, count in YEAR_BOUNDARY:
        curated.append(oracle.case(spec, zone, base, count))
    write("calendar_curated.json", oracle, curated)

    dst = []
    for zone in NORTH + SOUTH:
        for moment in transitions(zone, range(2024, 2026)):
            for spec in DST_SPECS:
                offset = rng.choice([-26 * 60, -120, -10, 30])  # minutes before/after
                dst.append(oracle.case(spec, zone, moment + timedelta(minutes=offset), 12))
    write("calendar_dst.json", oracle, dst)

    random_cases = []
    seen = set()
    while len(random_cases) < args.random:
        spec = random_event(rng)
        if rng.random() < 0.15:
            spec = mutate(rng, spec)
        if spec in seen:
            continue
        seen.add(spec)
        zone = rng.choice(ZONES)
        base = datetime(2020, 1, 1, tzinfo=UTC) + timedelta(
            seconds=rng.randint(0, 8 * 365 * 86400), microseconds=rng.choice([0, 0, 500000])
        )
        random_cases.append(oracle.case(spec, zone, base))
    write("calendar_random.json", oracle, random_cases)


if __name__ == "__main__":
    main()
