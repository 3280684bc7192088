"""Five-field cron expressions, computed by cronsim (Debian cron semantics).

Day of month and day of week (Debian/Vixie cron, as cronsim implements it): when both
fields are restricted, a day matches if *either* matches (``0 9 13 * 5`` fires on
every 13th and on every Friday); when one of them starts with ``*`` (``*``, ``*/2``),
both must match. Calendar events always require both; write ``Fri *-*-13 09:00`` for
"Friday the 13th".

Daylight saving time follows the calendar-event rule rather than cron's own habits:
the expression is matched against wall-clock time in the timer's zone, a wall time
that does not exist (skipped by a DST change) is skipped, and a wall time that exists
twice fires once, at its first occurrence (or at the second, when the search starts
inside the repeated hour). See ``docs/timers.md``.
"""

from __future__ import annotations

from collections.abc import Hashable
from datetime import UTC, datetime

from cronsim import CronSim, CronSimError

from django_tasks_coord.exceptions import TimerError
from django_tasks_coord.timers.base import (
    Timer,
    Zone,
    ZoneLike,
    get_zone,
    require_aware,
    to_usec,
    zone_name,
)

__all__ = ["NICKNAMES", "CronExpression"]

#: The ``@`` nicknames and the expressions they stand for (cronsim has none).
NICKNAMES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_FIELDS = ("minute", "hour", "day-of-month", "month", "day-of-week")
_CRONSIM_FIELDS = ("second", *_FIELDS)
_VALIDATION_BASE = datetime(2000, 1, 1)
_MAX_CANDIDATES = 10_000  # wall times skipped by DST are few; this only bounds the loop
_EARLIEST = datetime(1, 1, 3, tzinfo=UTC)  # any zone's wall clock is still representable


def _restore(expression: str, tz: Zone) -> CronExpression:
    return CronExpression(expression, tz=tz)


class CronExpression(Timer):
    """A cron expression (``"0 9 * * 1-5"``) or nickname (``"@daily"``) in a zone.

    Fields: minute, hour, day of month, month, day of week (0 or 7 = Sunday, names
    ``JAN``/``MON`` allowed), with ``*``, lists, ranges, steps, and cronsim's ``L``,
    ``LW`` and ``#`` extensions. See the module docstring for the day and DST rules.
    """

    __slots__ = ("_expression", "_fields", "_tz")
    _expression: str
    _fields: str
    _tz: Zone

    def __init__(self, expression: str, *, tz: ZoneLike | None = None) -> None:
        if not isinstance(expression, str):
            raise TimerError(
                f"A cron expression must be a string, not {type(expression).__name__}."
            )
        text = " ".join(expression.split())
        if text.startswith("@"):
            fields = NICKNAMES.get(text.lower())
            if fields is None:
                reason = (
                    "@reboot is not a schedule" if text.lower() == "@reboot" else "unknown nickname"
                )
                raise TimerError(
                    f"Invalid cron expression {expression!r}: {reason}; "
                    f"known nicknames: {', '.join(NICKNAMES)}."
                )
            text = text.lower()
        else:
            parts = text.split()
            if len(parts) != 5:
                raise TimerError(
                    f"Invalid cron expression {expression!r}: {len(parts)} fields, expected "
                    f"5 ({' '.join(_FIELDS)})."
                )
            fields = text
            _validate(expression, fields)
        self._init(_expression=text, _fields=fields, _tz=get_zone(tz))

    @property
    def tz(self) -> Zone:
        """The zone whose wall clock the expression is matched against."""
        return self._tz

    @property
    def fields(self) -> str:
        """The five fields (a nickname spelled out)."""
        return self._fields

    def next_after(self, dt: datetime) -> datetime | None:
        """The first matching wall time strictly after ``dt`` (DST rule: see the module)."""
        after = to_usec(require_aware(dt))
        try:
            wall = max(dt, _EARLIEST).astimezone(self._tz).replace(tzinfo=None)
            candidates = CronSim(self._fields, wall)
            for _ in range(_MAX_CANDIDATES):
                found = self._resolve(next(candidates), after)
                if found is not None:
                    return found
        except StopIteration:  # cronsim gives up after 50 years without a match
            return None
        except OverflowError:  # the search ran past year 9999
            return None
        return None

    def _resolve(self, wall: datetime, after: int) -> datetime | None:
        """The instant of a wall time after ``after``: None if it does not exist."""
        first = wall.replace(tzinfo=self._tz, fold=0)
        if first.astimezone(UTC).astimezone(self._tz).replace(tzinfo=None) != wall:
            return None  # skipped by a DST change
        if to_usec(first) > after:
            return first
        second = wall.replace(tzinfo=self._tz, fold=1)
        if to_usec(second) > after:
            return second  # repeated wall time; the search started in its second pass
        return None

    def __str__(self) -> str:
        return self._expression

    def _key(self) -> Hashable:
        return (self._expression, zone_name(self._tz))

    def __reduce__(self) -> tuple[object, tuple[str, Zone]]:
        return _restore, (self._expression, self._tz)


def _validate(expression: str, fields: str) -> None:
    try:
        CronSim(fields, _VALIDATION_BASE)
    except CronSimError as exc:
        message = str(exc)
        parts = fields.split()
        for index, name in enumerate(_CRONSIM_FIELDS):
            if message == f"Bad {name}" and index > 0:
                raise TimerError(
                    f"Invalid cron expression {expression!r}: bad {name} field "
                    f"{parts[index - 1]!r} (field {index} of 5)."
                ) from exc
        raise TimerError(f"Invalid cron expression {expression!r}: {message}.") from exc
    except (ValueError, IndexError, KeyError, TypeError) as exc:  # defensive: cronsim bugs
        raise TimerError(f"Invalid cron expression {expression!r}: {exc}.") from exc
