"""The scheduler loop: a node's duty of submitting due job slots, one round per tick.

Submitting (:func:`~django_tasks_coord.scheduling.scheduler.submit_due`, which locks the
due rows) happens only when a slot's time came, a schedule changed (NOTIFY, or a commit
of this process), or at the start. The waits in between are capped by the idle back-off
(:meth:`~django_tasks_coord.node.state.NodeState.idle_wait`), a safety net for changes
nobody announced (MariaDB/MySQL and SQLite have no NOTIFY): such a wake only reads when
the next job is due (:func:`~django_tasks_coord.scheduling.scheduler.next_due`).

The node (:class:`~django_tasks_coord.node.supervisor.Node`) runs it on a thread of its
own when ``SCHEDULER`` is on; this module imports nothing of the node at run time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from django.db import DatabaseError

from django_tasks_coord import db
from django_tasks_coord.scheduling import scheduler

if TYPE_CHECKING:
    from django_tasks_coord.node.backoff import IdleBackoff
    from django_tasks_coord.node.clock import Clock
    from django_tasks_coord.node.duty import WakeUp

__all__ = ["SchedulerLoop"]


class SchedulerLoop:
    """Submits due job slots for the node named ``node_name()`` (see the module).

    ``wake`` is set when a schedule changes; ``idle_wait(backoff)`` says how long an idle
    round may sleep; ``submitted()`` is called after a round submitted runs (the node's
    dispatcher claims them now). With ``burst`` the node submits the slots due at its start
    itself (:meth:`submit_due_slots`), so the first round only reads.
    """

    def __init__(
        self,
        node_name: Callable[[], str],
        *,
        clock: Clock,
        wake: WakeUp,
        stopping: threading.Event,
        backoff: IdleBackoff,
        idle_wait: Callable[[IdleBackoff], float],
        poll_interval: float,
        submitted: Callable[[], None],
        burst: bool = False,
    ) -> None:
        self.node_name = node_name
        self.clock = clock
        self.wake = wake
        self.stopping = stopping
        self.backoff = backoff
        self.idle_wait = idle_wait
        self.poll_interval = poll_interval
        self.submitted = submitted
        self._submit = not burst  # a burst submitted the due slots itself
        self._idle_after_wait = False  # the sleep before the next round counts as idle
        self._reconnect = db.Reconnect("Scheduling")

    def tick(self) -> float:
        """Submit if a slot is due or a schedule changed; return the seconds to sleep."""
        changed = self.wake.is_set()
        self.wake.clear()
        if self._idle_after_wait and not changed:
            self.backoff.idle()  # slept a whole idle wait: the next one is longer
        timeout = self.poll_interval
        failed = False
        try:
            if (self._submit or changed) and scheduler.submit_due(self.node_name()):
                self.submitted()
                changed = True
            next_due = scheduler.next_due()
        except DatabaseError as exc:
            timeout = self._reconnect.failed(exc)
            next_due, failed = None, True
        else:
            self._reconnect.succeeded()
        if changed:
            self.backoff.reset()
        if not failed:
            timeout = self.idle_wait(self.backoff)
        due_in = None if next_due is None else (next_due - self.clock.now()).total_seconds()
        # Submit next time only if that time is a slot's (or a change wakes the loop).
        self._submit = failed or (due_in is not None and due_in <= timeout)
        self._idle_after_wait = not self._submit
        if due_in is not None:
            timeout = min(timeout, max(due_in, 0.0))
        return timeout

    def submit_due_slots(self) -> None:
        """Burst: submit every job slot due now, before the first claim round.

        So a burst runs the jobs due when it starts (its scheduler thread would submit them
        too, but maybe after the dispatcher found nothing to do). A pass that leaves a job
        due skipped rows another node's pass holds (``SKIP LOCKED``), or stopped at its
        limit: pass again until none is due at the start.
        """
        now = self.clock.now()
        reconnect = db.Reconnect("Scheduling")
        while not self.stopping.is_set():
            try:
                submitted = scheduler.submit_due(self.node_name(), now=now)
                next_due = scheduler.next_due()
            except DatabaseError as exc:  # a lost connection, a deadlock: reconnect, go on
                self.stopping.wait(reconnect.failed(exc))
                continue
            reconnect.succeeded()
            if next_due is None or next_due > now:
                return
            if not submitted:  # another node is submitting them: its commit is near
                self.stopping.wait(0.05)
