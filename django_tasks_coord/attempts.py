"""The attempt log of tasks run by consumers: error, node and time of each attempt.

Tasks of ``@task`` (Django's task framework) keep ``Task.attempt_log`` through their
worker (:mod:`django_tasks_coord.backends.worker`). Tasks run by a consumer or a
handler path get the same entries from the node, written by :func:`record` when an
attempt ends:

- every attempt that failed (retried or not);
- any later attempt once the log has an entry, so that it ends with the attempt that
  finished the task.

A task that succeeds at its first attempt gets no entry: its ``started_at``,
``finished_at`` and owner say it all, and its completion stays one batched ``UPDATE``.
The entry is written fenced by the claim (``state`` ACTIVE under the task's
``exec_id``), like the worker's: a node that lost the task writes nothing.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from typing import Any

from django.utils import timezone

from django_tasks_coord import db
from django_tasks_coord.enums import Decision, Result, TaskState
from django_tasks_coord.handlers import TaskType
from django_tasks_coord.models import Task

logger = logging.getLogger(__name__)

#: ``outcome`` of an entry, per result (the words of the ``@task`` attempt log).
OUTCOMES = {
    Result.SUCCESS: "succeeded",
    Result.FAILURE: "failed",
    Result.FILTER: "filtered",
    Result.SUSPENSION: "suspended",
}


def entry(task: Task, decision: Decision, node: str | None) -> dict[str, Any]:
    """The attempt-log entry of the attempt of ``task`` that ended with ``decision``."""
    found: dict[str, Any] = {
        "attempt": task.attempts,
        "worker_id": node or "",
        "started_at": task.started_at.isoformat() if task.started_at else None,
        "finished_at": timezone.now().isoformat(),
        "outcome": OUTCOMES.get(decision.result, str(decision.result)),
    }
    if decision.message:
        found["message"] = decision.message
    exc = decision.exception
    if exc is not None:
        found["exception_class_path"] = f"{type(exc).__module__}.{type(exc).__qualname__}"
        found["error"] = str(exc)
        found["traceback"] = "".join(traceback.format_exception(exc))
    return found


def record(
    task_type: TaskType | None,
    task: Task,
    decision: Decision,
    node: str | None,
    *,
    wait: Callable[[float], bool] | None = None,
) -> bool:
    """Append this attempt to ``task``'s log if it must be kept (see the module docstring).

    Returns whether an entry was written. A lost database connection is waited out like
    every write of a node (:func:`~django_tasks_coord.db.retry_while_lost`; ``wait``
    sleeps between tries and returns True to give up): the write is fenced by the claim,
    so repeating it is safe. Never raises: the log is an aid, the completion that follows
    is what counts.
    """
    if task_type is not None and task_type.keeps_attempt_log:
        return False  # its own worker writes the log (Django tasks)
    if task.is_completed or (decision.result is not Result.FAILURE and not task.attempt_log):
        return False
    log = [*(task.attempt_log or []), entry(task, decision, node)]
    try:
        held = Task.objects.using(db.alias()).filter(
            topic_id=task.topic_id, pk=task.pk, state=TaskState.ACTIVE, exec_id=task.exec_id
        )
        written = db.retry_while_lost(
            lambda: held.update(attempt_log=log), what="Writing an attempt log", wait=wait
        )
        if written != 1:
            return False  # the claim was lost: the completion will say so
    except Exception:
        logger.exception("Could not write the attempt log of %s.", task)
        return False
    task.attempt_log = log
    return True
