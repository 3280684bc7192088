"""The node: what one ``manage.py runscheduler`` process does, as a supervisor of small duties.

A :class:`Node` registers itself as an :class:`~django_tasks_coord.models.Owner`, starts
its duties, guards them (a duty that dies stops the node), routes wake-ups to them
through a subscription table (:class:`~django_tasks_coord.node.subscriptions.Subscriptions`),
registers again when it may have been declared dead, and shuts down cleanly. The duties
do the work, each a small object with an injected clock and a ``tick()`` that does one
round (:mod:`django_tasks_coord.node.duty`):

- dispatching (:class:`~django_tasks_coord.node.dispatcher.Dispatcher`: claims, on the
  thread that called :meth:`Node.run`), running and settling tasks on ``WORKERS`` worker
  threads (:class:`~django_tasks_coord.node.execution.Executor`), and what the node holds
  against its capacity (:class:`~django_tasks_coord.node.load.Load`);
- the completer thread, which writes outcomes in batches
  (:class:`~django_tasks_coord.node.completer.Completer`);
- the lifeline thread (:class:`~django_tasks_coord.node.lifeline.Lifeline`: heartbeat,
  sweeps, status line) and, in a group, its leadership
  (:class:`~django_tasks_coord.node.leadership.Leadership`);
- the scheduler thread (:class:`~django_tasks_coord.scheduling.loop.SchedulerLoop`);
- the workflow advancer thread (:class:`~django_tasks_coord.node.workflows.WorkflowAdvancer`);
- the retention housekeeper thread (:class:`~django_tasks_coord.retention.Housekeeper`);
- on PostgreSQL, the listener thread (LISTEN/NOTIFY wake-ups).

The duties write task rows through :mod:`~django_tasks_coord.queue` (claims, completions,
releases), :mod:`~django_tasks_coord.owners` (registration, heartbeat, sweeps),
:mod:`~django_tasks_coord.attempts` (a consumer's attempt log), the scheduler (job runs)
and the task store (:func:`~django_tasks_coord.store.stamp_term`); the group's rows
through :mod:`~django_tasks_coord.coordination`. They read the topics, the queue depth and
the next delayed task with queries of their own.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import Counter
from collections.abc import Callable

from django.db import connections

from django_tasks_coord import db, owners, topics
from django_tasks_coord.coordination import RELEASED
from django_tasks_coord.enums import Decision
from django_tasks_coord.exceptions import DuplicateOwnerError
from django_tasks_coord.handlers import Registry, TaskType, registry
from django_tasks_coord.models import Owner, Task
from django_tasks_coord.node import startup
from django_tasks_coord.node.clock import SYSTEM_CLOCK, Clock
from django_tasks_coord.node.completer import Completer
from django_tasks_coord.node.config import NodeConfig
from django_tasks_coord.node.dispatcher import Dispatcher
from django_tasks_coord.node.duty import Duty, run_loop
from django_tasks_coord.node.execution import Executor
from django_tasks_coord.node.leadership import Leadership
from django_tasks_coord.node.lifeline import Lifeline
from django_tasks_coord.node.load import Load
from django_tasks_coord.node.pool import WorkerPool
from django_tasks_coord.node.state import NodeState
from django_tasks_coord.node.stops import StopRequests
from django_tasks_coord.node.subscriptions import Subscriptions
from django_tasks_coord.node.wakeup import Listener, WakeEvent, listen_supported
from django_tasks_coord.node.workflows import WorkflowAdvancer
from django_tasks_coord.retention import Housekeeper
from django_tasks_coord.scheduling.loop import SchedulerLoop
from django_tasks_coord.scheduling.names import JOBS_TOPIC, SCHEDULE_CHANGED, group_topic
from django_tasks_coord.scheduling.runner import job_task_type
from django_tasks_coord.topics import RESUMED

__all__ = ["EXIT_LOST_OWNERSHIP", "EXIT_OK", "EXIT_SIDE_TASK_FAILED", "Node"]

logger = logging.getLogger("django_tasks_coord.node")

#: Exit codes of :meth:`Node.run`.
EXIT_OK = 0
EXIT_LOST_OWNERSHIP = 3
EXIT_SIDE_TASK_FAILED = 4


class Node:
    """One processing node. Create it, then call :meth:`run` (blocking) from the main thread.

    :meth:`request_stop` (the SIGTERM/SIGINT handler) stops it gracefully; a second
    call stops it at once. Both release every claim the node still holds; their log lines
    come from the node's shutdown (:mod:`~django_tasks_coord.node.stops`). ``clock``
    is what every duty reads the time from (tests pass a fake one).
    """

    def __init__(
        self, config: NodeConfig, handlers: Registry = registry, *, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.config = config
        self.handlers = handlers
        self.state = NodeState(config, clock)
        self.exit_code = EXIT_OK
        self.completer: Completer | None = None
        self.stops = StopRequests(
            self.state.stopping, self.state.force, shutdown_max_wait=config.shutdown_max_wait
        )

        # The duties call each other back through these (looked up at each call: a test
        # may replace a duty's wake-up event).
        def wake_lifeline() -> None:
            self.lifeline.wake.set()

        def node_name() -> str:
            assert self.owner is not None  # registered before any duty runs
            return self.owner.name

        self.load = Load(
            config,
            on_busy=lambda: self.lifeline.busy(),
            on_room=lambda: self.dispatcher.wake.set(),
        )
        self.executor = Executor(self.state, self.load, wake_lifeline=wake_lifeline)
        self.dispatcher = Dispatcher(
            self.state,
            handlers,
            self.load,
            self.executor,
            wake_lifeline=wake_lifeline,
            declared_dead=lambda: self.lifeline.declared_dead(),
        )
        self.lifeline = Lifeline(
            self.state,
            self.load,
            topics=lambda: self.dispatcher.topics,
            completer_idle=self.executor.completer_idle,
            rejoin=self._rejoin,
        )
        self.scheduler_loop = SchedulerLoop(
            node_name,
            clock=clock,
            wake=WakeEvent(self.state.stopping),
            stopping=self.state.stopping,
            backoff=self.state.backoff(),
            idle_wait=self.state.idle_wait,
            poll_interval=config.poll_interval,
            submitted=lambda: self.wake(JOBS_TOPIC),  # its dispatcher claims the runs now
            burst=config.burst,
        )
        self.workflows = WorkflowAdvancer(self.state, interval=config.workflow_poll_interval)
        self.subscriptions = self._subscriptions()
        self._side_threads: list[threading.Thread] = []

    def _subscriptions(self) -> Subscriptions:
        """Which duty each wake-up concerns (see :meth:`wake`)."""
        table = Subscriptions()
        table.subscribe(SCHEDULE_CHANGED, lambda _: self.scheduler_loop.wake.set())
        table.subscribe_prefix(RESUMED, self.dispatcher.on_resumed)  # re-read the topics
        table.subscribe_prefix(RELEASED, self._token_released)
        table.subscribe_others(self.dispatcher.on_topic)  # a task pushed: claim if ours
        return table

    # --- what the rest of the package and the metrics read ------------------------------

    @property
    def owner(self) -> Owner | None:
        """The node's current owner row (a new one after it registered again)."""
        return self.state.owner

    @owner.setter
    def owner(self, owner: Owner | None) -> None:
        self.state.owner = owner

    @property
    def leadership(self) -> Leadership | None:
        """The node's role in its group (``--group``), or None."""
        return self.state.leadership

    @leadership.setter
    def leadership(self, leadership: Leadership | None) -> None:
        self.state.leadership = leadership

    @property
    def stats(self) -> Counter[str]:
        """``processed``, ``failed`` and ``retried`` tasks so far."""
        return self.state.stats

    @property
    def node_id(self) -> str | None:
        """This node's id (its owner's name) once it runs."""
        return self.state.node_id

    @property
    def stopping(self) -> bool:
        """True once a stop was requested (or the node must stop)."""
        return self.state.stopping.is_set()

    @property
    def capacity(self) -> int:
        """How many tasks the node holds at most (:attr:`Load.capacity`)."""
        return self.load.capacity

    @property
    def in_flight(self) -> int:
        """Tasks claimed by this node and not yet completed or released."""
        return self.load.count

    @property
    def workers_busy(self) -> int:
        """Workers running a task right now (a gauge of the node's metrics)."""
        pool = self.dispatcher.pool
        return 0 if pool is None else len(pool.running())

    def wait_unless_forced(self, seconds: float) -> bool:
        """Wait ``seconds`` (a write backing off while the database is unreachable). True,
        at once, if the node must stop now (declared dead, or a second stop request): a
        write it gives up is then left to expire."""
        return self.state.wait_unless_forced(seconds)

    def forget_topic(self, topic: str) -> None:
        """Stop claiming ``topic`` at once (this node just paused it) and release its
        buffered tasks."""
        self.dispatcher.forget_topic(topic)

    def done(self, n: int) -> None:
        """``n`` tasks left this node (completed or released): wake the dispatcher if it was full."""
        self.load.left(n)

    def finish(
        self, task_type: TaskType | None, task: Task, decision: Decision, *, final: bool = False
    ) -> None:
        """Record a task's outcome (:meth:`Executor.finish`)."""
        self.executor.finish(task_type, task, decision, final=final)

    def wake(self, topic: str | None = None) -> None:
        """Route a wake-up (a NOTIFY payload, a local commit, a freed worker; None: look
        for work) to the duties it concerns (:attr:`subscriptions`)."""
        self.subscriptions.publish(topic)

    # --- lifecycle ----------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped (or, with ``burst``, until nothing is due). Returns an exit code."""
        state, config = self.state, self.config
        if state.stopping.is_set():  # a stop request came before the node registered
            self.stops.log()
            logger.info("Stop requested during start-up: exiting before registering.")
            return self.exit_code
        registered = state.claims.now()
        owner = state.owner = owners.register_owner(config.node_id)
        state.claims.registered(owner, registered)
        startup.prepare(config, self.handlers)  # consumer topics; loud warnings
        # Where the database has no NOTIFY, this process's own commits still wake this node.
        db.add_local_listener(self.wake)
        logger.info(
            "Node %s started: %s workers, topics %s.",
            owner.name,
            config.workers,
            ", ".join(config.topics or sorted(self.handlers.consumers())) or "none",
            extra={"node": owner.name},
        )
        self.dispatcher.pool = WorkerPool(config.workers)
        self.completer = self.executor.completer = Completer(self, state.stopping)
        self.completer.start()
        try:  # from here on, a stop request (even during start-up) ends in _shutdown
            if config.group and not state.stopping.is_set():
                self._join_group(config.group)
            self._start_side_threads()
            if config.burst and config.scheduler:
                self.scheduler_loop.submit_due_slots()
            run_loop(self.dispatcher, state.stopping)
        finally:
            self._shutdown()
        return self.exit_code

    def request_stop(self) -> None:
        """Stop gracefully; called a second time, stop at once (claims are still released).

        Callable from any thread: it sets the stop events at once and logs nothing; the node
        logs the request when its shutdown starts
        (:class:`~django_tasks_coord.node.stops.StopRequests`). Not from a signal handler:
        setting the events takes the locks of the loops' wake-up events, which the
        interrupted main thread may hold; ``runscheduler``'s handler hands the signal to a
        thread that calls this.
        """
        self.stops.request()

    def lost_ownership(self) -> None:
        """Stop at once without completing anything: this node was declared dead and a
        live node took its id (exit code :data:`EXIT_LOST_OWNERSHIP`)."""
        logger.error(
            "Node %s was declared dead and cannot register again: a live node took its node "
            "id. Stopping without completing anything.",
            self.owner.name if self.owner else "?",
            extra={"node": self.node_id},
        )
        self.exit_code = EXIT_LOST_OWNERSHIP
        self.state.force.set()
        self.state.stopping.set()
        self.dispatcher.wake.set()

    # --- the group ----------------------------------------------------------------------

    def _join_group(self, group: str) -> None:
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
            on_change=lambda term: self.dispatcher.topics_changed(),  # the group topic
            notified=self.state.notified,
            clock=self.state.clock,
        )
        self.leadership.start()

    def _token_released(self, payload: str) -> None:
        """A group token was released: read it again, and try to take it now."""
        if self.leadership is not None:
            self.leadership.forget_lease()  # read the token again at the next beat
        self.lifeline.wake.set()

    # --- registering again -------------------------------------------------------------

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
        pool = self.dispatcher.pool
        assert self.owner is not None
        assert pool is not None
        with self.state.claims.claiming:  # a claim in flight is queued on the workers first
            self.lifeline.declared_dead()
            buffered = [task for job in pool.take_queued() for task in job.payload]
        self.executor.release(buffered, refund_attempt=True)
        owners.unregister_owner(self.owner)
        if self.leadership is not None:
            self.leadership.stop()  # releases the token if this node still held it
        started = self.state.claims.now()
        try:
            owner = owners.register_owner(self.config.node_id)
        except DuplicateOwnerError:  # a live node took this node's name meanwhile
            self.lost_ownership()
            return
        self.owner = owner
        self.state.claims.registered(owner, started)
        logger.warning(
            "Node %s registered again; it goes on as a fresh node.",
            owner.name,
            extra={"node": owner.name},
        )
        if self.config.group:
            self._lead(self.config.group)
        self.dispatcher.topics_changed()

    # --- threads ------------------------------------------------------------------------

    def _start_side_threads(self) -> None:
        state, config = self.state, self.config
        threads = [self._duty_thread("lifeline", self.lifeline)]
        if self.workflows.enabled:  # WORKFLOW_POLL_INTERVAL 0: no advancer on this node
            threads.append(self._duty_thread("workflows", self.workflows))
        if config.scheduler:
            threads.append(self._duty_thread("scheduler", self.scheduler_loop))
        if config.listen_notify and listen_supported(db.alias()):
            state.listener = Listener(db.listen_alias(), self.wake, state.stopping)
            threads.append(state.listener)
        if config.retention_interval:  # its own thread: a pass never delays a heartbeat
            housekeeper = Housekeeper(
                config.retention_interval,
                state.stopping,
                node=self.node_id,
                clock=state.clock.monotonic,
                now=state.clock.now,
            )
            threads.append(housekeeper)
        self._side_threads = threads
        for thread in threads:
            thread.start()

    def _duty_thread(self, name: str, duty: Duty) -> threading.Thread:
        """A daemon thread ticking ``duty``; if it dies of an error, the node stops."""
        loop = functools.partial(run_loop, duty, self.state.stopping)
        guarded = functools.partial(self._guarded, loop)
        return threading.Thread(target=guarded, name=name, daemon=True)

    def _guarded(self, target: Callable[[], None]) -> None:
        try:
            target()
        except Exception:
            logger.exception("A side task of the node died; stopping the node.")
            self.exit_code = EXIT_SIDE_TASK_FAILED
            self.state.force.set()
            self.request_stop()
        finally:
            connections.close_all()

    # --- shutdown -----------------------------------------------------------------------

    def _shutdown(self) -> None:
        state = self.state
        state.stopping.set()
        self.stops.log()  # the stop requests so far (a signal handler logs nothing)
        for thread in self._side_threads:  # no heartbeat may race the unregistration below
            thread.join(timeout=self.config.heartbeat_frequency + 5)
        pool, completer = self.dispatcher.pool, self.completer
        assert pool is not None
        assert completer is not None
        lost = self.exit_code == EXIT_LOST_OWNERSHIP
        unstarted = [task for job in pool.take_queued() for task in job.payload]
        if not lost:
            self.executor.release(unstarted, refund_attempt=True)
        if not state.force.is_set():
            still_running = pool.join_running(self.config.shutdown_max_wait, abort=state.force)
        else:
            still_running = pool.running()
        pool.stop()
        completer.flush_and_stop()
        if not lost:
            self.lifeline.flush_progress()  # the last reports of the tasks that ended
        if still_running and not lost:
            tasks = [task for job in still_running for task in job.payload]
            logger.warning("Releasing %s task(s) still running at shutdown.", len(tasks))
            self.executor.release(tasks, refund_attempt=False)
        if self.leadership is not None and not lost:
            self.leadership.stop()
        if self.owner is not None and not lost:
            owners.unregister_owner(self.owner)
        self.stops.log()  # the requests that came during the shutdown
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
