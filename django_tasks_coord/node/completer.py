"""The completer: writes the outcomes of finished tasks in batches, off the workers' threads.

Workers hand ``(task type, task, decision)`` over and go on with the next task;
the completer groups outcomes that can share one ``UPDATE`` (same result, same
message, no exception) and completes each group with ``queue.complete_many``. Then
it applies error policies and keeps the topics' failure streaks.

A node killed between a task's end and its completion runs that task again after
the liveness interval: execution is at least once.

A completion that fails because the database connection broke (a restart, a killed
connection) is not dropped: the completer closes its connection, backs off
(:class:`~django_tasks_coord.db.Reconnect`) and writes the same batch again until the
database answers, or until the node must stop at once (declared dead: its tasks belong
to others then; or a second stop request). Its follow-ups (failure streaks, error
policies, ``on_outcome``) are retried the same way. Completions are fenced by their
claim, so a batch whose commit went through just before the connection broke matches
nothing the second time; such tasks, found finished under their own claim with the
outcome written, count as completed once.
"""

from __future__ import annotations

import functools
import logging
import queue as stdlib_queue
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING

from django.db import connections

from django_tasks_coord import db, queue, signals, topics
from django_tasks_coord.enums import Decision, ErrorPolicy, Result
from django_tasks_coord.exceptions import (
    TaskAlreadyCompletedError,
    TaskRedundantError,
    TasksCoordError,
)
from django_tasks_coord.handlers import TaskType
from django_tasks_coord.models import Task

if TYPE_CHECKING:
    from django_tasks_coord.node import Node

logger = logging.getLogger(__name__)

Item = tuple[TaskType | None, Task, Decision]
MAX_BATCH = 500


