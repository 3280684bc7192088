"""The completer: the one writer of a node, off the workers' threads, in batches.

Workers hand ``(task type, task, decision)`` over and go on with the next task; the
completer writes every kind of task's outcome:

- outcomes that carry values of their own (a ``@task``'s return value and attempt
  log entry, which ride back in its :class:`~django_tasks_coord.enums.Decision`, or a
  consumer's entry that ends its attempt log) are written together, per-row values in
  one ``UPDATE`` (:func:`~django_tasks_coord.store.completion.write_changes`);
- the others are grouped by what they share (same result, same message, no
  exception) and each group completed with one ``queue.complete_many``.

Then it hands them to their follow-ups (:mod:`~django_tasks_coord.node.follow_ups`).
It also writes the attempt log of running tasks, batched with
everything else handed over meanwhile: the end of a failed attempt (:meth:`attempt_ended`,
waited for by its worker: the node retries or fails the task right after, and must
find it written) and, for task types that log every attempt (``@task``), its start
(:meth:`starting`), written only if the attempt still runs :data:`START_DELAY` seconds
later: a shorter attempt's outcome carries its whole log anyway, so most tasks cost
one batched write. A node killed between a task's end and its completion runs that
task again after the liveness interval: execution is at least once.

A write that fails because the database connection broke is not dropped: the completer
backs off (:class:`~django_tasks_coord.db.Reconnect`) and writes the same batch again
until the database answers, or until the node must stop at once (declared dead, or a
second stop request). Follow-ups are retried the same way. Writes are fenced by their
claim: a batch whose commit went through just before the connection broke matches
nothing the second time, and its tasks, found finished under their own claim with the
outcome written, count as completed once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import queue as stdlib_queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.utils import timezone

from django_tasks_coord import attempts, db, queue, store
from django_tasks_coord.enums import UNSET, Decision, Result, TaskState
from django_tasks_coord.exceptions import (
    TaskAlreadyCompletedError,
    TaskRedundantError,
    TasksCoordError,
)
from django_tasks_coord.handlers import TaskType
from django_tasks_coord.models import Task
from django_tasks_coord.node.follow_ups import FollowUps, Item, log_extra
from django_tasks_coord.node.log_writes import TICK, DelayedStarts, LogWrite, Received

if TYPE_CHECKING:
    from django_tasks_coord.node import Node

logger = logging.getLogger(__name__)

MAX_BATCH = 500
#: Seconds after which the start of a still running attempt is written.
START_DELAY = 0.2
#: Seconds the completer waits for more outcomes before it writes a batch, while more of
#: its node's tasks are under way (see :meth:`Completer._receive`). Without it, under load,
#: each write took the one or two outcomes handed over during the previous write: a
#: statement, a commit and the follow-ups' work for every few tasks.
LINGER = 0.002


class Completer(threading.Thread):
    """Writes the outcomes and attempt logs of one node's tasks, in batches."""

    def __init__(self, node: Node, stopping: threading.Event) -> None:
        super().__init__(name="completer", daemon=True)
        self.node = node
        self._items: stdlib_queue.SimpleQueue[Received] = stdlib_queue.SimpleQueue()
        self._follow_ups = FollowUps(node)
        self._busy = threading.Event()
        self._lock = threading.Lock()
        #: Starts of attempts not written yet (see :meth:`starting`).
        self._delayed = DelayedStarts()
        #: Set once a write of the current batch had to be retried after a lost connection.
        self._reconnected = False

    def put(self, task_type: TaskType | None, task: Task, decision: Decision) -> None:
        """Hand over a finished task."""
        self._items.put((task_type, task, decision))

    def starting(self, task_type: TaskType, tasks: list[Task]) -> list[LogWrite]:
        """``tasks`` start an attempt now: for task types that log every attempt, begin
        their entries (:func:`~django_tasks_coord.attempts.begin`) and write them if the
        attempts still run :data:`START_DELAY` seconds later. Returns those writes.

        They wait in :class:`~django_tasks_coord.node.log_writes.DelayedStarts`, not in
        the queue: most attempts end sooner, and their outcome replaces the start unwritten.
        """
        if not task_type.logs_every_attempt:
            return []
        now, due = timezone.now(), time.monotonic() + START_DELAY
        node_id = self.node.node_id or ""
        for task in tasks:
            attempts.begin(task, node_id, now=now)
        writes = [
            LogWrite(store.Change(task, {"attempt_log": list(task.attempt_log or [])}), due)
            for task in tasks
        ]
        sleeping = self._delayed.add(writes) if self.is_alive() else None
        if sleeping is None:
            return []
        if sleeping:  # the thread sleeps without a timeout: it needs one now
            self._items.put(TICK)
        return writes

    def attempt_ended(self, task_type: TaskType | None, task: Task, decision: Decision) -> Decision:
        """Log the attempt of ``task`` that ended with ``decision`` (see
        :mod:`~django_tasks_coord.attempts`) and return the decision to complete it with.

        A failure's entry is written now, and waited for: the task may go back to the
        queue for a retry. Any other entry rides back in the decision (``attempt``), to
        be written with the completion. Never raises: the log is an aid, the completion
        that follows is what counts.
        """
        entry = decision.attempt
        if entry is None:
            if task_type is not None and task_type.logs_every_attempt:
                return decision  # not run (a pre-run verdict): results show it as lost
            if not attempts.must_log(task, decision):
                return decision
            entry = attempts.ended(task, decision, self.node.node_id)
        try:  # a run the node may not complete is released: its entry must not wait for that
            rides = decision.result is not Result.FAILURE and (
                task_type is None or task_type.may_complete(task)
            )
        except Exception:  # noqa: BLE001 - the node asks again, and handles it, right after
            rides = False
        if rides:
            return dataclasses.replace(decision, attempt=entry)
        self._write_log(task, entry.into(task.attempt_log))
        return dataclasses.replace(decision, attempt=None)

    @property
    def idle(self) -> bool:
        """Nothing waiting and nothing being written (delayed starts aside: their tasks
        are running, or gone)."""
        return self._items.empty() and not self._busy.is_set()

    def flush_and_stop(self, timeout: float = 60.0) -> None:
        """Write everything handed over so far (delayed starts too), then stop the thread.

        Attempt logs handed over later are written by their workers themselves."""
        with self._lock:
            self._delayed.closed = True
            self._items.put(None)
        self.join(timeout)

    def run(self) -> None:
        try:
            stop = False
            while not stop:
                received = self._receive()
                self._busy.set()
                stop = None in received
                items, logs, replaced = self._delayed.sort(received, time.monotonic(), stop)
                if logs:
                    self._write_logs(logs)
                if items:
                    self._reconnected = False
                    self._write(items)
                for start in replaced:  # written with its completion, if that was
                    start.settle(start.change.task.is_completed)
                self._busy.clear()
        finally:
            connections[db.alias()].close()

    # --- attempt logs -------------------------------------------------------------------

    def _submit(self, write: LogWrite) -> bool:
        with self._lock:
            if self._delayed.closed or not self.is_alive():
                return False
            self._items.put(write)
            return True

    def _write_log(self, task: Task, log: list[Any]) -> None:
        write = LogWrite(store.Change(task, {"attempt_log": log}))
        try:
            written = write.wait() if self._submit(write) else None
            if written is None:  # no completer thread, or its batch failed: write it alone
                written = store.write_log(task, log)
            elif written:
                task.attempt_log = log
        except Exception:
            logger.exception(
                "Could not write the attempt log of %s.",
                task,
                extra=log_extra(task, self.node.node_id),
            )

    def _receive(self) -> list[Received]:
        """What was handed over: waits for the first one, or until a delayed start is due.

        Then, while more of the node's tasks are under way than outcomes were received (and
        no stop came), waits up to :data:`LINGER` seconds for theirs, so that one write
        takes many. A node running one task at a time writes its outcome at once.
        """
        due = self._delayed.next_due()
        timeout = None if due is None else max(due - time.monotonic(), 0)
        received: list[Received] = []
        with contextlib.suppress(stdlib_queue.Empty):
            received.append(self._items.get(timeout=timeout))
        self._delayed.sleeping = False
        self._take_waiting(received)
        deadline = time.monotonic() + LINGER
        while received and self._more_coming(received):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                received.append(self._items.get(timeout=left))
            except stdlib_queue.Empty:
                break
            self._take_waiting(received)
        return received

    def _take_waiting(self, received: list[Received]) -> None:
        """Add what waits in the queue to ``received``, up to :data:`MAX_BATCH`."""
        while len(received) < MAX_BATCH:
            try:
                received.append(self._items.get_nowait())
            except stdlib_queue.Empty:
                break

    def _more_coming(self, received: list[Received]) -> bool:
        """Whether waiting for more outcomes may pay: the batch has room, no stop came,
        and the node has more tasks under way than ``received`` completes."""
        if len(received) >= MAX_BATCH or None in received:
            return False
        outcomes = sum(1 for item in received if isinstance(item, tuple))
        return outcomes > 0 and self.node.in_flight > outcomes

    def _write_logs(self, writes: list[LogWrite]) -> None:
        ok: dict[int, bool | None] = {}
        try:
            changes = [write.change for write in writes]
            self._retrying(lambda: store.write_changes(changes))
            ok = {id(write): write.change.ok for write in writes}
        except Exception:
            logger.exception("Writing %s attempt log(s) failed.", len(writes))
            connections[db.alias()].close()
        finally:
            for write in writes:
                write.settle(ok.get(id(write)))

    # --- completions --------------------------------------------------------------------

    def _write(self, batch: list[Item]) -> None:
        groups: dict[tuple[Result, str | None], list[Item]] = defaultdict(list)
        singles: list[Item] = []
        done_in_band = [item for item in batch if item[1].is_completed]
        if done_in_band:  # completed by the handler itself (a fenced job run)
            self._follow_ups.completed([item for item in done_in_band if self._committed(item)])
        rest = [item for item in batch if not item[1].is_completed]
        own_values = [item for item in rest if _carries_values(item[2])]
        if own_values:
            self._write_own_values(own_values)
        for item in rest:
            if _carries_values(item[2]):
                continue
            decision = item[2]
            if decision.exception is None:
                groups[(decision.result, decision.message)].append(item)
            else:
                singles.append(item)
        for items in groups.values():
            decision = items[0][2]
            tasks = [task for _, task, _ in items]
            try:
                self._retrying(lambda: queue.complete_many(tasks, decision))  # noqa: B023
            except TasksCoordError:
                singles.extend(items)  # someone else changed one of them: go one by one
            except Exception:
                logger.exception("Completing %s task(s) failed; they will expire.", len(items))
                self.node.done(len(items))
            else:
                self._follow_ups.completed(items)
        for item in singles:
            self._complete_one(item)

    def _write_own_values(self, items: list[Item]) -> None:
        """Complete tasks whose outcomes carry values of their own, per-row in one ``UPDATE``;
        if that fails, each alone (one row's values must not sink the others')."""
        changes = [store.Change(task, _completion(task, decision)) for _, task, decision in items]
        try:
            self._retrying(lambda: store.write_changes(changes))
        except Exception:
            logger.exception("Writing %s outcome(s) at once failed; each alone now.", len(items))
            for change in changes:
                try:
                    self._retrying(functools.partial(store.write_changes, [change]))
                except Exception:
                    logger.exception(
                        "Completing task %s failed; it will expire.",
                        change.task,
                        extra=log_extra(change.task, self.node.node_id),
                    )
        written = []
        for item, change in zip(items, changes, strict=True):
            task = item[1]
            if change.ok:
                for name, value in change.fields.items():
                    setattr(task, name, value)
                if change.canceled:  # a cancel was requested (store.claims.end_claims)
                    task.state = TaskState.CANCELED
                written.append(item)
            elif change.ok is False:
                logger.warning(
                    "Task %s could not be completed: its claim was lost (replaced, cancelled, "
                    "or handed to another node); its outcome is discarded.",
                    task,
                    extra=log_extra(task, self.node.node_id),
                )
                self.node.done(1)
            else:
                self.node.done(1)  # its write failed (logged above): it expires
        self._follow_ups.completed(written)

    def _not_completed(self, task: Task, exc: TasksCoordError) -> None:
        logger.warning(
            "Task %s could not be completed: %s",
            task,
            exc,
            extra=log_extra(task, self.node.node_id),
        )
        self.node.done(1)

    def _complete_one(self, item: Item) -> None:
        _, task, decision = item
        try:
            self._retrying(lambda: queue.complete(task, decision))
        except TaskRedundantError:
            logger.info(
                "Task %s was replaced while it ran; its result is discarded.",
                task,
                extra=log_extra(task, self.node.node_id),
            )
            self.node.done(1)
        except TaskAlreadyCompletedError as exc:
            if self._reconnected and self._written_before(task, decision):
                self._follow_ups.completed(
                    [item]
                )  # its commit went through as the connection broke
            else:
                self._not_completed(task, exc)
        except TasksCoordError as exc:
            self._not_completed(task, exc)
        except Exception:
            logger.exception(
                "Completing task %s failed; it will expire.",
                task,
                extra=log_extra(task, self.node.node_id),
            )
            self.node.done(1)
        else:
            self._follow_ups.completed([item])

    def _retrying(self, write: Callable[[], object]) -> None:
        """Run ``write``; while the database connection is lost, reconnect and run it again.

        It gives up (raising the error) only once the node must stop at once (declared
        dead, or a second stop request): its tasks expire then and other nodes run them.
        """

        def wait(seconds: float) -> bool:
            self._reconnected = True
            return self.node.wait_unless_forced(seconds)

        db.retry_while_lost(write, what="Completing tasks", wait=wait)

    def _written_before(self, task: Task, decision: Decision) -> bool:
        """Whether ``task`` is finished under its own claim with ``decision``'s state (the
        commit of an earlier try went through, only its answer was lost)."""
        rows = store.held([task], state=decision.result.state)
        return bool(
            db.retry_while_lost(
                rows.exists, what="Completing tasks", wait=self.node.wait_unless_forced
            )
        )

    def _committed(self, item: Item) -> bool:
        """Whether a task its handler completed is completed in the database too (the task
        type's ``outcome_committed``).

        Only then does it count as processed and send its signals: an outcome whose write
        failed leaves the task to expire and run again, and must not be announced twice.
        """
        task_type, task, _ = item
        try:
            if task_type is None or db.retry_while_lost(
                functools.partial(task_type.outcome_committed, task),
                what="Completing tasks",
                wait=self.node.wait_unless_forced,
            ):
                return True
        except Exception:
            logger.exception(
                "Completing task %s failed; it will expire.",
                task,
                extra=log_extra(task, self.node.node_id),
            )
        self.node.done(1)
        return False


def _carries_values(decision: Decision) -> bool:
    """Whether completing with ``decision`` writes values of its own (a return value, an
    attempt log entry), per row."""
    return decision.value is not UNSET or decision.attempt is not None


def _completion(task: Task, decision: Decision) -> dict[str, Any]:
    """The fields a completion with ``decision`` writes (``finished_at`` aside)."""
    fields: dict[str, Any] = {
        "state": decision.result.state,
        "message": decision.message,
        "error": queue.format_exception(decision.exception),
        "owner": None,
    }
    if decision.value is not UNSET:
        fields["result"] = decision.value
    if decision.attempt is not None:
        fields["attempt_log"] = decision.attempt.into(task.attempt_log)
    return fields
