"""What the duties of one node share: its settings, clock, stop request, owner and group role.

The supervisor (:class:`~django_tasks_coord.node.supervisor.Node`) creates one
:class:`NodeState` and hands it to each duty; the owner and the leadership change when
the node registers again, so duties read them here at each use rather than keeping them.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

from django_tasks_coord.models import Owner
from django_tasks_coord.node.backoff import IdleBackoff
from django_tasks_coord.node.claims import Claims
from django_tasks_coord.node.clock import Clock
from django_tasks_coord.node.config import NodeConfig
from django_tasks_coord.node.leadership import Leadership
from django_tasks_coord.node.wakeup import Listener, StopEvent
from django_tasks_coord.running import Runs


@dataclass(eq=False)
class NodeState:
    """The state one node's duties share (see the module)."""

    config: NodeConfig
    clock: Clock
    #: Set to stop; it sets each duty's wake-up event (and wakes the listener) for good.
    stopping: StopEvent = field(default_factory=StopEvent)
    #: Set when the node must stop at once (a second stop request, declared dead for good).
    force: threading.Event = field(default_factory=threading.Event)
    #: ``processed``, ``failed``, ``retried``: the status line and the final log line.
    stats: Counter[str] = field(default_factory=Counter)
    owner: Owner | None = None
    leadership: Leadership | None = None
    #: The LISTEN thread on PostgreSQL, once started.
    listener: Listener | None = None
    #: Whether the node can still prove it holds its claims (its clock against its heartbeat).
    claims: Claims = field(init=False)
    #: Live owners in the cluster, as the node's last sweep counted them (at least itself).
    live_nodes: int = 1
    #: The tasks its workers run: cancel flags and progress, shared with the lifeline.
    runs: Runs = field(default_factory=Runs)

    def __post_init__(self) -> None:
        self.claims = Claims(self.config.liveness_interval, self.clock.monotonic)

    @property
    def node_id(self) -> str | None:
        """This node's id (its owner's name) once it runs."""
        return self.owner.name if self.owner is not None else None

    def wait_unless_forced(self, seconds: float) -> bool:
        """Wait ``seconds``; True, at once, if the node must stop now (see ``Node``)."""
        return self.force.wait(seconds)

    def notified(self) -> bool:
        """Whether NOTIFY wakes this node now (PostgreSQL, its listener connected)."""
        return self.listener is not None and self.listener.listening.is_set()

    def backoff(self) -> IdleBackoff:
        """An idle back-off whose cap is the larger of the two (see :meth:`idle_wait`)."""
        config = self.config
        return IdleBackoff(
            config.poll_interval, max(config.max_poll_interval, config.notified_poll_interval)
        )

    def idle_wait(self, backoff: IdleBackoff, *, watched: bool = False) -> float:
        """Seconds an idle duty waits for a wake-up before it polls anyway.

        ``backoff``'s current wait: ``POLL_INTERVAL`` doubled per idle round, up to
        ``NOTIFIED_POLL_INTERVAL`` while NOTIFY can wake the node (PostgreSQL, its LISTEN
        connection up) or the duty's work is ``watched`` (the dispatcher's work watch,
        :mod:`~django_tasks_coord.node.watch`), up to ``MAX_POLL_INTERVAL`` where nothing
        announces work (MariaDB/MySQL, SQLite, ``LISTEN_NOTIFY`` off). On PostgreSQL while
        the LISTEN connection is down nothing would wake the node: it polls every
        ``POLL_INTERVAL``.
        """
        config = self.config
        if self.notified() or watched:
            return backoff.wait
        if self.listener is not None:  # PostgreSQL, its LISTEN connection down
            return config.poll_interval
        return min(backoff.wait, max(config.max_poll_interval, config.poll_interval))
