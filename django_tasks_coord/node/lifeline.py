"""The lifeline: the node's heartbeat, its group leadership, the cluster's sweeps, the status line.

One :meth:`Lifeline.tick` does what is due: a heartbeat (at a fixed rate:
``HEARTBEAT_FREQUENCY`` while the node holds tasks or belongs to a group, else
:attr:`~django_tasks_coord.node.config.NodeConfig.idle_heartbeat`; at once when woken),
the group's leadership (:meth:`~django_tasks_coord.node.leadership.Leadership.tick`), a
sweep of dead owners and timeouts (:meth:`Lifeline.sweep_wait`), the status line. It
returns the seconds to the next of them. A node that finds it may have been declared
dead registers again through ``rejoin``
(:meth:`~django_tasks_coord.node.supervisor.Node._rejoin`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from datetime import timedelta

from django_tasks_coord import coordination, db, executions, owners, store
from django_tasks_coord.exceptions import TasksCoordError
from django_tasks_coord.models import Owner, Task
from django_tasks_coord.node.load import Load
from django_tasks_coord.node.state import NodeState
from django_tasks_coord.node.wakeup import WakeEvent

logger = logging.getLogger("django_tasks_coord.node")


class Lifeline:
    """The node's heartbeat, sweeps and status line, one round per :meth:`tick`.

    ``topics`` returns the topics the node claims from (the status line's queue depth),
    ``completer_idle`` whether no completion waits to be written, ``rejoin`` registers
    the node again after it may have been declared dead.
    """

    def __init__(
        self,
        state: NodeState,
        load: Load,
        *,
        topics: Callable[[], list[str]],
        completer_idle: Callable[[], bool],
        rejoin: Callable[[], None],
    ) -> None:
        self.state = state
        self.config = state.config
        self.load = load
        self.topics = topics
        self.completer_idle = completer_idle
        self.rejoin = rejoin
        self.wake = WakeEvent(state.stopping)
        #: True while it beats at the idle rate (:meth:`beat_interval`).
        self.beating_idle = False
        self._next_beat: float | None = None  # None: before the first tick
        self._next_sweep = self._last_status = 0.0
        self._reconnect = db.Reconnect("Heartbeat")
        #: (owner pk, its ``cancel_requests`` count) as the last beat read it.
        self._cancels_seen: tuple[int, int] = (0, 0)

    def busy(self) -> None:
        """The node, idle so far, holds tasks now: beat at once, then at the busy rate."""
        if self.beating_idle:
            self.wake.set()

    def tick(self) -> float:
        """Heartbeat, sweep, status line, each if due; return the seconds to the next one."""
        clock, config = self.state.clock, self.config
        now = clock.monotonic()
        if self._next_beat is None:
            self._last_status = now
            self._next_beat = now + self.beat_interval()
            self._next_sweep = now + config.reap_interval
        woken = self.wake.is_set()
        self.wake.clear()
        status = config.status_interval
        try:
            if woken or now >= self._next_beat:
                self._beat(now, woken)
            if now >= self._next_sweep:
                self._next_sweep = now + config.reap_interval  # retried then if it fails
                self._next_sweep = now + self.sweep_wait(*self.sweep())
            if status and now - self._last_status >= status:
                self._last_status = now
                self.status_line()
        except TasksCoordError:
            raise
        except Exception as exc:  # noqa: BLE001 - the database may be briefly unreachable
            # Closes the connection; the beat is retried after a beat. A wake-up asked for
            # during the failed round (registering again after being declared dead asks
            # for one) must not retry it at once: that was a busy loop through an outage,
            # a thousand failures a second.
            self._reconnect.failed(exc)
            self.wake.clear()
            self._next_beat = min(self._next_beat, now + config.heartbeat_frequency)
        else:
            self._reconnect.succeeded()
        wake_at = min(
            self._next_beat, self._next_sweep, self._last_status + status if status else math.inf
        )
        return max(wake_at - clock.monotonic(), 0.0)

    def _beat(self, now: float, woken: bool) -> None:
        assert self._next_beat is not None
        interval = self.beat_interval()
        # Fixed rate, not fixed delay: the time a beat takes does not push the next one
        # back, so a standby notices a dead leader within liveness + one beat. A wake-up
        # (work claimed, a token released) beats now and restarts the rate.
        self._next_beat = now + interval if woken else max(self._next_beat + interval, now)
        if not self.heartbeat():
            self.rejoin()
        leadership = self.state.leadership
        if leadership is not None:
            wait = leadership.tick()  # sooner than a beat when the leader's lease ends first
            self._next_beat = min(self._next_beat, self.state.clock.monotonic() + wait)

    def beat_interval(self) -> float:
        """Seconds to the next heartbeat: ``HEARTBEAT_FREQUENCY`` while the node holds tasks
        (in flight, buffered, or completions not yet written) or belongs to a group, else
        :attr:`NodeConfig.idle_heartbeat` (an idle node only has to stay alive)."""
        idle = (
            self.state.leadership is None
            and self.load.count == 0
            and self.completer_idle()
            and not self.state.runs.progress_pending
        )
        self.beating_idle = idle
        if idle and self.load.count:  # claimed meanwhile (it found beating_idle still False)
            self.beating_idle = idle = False
        return self.config.idle_heartbeat if idle else self.config.heartbeat_frequency

    def heartbeat(self) -> bool:
        """Heartbeat this node's owner; False if it may have been declared dead.

        A node silent for more than the liveness interval (frozen, or the database was
        out of reach) does not beat its old owner row back to life: the others may have
        handed its tasks out already (a sweep that met a locked task row even keeps the
        row). It counts itself dead, like a node whose row is gone.
        """
        owner, claims = self.state.owner, self.state.claims
        assert owner is not None
        if claims.expired:
            return False
        started = claims.now()
        runs = self.state.runs
        alive, cancels = owners.beat(owner, read=self.load.count > 0 or runs.count > 0)
        if not alive:
            return False
        claims.beaten(owner, started)
        self._deliver(owner, cancels)
        self._write_progress()
        return True

    def _deliver(self, owner: Owner, cancels: int | None) -> None:
        """Flag the running tasks whose cancel was requested since the last beat read the
        owner's ``cancel_requests`` (a query only when that count moved)."""
        if cancels is None:
            return
        seen_owner, seen = self._cancels_seen
        if seen_owner == owner.pk and cancels == seen:
            return
        requested = owners.cancel_requested_tasks(owner)
        self._cancels_seen = (owner.pk, cancels)
        if requested:
            new = self.state.runs.cancel(requested)
            if new:
                logger.info(
                    "Delivered %s cancel request(s) to running tasks: %s.",
                    new,
                    ", ".join(f"#{pk}" for pk in requested),
                    extra={"node": owner.name},
                )

    def flush_progress(self) -> None:
        """Write the progress reported and not written yet, whatever ``PROGRESS_INTERVAL``
        (the node stops); a failure is logged."""
        try:
            self._write_progress(at=math.inf)
        except Exception:
            logger.exception("Could not write the last progress reports.")

    def _write_progress(self, at: float | None = None) -> None:
        """Write the progress the running handlers reported (one statement for all)."""
        runs = self.state.runs
        due = runs.due_progress(self.state.clock.monotonic() if at is None else at)
        if not due:
            return
        try:
            store.progress.write(due)
        except Exception:
            runs.unwritten(due)
            raise

    def declared_dead(self) -> None:
        """This node may have been declared dead: start nothing more, and register again
        at the next beat, now."""
        lost = self.state.claims.lose()
        if lost is not None:
            # After a database outage longer than the liveness interval this is its expected
            # consequence (a WARNING); otherwise the node was frozen or starved (an ERROR).
            logger.log(
                logging.WARNING if db.OUTAGE.recent() else logging.ERROR,
                "Node %s may have been declared dead (no heartbeat for over %ss, or its owner "
                "row is gone): dropping its buffered tasks and registering again.",
                lost.name,
                self.config.liveness_interval,
                extra={"node": lost.name},
            )
        self.wake.set()

    def sweep_wait(self, live: int, rank: int = 0) -> float:
        """Seconds to this node's next sweep (dead owners, executors' timeouts, dead group
        members): these are chores of the cluster, which any node does for all.

        A node alone sweeps every ``REAP_INTERVAL``. Of ``live`` owners, the one of rank
        ``rank`` (:func:`~django_tasks_coord.owners.survey`) takes turns: the wall clock is
        cut into slots of ``REAP_INTERVAL`` seconds, slot ``k`` is swept at its start by
        the owners of ranks ``k mod live`` and ``k - 1 mod live``. So the cluster sweeps at
        the start of every slot, twice (each node every ``live / 2`` slots on average),
        and still at every slot when one of them is dead: a dead node's tasks are freed
        at the first slot start after its heartbeat is ``LIVENESS_INTERVAL`` old, at most
        ``LIVENESS_INTERVAL + REAP_INTERVAL`` after its last heartbeat (plus the sweep's
        own time and the nodes' clock skew).
        """
        period = self.config.reap_interval
        if live <= 1:
            return period
        now = self.state.clock.now().timestamp()
        slot = math.floor(now / period) + 1  # the next slot
        for ahead in range(live):
            if (slot + ahead - rank) % live in (0, 1):
                return max((slot + ahead) * period - now, 0.0)
        return period  # unreachable: one of any ``live`` consecutive slots is this node's

    def sweep(self) -> tuple[int, int]:
        """Free dead owners' tasks, forget long-dead group members, enforce executors'
        timeouts. Returns the number of live owners and this node's rank among them."""
        bound = timedelta(seconds=self.config.liveness_interval)
        _, live, rank = owners.survey(self.state.owner, bound)
        self.state.live_nodes = max(live, 1)  # the work watch looks less often in a crowd
        if self.state.leadership is not None:
            coordination.forget_dead(timedelta(seconds=10 * self.config.liveness_interval))
        executions.reap()  # timeouts of tasks run by external executors
        return live, rank

    def status_line(self) -> None:
        """Log the node's counters and its topics' queue depth (INFO; skipped, with its
        query, when nobody reads it)."""
        if not logger.isEnabledFor(logging.INFO):
            return  # nobody reads it: spare the database the count
        stats = self.state.stats
        depth = Task.objects.using(db.alias()).filter(topic_id__in=self.topics()).due().count()
        logger.info(
            "processed=%s failed=%s retried=%s in_flight=%s queue_depth=%s",
            stats["processed"],
            stats["failed"],
            stats["retried"],
            self.load.count,
            depth,
            extra={"node": self.state.node_id, **stats},
        )
