"""What follows the completion of tasks on a node: counts, streaks, policies, signals.

Once the completer (:mod:`django_tasks_coord.node.completer`) has written outcomes, it
hands the tasks here: each counts as processed (or failed) on the node, the topics'
failure streaks are kept, a failure's error policy applies (it may pause the topic),
the task types' ``on_outcome`` is called, ``task_completed`` is sent, and the workflow
advancer is woken (:mod:`~django_tasks_coord.node.workflows`). Each
follow-up is called again while the database connection is lost.
"""

from __future__ import annotations

import functools
import logging
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING

from django_tasks_coord import db, signals, topics
from django_tasks_coord.enums import Decision, ErrorPolicy, Result, TaskState
from django_tasks_coord.handlers import TaskType
from django_tasks_coord.models import Task

if TYPE_CHECKING:
    from django_tasks_coord.node import Node

#: The completer's logger: these records are about its completions.
logger = logging.getLogger("django_tasks_coord.node.completer")

#: A finished task as workers hand it over: its task type, the task and its decision.
Item = tuple[TaskType | None, Task, Decision]


def log_extra(task: Task, node_id: str | None) -> dict[str, object]:
    """The structured fields of a log record about ``task``."""
    return {"task_sequence": task.sequence, "topic": task.topic_id, "node": node_id}


def _has_on_outcome(task_type: TaskType) -> bool:
    """Whether ``task_type`` does something once an outcome is written (not the base no-op)."""
    return type(task_type).on_outcome is not TaskType.on_outcome


class FollowUps:
    """The follow-ups of one node's completions."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def _follow_up(self, call: Callable[..., object], *args: object, **kwargs: object) -> None:
        """``call(*args, **kwargs)``, called again while the database connection is lost."""
        db.retry_while_lost(
            functools.partial(call, *args, **kwargs),
            what="After completing tasks",
            wait=self.node.wait_unless_forced,
        )

    def completed(self, items: list[Item]) -> None:
        """Follow up on ``items``, whose outcomes are written."""
        try:  # the workflow steps these tasks were (before they count as done: a burst)
            self.node.workflows.wake_after_completions()
        except Exception:
            logger.exception("After completing tasks: advancing workflows failed.")
        by_topic: dict[str, list[Item]] = defaultdict(list)
        for item in items:
            by_topic[item[1].topic_id].append(item)
        for topic, topic_items in by_topic.items():
            canceled = sum(1 for item in topic_items if item[1].state == TaskState.CANCELED)
            failures = [
                item
                for item in topic_items
                if item[2].result is Result.FAILURE and item[1].state != TaskState.CANCELED
            ]  # a canceled task's handler may fail (TaskCanceledError): not the topic's failure
            self.node.stats["processed"] += len(topic_items)
            self.node.stats["failed"] += len(failures)
            successes = len(topic_items) - len(failures) - canceled
            try:  # each follow-up again if the connection breaks in it (a restart, a kill)
                self._follow_up(
                    topics.record_outcomes, topic, successes=successes, failures=len(failures)
                )
                for task_type, task, decision in failures:
                    self._follow_up(self._apply_error_policy, task_type, task, decision)
                for task_type, task, decision in topic_items:
                    if task_type is not None and _has_on_outcome(task_type):
                        self._follow_up(task_type.on_outcome, task, decision)
            except Exception:
                logger.exception(
                    "After completing tasks of %r: a follow-up failed.",
                    topic,
                    extra={"topic": topic, "node": self.node.node_id},
                )
            finally:
                self.node.done(len(topic_items))
            if not signals.task_completed.has_listeners(Task):  # asked once per batch
                continue
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
                extra={**log_extra(task, self.node.node_id), "attempt": task.attempts},
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
