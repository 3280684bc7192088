"""The dispatcher: claims due tasks of the node's topics and hands them to the workers.

One :meth:`Dispatcher.tick` is one claim round: re-read the topics to process (at most
once per ``POLL_INTERVAL``, at once after a resume or a change of leadership), claim
due tasks of each (fairly, round-robin) up to the node's free capacity, stamp the
leader's term on leader-only runs, and submit them to the worker pool. It returns how
long to sleep: not at all while it claims and has room, else until the next delayed task
is due, at most the idle back-off (:meth:`~django_tasks_coord.node.state.NodeState.idle_wait`).
It runs on the thread that called :meth:`~django_tasks_coord.node.supervisor.Node.run`.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import time
from collections.abc import Callable

from django.db import DatabaseError
from django.db.models import Min

from django_tasks_coord import db, flow, queue, signals, store
from django_tasks_coord.enums import Decision, Result, TaskState
from django_tasks_coord.exceptions import OwnerExpiredError
from django_tasks_coord.handlers import HandlerNotFoundError, Registry, TaskType
from django_tasks_coord.models import Task, Topic
from django_tasks_coord.node.execution import Executor
from django_tasks_coord.node.load import Load
from django_tasks_coord.node.pool import Job, WorkerPool
from django_tasks_coord.node.state import NodeState
from django_tasks_coord.node.wakeup import WakeEvent
from django_tasks_coord.node.watch import WorkWatch
from django_tasks_coord.scheduling.names import GROUP_TOPIC_PREFIX, group_topic
from django_tasks_coord.store import flow as flow_claims

logger = logging.getLogger("django_tasks_coord.node")


class Dispatcher:
    """The node's claim loop, one round per :meth:`tick` (see the module).

    ``wake_lifeline`` is called when the node cannot prove it holds its claims any more,
    ``declared_dead`` when its owner row is gone: the lifeline registers it again.
    :attr:`pool` is set once the node runs.
    """

    def __init__(
        self,
        state: NodeState,
        handlers: Registry,
        load: Load,
        executor: Executor,
        *,
        wake_lifeline: Callable[[], None],
        declared_dead: Callable[[], None],
    ) -> None:
        self.state = state
        self.config = state.config
        self.handlers = handlers
        self.load = load
        self.executor = executor
        self.wake_lifeline = wake_lifeline
        self.declared_dead = declared_dead
        self.wake = WakeEvent(state.stopping)
        self.pool: WorkerPool | None = None
        #: The topics claimed from, as last read (paused ones excluded).
        self.topics: list[str] = []
        #: Idle back-off of the polls (see :meth:`idle_timeout`).
        self.backoff = state.backoff()
        #: Where nothing announces work: the cheap look between two polls (see :meth:`watching`).
        self.watch = WorkWatch(state)
        self._poll_at: float | None = None  # while watching: when the next full round is due
        self._watch_saw_work = False  # the last look saw a change: see round()
        self._topics_checked: float | None = None  # when the topics were read (monotonic)
        self._topics_resumed = False  # a topic was resumed: re-read the topics now
        self._round_robin = itertools.count()
        self._claimed_at = math.inf  # when the last claim round began (monotonic)
        self._reconnect = db.Reconnect("Claiming")

    # --- the round ----------------------------------------------------------------------

    def tick(self) -> float | None:
        """One claim round; the seconds to sleep after it, or None: a burst is done."""
        woken = self.wake.is_set()
        self.wake.clear()
        # Burst: read before claiming, so that a round that finds nothing has seen every
        # outcome written (ordered successors, due retries): then nothing is claimable.
        quiet = self.config.burst and self.load.count == 0
        try:
            if self._poll_at is not None:
                wait = self.watching(woken)
                if wait is not None:
                    return wait
            claimed = self.round()
        except OwnerExpiredError:  # its owner row is gone: the lifeline registers again
            self.declared_dead()
            claimed = 0
        except DatabaseError as exc:  # a lost connection, a deadlock: reconnect, go on
            self._poll_at = None
            self.state.stopping.wait(self._reconnect.failed(exc))  # no wake-up cuts it short
            return 0.0
        self._reconnect.succeeded()
        if quiet and not claimed:
            logger.info("Burst mode: nothing is due, exiting.")
            return None
        if claimed or self.load.count:
            self.backoff.reset()  # busy: look for more every POLL_INTERVAL
            if claimed and self.load.room() > 0:
                return 0.0
            if claimed:  # full: room comes with a wake-up
                return self.idle_timeout()
            return self.watch_until(self.idle_timeout())
        timeout = self.idle_timeout()
        self.backoff.idle()  # idle: the next wait is longer, up to the cap
        return self.watch_until(timeout)

    def round(self) -> int:
        """Re-read the topics if due, claim; when the work watch saw work that this claim did
        not find (a resumed topic the topics as last read leave out), read them and claim again."""
        self.refresh_topics()
        claimed = self.claim_round()
        if not claimed and self._watch_saw_work:
            self._topics_checked = None
            self.refresh_topics()
            claimed = self.claim_round()
        self._watch_saw_work = False
        return claimed

    def watch_until(self, timeout: float) -> float:
        """After a round that claimed nothing: sleep ``timeout``, or, where the work watch is
        on (:mod:`~django_tasks_coord.node.watch`) and the next look comes sooner, until
        then (the next round is due ``timeout`` from now, earlier if the look sees work)."""
        watch = self.watch
        if self.config.burst or not watch.active or timeout <= watch.period():
            return timeout
        watch.expect_nothing()
        self._poll_at = self.state.clock.monotonic() + timeout
        return watch.period()

    def watching(self, woken: bool) -> float | None:
        """A look of the work watch (one statement) between two rounds; the seconds to sleep
        on, or None: do the round now (the look saw work, a wake-up came, or it is due)."""
        assert self._poll_at is not None
        changed = self.watch.look(self.wanted())  # also what the round that follows saw first
        now = self.state.clock.monotonic()
        self._watch_saw_work = changed
        if woken or changed or now >= self._poll_at:
            self._poll_at = None
            return None
        return min(self.watch.period(), self._poll_at - now)

    def claim_round(self) -> int:
        """Claim due tasks of every topic (fairly, round-robin) up to the free capacity."""
        claimed = 0
        topics, claims = self.topics, self.state.claims
        if not topics:
            return 0
        self._claimed_at = time.monotonic()  # what its claims note counts (idle_timeout)
        start = next(self._round_robin) % len(topics)
        for topic in topics[start:] + topics[:start]:
            with claims.claiming:  # until they are queued: see Claims.claiming
                got = self._claim_topic(topic)
            if got is None:
                break
            claimed += got
        return claimed

    def _claim_topic(self, topic: str) -> int | None:
        """Claim due tasks of ``topic`` up to the free capacity and queue them on the
        workers; None when the round stops here (no room, stopping, or a zombie)."""
        claims, load = self.state.claims, self.load
        free = load.room()
        owner = claims.owner
        if owner is None or not claims.holds(owner.pk):
            self.wake_lifeline()  # a zombie claims nothing: the lifeline registers again
            return None
        if free <= 0 or self.state.stopping.is_set():
            return None
        started = self.state.clock.monotonic()
        tasks = queue.poll(
            topic, min(free, self.config.batch_size), owner=owner, heartbeat_owner=False
        )
        load.claim_seconds.add(self.state.clock.monotonic() - started)
        if tasks and topic.startswith(GROUP_TOPIC_PREFIX):
            try:
                tasks = self.stamp_term(tasks)
            except DatabaseError:
                # Claimed but neither stamped nor started: give them back now, or they
                # would stay ACTIVE under this live node, which does not hold them.
                load.claimed(len(tasks))  # release counts each one done
                self.executor.release(tasks, refund_attempt=True)
                raise
        if tasks:
            load.claimed(len(tasks))
            if signals.task_claimed.has_listeners(Task):  # asked once per claim
                for task in tasks:
                    signals.send(signals.task_claimed, Task, task=task, node=self.state.node_id)
            self.submit(tasks)
        return len(tasks)

    def stamp_term(self, tasks: list[Task]) -> list[Task]:
        """Record on just claimed leader-only runs the term they were claimed under (fencing).

        One ``UPDATE`` (:func:`~django_tasks_coord.store.stamp_term`) that stamps them only
        while this node still holds the group's token under the term it believes it leads
        under. Runs it cannot stamp so (it lost the lead between its poll and now, or never
        led) go back to the queue unstarted, their attempt refunded, for the leader: a run
        without a term is never started. Returns the runs stamped.
        """
        leadership = self.state.leadership
        term = None if leadership is None else leadership.valid_term()
        stamped = 0
        if leadership is not None and term is not None:
            stamped = store.stamp_term(
                tasks,
                group=leadership.group,
                node_id=leadership.node_id,
                term=term,
                wait=self.state.wait_unless_forced,
            )
        if stamped == len(tasks):
            for task in tasks:
                task.term = term
            return tasks
        logger.warning(
            "Giving back %s leader-only run(s) of %s: this node no longer leads under term %s.",
            len(tasks),
            tasks[0].topic_id,
            term,
            extra={"topic": tasks[0].topic_id, "node": self.state.node_id, "term": term},
        )
        self.load.claimed(len(tasks))  # release counts each one done
        self.executor.release(tasks, refund_attempt=True)
        return []

    def submit(self, tasks: list[Task]) -> None:
        """Queue ``tasks`` on the workers: one job per task, or per batch of a batch type;
        a task without a handler fails at once."""
        assert self.pool is not None
        groups: dict[TaskType | None, list[Task]] = {}
        errors: dict[int, HandlerNotFoundError] = {}
        for task in tasks:
            try:
                task_type: TaskType | None = self.handlers.for_task(task)
            except HandlerNotFoundError as exc:
                task_type, errors[task.sequence] = None, exc
            groups.setdefault(task_type, []).append(task)
        execute = self.executor.execute
        for task_type, group in groups.items():
            if task_type is None:
                for task in group:
                    failure = Decision(Result.FAILURE, exception=errors[task.sequence])
                    self.executor.finish(None, task, failure, final=True)
            elif task_type.batch:
                self.pool.submit(Job(functools.partial(execute, task_type, group), group))
            else:
                for task in group:
                    self.pool.submit(Job(functools.partial(execute, task_type, [task]), [task]))

    # --- topics -------------------------------------------------------------------------

    def on_topic(self, topic: str | None) -> None:
        """A NOTIFY (or a local commit) about ``topic`` (None: any): claim now if it is ours."""
        if topic is None or topic in self.topics:
            self.wake.set()

    def on_resumed(self, topic: str) -> None:
        """A topic was resumed: re-read the topics (paused ones excluded) and claim now."""
        self._topics_resumed = True
        self.wake.set()

    def topics_changed(self) -> None:
        """Re-read the topics at the next round (the group topic comes or goes), now."""
        self._topics_checked = None
        self.wake.set()

    def forget_topic(self, topic: str) -> None:
        """Stop claiming ``topic`` at once and release its buffered tasks."""
        self.topics = [name for name in self.topics if name != topic]
        self._topics_checked = None
        self.release_buffered({topic})

    def refresh_topics(self) -> None:
        """Re-read which topics to process (paused ones excluded) once per poll interval, and
        their flow limits (:func:`django_tasks_coord.flow.remember`: claims need no query
        of their own to know whether a topic is limited)."""
        now = self.state.clock.monotonic()
        checked = self._topics_checked
        recent = checked is not None and now - checked < self.config.poll_interval
        if recent and not self._topics_resumed:
            return
        self._topics_resumed = False  # before the read: a resumption during it reads again
        active = Topic.objects.using(db.alias()).filter(name__in=self.wanted(), paused=False)
        rows = active.values_list("name", *flow.FIELDS)
        flow.remember({name: flow.Limits.of(*limits) for name, *limits in rows}, db.alias())
        topics = sorted(name for name, *_ in rows)
        if topics != self.topics:
            logger.info(
                "Processing topics: %s.", ", ".join(topics) or "none (all paused or unknown)"
            )
        dropped = set(self.topics) - set(topics)
        self.topics, self._topics_checked = topics, now
        if dropped:
            self.release_buffered(dropped)

    def wanted(self) -> list[str]:
        """The topics this node processes when they are not paused: ``TOPICS`` (or every
        consumer's), and its group's topic while it leads."""
        wanted = [
            topic
            for topic in self.config.topics or self.handlers.consumers()
            if not topic.startswith(GROUP_TOPIC_PREFIX)  # only while leading, below
        ]
        leadership = self.state.leadership
        if leadership is not None and leadership.valid_term() is not None:
            wanted.append(group_topic(leadership.group))
        return wanted

    def release_buffered(self, dropped: set[str]) -> None:
        """Give back the claimed, not yet started tasks of topics this node stopped
        processing (paused, or a group topic after losing the lead): they do not start."""
        if self.pool is None:
            return
        jobs = self.pool.take_queued(lambda job: job.payload[0].topic_id in dropped)
        tasks = [task for job in jobs for task in job.payload]
        if tasks:
            logger.info(
                "Releasing %s buffered task(s) of %s.", len(tasks), ", ".join(sorted(dropped))
            )
            self.executor.release(tasks, refund_attempt=True)

    def idle_timeout(self) -> float:
        """Seconds to sleep: until the next delayed task is due, or a claim of the last claim
        round that a flow limit held back may find room
        (:func:`~django_tasks_coord.store.flow.next_look`), at most the idle wait."""
        timeout = self.state.idle_wait(self.backoff, watched=self.watch.active)
        if self.load.count >= self.load.capacity or not self.topics:
            return timeout
        # A limit may have room by then: a moment its last claim round noted (at least
        # RECHECK_AFTER ahead), not an old one of a topic unlimited since.
        held_back = flow_claims.next_look(self.topics, since=self._claimed_at)
        if held_back is not None:
            timeout = min(timeout, held_back)
        pending = Task.objects.using(db.alias()).filter(
            topic_id__in=self.topics, state=TaskState.PENDING, execute_at__isnull=False
        )
        try:
            next_due = pending.aggregate(next=Min("execute_at"))["next"]
        except DatabaseError:  # the next claim round reconnects and backs off
            db.reset_connection()
            return min(timeout, self.config.poll_interval)
        if next_due is not None:
            timeout = min(timeout, max((next_due - self.state.clock.now()).total_seconds(), 0.0))
        return timeout
