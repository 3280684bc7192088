"""The node: what one ``manage.py runscheduler`` process does.

A :class:`Node` registers itself as an :class:`~django_tasks_coord.models.Owner`,
keeps its heartbeat fresh, claims due tasks of its topics in batches, runs them on a
pool of worker threads, completes them in batches, retries failures with backoff,
frees the tasks of dead nodes, and stops cleanly. The loop only talks to the
database through :mod:`django_tasks_coord.queue` and :mod:`django_tasks_coord.owners`.

Threads: the dispatcher (the caller of :meth:`Node.run`), ``WORKERS`` workers, the
completer (batches completions), the lifeline (heartbeat, reaper, status line), the
retention housekeeper (:class:`~django_tasks_coord.retention.Housekeeper`) and, on
PostgreSQL, the listener (LISTEN/NOTIFY wake-ups).
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import DatabaseError, connections
from django.db.models import Exists, Min
from django.utils import timezone

from django_tasks_coord import coordination, db, executions, owners, queue, signals, topics
from django_tasks_coord.enums import Decision, Result, TaskState, WaitingPolicy
from django_tasks_coord.exceptions import DuplicateOwnerError, OwnerExpiredError, TasksCoordError
from django_tasks_coord.handlers import HandlerNotFoundError, Registry, TaskType, registry
from django_tasks_coord.models import Owner, Task, TokenHolder, Topic
from django_tasks_coord.node import startup
from django_tasks_coord.node.backoff import IdleBackoff
from django_tasks_coord.node.claims import Claims
from django_tasks_coord.node.completer import Completer
from django_tasks_coord.node.config import NodeConfig
from django_tasks_coord.node.leadership import Leadership
from django_tasks_coord.node.pool import Job, WorkerPool
from django_tasks_coord.node.wakeup import Listener, StopEvent, WakeEvent, listen_supported

__all__ = ["Node", "NodeConfig"]


class RunningMean:
    """An exponentially weighted mean of durations (thread-safe enough: one float store)."""

    def __init__(self, weight: float = 0.2) -> None:
        self.weight = weight
        self.value: float | None = None

    def add(self, sample: float) -> None:
        """Fold in one sample."""
        value = self.value
        self.value = sample if value is None else value + self.weight * (sample - value)


logger = logging.getLogger(__name__)

#: Exit codes of :meth:`Node.run`.
EXIT_OK = 0
EXIT_LOST_OWNERSHIP = 3
EXIT_SIDE_TASK_FAILED = 4


class Node:
    """One processing node. Create it, then call :meth:`run` (blocking) from the main thread.

    :meth:`request_stop` (the SIGTERM/SIGINT handler) stops it gracefully; a second
    call stops it at once. Both release every claim the node still holds.
    """

    def __init__(self, config: NodeConfig, handlers: Registry = registry) -> None:
        self.config = config
        self.handlers = handlers
        self.owner: Owner | None = None
        self.stats: Counter[str] = Counter()
        self.exit_code = EXIT_OK
        #: Set to stop; it sets each loop's wake-up event (and wakes the listener) for good.
        self._stopping = StopEvent()
        self._force = threading.Event()
        self._wakeup = WakeEvent(self._stopping)
        self._schedule_changed = WakeEvent(self._stopping)
        self._lifeline_wake = WakeEvent(self._stopping)
        self.leadership: Leadership | None = None
        #: Whether the node can still prove it holds its claims (see :meth:`_rejoin`).
        self._claims = Claims(config.liveness_interval)
        self._in_flight = 0
        self._claim_seconds = RunningMean()
        self._task_seconds = RunningMean()
        self._in_flight_lock = threading.Lock()
        self._topics: list[str] = []
        self._topics_checked = 0.0
        self._topics_resumed = False  # a topic was resumed: re-read the topics now
        self._round_robin = itertools.count()
        self._pool: WorkerPool | None = None
        self._completer: Completer | None = None
        self._side_threads: list[threading.Thread] = []
        self._listener: Listener | None = None
        #: Idle back-off of the dispatcher's polls (see :meth:`_idle_wait`).
        self._claim_backoff = self._backoff()
        #: True while the lifeline beats at the idle rate (:meth:`_beat_interval`).
        self._beating_idle = False
        self._random = random.Random()

    # --- lifecycle ----------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped (or, with ``burst``, until nothing is due). Returns an exit code."""
        if self._stopping.is_set():  # a stop request came before the node registered
            logger.info("Stop requested during start-up: exiting before registering.")
            return self.exit_code
        registered = self._claims.now()
        self.owner = owners.register_owner(self.config.node_id)
        self._claims.registered(self.owner, registered)
        startup.prepare(self.config, self.handlers)  # consumer topics; loud warnings
        # Where the database has no NOTIFY, this process's own commits still wake this node.
        db.add_local_listener(self.wake)
        logger.info(
            "Node %s started: %s workers, topics %s.",
            self.owner.name,
            self.config.workers,
            ", ".join(self.config.topics or sorted(self.handlers.consumers())) or "none",
            extra={"node": self.owner.name},
        )
        self._pool = WorkerPool(self.config.workers)
        self._completer = Completer(self, self._stopping)
        self._completer.start()
        try:  # from here on, a stop request (even during start-up) ends in _shutdown
            if self.config.group and not self._stopping.is_set():
                self._join_group(self.config.group)
            self._start_side_threads()
            self._dispatch_loop()
        finally:
            self._shutdown()
        return self.exit_code

    def _join_group(self, group: str) -> None:
        from django_tasks_coord.scheduling.runner import group_topic, job_task_type

        topics.register_internal_topic(group_topic(group))
        self.handlers.add(group_topic(group), job_task_type)
        self._lead(group)

    def _lead(self, group: str) -> None:
        """Join ``group`` as this node's current owner (a takeover happens at a beat)."""
        assert self.owner is not None
        self.leadership = Leadership(
            group,
            self.owner.name,
            liveness=self.config.liveness_interval,
            heartbeat=self.config.heartbeat_frequency,
            on_change=self._leadership_changed,
            notified=self._notified,
        )
        self.leadership.start()

    def _leadership_changed(self, term: int | None) -> None:
        self._topics_checked = 0.0  # re-read the topics now: the group topic comes or goes
        self._wakeup.set()

    def _leader_topic(self) -> str | None:
        """The group topic this node must process now (it leads its group), if any."""
        from django_tasks_coord.scheduling.runner import group_topic

        if self.leadership is None or self.leadership.valid_term() is None:
            return None
        return group_topic(self.leadership.group)

    def request_stop(self) -> None:
        """Stop gracefully; called a second time, stop at once (claims are still released)."""
        if self._stopping.is_set():
            logger.warning("Second stop request: stopping now, releasing running tasks.")
            self._force.set()
        else:
            logger.info(
                "Stopping: no new claims; running tasks get %ss.", self.config.shutdown_max_wait
            )
        self._stopping.set()  # wakes every loop

    @property
    def node_id(self) -> str | None:
        """This node's id (its owner's name) once it runs."""
        return self.owner.name if self.owner is not None else None

    @property
    def stopping(self) -> bool:
        """True once a stop was requested (or the node must stop)."""
        return self._stopping.is_set()

    def wait_unless_forced(self, seconds: float) -> bool:
        """Wait ``seconds`` (a write backing off while the database is unreachable). True,
        at once, if the node must stop now (declared dead, or a second stop request): a
        write it gives up is then left to expire."""
        return self._force.wait(seconds)

    def forget_topic(self, topic: str) -> None:
        """Stop claiming ``topic`` at once (this node just paused it) and release its
        buffered tasks."""
        self._topics = [name for name in self._topics if name != topic]
        self._topics_checked = 0.0
        self._release_buffered({topic})

    def wake(self, topic: str | None = None) -> None:
        """Make the dispatcher look for work now (a NOTIFY, a freed worker), or the scheduler
        look at the schedules (``topic`` is ``SCHEDULE_CHANGED``)."""
        from django_tasks_coord.coordination import RELEASED
        from django_tasks_coord.scheduling.runner import SCHEDULE_CHANGED
        from django_tasks_coord.topics import RESUMED

        if topic == SCHEDULE_CHANGED:
            self._schedule_changed.set()
        elif topic is not None and topic.startswith(RESUMED):
            self._topics_resumed = True  # re-read the topics (paused ones excluded) now
            self._wakeup.set()
        elif topic is not None and topic.startswith(RELEASED):
            if self.leadership is not None:
                self.leadership.forget_lease()  # read the token again at the next beat
            self._lifeline_wake.set()  # a token was released: try to take it now
        elif topic is None or topic in self._topics:
            self._wakeup.set()

    # --- dispatching --------------------------------------------------------------------

    def _dispatch_loop(self) -> None:
        if self.config.burst and self.config.scheduler:
            self._submit_due_slots()
        reconnect = db.Reconnect("Claiming")
        while not self._stopping.is_set():
            self._wakeup.clear()
            # Burst: read before claiming, so that a round that finds nothing has seen every
            # outcome written (ordered successors, due retries): then nothing is claimable.
            quiet = self.config.burst and self.in_flight == 0
            try:
                self._refresh_topics()
                claimed = self._claim_round()
            except OwnerExpiredError:  # its owner row is gone: the lifeline registers again
                self._declared_dead()
                claimed = 0
            except DatabaseError as exc:  # a lost connection, a deadlock: reconnect, go on
                self._stopping.wait(reconnect.failed(exc))
                continue
            reconnect.succeeded()
            if quiet and not claimed:
                logger.info("Burst mode: nothing is due, exiting.")
                return
            if claimed or self.in_flight:
                self._claim_backoff.reset()  # busy: look for more every POLL_INTERVAL
                if claimed and self.in_flight < self.capacity:
                    continue
                timeout = self._idle_timeout()
            else:
                timeout = self._idle_timeout()
                self._claim_backoff.idle()  # idle: the next wait is longer, up to the cap
            self._wakeup.wait(timeout)

    def _submit_due_slots(self) -> None:
        """Burst: submit every job slot due now, before the first claim round.

        So a burst runs the jobs due when it starts (its scheduler thread would submit them
        too, but maybe after the dispatcher found nothing to do). A pass that leaves a job
        due skipped rows another node's pass holds (``SKIP LOCKED``), or stopped at its
        limit: pass again until none is due at the start.
        """
        from django_tasks_coord.scheduling import scheduler

        assert self.owner is not None
        now = timezone.now()
        reconnect = db.Reconnect("Scheduling")
        while not self._stopping.is_set():
            try:
                submitted = scheduler.submit_due(self.owner.name, now=now)
                next_due = scheduler.next_due()
            except DatabaseError as exc:  # a lost connection, a deadlock: reconnect, go on
                self._stopping.wait(reconnect.failed(exc))
                continue
            reconnect.succeeded()
            if next_due is None or next_due > now:
                return
            if not submitted:  # another node is submitting them: its commit is near
                self._stopping.wait(0.05)

    def _claim_round(self) -> int:
        """Claim due tasks of every topic (fairly, round-robin) up to the free capacity."""
        from django_tasks_coord.scheduling.runner import GROUP_TOPIC_PREFIX

        claimed = 0
        topics = self._topics
        if not topics:
            return 0
        start = next(self._round_robin) % len(topics)
        for topic in topics[start:] + topics[:start]:
            free = self.capacity - self.in_flight
            owner = self._claims.owner
            if owner is None or not self._claims.holds(owner.pk):
                self._lifeline_wake.set()  # a zombie claims nothing: the lifeline registers again
                break
            if free <= 0 or self._stopping.is_set():
                break
            started = time.monotonic()
            tasks = queue.poll(
                topic, min(free, self.config.batch_size), owner=owner, heartbeat_owner=False
            )
            self._claim_seconds.add(time.monotonic() - started)
            if tasks and topic.startswith(GROUP_TOPIC_PREFIX):
                try:
                    tasks = self._stamp_term(tasks)
                except DatabaseError:
                    # Claimed but neither stamped nor started: give them back now, or they
                    # would stay ACTIVE under this live node, which does not hold them.
                    self._add_in_flight(len(tasks))  # _release counts each one done
                    self._release(tasks, refund_attempt=True)
                    raise
            if tasks:
                self._add_in_flight(len(tasks))
                claimed += len(tasks)
                for task in tasks:
                    signals.send(signals.task_claimed, Task, task=task, node=self.node_id)
                self._submit(topic, tasks)
        return claimed

    def _stamp_term(self, tasks: list[Task]) -> list[Task]:
        """Record on just claimed leader-only runs the term they were claimed under (fencing).

        One ``UPDATE`` that stamps them only while this node still holds the group's token
        under the term it believes it leads under. Runs it cannot stamp so (it lost the
        lead between its poll and now, or never led) go back to the queue unstarted, their
        attempt refunded, for the leader: a run without a term is never started. Returns
        the runs stamped.
        """
        leadership = self.leadership
        term = None if leadership is None else leadership.valid_term()
        stamped = 0
        if leadership is not None and term is not None:
            holder = TokenHolder.objects.using(db.alias()).filter(
                group_id=leadership.group, task_id=leadership.node_id, term=term
            )
            claimed = Task.objects.using(db.alias()).rows(tasks)
            held = claimed.filter(state=TaskState.ACTIVE, exec_id=tasks[0].exec_id)
            stamped = db.retry_while_lost(  # the same UPDATE again is harmless
                lambda: held.filter(Exists(holder)).update(term=term),
                what="Stamping leader-only runs",
                wait=self.wait_unless_forced,
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
            extra={"topic": tasks[0].topic_id, "node": self.node_id, "term": term},
        )
        self._add_in_flight(len(tasks))  # _release counts each one done
        self._release(tasks, refund_attempt=True)
        return []

    def _submit(self, topic: str, tasks: list[Task]) -> None:
        assert self._pool is not None
        groups: dict[TaskType | None, list[Task]] = {}
        errors: dict[int, HandlerNotFoundError] = {}
        for task in tasks:
            try:
                task_type: TaskType | None = self.handlers.for_task(task)
            except HandlerNotFoundError as exc:
                task_type, errors[task.sequence] = None, exc
            groups.setdefault(task_type, []).append(task)
        for task_type, group in groups.items():
            if task_type is None:
                for task in group:
                    failure = Decision(Result.FAILURE, exception=errors[task.sequence])
                    self.finish(None, task, failure, final=True)
            elif task_type.batch:
                self._pool.submit(Job(functools.partial(self._execute, task_type, group), group))
            else:
                for task in group:
                    self._pool.submit(
                        Job(functools.partial(self._execute, task_type, [task]), [task])
                    )

    def _execute(self, task_type: TaskType, tasks: list[Task]) -> None:
        """Run in a worker: apply attempt and waiting rules, call the handler, finish each task."""
        tasks = self._startable(tasks)
        runnable = []
        now = timezone.now()
        for task in tasks:
            verdict = self._pre_run_verdict(task_type, task, now)
            if verdict is None:
                runnable.append(task)
            else:
                self.finish(task_type, task, verdict, final=True)
        if runnable:
            assert self._completer is not None
            self._completer.starting(task_type, runnable)  # @task: log each attempt's start
            started = time.monotonic()
            decisions = task_type.run(runnable)
            self._task_seconds.add((time.monotonic() - started) / len(runnable))
            for task, decision in zip(runnable, decisions, strict=True):
                self.finish(task_type, task, decision)

    def _startable(self, tasks: list[Task]) -> list[Task]:
        """Those of ``tasks`` a worker may start now; the others go back to the queue.

        A node starts nothing from a claim it cannot prove it still holds: not after it
        may have been declared dead (:class:`~django_tasks_coord.node.claims.Claims`), and
        a leader-only run only under the term it was stamped with, while this node still
        leads under it. The others are released unstarted, their attempt refunded (a
        claim another node took meanwhile is left alone).
        """
        from django_tasks_coord.scheduling.runner import GROUP_TOPIC_PREFIX

        leadership = self.leadership
        term = None if leadership is None else leadership.valid_term()
        startable: list[Task] = []
        unproven: list[Task] = []
        for task in tasks:
            leader_only = task.topic_id.startswith(GROUP_TOPIC_PREFIX)
            proven = self._claims.holds(task.owner_id) and (
                not leader_only or (task.term is not None and task.term == term)
            )
            (startable if proven else unproven).append(task)
        if unproven:
            zombie = self._claims.expired
            logger.warning(
                "Not starting %s task(s) of %s: %s.",
                len(unproven),
                unproven[0].topic_id,
                f"no heartbeat for {self._claims.silence():.1f}s, this node may have been "
                "declared dead"
                if zombie
                else f"this node no longer leads under term {unproven[0].term}",
                extra={"topic": unproven[0].topic_id, "node": self.node_id},
            )
            if zombie:
                self._lifeline_wake.set()  # register again
            self._release(unproven, refund_attempt=True)
        return startable

    def _pre_run_verdict(self, task_type: TaskType, task: Task, now: datetime) -> Decision | None:
        max_attempts = task_type.max_attempts_for(task)
        if task.attempts > max_attempts:
            return Decision(
                Result.FAILURE,
                message=f"Attempts exhausted ({task.attempts - 1} of {max_attempts} "
                "used, the last by a node that died).",
            )
        waiting_time = task_type.waiting_time
        if task.execute_at is None or waiting_time is None:
            return None
        late = (now - task.execute_at).total_seconds()
        if late <= waiting_time or task_type.waiting_policy is WaitingPolicy.WAIT:
            return None
        message = (
            f"Missed: could start only {late:.3f}s after its time (waiting_time {waiting_time}s)."
        )
        if task_type.waiting_policy is WaitingPolicy.LOG_AND_IGNORE:
            logger.warning(
                "Task %s skipped. %s",
                task,
                message,
                extra={
                    "task_sequence": task.sequence,
                    "topic": task.topic_id,
                    "node": self.node_id,
                },
            )
        return Decision(Result.FILTER, message=message)

    def finish(
        self, task_type: TaskType | None, task: Task, decision: Decision, *, final: bool = False
    ) -> None:
        """Record a task's outcome: retry a failure that has attempts left, else complete it.

        ``final`` failures (no handler, attempts used up by dead nodes) are never retried.
        """
        assert self._completer is not None
        decision = self._completer.attempt_ended(task_type, task, decision)  # its log entry
        retry_at = None
        if not final and task_type is not None and decision.result is Result.FAILURE:
            retry_at = db.retry_while_lost(  # a job's policy is read from the database
                functools.partial(task_type.retry_at, task, decision, timezone.now()),
                what="Scheduling a retry",
                wait=self.wait_unless_forced,
            )
        if task.is_completed:  # the handler completed it in its own transaction (fenced run)
            self._completer.put(task_type, task, decision)
        elif task_type is not None and not task_type.may_complete(task):
            logger.warning(
                "Not completing %s: this node no longer leads under term %s.",
                task,
                task.term,
                extra={
                    "task_sequence": task.sequence,
                    "topic": task.topic_id,
                    "node": self.node_id,
                    "term": task.term,
                },
            )
            self._release([task], refund_attempt=False)
        elif retry_at is not None and task_type is not None:
            self._retry(task_type, task, decision, retry_at)
        else:
            self._completer.put(task_type, task, decision)

    def _retry(self, task_type: TaskType, task: Task, decision: Decision, at: datetime) -> None:
        delay = at - timezone.now()
        try:
            db.retry_while_lost(
                functools.partial(queue.release, task, execute_at=at, decision=decision),
                what="Scheduling a retry",
                wait=self.wait_unless_forced,
            )
        except TasksCoordError as exc:
            logger.warning("Could not schedule a retry of %s: %s", task, exc)
        else:
            self.stats["retried"] += 1
            logger.warning(
                "Task %s failed (attempt %s of %s), retrying in %.1fs: %s",
                task,
                task.attempts,
                task_type.max_attempts_for(task),
                max(delay.total_seconds(), 0.0),
                decision.exception or decision.message,
                extra={
                    "task_sequence": task.sequence,
                    "topic": task.topic_id,
                    "attempt": task.attempts,
                    "node": self.node_id,
                },
            )
            signals.send(
                signals.task_retried,
                Task,
                task=task,
                decision=decision,
                retry_at=at,
                node=self.node_id,
            )
        finally:
            self.done(1)

    # --- bookkeeping used by the completer ----------------------------------------------

    @property
    def capacity(self) -> int:
        """How many tasks the node holds at most: one per worker plus an adaptive buffer.

        The buffer is ``BUFFER`` for slow tasks; when tasks are fast compared with a
        claim, it grows so that the workers never wait for the next claim (enough for
        two claims' worth of work), up to ``10 * BATCH_SIZE``. Claimed tasks are not
        available to other nodes, so slow tasks are never hoarded. ``BUFFER=0`` means
        never claim ahead.
        """
        config = self.config
        buffer = config.buffer
        task_s, claim_s = self._task_seconds.value, self._claim_seconds.value
        if buffer and task_s is not None and claim_s is not None:  # BUFFER=0: never claim ahead
            wanted = math.ceil(2 * config.workers * claim_s / max(task_s, 1e-6))
            buffer = min(max(buffer, wanted), max(buffer, 10 * config.batch_size))
        return config.workers + buffer

    @property
    def in_flight(self) -> int:
        """Tasks claimed by this node and not yet completed or released."""
        with self._in_flight_lock:
            return self._in_flight

    @property
    def workers_busy(self) -> int:
        """Workers running a task right now (a gauge of the node's metrics)."""
        return 0 if self._pool is None else len(self._pool.running())

    def _add_in_flight(self, n: int) -> None:
        with self._in_flight_lock:
            was_idle = self._in_flight == 0
            self._in_flight += n
        if was_idle and self._beating_idle:
            self._lifeline_wake.set()  # it holds tasks now: beat at once, then every beat

    def done(self, n: int) -> None:
        """``n`` tasks left this node (completed or released): wake the dispatcher if it was full."""
        with self._in_flight_lock:
            was_full = self._in_flight >= self.capacity
            self._in_flight -= n
        if was_full or self.config.burst:
            self._wakeup.set()

    def _completer_idle(self) -> bool:
        return self._completer is None or self._completer.idle

    # --- topics and sleeping ------------------------------------------------------------

    def _refresh_topics(self) -> None:
        """Re-read which topics to process (paused ones excluded) once per poll interval."""
        now = time.monotonic()
        recent = self._topics_checked and now - self._topics_checked < self.config.poll_interval
        if recent and not self._topics_resumed:
            return
        self._topics_resumed = False  # before the read: a resumption during it reads again
        from django_tasks_coord.scheduling.runner import GROUP_TOPIC_PREFIX

        wanted = [
            topic
            for topic in self.config.topics or self.handlers.consumers()
            if not topic.startswith(GROUP_TOPIC_PREFIX)  # only while leading, below
        ]
        leader_topic = self._leader_topic()
        if leader_topic is not None:
            wanted.append(leader_topic)
        active = Topic.objects.using(db.alias()).filter(name__in=wanted, paused=False)
        topics = sorted(active.values_list("name", flat=True))
        if topics != self._topics:
            logger.info(
                "Processing topics: %s.", ", ".join(topics) or "none (all paused or unknown)"
            )
        dropped = set(self._topics) - set(topics)
        self._topics, self._topics_checked = topics, now
        if dropped:
            self._release_buffered(dropped)

    def _release_buffered(self, dropped: set[str]) -> None:
        """Give back the claimed, not yet started tasks of topics this node stopped
        processing (paused, or a group topic after losing the lead): they do not start."""
        if self._pool is None:
            return
        jobs = self._pool.take_queued(lambda job: job.payload[0].topic_id in dropped)
        tasks = [task for job in jobs for task in job.payload]
        if tasks:
            logger.info(
                "Releasing %s buffered task(s) of %s.", len(tasks), ", ".join(sorted(dropped))
            )
            self._release(tasks, refund_attempt=True)

    def _notified(self) -> bool:
        """Whether NOTIFY wakes this node now (PostgreSQL, its listener connected)."""
        return self._listener is not None and self._listener.listening.is_set()

    def _backoff(self) -> IdleBackoff:
        """An idle back-off whose cap is the larger of the two (see :meth:`_idle_wait`)."""
        config = self.config
        cap = max(config.max_poll_interval, config.notified_poll_interval)
        return IdleBackoff(config.poll_interval, cap)

    def _idle_wait(self, backoff: IdleBackoff) -> float:
        """Seconds an idle loop waits for a wake-up before it polls anyway.

        ``backoff``'s current wait: ``POLL_INTERVAL`` doubled per idle round, up to
        ``NOTIFIED_POLL_INTERVAL`` while NOTIFY can wake the node (PostgreSQL, its LISTEN
        connection up), up to ``MAX_POLL_INTERVAL`` where nothing announces work
        (MariaDB/MySQL, SQLite, ``LISTEN_NOTIFY`` off). On PostgreSQL while the LISTEN
        connection is down nothing would wake the node: it polls every ``POLL_INTERVAL``.
        """
        if self._notified():
            return backoff.wait
        if self._listener is not None:  # PostgreSQL, its LISTEN connection down
            return self.config.poll_interval
        return min(backoff.wait, max(self.config.max_poll_interval, self.config.poll_interval))

    def _idle_timeout(self) -> float:
        """Seconds to sleep: until the next delayed task is due, at most :meth:`_idle_wait`."""
        timeout = self._idle_wait(self._claim_backoff)
        if self.in_flight >= self.capacity or not self._topics:
            return timeout
        pending = Task.objects.using(db.alias()).filter(
            topic_id__in=self._topics, state=TaskState.PENDING, execute_at__isnull=False
        )
        try:
            next_due = pending.aggregate(next=Min("execute_at"))["next"]
        except DatabaseError:  # the next claim round reconnects and backs off
            db.reset_connection()
            return min(timeout, self.config.poll_interval)
        if next_due is not None:
            timeout = min(timeout, max((next_due - timezone.now()).total_seconds(), 0.0))
        return timeout

    # --- side tasks ---------------------------------------------------------------------

    def _start_side_threads(self) -> None:
        lifeline = threading.Thread(
            target=self._guard(self._lifeline), name="lifeline", daemon=True
        )
        self._side_threads.append(lifeline)
        if self.config.scheduler:
            scheduler = threading.Thread(
                target=self._guard(self._schedule_loop), name="scheduler", daemon=True
            )
            self._side_threads.append(scheduler)
        if self.config.listen_notify and listen_supported(db.alias()):
            self._listener = Listener(db.alias(), self.wake, self._stopping)
            self._side_threads.append(self._listener)
        if self.config.retention_interval:  # its own thread: a pass never delays a heartbeat
            from django_tasks_coord.retention import Housekeeper

            self._side_threads.append(
                Housekeeper(self.config.retention_interval, self._stopping, node=self.node_id)
            )
        for thread in self._side_threads:
            thread.start()

    def _guard(self, target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except Exception:
                logger.exception("A side task of the node died; stopping the node.")
                self.exit_code = EXIT_SIDE_TASK_FAILED
                self._force.set()
                self.request_stop()
            finally:
                connections.close_all()

        return run

    def _beat_interval(self) -> float:
        """Seconds to the next heartbeat: ``HEARTBEAT_FREQUENCY`` while the node holds tasks
        (in flight, buffered, or completions not yet written) or belongs to a group, else
        :attr:`NodeConfig.idle_heartbeat` (an idle node only has to stay alive)."""
        idle = self.leadership is None and self.in_flight == 0 and self._completer_idle()
        self._beating_idle = idle
        if idle and self.in_flight:  # claimed meanwhile (it found _beating_idle still False)
            self._beating_idle = idle = False
        return self.config.idle_heartbeat if idle else self.config.heartbeat_frequency

    def _sweep_wait(self, live: int) -> float:
        """Seconds to this node's next sweep (dead owners, executors' timeouts, dead group
        members): these are chores of the cluster, which any node does for all.

        A node alone sweeps every ``REAP_INTERVAL``. Of ``live`` owners each sweeps every
        ``live * REAP_INTERVAL`` on average, capped at ``max(REAP_INTERVAL, 2 *
        LIVENESS_INTERVAL)`` and jittered by +-50% (nodes started together drift apart),
        so the cluster sweeps about every ``REAP_INTERVAL`` whatever its size.
        """
        config = self.config
        if live <= 1:
            return config.reap_interval
        cap = max(config.reap_interval, 2 * config.liveness_interval)
        return min(live * config.reap_interval, cap) * self._random.uniform(0.5, 1.5)

    def _sweep(self) -> int:
        """Free dead owners' tasks, forget long-dead group members, enforce executors'
        timeouts. Returns the number of live owners."""
        _, live = owners.sweep(timedelta(seconds=self.config.liveness_interval))
        if self.leadership is not None:
            coordination.forget_dead(timedelta(seconds=10 * self.config.liveness_interval))
        executions.reap()  # timeouts of tasks run by external executors
        return live

    def _lifeline(self) -> None:
        """Heartbeat (:meth:`_beat_interval`), sweep (:meth:`_sweep_wait`), status line."""
        assert self.owner is not None
        last_beat = last_status = time.monotonic()
        next_beat = last_beat + self._beat_interval()
        next_sweep = last_beat + self.config.reap_interval
        status = self.config.status_interval
        reconnect = db.Reconnect("Heartbeat")
        while not self._stopping.is_set():
            wake_at = min(next_beat, next_sweep, last_status + status if status else math.inf)
            woken = self._lifeline_wake.wait(max(wake_at - time.monotonic(), 0.0))
            self._lifeline_wake.clear()
            if self._stopping.is_set():
                return
            now = time.monotonic()
            beat = woken or now >= next_beat
            try:
                if beat:
                    interval = self._beat_interval()
                    # Fixed rate, not fixed delay: the time a beat takes does not push the next
                    # one back, so a standby notices a dead leader within liveness + one beat.
                    # A wake-up (work claimed, a token released) beats now and restarts the rate.
                    next_beat = now + interval if woken else max(next_beat + interval, now)
                    if not self._heartbeat():
                        self._rejoin()
                    last_beat = now
                    if self.leadership is not None:
                        self.leadership.beat()
                        if self.leadership.retry_in is not None:  # the leader's lease ends sooner
                            next_beat = min(
                                next_beat, time.monotonic() + self.leadership.retry_in + 0.002
                            )
                if now >= next_sweep:
                    next_sweep = now + self.config.reap_interval  # retried then if it fails
                    next_sweep = now + self._sweep_wait(self._sweep())
                if status and now - last_status >= status:
                    last_status = now
                    self._status_line()
            except TasksCoordError:
                raise
            except Exception as exc:  # noqa: BLE001 - the database may be briefly unreachable
                reconnect.failed(exc)  # closes the connection; a beat is retried after a beat
                next_beat = min(next_beat, now + self.config.heartbeat_frequency)
            else:
                reconnect.succeeded()

    def _heartbeat(self) -> bool:
        """Heartbeat this node's owner; False if it may have been declared dead.

        A node silent for more than the liveness interval (frozen, or the database was
        out of reach) does not beat its old owner row back to life: the others may have
        handed its tasks out already (a sweep that met a locked task row even keeps the
        row). It counts itself dead, like a node whose row is gone.
        """
        assert self.owner is not None
        if self._claims.expired:
            return False
        started = self._claims.now()
        if not owners.heartbeat(self.owner):
            return False
        self._claims.beaten(self.owner, started)
        return True

    def _declared_dead(self) -> None:
        """This node may have been declared dead: start nothing more, let the lifeline
        register it again (:meth:`_rejoin`)."""
        lost = self._claims.lose()
        if lost is not None:
            logger.error(
                "Node %s may have been declared dead (no heartbeat for over %ss, or its owner "
                "row is gone): dropping its buffered tasks and registering again.",
                lost.name,
                self.config.liveness_interval,
                extra={"node": lost.name},
            )
        self._lifeline_wake.set()

    def _rejoin(self) -> None:
        """Continue as a fresh node after this one may have been declared dead.

        Its buffered tasks are dropped unstarted (released, attempt refunded, where the
        claim still stands; another node may hold them already), its old owner row is
        removed (what it still holds goes back to the queue, tasks still running here
        included: their completions will be refused), it leaves its group (a term it held
        is stale), and it registers a new owner. Completions already handed to the
        completer are written only where the claim still stands (``exec_id``). Called
        by the lifeline; a database error leaves the node dead, and the next beat tries
        again.
        """
        assert self.owner is not None
        assert self._pool is not None
        self._declared_dead()
        buffered = [task for job in self._pool.take_queued() for task in job.payload]
        self._release(buffered, refund_attempt=True)
        owners.unregister_owner(self.owner)
        if self.leadership is not None:
            self.leadership.stop()  # releases the token if this node still held it
        started = self._claims.now()
        try:
            owner = owners.register_owner(self.config.node_id)
        except DuplicateOwnerError:  # a live node took this node's name meanwhile
            self._lost_ownership()
            return
        self.owner = owner
        self._claims.registered(owner, started)
        logger.warning(
            "Node %s registered again; it goes on as a fresh node.",
            owner.name,
            extra={"node": owner.name},
        )
        if self.config.group:
            self._lead(self.config.group)
        self._topics_checked = 0.0
        self._wakeup.set()

    def _schedule_loop(self) -> None:
        """Submit due job slots; sleep until the next one is due or a schedule changes.

        Submitting (``submit_due``, which locks the due rows) happens only when a slot's
        time came, a schedule changed (NOTIFY, or a commit of this process), or at the
        start. The waits in between are capped by the idle back-off (:meth:`_idle_wait`),
        a safety net for changes nobody announced (MariaDB/MySQL and SQLite have no
        NOTIFY): such a wake only reads when the next job is due (``next_due``).
        """
        from django_tasks_coord.scheduling import scheduler
        from django_tasks_coord.scheduling.runner import JOBS_TOPIC

        assert self.owner is not None
        backoff = self._backoff()
        reconnect = db.Reconnect("Scheduling")
        submit = not self.config.burst  # a burst submitted the due slots itself
        while not self._stopping.is_set():
            changed = self._schedule_changed.is_set()
            self._schedule_changed.clear()
            timeout = self.config.poll_interval
            failed = False
            try:
                if (submit or changed) and scheduler.submit_due(self.owner.name):
                    self.wake(JOBS_TOPIC)
                    changed = True
                next_due = scheduler.next_due()
            except DatabaseError as exc:
                timeout = reconnect.failed(exc)
                next_due, failed = None, True
            else:
                reconnect.succeeded()
            if changed:
                backoff.reset()
            if not failed:
                timeout = self._idle_wait(backoff)
            due_in = None if next_due is None else (next_due - timezone.now()).total_seconds()
            # Submit next time only if that time is a slot's (or a change wakes the loop).
            submit = failed or (due_in is not None and due_in <= timeout)
            if due_in is not None:
                timeout = min(timeout, max(due_in, 0.0))
            if not self._schedule_changed.wait(timeout) and not submit:
                backoff.idle()

    def _status_line(self) -> None:
        if not logger.isEnabledFor(logging.INFO):
            return  # nobody reads it: spare the database the count
        depth = Task.objects.using(db.alias()).filter(topic_id__in=self._topics).due().count()
        logger.info(
            "processed=%s failed=%s retried=%s in_flight=%s queue_depth=%s",
            self.stats["processed"],
            self.stats["failed"],
            self.stats["retried"],
            self.in_flight,
            depth,
            extra={"node": self.owner.name if self.owner else None, **self.stats},
        )

    def _lost_ownership(self) -> None:
        logger.error(
            "Node %s was declared dead and cannot register again: a live node took its node "
            "id. Stopping without completing anything.",
            self.owner.name if self.owner else "?",
            extra={"node": self.node_id},
        )
        self.exit_code = EXIT_LOST_OWNERSHIP
        self._force.set()
        self._stopping.set()
        self._wakeup.set()

    # --- shutdown -----------------------------------------------------------------------

    def _shutdown(self) -> None:
        self._stopping.set()
        for thread in self._side_threads:  # no heartbeat may race the unregistration below
            thread.join(timeout=self.config.heartbeat_frequency + 5)
        pool, completer = self._pool, self._completer
        assert pool is not None
        assert completer is not None
        lost = self.exit_code == EXIT_LOST_OWNERSHIP
        unstarted = [task for job in pool.take_queued() for task in job.payload]
        if not lost:
            self._release(unstarted, refund_attempt=True)
        if not self._force.is_set():
            still_running = pool.join_running(self.config.shutdown_max_wait, abort=self._force)
        else:
            still_running = pool.running()
        pool.stop()
        completer.flush_and_stop()
        if still_running and not lost:
            tasks = [task for job in still_running for task in job.payload]
            logger.warning("Releasing %s task(s) still running at shutdown.", len(tasks))
            self._release(tasks, refund_attempt=False)
        if self.leadership is not None and not lost:
            self.leadership.stop()
        if self.owner is not None and not lost:
            owners.unregister_owner(self.owner)
        logger.info(
            "Node %s stopped: processed=%s failed=%s retried=%s.",
            self.owner.name if self.owner else "?",
            self.stats["processed"],
            self.stats["failed"],
            self.stats["retried"],
            extra={"node": self.node_id, **self.stats},
        )
        db.remove_local_listener(self.wake)
        connections.close_all()

    def _release(self, tasks: list[Task], *, refund_attempt: bool) -> None:
        for task in tasks:
            try:
                db.retry_while_lost(
                    functools.partial(queue.release, task, refund_attempt=refund_attempt),
                    what="Releasing tasks",
                    wait=self.wait_unless_forced,
                )
            except (TasksCoordError, DatabaseError) as exc:
                logger.debug("Not releasing %s: %s", task, exc)
            finally:
                self.done(1)
