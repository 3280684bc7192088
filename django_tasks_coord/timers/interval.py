"""Fixed-rate intervals (``every 30s``) and one-time timers (an ISO 8601 datetime).

An :class:`Interval` fires at ``anchor + k * period`` for every integer ``k >= 0``: the
elapses are computed from the anchor, never from the previous run, so they do not
drift however late a run starts. The default anchor is the Unix epoch
(1970-01-01 00:00 UTC), so ``every 1h`` fires on the hour (UTC) and ``every 1d`` at
midnight UTC; give an anchor to place the runs elsewhere.

A :class:`OneTime` timer fires once, at its instant.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from datetime import datetime, timedelta, tzinfo

from django_tasks_coord.exceptions import TimerError
from django_tasks_coord.timers.base import (
    EPOCH,
    Timer,
    Zone,
    ZoneLike,
    from_usec,
    get_zone,
    require_aware,
    to_usec,
    zone_name,
)

__all__ = ["Interval", "OneTime", "format_duration", "parse_duration"]

_UNITS = {  # unit -> microseconds
    "w": 604_800_000_000, "week": 604_800_000_000, "weeks": 604_800_000_000,
    "d": 86_400_000_000, "day": 86_400_000_000, "days": 86_400_000_000,
    "h": 3_600_000_000, "hr": 3_600_000_000, "hrs": 3_600_000_000, "hour": 3_600_000_000,
    "hours": 3_600_000_000,
    "m": 60_000_000, "min": 60_000_000, "mins": 60_000_000, "minute": 60_000_000,
    "minutes": 60_000_000,
    "s": 1_000_000, "sec": 1_000_000, "secs": 1_000_000, "second": 1_000_000,
    "seconds": 1_000_000,
    "ms": 1_000, "msec": 1_000, "millisecond": 1_000, "milliseconds": 1_000,
    "us": 1, "usec": 1, "microsecond": 1, "microseconds": 1,
}  # fmt: skip
_CANONICAL = (("w", 604_800_000_000), ("d", 86_400_000_000), ("h", 3_600_000_000),
              ("m", 60_000_000), ("s", 1_000_000), ("ms", 1_000), ("us", 1))  # fmt: skip
_PART = re.compile(r"\s*([0-9]+)\s*([a-zA-Z]+)")
_FROM = re.compile(r"\s+from\s+", re.IGNORECASE)


def parse_duration(text: str, *, spec: str | None = None) -> timedelta:
    """``"1h30m"``, ``"90 seconds"``, ``"2d 12h"`` -> timedelta (integers and units only).

    Units: w, d, h, m, s, ms, us (and their long names). Raises :class:`TimerError`,
    quoting ``spec`` (the whole specification) when given.
    """
    position, total = 0, 0
    stripped = text.strip()
    what = f"Invalid interval {spec!r}" if spec is not None else f"Invalid duration {text!r}"
    if not stripped:
        raise TimerError(f"{what}: it needs a duration, such as 'every 30s' or 'every 1h30m'.")
    while position < len(stripped):
        match = _PART.match(stripped, position)
        unit = match and _UNITS.get(match.group(2).lower())
        if not match or unit is None:
            raise TimerError(
                f"{what}: cannot read the duration at {stripped[position:]!r}; write numbers "
                "with units w, d, h, m, s, ms or us, such as '30s', '5m' or '1h30m'."
            )
        total += int(match.group(1)) * unit
        position = match.end()
    if total <= 0:
        raise TimerError(f"{what}: an interval must be longer than zero.")
    return timedelta(microseconds=total)


def format_duration(period: timedelta) -> str:
    """The canonical spelling of a positive duration: ``"1h30m"``, ``"1w2d"``, ``"250ms"``."""
    remaining = period // timedelta(microseconds=1)
    parts = []
    for name, size in _CANONICAL:
        count, remaining = divmod(remaining, size)
        if count:
            parts.append(f"{count}{name}")
    return "".join(parts)


def _aware(value: datetime, tz: tzinfo, what: str) -> datetime:
    if not isinstance(value, datetime):
        raise TimerError(f"{what} must be a datetime, not {type(value).__name__}.")
    if value.utcoffset() is None:
        # Naive: a wall time in the timer's zone. In a DST gap, zoneinfo (fold=0) uses
        # the offset from before the change, i.e. the wall time moved forward by the gap.
        return value.replace(tzinfo=tz)
    return value


def _restore_interval(period: timedelta, anchor: datetime | None, tz: Zone) -> Interval:
    return Interval(period, anchor=anchor, tz=tz)


def _restore_one_time(at: datetime, tz: Zone) -> OneTime:
    return OneTime(at, tz=tz)


class Interval(Timer):
    """Fires every ``period``, at ``anchor + k * period`` (``k >= 0``): fixed rate, no drift.

    ``anchor`` defaults to the Unix epoch (UTC); a naive anchor is read in ``tz``.
    Before the anchor, the next elapse is the anchor itself.
    """

    __slots__ = ("_anchor", "_anchor_usec", "_period", "_period_usec", "_tz")
    _anchor: datetime | None
    _anchor_usec: int
    _period: timedelta
    _period_usec: int
    _tz: Zone

    def __init__(
        self,
        period: timedelta,
        *,
        anchor: datetime | None = None,
        tz: ZoneLike | None = None,
    ) -> None:
        if not isinstance(period, timedelta):
            raise TimerError(
                f"An interval period must be a timedelta, not {type(period).__name__}."
            )
        if period <= timedelta(0):
            raise TimerError(f"An interval period must be positive, not {period}.")
        zone = get_zone(tz)
        aware = None if anchor is None else _aware(anchor, zone, "The anchor")
        self._init(
            _period=period,
            _period_usec=period // timedelta(microseconds=1),
            _anchor=aware,
            _anchor_usec=0 if aware is None else to_usec(aware),
            _tz=zone,
        )

    @classmethod
    def from_string(cls, text: str, *, tz: ZoneLike | None = None) -> Interval:
        """Parse ``"every <duration>[ from <ISO 8601 datetime>]"``."""
        body = text.strip()
        if body[:5].lower() != "every" or not body[5:6].isspace():
            raise TimerError(
                f"Invalid interval {text!r}: write 'every <duration>', e.g. 'every 5m'."
            )
        duration, *rest = _FROM.split(body[6:], maxsplit=1)
        anchor = None
        if rest:
            try:
                anchor = datetime.fromisoformat(rest[0].strip())
            except ValueError as exc:
                raise TimerError(
                    f"Invalid interval {text!r}: {rest[0].strip()!r} is not an ISO 8601 datetime."
                ) from exc
        return cls(parse_duration(duration, spec=text), anchor=anchor, tz=tz)

    @property
    def tz(self) -> Zone:
        """The zone results are expressed in (and naive anchors are read in)."""
        return self._tz

    @property
    def period(self) -> timedelta:
        """The time between two elapses."""
        return self._period

    @property
    def anchor(self) -> datetime:
        """The first elapse; the Unix epoch unless given."""
        return EPOCH if self._anchor is None else self._anchor

    def next_after(self, dt: datetime) -> datetime | None:
        """``anchor + k * period`` for the smallest ``k >= 0`` that is after ``dt``."""
        after = to_usec(require_aware(dt))
        anchor, period = self._anchor_usec, self._period_usec
        found = anchor if after < anchor else anchor + ((after - anchor) // period + 1) * period
        try:
            return from_usec(found, self._tz)
        except OverflowError:  # past year 9999: never, as far as datetime can tell
            return None

    def __str__(self) -> str:
        text = f"every {format_duration(self._period)}"
        if self._anchor is not None:
            text += f" from {self._anchor.isoformat()}"
        return text

    def _key(self) -> Hashable:
        return (self._period_usec, self._anchor_usec, zone_name(self._tz))

    def __reduce__(self) -> tuple[object, tuple[timedelta, datetime | None, Zone]]:
        return _restore_interval, (self._period, self._anchor, self._tz)


class OneTime(Timer):
    """Fires once, at ``at``; a naive ``at`` (or ISO string without offset) is read in ``tz``."""

    __slots__ = ("_at", "_at_usec", "_tz")
    _at: datetime
    _at_usec: int
    _tz: Zone

    def __init__(self, at: datetime | str, *, tz: ZoneLike | None = None) -> None:
        zone = get_zone(tz)
        if isinstance(at, str):
            try:
                at = datetime.fromisoformat(at.strip())
            except ValueError as exc:
                raise TimerError(f"Invalid ISO 8601 datetime {at!r}: {exc}.") from exc
        aware = _aware(at, zone, "A one-time timer")
        self._init(_at=aware, _at_usec=to_usec(aware), _tz=zone)

    @property
    def tz(self) -> Zone:
        """The zone results are expressed in."""
        return self._tz

    @property
    def at(self) -> datetime:
        """The instant the timer fires at (aware)."""
        return self._at

    def next_after(self, dt: datetime) -> datetime | None:
        """``at`` if ``dt`` is before it, else ``None``."""
        if to_usec(require_aware(dt)) < self._at_usec:
            try:
                return from_usec(self._at_usec, self._tz)
            except OverflowError:  # representable in its own zone only
                return self._at
        return None

    def __str__(self) -> str:
        return self._at.isoformat()

    def _key(self) -> Hashable:
        return (self._at_usec, zone_name(self._tz))

    def __reduce__(self) -> tuple[object, tuple[datetime, Zone]]:
        return _restore_one_time, (self._at, self._tz)
