"""The :class:`Timer` interface shared by every kind of timer, and zone/instant helpers.

A timer is an immutable value: it answers "when next, strictly after this instant?"
(:meth:`Timer.next_after`) and prints as a canonical specification (``str(timer)``)
that :func:`django_tasks_coord.timers.parse` reads back into an equal timer.

Instants are aware :class:`~datetime.datetime` objects. Internally they are handled
as integer microseconds since the Unix epoch, which is exact (no float rounding) and
matches systemd's ``usec_t`` arithmetic.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Hashable, Iterator
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django_tasks_coord.exceptions import TimerError

__all__ = ["UTC", "Timer", "Zone", "ZoneLike", "default_zone", "get_zone", "zone_name"]

#: The zones timers compute in: IANA zones and fixed offsets (``datetime.UTC`` included).
Zone = ZoneInfo | timezone
#: What the ``tz`` argument of the timers accepts: a zone or an IANA name.
ZoneLike = str | ZoneInfo | timezone

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_FIXED_OFFSET = re.compile(r"UTC([+-])([0-9]{2}):([0-9]{2})(?::([0-9]{2}))?")
ONE_USEC = timedelta(microseconds=1)
USEC_PER_SEC = 1_000_000


def default_zone() -> Zone:
    """The zone used when a timer is given none: Django's ``TIME_ZONE``, else UTC.

    ``settings.TIME_ZONE`` is read on every call (never at import time), and only when
    Django settings are configured; without settings, or with ``TIME_ZONE = None``,
    the default is UTC.
    """
    from django.conf import settings

    if settings.configured:
        name = getattr(settings, "TIME_ZONE", None)
        if name:
            return get_zone(name)
    return UTC


def get_zone(tz: ZoneLike | None) -> Zone:
    """Turn a ``tz`` argument into a zone; ``None`` means :func:`default_zone`.

    Accepts an IANA name (``"Europe/Berlin"``, ``"UTC"``), a fixed offset written as
    :func:`zone_name` prints it (``"UTC+05:30"``), a :class:`zoneinfo.ZoneInfo` or a
    :class:`datetime.timezone`. Raises :class:`TimerError` otherwise.
    """
    if tz is None:
        return default_zone()
    if isinstance(tz, ZoneInfo | timezone):
        return tz
    if isinstance(tz, str):
        if tz.upper() == "UTC":
            return UTC
        fixed = _FIXED_OFFSET.fullmatch(tz)
        if fixed:  # what zone_name() prints for a datetime.timezone
            sign, hours, minutes, seconds = fixed.groups()
            offset = timedelta(hours=int(hours), minutes=int(minutes), seconds=int(seconds or 0))
            if offset < timedelta(hours=24):
                return timezone(-offset if sign == "-" else offset)
        try:
            return ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
            raise TimerError(
                f"Unknown time zone {tz!r}: use 'UTC' or an IANA name such as 'Europe/Berlin'."
            ) from exc
    raise TimerError(
        f"A time zone must be an IANA name, a zoneinfo.ZoneInfo or a datetime.timezone, "
        f"not {type(tz).__name__}."
    )


def zone_name(tz: tzinfo) -> str:
    """A zone's canonical name: the IANA key, ``"UTC"`` or ``"UTC+01:00"``.

    :func:`get_zone` reads it back.
    """
    if tz is UTC:
        return "UTC"
    key = getattr(tz, "key", None)
    if isinstance(key, str):
        return key
    return str(tz)


def require_aware(dt: object, what: str = "dt") -> datetime:
    """Return ``dt`` if it is an aware datetime, else raise :class:`TimerError`."""
    if not isinstance(dt, datetime):
        raise TimerError(f"{what} must be an aware datetime, not {type(dt).__name__}.")
    if dt.utcoffset() is None:
        raise TimerError(
            f"{what} must be an aware datetime, got the naive {dt.isoformat()!r}; "
            "use django.utils.timezone.now() or attach a zone (dt.replace(tzinfo=...))."
        )
    return dt


def to_usec(dt: datetime) -> int:
    """Microseconds since the Unix epoch of an aware datetime (exact)."""
    return (dt - EPOCH) // ONE_USEC


def from_usec(usec: int, tz: tzinfo) -> datetime:
    """The aware datetime ``usec`` microseconds after the epoch, expressed in ``tz``."""
    return (EPOCH + timedelta(microseconds=usec)).astimezone(tz)


class Timer(abc.ABC):
    """The interface of every timer: calendar events, cron expressions, intervals, one-time.

    Timers are immutable and hashable; two timers are equal when they have the same
    canonical specification (``str``) and the same zone, hence the same elapses.
    """

    __slots__ = ()

    @property
    @abc.abstractmethod
    def tz(self) -> tzinfo:
        """The zone in which the timer's wall-clock fields are read; results are in it."""

    @abc.abstractmethod
    def next_after(self, dt: datetime) -> datetime | None:
        """The first elapse strictly after the aware datetime ``dt``, or ``None`` if none.

        The result is an aware datetime in :attr:`tz`. A naive ``dt`` raises
        :class:`TimerError`.
        """

    @abc.abstractmethod
    def __str__(self) -> str:
        """The canonical specification; ``parse(str(t), tz=t.tz)`` equals ``t``."""

    @abc.abstractmethod
    def _key(self) -> Hashable:
        """The value that equality and hashing are based on."""

    def elapses(self, after: datetime, count: int | None = None) -> Iterator[datetime]:
        """Successive elapses strictly after ``after`` (at most ``count`` of them)."""
        current = require_aware(after, "after")
        produced = 0
        while count is None or produced < count:
            found = self.next_after(current)
            if found is None:
                return
            produced += 1
            yield found
            current = found

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r}, tz={zone_name(self.tz)!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Timer):
            return NotImplemented
        return type(self) is type(other) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._key()))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} objects are immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} objects are immutable")

    def _init(self, **values: Any) -> None:
        """Set slots once, from ``__init__`` (normal assignment is refused)."""
        for name, value in values.items():
            object.__setattr__(self, name, value)
