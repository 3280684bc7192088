"""Running claimed tasks on the workers, and what becomes of each: complete, retry or release.

:class:`Executor` is what a worker thread calls with a batch of claimed tasks
(:meth:`Executor.execute`): it starts only what the node can prove it still holds, applies
the attempt and waiting rules, calls the handler, and hands each outcome to the completer,
or releases the task for a retry. It also gives tasks back to the queue for the other
duties (:meth:`Executor.release`). Its writes go through the queue (releases, retries)
and the completer (outcomes and attempt-log entries).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from datetime import datetime

from django.db import DatabaseError

from django_tasks_coord import db, queue, signals
from django_tasks_coord.enums import Decision, Result, TaskState, WaitingPolicy
from django_tasks_coord.exceptions import TaskCanceledError, TasksCoordError
from django_tasks_coord.handlers import TaskType
from django_tasks_coord.models import Task
from django_tasks_coord.node.completer import Completer
from django_tasks_coord.node.load import Load
from django_tasks_coord.node.state import NodeState
from django_tasks_coord.scheduling.names import GROUP_TOPIC_PREFIX
from django_tasks_coord.store.fencing import held

logger = logging.getLogger("django_tasks_coord.node")

#: The result a handler's own completion reported, by the state it left the row in (a
#: completion of a run whose cancel was requested ends CANCELED: a failure of the run).
#: REDUNDANT is no completion's: a row replaced under the claim has no outcome to report.
_RESULT_BY_STATE = {
    TaskState.SUCCEEDED: Result.SUCCESS,
    TaskState.SUSPENDED: Result.SUSPENSION,
    TaskState.FILTERED: Result.FILTER,
    TaskState.FAILED: Result.FAILURE,
    TaskState.CANCELED: Result.FAILURE,
}


class Executor:
    """Runs tasks in the workers and settles each one (see the module).

    ``wake_lifeline`` is called when the node finds it may have been declared dead (the
    lifeline registers it again). :attr:`completer` is set once the node runs.
    """

    def __init__(self, state: NodeState, load: Load, *, wake_lifeline: Callable[[], None]) -> None:
        self.state = state
        self.load = load
        self.wake_lifeline = wake_lifeline
        self.completer: Completer | None = None

    def completer_idle(self) -> bool:
        """Whether no completion waits to be written."""
        return self.completer is None or self.completer.idle

    def execute(self, task_type: TaskType, tasks: list[Task]) -> None:
        """Run in a worker: apply attempt and waiting rules, call the handler, finish each task."""
        tasks = self.startable(tasks)
        runnable = []
        clock = self.state.clock
        now = clock.now()
        for task in tasks:
            verdict = self.pre_run_verdict(task_type, task, now)
            if verdict is None:
                runnable.append(task)
            else:
                self.finish(task_type, task, verdict, final=True)
        if runnable:
            assert self.completer is not None
            self.completer.starting(task_type, runnable)  # @task: log each attempt's start
            started = clock.monotonic()
            with self.state.runs.running(runnable):  # cancel flags, progress (running.py)
                decisions = task_type.run(runnable)
            self.load.task_seconds.add((clock.monotonic() - started) / len(runnable))
            for task, decision in zip(runnable, decisions, strict=True):
                self.finish(task_type, task, decision)

    def startable(self, tasks: list[Task]) -> list[Task]:
        """Those of ``tasks`` a worker may start now; the others go back to the queue.

        A node starts nothing from a claim it cannot prove it still holds: not after it
        may have been declared dead (:class:`~django_tasks_coord.node.claims.Claims`), and
        a leader-only run only under the term it was stamped with, while this node still
        leads under it. The others are released unstarted, their attempt refunded (a
        claim another node took meanwhile is left alone).
        """
        claims, leadership = self.state.claims, self.state.leadership
        term = None if leadership is None else leadership.valid_term()
        startable: list[Task] = []
        unproven: list[Task] = []
        for task in tasks:
            leader_only = task.topic_id.startswith(GROUP_TOPIC_PREFIX)
            proven = claims.holds(task.owner_id) and (
                not leader_only or (task.term is not None and task.term == term)
            )
            (startable if proven else unproven).append(task)
        if unproven:
            zombie = claims.expired
            first = unproven[0]
            if zombie:
                why = f"no heartbeat for {claims.silence():.1f}s, this node may have been declared dead"
            elif not claims.holds(first.owner_id):
                why = "they were claimed before this node registered again"
            else:
                why = f"this node no longer leads under term {first.term}"
            logger.warning(
                "Not starting %s task(s) of %s: %s.",
                len(unproven),
                first.topic_id,
                why,
                extra={"topic": first.topic_id, "node": self.state.node_id},
            )
            if zombie:
                self.wake_lifeline()  # register again
            self.release(unproven, refund_attempt=True)
        return startable

    def pre_run_verdict(self, task_type: TaskType, task: Task, now: datetime) -> Decision | None:
        """The outcome of ``task`` without running it (attempts used up by dead nodes, or
        too late for its ``waiting_time``), or None: run it."""
        if self.state.runs.is_requested(task):
            return Decision(Result.FAILURE, message="Canceled before it started.")
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
                    "node": self.state.node_id,
                },
            )
        return Decision(Result.FILTER, message=message)

    def finish(
        self, task_type: TaskType | None, task: Task, decision: Decision, *, final: bool = False
    ) -> None:
        """Record a task's outcome: retry a failure that has attempts left, else complete it.

        ``final`` failures (no handler, attempts used up by dead nodes) are never retried.
        """
        assert self.completer is not None
        wait = self.state.wait_unless_forced
        runs = self.state.runs
        requested = runs.is_requested(task)
        if requested or isinstance(decision.exception, TaskCanceledError):
            final = True  # never retried; a requested cancel's completion ends it CANCELED
        if requested and task.cancel_requested_at is None:
            task.cancel_requested_at = self.state.clock.now()  # as the database has it
        runs.forget(task)
        held_outcome = self._held_outcome(task, decision)
        if held_outcome is not None:  # the handler raised after its completion committed
            decision = held_outcome
        decision = self.completer.attempt_ended(task_type, task, decision)  # its log entry
        retry_at = None
        if not final and task_type is not None and decision.result is Result.FAILURE:
            retry_at = db.retry_while_lost(  # a job's policy is read from the database
                functools.partial(task_type.retry_at, task, decision, self.state.clock.now()),
                what="Scheduling a retry",
                wait=wait,
            )
        # The handler completed it in its own transaction (a fenced run), and that held.
        if task.is_completed and (held_outcome is not None or not self._rolled_back(task)):
            self.completer.put(task_type, task, decision)
        elif task_type is not None and not db.retry_while_lost(  # a leader's term is read
            functools.partial(task_type.may_complete, task), what="Checking a term", wait=wait
        ):
            logger.warning(
                "Not completing %s: this node no longer leads under term %s.",
                task,
                task.term,
                extra={
                    "task_sequence": task.sequence,
                    "topic": task.topic_id,
                    "node": self.state.node_id,
                    "term": task.term,
                },
            )
            self.release([task], refund_attempt=False)
        elif retry_at is not None and task_type is not None:
            self.retry(task_type, task, decision, retry_at)
        else:
            self.completer.put(task_type, task, decision)

    def _held_outcome(self, task: Task, decision: Decision) -> Decision | None:
        """The outcome to report for ``task`` when its handler completed it in its own
        transaction and then raised, and that completion held (the row is completed in the
        database under the claim: the exception came after the ``COMMIT`` went through, say
        a connection lost as its answer came back); None otherwise (the handler did not
        raise, did not complete the task, or its completion was rolled back:
        :meth:`_rolled_back`).

        The task succeeded (or ended as its handler decided): the node reports that
        completion, not a failure (no failure counted, no error policy), and logs what the
        handler raised: at INFO for a lost connection (part of an outage, which the node
        reports once: :mod:`django_tasks_coord.db`), at WARNING otherwise.
        """
        exc, state = decision.exception, TaskState(task.state)
        result = _RESULT_BY_STATE.get(state) if task.is_completed else None
        if exc is None or result is None:
            return None
        rows = held([task], state=state)  # the row in the state the completion gave it
        wait = self.state.wait_unless_forced
        if not db.retry_while_lost(rows.exists, what="Completing tasks", wait=wait):
            return None
        lost = db.connection_lost(exc)
        logger.log(
            logging.INFO if lost else logging.WARNING,
            "Task %s: its handler completed it and that completion held, then raised: %r; "
            "the node reports the completion.",
            task,
            exc,
            exc_info=None if lost else exc,
            extra={
                "task_sequence": task.sequence,
                "topic": task.topic_id,
                "node": self.state.node_id,
            },
        )
        return Decision(result, message=task.message)

    def _rolled_back(self, task: Task) -> bool:
        """Whether the handler's own completion of ``task`` was rolled back with its
        transaction (an exception later in the block, a connection lost at its ``COMMIT``):
        the row is still ACTIVE under the claim, whatever the object says. Then the object is
        made ACTIVE again, for the node to record the handler's outcome (a failure, retried
        under its policy): trusted, the task would stay ACTIVE under this live node's claim,
        which nothing expires (a workflow step waiting on it would never end)."""
        wait = self.state.wait_unless_forced
        if not db.retry_while_lost(held([task]).exists, what="Completing tasks", wait=wait):
            return False
        logger.warning(
            "Task %s: its handler completed it, but that completion was rolled back with the "
            "handler's transaction; the node records the handler's outcome instead.",
            task,
            extra={
                "task_sequence": task.sequence,
                "topic": task.topic_id,
                "node": self.state.node_id,
            },
        )
        task.state, task.finished_at = TaskState.ACTIVE, None
        return True

    def retry(self, task_type: TaskType, task: Task, decision: Decision, at: datetime) -> None:
        """Give ``task`` back to the queue, due ``at``, for its next attempt."""
        delay = at - self.state.clock.now()
        node_id = self.state.node_id
        try:
            db.retry_while_lost(
                functools.partial(queue.release, task, execute_at=at, decision=decision),
                what="Scheduling a retry",
                wait=self.state.wait_unless_forced,
            )
        except TasksCoordError as exc:
            logger.warning("Could not schedule a retry of %s: %s", task, exc)
        else:
            self.state.stats["retried"] += 1
            # An attempt that failed because the database connection was lost is part of
            # the outage, which the node reports once (django_tasks_coord.db): INFO here.
            lost = decision.exception is not None and db.connection_lost(decision.exception)
            logger.log(
                logging.INFO if lost else logging.WARNING,
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
                    "node": node_id,
                },
            )
            signals.send(
                signals.task_retried, Task, task=task, decision=decision, retry_at=at, node=node_id
            )
        finally:
            self.load.left(1)

    def release(self, tasks: list[Task], *, refund_attempt: bool) -> None:
        """Give ``tasks`` back to the queue (where their claim still stands); each one
        leaves the node's :class:`~django_tasks_coord.node.load.Load`."""
        for task in tasks:
            try:
                db.retry_while_lost(
                    functools.partial(queue.release, task, refund_attempt=refund_attempt),
                    what="Releasing tasks",
                    wait=self.state.wait_unless_forced,
                )
            except (TasksCoordError, DatabaseError) as exc:
                logger.debug("Not releasing %s: %s", task, exc)
            finally:
                self.load.left(1)
