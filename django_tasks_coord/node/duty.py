"""A duty of a node: one round at a time (:meth:`Duty.tick`), on a thread the node owns.

Each background duty of a node (dispatching, the lifeline, the scheduler loop) is a small
object with a wake-up event and a ``tick()`` that does one round and says how long to
sleep before the next. :func:`run_loop` is the loop around it; tests call ``tick()``
themselves, with a fake clock, instead of running threads.
"""

from __future__ import annotations

import threading
from typing import Protocol


class WakeUp(Protocol):
    """What a duty sleeps on (a :class:`~django_tasks_coord.node.wakeup.WakeEvent`)."""

    def is_set(self) -> bool: ...

    def set(self) -> None: ...

    def clear(self) -> None: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class Duty(Protocol):
    """One background duty of a node."""

    @property
    def wake(self) -> WakeUp:
        """Set to cut the current sleep short (a NOTIFY, a freed worker, a stop request)."""
        ...

    def tick(self) -> float | None:
        """Do one round; return the seconds to sleep before the next (0: go on at once),
        or None when the duty is done (a burst found nothing more to do)."""
        ...


def run_loop(duty: Duty, stopping: threading.Event) -> None:
    """Tick ``duty`` until ``stopping`` is set or it is done, sleeping in between on its
    wake-up event (a wake-up or the stop request cuts the sleep short)."""
    while not stopping.is_set():
        wait = duty.tick()
        if wait is None:
            return
        if wait > 0:
            duty.wake.wait(wait)