class Completer(threading.Thread):
    """Completes finished tasks in batches for one node."""

    def __init__(self, node: Node, stopping: threading.Event) -> None:
        super().__init__(name="completer", daemon=True)
        self.node = node
        self._items: stdlib_queue.SimpleQueue[Item | None] = stdlib_queue.SimpleQueue()
        self._busy = threading.Event()
        self._stopped = threading.Event()
        #: Set once a write of the current batch had to be retried after a lost connection.
        self._reconnected = False

    def put(self, task_type: TaskType | None, task: Task, decision: Decision) -> None:
        """Hand over a finished task."""
        self._items.put((task_type, task, decision))

    @property
    def idle(self) -> bool:
        """Nothing waiting and nothing being written."""
        return self._items.empty() and not self._busy.is_set()

    def flush_and_stop(self, timeout: float = 60.0) -> None:
        """Write everything handed over so far, then stop the thread."""
        self._items.put(None)
        self.join(timeout)

    def run(self) -> None:
        try:
            while True:
                first = self._items.get()
                self._busy.set()
                batch, stop = ([] if first is None else [first]), first is None
                while not stop and len(batch) < MAX_BATCH:
                    try:
                        item = self._items.get_nowait()
                    except stdlib_queue.Empty:
                        break
                    if item is None:
                        stop = True
                    else:
                        batch.append(item)
                if batch:
                    self._reconnected = False
                    self._write(batch)
                self._busy.clear()
                if stop:
                    return
        finally:
            connections[db.alias()].close()

    def _write(self, batch: list[Item]) -> None:
        groups: dict[tuple[Result, str | None], list[Item]] = defaultdict(list)
        singles: list[Item] = []
        done_in_band = [item for item in batch if item[1].is_completed]
        if done_in_band:  # completed by the handler itself (a fenced job run, a Django task)
            self._completed([item for item in done_in_band if self._committed(item)])
        for item in batch:
            if item[1].is_completed:
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
                self._completed(items)
        for item in singles:
            self._complete_one(item)

    def _complete_one(self, item: Item) -> None:
        _, task, decision = item
        try:
            self._retrying(lambda: queue.complete(task, decision))
        except TaskRedundantError:
            logger.info(
                "Task %s was replaced while it ran; its result is discarded.",
                task,
                extra=self._extra(task),
            )
            self.node.done(1)
        except TaskAlreadyCompletedError as exc:
            if self._reconnected and self._written_before(task, decision):
                self._completed([item])  # its commit went through as the connection broke
            else:
                logger.warning(
                    "Task %s could not be completed: %s", task, exc, extra=self._extra(task)
                )
                self.node.done(1)
        except TasksCoordError as exc:
            logger.warning("Task %s could not be completed: %s", task, exc, extra=self._extra(task))
            self.node.done(1)
        except Exception:
            logger.exception(
                "Completing task %s failed; it will expire.", task, extra=self._extra(task)
            )
            self.node.done(1)
        else:
            self._completed([item])

    def _retrying(self, write: Callable[[], object]) -> None:
        """Run ``write``; while the database connection is lost, reconnect and run it again.

        It gives up (raising the error) only once the node must stop at once (declared
        dead, or a second stop request): its tasks expire then and other nodes run them.
        """

        def wait(seconds: float) -> bool:
            self._reconnected = True
            return self.node.wait_unless_forced(seconds)

        db.retry_while_lost(write, what="Completing tasks", wait=wait)

    def _follow_up(self, call: Callable[..., object], *args: object, **kwargs: object) -> None:
        """``call(*args, **kwargs)``, called again while the database connection is lost."""
        db.retry_while_lost(
            functools.partial(call, *args, **kwargs),
            what="After completing tasks",
            wait=self.node.wait_unless_forced,
        )

    def _written_before(self, task: Task, decision: Decision) -> bool:
        """Whether ``task`` is finished under its own claim with ``decision``'s state (the
        commit of an earlier try went through, only its answer was lost)."""
        rows = Task.objects.using(db.alias()).filter(
            pk=task.pk, exec_id=task.exec_id, state=decision.result.state
        )
        return bool(
            db.retry_while_lost(
                rows.exists, what="Completing tasks", wait=self.node.wait_unless_forced
            )
        )

    def _committed(self, item: Item) -> bool:
        """Whether a task its handler completed is completed in the database too.

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
                "Completing task %s failed; it will expire.", task, extra=self._extra(task)
            )
        self.node.done(1)
        return False

    def _extra(self, task: Task) -> dict[str, object]:
        """The structured fields of a log record about ``task``."""
        return {"task_sequence": task.sequence, "topic": task.topic_id, "node": self.node.node_id}

    def _completed(self, items: list[Item]) -> None:
        by_topic: dict[str, list[Item]] = defaultdict(list)
        for item in items:
            by_topic[item[1].topic_id].append(item)
        for topic, topic_items in by_topic.items():
            failures = [item for item in topic_items if item[2].result is Result.FAILURE]
            self.node.stats["processed"] += len(topic_items)
            self.node.stats["failed"] += len(failures)
            successes = len(topic_items) - len(failures)
            try:  # each follow-up again if the connection breaks in it (a restart, a kill)
                self._follow_up(
                    topics.record_outcomes, topic, successes=successes, failures=len(failures)
                )
                for task_type, task, decision in failures:
                    self._follow_up(self._apply_error_policy, task_type, task, decision)
                for task_type, task, decision in topic_items:
                    if task_type is not None:
                        self._follow_up(task_type.on_outcome, task, decision)
            except Exception:
                logger.exception(
                    "After completing tasks of %r: a follow-up failed.",
                    topic,
                    extra={"topic": topic, "node": self.node.node_id},
                )
            finally:
                self.node.done(len(topic_items))
            for _, task, decision in topic_items:
                signals.send(
                    signals.task_completed,
                    Task,
                    task=task,
                    decision=decision,
                    node=self.node.node_id,
                )

    def _apply_error_policy(
        self, task_type: TaskType | None, task: Task, decision: Decision
    ) -> None:
        policy = task_type.error_policy if task_type is not None else ErrorPolicy.LOG_AND_CONTINUE
        if policy.logs:
            logger.error(
                "Task %s failed after %s attempt(s): %s\n%s",
                task,
                task.attempts,
                decision.message or "",
                task.error or "",
                extra={**self._extra(task), "attempt": task.attempts},
            )
        if not policy.terminates:
            return
        # Pause in the database first: a topic refresh in between must not bring it back.
        paused = topics.pause_topic(task.topic_id)
        self.node.forget_topic(task.topic_id)
        if paused:
            logger.warning(
                "Topic %r paused by the error policy %s of %s; resume it when fixed.",
                task.topic_id,
                policy.name,
                task_type.name if task_type else "?",
                extra={"topic": task.topic_id, "node": self.node.node_id},
            )
