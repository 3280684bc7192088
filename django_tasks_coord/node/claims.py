"""Whether a node can still prove that it holds its claims: its own clock against its heartbeat.

Other nodes declare a node dead once its heartbeat (on the database clock) is older than
``LIVENESS_INTERVAL``, and give its tasks to others. A node frozen that long (SIGSTOP, a
long GC pause, a paused VM) cannot ask the database whether that happened before it acts
on a claim, but its own clock tells it that it *may* have: more than the liveness interval
has passed since the start of its last successful heartbeat. Such a node is a zombie. It
starts nothing more from the claims it made before (neither a buffered task nor a batch it
just claimed), gives back what it still holds, and registers again as a fresh node
(:meth:`django_tasks_coord.node.supervisor.Node._rejoin`).

The clock is the node's (:class:`~django_tasks_coord.node.clock.Clock`); the real one is
``CLOCK_BOOTTIME`` where there is one (Linux): unlike ``CLOCK_MONOTONIC`` it also counts the
time the machine was suspended.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

from django_tasks_coord.models import Owner
from django_tasks_coord.node.clock import boot_seconds

__all__ = ["Claims", "clock"]

#: Seconds that never go back and count suspended time where they can (the default clock).
clock = boot_seconds


class Claims:
    """The owner a node claims tasks for, and whether its claims still stand.

    A claim stands while the owner is the node's current one and less than ``liveness``
    seconds passed (on :func:`clock`) since its last successful heartbeat *started*
    (the database stamps the heartbeat later than that, so the node always counts itself
    dead no later than the others may).
    """

    def __init__(self, liveness: float, now: Callable[[], float] = clock) -> None:
        self.liveness = liveness
        self.now = now
        self._lock = threading.Lock()
        #: Held by the dispatcher from its check that its claims stand until the tasks it
        #: claimed are on the workers' queue, and by the node registering again while it
        #: loses its claims and takes its buffered tasks back: so no claim in flight slips
        #: past the tasks given back (its attempt would be used without having started).
        self.claiming = threading.Lock()
        self._owner: Owner | None = None
        self._last_beat = -math.inf

    @property
    def owner(self) -> Owner | None:
        """The owner new claims are made for; None while the node registers again."""
        return self._owner

    def registered(self, owner: Owner, at: float) -> None:
        """``owner`` was registered (its row created, heartbeat included) at ``at``."""
        with self._lock:
            self._owner, self._last_beat = owner, at

    def beaten(self, owner: Owner, at: float) -> None:
        """A heartbeat of ``owner`` that started at ``at`` succeeded."""
        with self._lock:
            if owner is self._owner:
                self._last_beat = max(self._last_beat, at)

    def lose(self) -> Owner | None:
        """The node counts as dead: nothing claimed so far may start. Returns the lost owner."""
        with self._lock:
            owner, self._owner, self._last_beat = self._owner, None, -math.inf
        return owner

    def silence(self) -> float:
        """Seconds since the last successful heartbeat started (inf before the first)."""
        return self.now() - self._last_beat

    @property
    def expired(self) -> bool:
        """Whether the node may have been declared dead (or knows it was)."""
        return self._owner is None or self.silence() > self.liveness

    def holds(self, owner_id: int | None) -> bool:
        """Whether a claim made for owner ``owner_id`` still stands (see the class)."""
        owner = self._owner
        return owner is not None and owner.pk == owner_id and not self.expired
