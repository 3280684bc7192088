"""The syntax of systemd calendar events: parsing, normalization and validation.

Accepts exactly what systemd 252's ``calendar_spec_from_string`` accepts (checked
against ``systemd-analyze calendar`` by ``tests/timers``), with error messages that
name the offending part. The normalized form is printed by ``calendar.py``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import NoReturn
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django_tasks_coord.exceptions import TimerError
from django_tasks_coord.timers._calendar_spec import (
    MAX_YEAR,
    MIN_YEAR,
    CalendarSpec,
    Chain,
)

__all__ = ["WEEKDAY_NAMES", "parse_calendar_spec"]

USEC = 1_000_000
_INT_MAX = 2**31 - 1
_ULONG_MAX = 2**64 - 1
_MAX_COMPONENTS = 241  # systemd refuses longer comma-separated lists
_DIGITS = re.compile(r"[0-9]+")
_ZONE_NAME = re.compile(r"[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+)*")
WEEKDAY_NAMES = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_WEEKDAYS = (
    ("monday", 0), ("mon", 0), ("tuesday", 1), ("tue", 1), ("wednesday", 2), ("wed", 2),
    ("thursday", 3), ("thu", 3), ("friday", 4), ("fri", 4), ("saturday", 5), ("sat", 5),
    ("sunday", 6), ("sun", 6),
)  # fmt: skip
_DAILY: dict[str, tuple[int, ...]] = {"hour": (0,), "minute": (0,)}
_SHORTHANDS: dict[str, dict[str, tuple[int, ...]]] = {
    "minutely": {},
    "hourly": {"minute": (0,)},
    "daily": _DAILY,
    "monthly": {"day": (1,), **_DAILY},
    "weekly": {"weekdays": (0,), **_DAILY},
    "yearly": {"month": (1,), "day": (1,), **_DAILY},
    "annually": {"month": (1,), "day": (1,), **_DAILY},
    "anually": {"month": (1,), "day": (1,), **_DAILY},  # sic, systemd accepts it
    "quarterly": {"month": (1, 4, 7, 10), "day": (1,), **_DAILY},
    "semiannually": {"month": (1, 7), "day": (1,), **_DAILY},
    "semi-annually": {"month": (1, 7), "day": (1,), **_DAILY},
    "biannually": {"month": (1, 7), "day": (1,), **_DAILY},
    "bi-annually": {"month": (1, 7), "day": (1,), **_DAILY},
}
_FIELDS = (  # name, minimum, maximum
    ("year", MIN_YEAR, MAX_YEAR),
    ("month", 1, 12),
    ("day", 1, 31),
    ("hour", 0, 23),
    ("minute", 0, 59),
    ("second", 0, 60 * USEC - 1),
)

# A component while parsing: start, stop, repeat, and its span in the text.
_Raw = tuple[int, int, int, int, int]


def _ascii_lower(text: str) -> str:
    return text.lower() if text.isascii() else text


def _weekday_at(text: str, pos: int) -> tuple[str, int] | None:
    """The (lower-case name, number) of the weekday name starting at ``pos``, if any."""
    for name, number in _WEEKDAYS:
        if _ascii_lower(text[pos : pos + len(name)]) == name:
            return name, number
    return None


class _Parser:
    """Reads one calendar event; every error names the offending part of the text."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.body = text  # the text without its time-zone suffix
        self.weekdays = 0
        self.chains: dict[str, list[_Raw] | None] = dict.fromkeys(
            ("year", "month", "day", "hour", "minute", "second")
        )
        self.end_of_month = False
        self.utc = False
        self.timezone: str | None = None
        self._range_start = 0  # where the weekday range being read starts

    def fail(self, start: int, end: int, reason: str) -> NoReturn:
        part = self.text[start:end] if end > start else self.text[start : start + 1]
        where = f" at {part!r} (character {start + 1})" if part else " at the end"
        raise TimerError(f"Invalid calendar event {self.text!r}: {reason}{where}.")

    # -- top level ------------------------------------------------------------------

    def parse(self) -> CalendarSpec:
        self._split_zone()
        body = self.body
        if not body:
            self.fail(0, len(self.text), "the event is empty")
        if body != body.strip(" ") and _ascii_lower(body.strip(" ")) in _SHORTHANDS:
            self.fail(0, len(body), "no spaces are allowed around a shorthand")
        shorthand = _SHORTHANDS.get(_ascii_lower(body))
        if shorthand is not None:
            self.chains["second"] = [(0, -1, 0, 0, len(body))]
            for name, values in shorthand.items():
                if name == "weekdays":
                    self.weekdays = 1 << values[0]
                else:
                    self.chains[name] = [(v, -1, 0, 0, len(body)) for v in values]
        else:
            pos = self._weekdays(0)
            pos, done = self._date(pos)
            if not done:
                pos = self._time(pos)
            if pos != len(body):
                self.fail(pos, len(body), "unexpected text")
        return self._normalize()

    def _split_zone(self) -> None:
        text = self.text
        if len(text) >= 4 and _ascii_lower(text[-4:]) == " utc":
            self.utc, self.body = True, text[:-4]
            return
        space = text.rfind(" ")
        name = text[space + 1 :]
        if space >= 0 and _is_zone_name(name):
            self.timezone, self.body = name, text[:space]

    # -- weekdays ---------------------------------------------------------------------

    def _weekdays(self, pos: int) -> int:
        body, end = self.body, len(self.body)
        range_from = -1
        first = True
        while True:
            found = _weekday_at(body, pos)
            if found is None:
                if first:
                    return pos
                self.fail(pos, _word_end(body, pos), "expected a weekday name")
            name, number = found
            after = pos + len(name)
            if body[after : after + 1] not in ("", "-", ".", ",", " "):
                self.fail(pos, _word_end(body, pos), "unknown weekday name")
            self.weekdays |= 1 << number
            if range_from >= 0:
                if range_from > number:
                    self.fail(
                        self._range_start, after, "a weekday range must go from Monday to Sunday"
                    )
                for day in range(range_from + 1, number):
                    self.weekdays |= 1 << day
            start, pos = pos, after
            if pos == end:
                return pos
            char = body[pos]
            if char == " ":
                return _skip_spaces(body, pos)
            if char in ".-":
                if range_from >= 0:
                    self.fail(
                        self._range_start,
                        _word_end(body, pos),
                        "a weekday range cannot be continued (write 'Mon..Wed,Fri')",
                    )
                if char == "." and body[pos + 1 : pos + 2] != ".":
                    self.fail(pos, pos + 1, "a weekday range is written 'Mon..Fri'")
                range_from, self._range_start = number, start
                pos += 2 if char == "." else 1
            else:  # ","
                range_from = -1
                pos += 1
            if pos == end or body[pos] == " ":
                if range_from >= 0:
                    self.fail(self._range_start, pos, "the weekday range has no end")
                return _skip_spaces(body, pos)
            first = False

    # -- date ---------------------------------------------------------------------------

    def _date(self, pos: int) -> tuple[int, bool]:
        """Parse the date, if any; ``done`` is True after an ``@epoch`` timestamp."""
        body, end = self.body, len(self.body)
        if pos == end:
            return pos, False
        if body[pos] == "@":
            return self._epoch(pos), True
        first, after = self._chain(pos, "date")
        if after == end or body[after] == ":":
            return pos, False  # it was the time
        parts = [first]
        while True:
            separator = body[after]
            if separator == "~":
                if self.end_of_month:
                    self.fail(after, after + 1, "'~' may only separate the month and the day")
                self.end_of_month = True
            elif separator != "-":
                self.fail(pos, after, "a date is written 'YYYY-MM-DD' or 'MM-DD'")
            chain, after = self._chain(after + 1, "date")
            parts.append(chain)
            if after == end or body[after] == " ":
                break
            if len(parts) == 3 or self.end_of_month:
                self.fail(pos, _word_end(body, pos), "a date is written 'YYYY-MM-DD' or 'MM-DD'")
        if len(parts) == 3:
            self.chains["year"] = parts[0]
        self.chains["month"], self.chains["day"] = parts[-2], parts[-1]
        return _skip_spaces(body, after), False

    def _epoch(self, pos: int) -> int:
        body = self.body
        at = pos
        pos += 1
        while body[pos : pos + 1] in (" ", "\t", "\n", "\v", "\f", "\r"):
            pos += 1
        negative = body[pos : pos + 1] == "-"
        if body[pos : pos + 1] in ("+", "-"):
            pos += 1
        match = _DIGITS.match(body, pos)
        if not match:
            self.fail(at, pos + 1, "'@' must be followed by seconds since the epoch")
        value = int(match.group())
        if value > _ULONG_MAX or (negative and value != 0) or value > 7258118399:
            self.fail(at, match.end(), "an '@' timestamp must be within @0..@7258118399")
        moment = datetime.fromtimestamp(value, UTC)
        for name, number in zip(
            ("year", "month", "day", "hour", "minute"),
            (moment.year, moment.month, moment.day, moment.hour, moment.minute),
            strict=True,
        ):
            self.chains[name] = [(number, -1, 0, at, match.end())]
        self.chains["second"] = [(moment.second * USEC, -1, 0, at, match.end())]
        self.utc = True
        return match.end()

    # -- time ---------------------------------------------------------------------------

    def _time(self, pos: int) -> int:
        body, end = self.body, len(self.body)
        if pos == end:
            for name in ("hour", "minute", "second"):
                self.chains[name] = [(0, -1, 0, pos, pos)]
            return pos
        hour, after = self._chain(pos, "hour")
        if body[after : after + 1] != ":":
            self.fail(pos, _word_end(body, pos), "a time is written 'HH:MM' or 'HH:MM:SS'")
        minute, after = self._chain(after + 1, "minute")
        second: list[_Raw] | None = [(0, -1, 0, after, after)]
        if after < end:
            if body[after] != ":":
                self._trailing(after)
            second, after = self._chain(after + 1, "second")
            if after < end:
                self._trailing(after)
        self.chains["hour"], self.chains["minute"], self.chains["second"] = hour, minute, second
        return after

    def _trailing(self, pos: int) -> NoReturn:
        rest = self.body[pos:]
        if rest.startswith(" ") and rest.strip() and " " not in rest.strip():
            self.fail(
                pos + 1,
                len(self.body),
                "unknown time zone (use 'UTC' or an IANA name such as 'Europe/Berlin')",
            )
        self.fail(pos, len(self.body), "unexpected text after the time")

    # -- values ---------------------------------------------------------------------------

    def _chain(self, pos: int, field: str) -> tuple[list[_Raw] | None, int]:
        """A ``*`` or comma-separated ``value[..stop][/repeat]`` list."""
        body = self.body
        usec = field == "second"
        if body[pos : pos + 1] == "*":
            return ([(0, -1, USEC, pos, pos + 1)] if usec else None), pos + 1
        chain: list[_Raw] = []
        while True:
            if len(chain) == _MAX_COMPONENTS:
                self.fail(pos, _word_end(body, pos), f"at most {_MAX_COMPONENTS} values per field")
            begin = pos
            start, pos = self._decimal(pos, usec, field)
            stop, repeat = -1, 0
            if body.startswith("..", pos):
                stop, pos = self._decimal(pos + 2, usec, field)
                repeat = USEC if usec else 1
            if body[pos : pos + 1] == "/":
                repeat, pos = self._decimal(pos + 1, usec, field)
                if repeat == 0:
                    self.fail(begin, pos, "a repetition must not be zero")
            elif start > _INT_MAX - repeat:
                self.fail(begin, pos, "number too large")
            elif usec and stop >= 0 and start + repeat > stop:
                self.fail(begin, pos, "a range of seconds must span at least one second")
            if body[pos : pos + 1] not in ("", " ", ",", "-", "~", ":"):
                self.fail(pos, pos + 1, f"unexpected character in the {field}")
            chain.append((start, stop, repeat, begin, pos))
            if body[pos : pos + 1] != ",":
                return chain, pos
            pos += 1

    def _decimal(self, pos: int, usec: bool, field: str) -> tuple[int, int]:
        body = self.body
        match = _DIGITS.match(body, pos)
        if not match:
            self.fail(pos, _word_end(body, pos), f"expected a number in the {field}")
        value = int(match.group())
        pos = match.end()
        if value > _ULONG_MAX or (usec and value * USEC > _ULONG_MAX):
            self.fail(match.start(), pos, "number too large")
        if usec:
            value *= USEC
            if body[pos : pos + 1] == "." and body[pos + 1 : pos + 2] != ".":
                fraction = _DIGITS.match(body, pos + 1)
                if not fraction:
                    self.fail(pos, pos + 2, "expected digits after the decimal point")
                digits = fraction.group()
                value += int(digits[:6].ljust(6, "0")) + (digits[6:7] >= "5")  # round to 1µs
                pos = fraction.end()
        if value > _INT_MAX:
            self.fail(match.start(), pos, "number too large")
        return value, pos

    # -- normalization and validation ---------------------------------------------------------

    def _normalize(self) -> CalendarSpec:
        chains = self.chains
        if chains["day"] is None:
            self.end_of_month = False
        if chains["year"] is not None:  # two-digit years: 70..99 -> 19xx, 0..69 -> 20xx
            chains["year"] = [
                (_full_year(start), _full_year(stop), repeat, a, b)
                for start, stop, repeat, a, b in chains["year"]
            ]
        result: dict[str, Chain] = {}
        for name, low, high in _FIELDS:
            raw = chains[name]
            if raw is None:
                result[name] = None
                continue
            normalized = _normalize_chain(raw)
            eom = name == "day" and self.end_of_month
            for component in normalized:
                if eom:
                    # "~" days count at most 28 back; systemd lowers that bound by 3
                    # again for each further value of the list (a quirk we mirror:
                    # "*-*~04,17,28" is rejected, the third value must be <= 22).
                    high -= 3
                self._validate(name, component, low, high, eom)
            result[name] = tuple(c[:3] for c in normalized)
        weekdays = self.weekdays if 0 < self.weekdays < 127 else 0
        usec = result["second"]
        assert usec is not None
        return CalendarSpec(
            weekdays=weekdays,
            year=result["year"],
            month=result["month"],
            day=result["day"],
            end_of_month=self.end_of_month,
            hour=result["hour"],
            minute=result["minute"],
            usec=usec,
            utc=self.utc,
            timezone=self.timezone,
        )

    def _validate(self, name: str, component: _Raw, low: int, high: int, eom: bool) -> None:
        start, stop, repeat, a, b = component
        scale = USEC if name == "second" else 1
        field = "day (counted from the end of the month)" if eom else name
        bounds = f"{low // scale}..{high // scale}"
        if not low <= start <= high or (stop >= 0 and not low <= stop <= high):
            self.fail(a, b, f"the {field} must be within {bounds}")
        if repeat > high - low:
            self.fail(a, b, f"the repetition is longer than the {field} range {bounds}")
        if stop >= 0 and start + repeat > stop:
            self.fail(a, b, f"the {field} range is empty or backwards")
        if stop < 0 and (start - repeat < low if eom else start + repeat > high):
            self.fail(a, b, f"the {field} never repeats within {bounds}")


