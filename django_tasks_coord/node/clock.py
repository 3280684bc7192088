"""The clock every duty of a node reads, injected so that tests can move time themselves.

A duty never calls ``time.monotonic()`` or ``timezone.now()`` directly: it asks the
:class:`Clock` it was given. The node's is :data:`SYSTEM_CLOCK`; a test passes one whose
time moves only when the test says so.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Protocol

from django.utils import timezone

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock", "boot_seconds"]


def boot_seconds() -> float:
    """Seconds on a clock that never goes back and counts suspended time where it can.

    ``CLOCK_BOOTTIME`` where there is one (Linux): unlike ``CLOCK_MONOTONIC`` it also
    counts the time the machine was suspended, so a node that was suspended knows that
    its heartbeat, its lease and its claims may have lapsed meanwhile.
    """
    if hasattr(time, "CLOCK_BOOTTIME"):
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    return time.monotonic()  # pragma: no cover - not Linux


class Clock(Protocol):
    """What a duty reads the time from."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (intervals, deadlines)."""
        ...

    def now(self) -> datetime:
        """The current aware datetime (compared with the database's times)."""
        ...


class SystemClock:
    """The real clock: :func:`boot_seconds` and ``django.utils.timezone.now``."""

    def monotonic(self) -> float:
        """See :func:`boot_seconds`."""
        return boot_seconds()

    def now(self) -> datetime:
        """``timezone.now()``."""
        return timezone.now()


#: The clock of every node that is not given another one.
SYSTEM_CLOCK: Clock = SystemClock()
