"""A node's role in its coordination group (warm backup), refreshed by the lifeline thread.

Every heartbeat (:meth:`Leadership.tick`, called by the lifeline) the node refreshes its
``health_check`` row and tries to take (or keep) the group's token. A standby reads the
token only when the holder's lease may have run out, while NOTIFY would tell it of a
release (PostgreSQL, listening). If it cannot reach the database it steps down by itself
once its own lease would have expired, a heartbeat *before* a standby may take over,
so two nodes never both believe they lead. Time is read from an injected
:class:`~django_tasks_coord.node.clock.Clock`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from django.db import DatabaseError

from django_tasks_coord import coordination, db, signals
from django_tasks_coord.exceptions import TokenBusyError
from django_tasks_coord.models import TokenHolder
from django_tasks_coord.node.clock import SYSTEM_CLOCK, Clock

logger = logging.getLogger(__name__)


class Leadership:
    """Whether this node leads ``group``, and under which term."""

    def __init__(
        self,
        group: str,
        node_id: str,
        *,
        liveness: float,
        heartbeat: float,
        on_change: Callable[[int | None], None],
        notified: Callable[[], bool] = lambda: False,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.group, self.node_id = group, node_id
        self.clock = clock
        self.liveness, self.heartbeat = liveness, heartbeat
        self.on_change = on_change
        self._term: int | None = None
        self._last_success = self.clock.monotonic()
        #: Seconds after the last beat at which the holder's lease runs out, when that
        #: comes before the next regular beat: the lifeline beats again right then.
        self.retry_in: float | None = None
        #: Whether a release of the token would wake this node now (NOTIFY).
        self.notified = notified
        #: When (monotonic) the lease of another holder, as last read, runs out.
        self._lease_ends: float | None = None

    def start(self) -> None:
        """Join the group (the first election happens at the first :meth:`beat`)."""
        coordination.join(self.group, self.node_id)
        self.beat()

    def valid_term(self) -> int | None:
        """The term this node leads under, or None; None too once its lease may have expired."""
        if self._term is not None and self.clock.monotonic() - self._last_success > self._lease():
            self._set(None, "it could not heartbeat for a whole lease; stepping down")
        return self._term

    def _lease(self) -> float:
        """How long a leader may go without a heartbeat before it steps down (one beat early)."""
        return self.liveness - self.heartbeat

    def tick(self) -> float:
        """One heartbeat (:meth:`beat`); return the seconds until the next one is due: a
        heartbeat, or sooner when the lease another node holds runs out first
        (:attr:`retry_in`, plus 2 ms so that the lease has surely ended)."""
        self.beat()
        return self.heartbeat if self.retry_in is None else self.retry_in + 0.002

    def beat(self) -> None:
        """Heartbeat the membership, then keep the token, wait, or try to take it.

        The token is read without a lock; it is locked (:func:`coordination.try_acquire`)
        only when a takeover is possible, so a healthy group takes no row lock at all.
        A standby that read another node's lease does not read the token again until
        that lease may have run out, as long as :attr:`notified` holds (a release
        would wake it, :meth:`forget_lease`): the holder's heartbeat only pushes the
        end further away, and a takeover by a third node changes nothing for it.
        """
        liveness = timedelta(seconds=self.liveness)
        self.retry_in = None
        started = self.clock.monotonic()
        try:
            if not coordination.heartbeat(self.group, self.node_id):
                coordination.join(self.group, self.node_id)
            ends = self._lease_ends
            if self._term is None and ends is not None and started < ends and self.notified():
                if ends - started < self.heartbeat:
                    self.retry_in = ends - started
                self._last_success = self.clock.monotonic()
                return
            self._lease_ends = None
            lease = coordination.lease(self.group, liveness)
            if lease is not None and lease.node_id == self.node_id:
                term: int | None = lease.term
            elif lease is not None and lease.seconds_left > 0:
                term = None
                self._lease_ends = started + lease.seconds_left
                if lease.seconds_left < self.heartbeat:
                    self.retry_in = lease.seconds_left
            else:
                term = coordination.try_acquire(self.group, self.node_id, liveness)
        except TokenBusyError as exc:  # someone holds the token row: like a missed beat
            logger.info("Group %r: %s", self.group, exc)
            self.valid_term()
            return
        except DatabaseError as exc:
            if not db.connection_lost(exc):  # a lost connection: the lifeline reports it once
                logger.warning("Group %r: heartbeat failed (%s).", self.group, exc)
            self.valid_term()
            raise
        self._last_success = self.clock.monotonic()
        self._set(term, "another node holds the token now")

    def forget_lease(self) -> None:
        """The token changed hands (a release was announced): read it at the next beat."""
        self._lease_ends = None

    def stop(self) -> None:
        """Release the token (standbys take over at once) and leave the group."""
        self._set(None, "this node is stopping")
        coordination.leave(self.group, self.node_id)

    def _set(self, term: int | None, reason: str) -> None:
        if term == self._term:
            return
        previous, self._term = self._term, term
        if term is not None:
            logger.warning(
                "Node %s leads group %r (term %s).",
                self.node_id,
                self.group,
                term,
                extra={"group": self.group, "node": self.node_id, "term": term},
            )
        else:
            logger.warning(
                "Node %s no longer leads group %r (term %s): %s.",
                self.node_id,
                self.group,
                previous,
                reason,
                extra={"group": self.group, "node": self.node_id, "term": previous},
            )
        self.on_change(term)
        if previous is not None:
            signals.send(
                signals.leader_demoted,
                TokenHolder,
                group=self.group,
                node=self.node_id,
                term=previous,
                reason=reason,
            )
        if term is not None:
            signals.send(
                signals.leader_elected, TokenHolder, group=self.group, node=self.node_id, term=term
            )