def _full_year(year: int) -> int:
    if 0 <= year < 70:
        return year + 2000
    if 70 <= year < 100:
        return year + 1900
    return year


def _normalize_chain(chain: list[_Raw]) -> list[_Raw]:
    """systemd's normalize_chain: trim ranges to whole repetitions, sort, drop duplicates."""
    out: list[_Raw] = []
    for start, stop, repeat, a, b in chain:
        if stop > start and repeat > 0:
            stop -= (stop - start) % repeat
            if start + repeat > stop:
                stop, repeat = -1, 0
        if start == stop:
            stop, repeat = -1, 0
        out.append((start, stop, repeat, a, b))
    out.sort(key=lambda c: c[:3])
    return [c for i, c in enumerate(out) if i == 0 or out[i - 1][:3] != c[:3]]


def _skip_spaces(text: str, pos: int) -> int:
    while text[pos : pos + 1] == " ":
        pos += 1
    return pos


def _word_end(text: str, pos: int) -> int:
    end = text.find(" ", pos)
    return len(text) if end < 0 else end


def _is_zone_name(name: str) -> bool:
    """systemd's check for an IANA zone suffix: a plain name with a TZif file behind it."""
    if not name.isascii() or not _ZONE_NAME.fullmatch(name):
        return False
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # unknown, directory, not TZif
        return False
    return True


def parse_calendar_spec(text: str) -> CalendarSpec:
    """Parse and normalize a calendar event exactly as systemd does.

    Raises :class:`TimerError` for anything systemd rejects, naming the offending part.
    """
    if not isinstance(text, str):
        raise TimerError(f"A calendar event must be a string, not {type(text).__name__}.")
    if "\x00" in text:
        raise TimerError(f"Invalid calendar event {text!r}: it contains a NUL character.")
    return _Parser(text).parse()
