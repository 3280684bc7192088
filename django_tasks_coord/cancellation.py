"""Cancelling tasks: at once if they do not run, by a request to their handler if they do.

:func:`cancel` and :func:`cancel_many` are re-exported by :mod:`django_tasks_coord.queue`
(``queue.cancel``). What a running handler sees of a request, and how the node delivers
it, is :mod:`django_tasks_coord.running`; the task store writes the rows
(:func:`django_tasks_coord.store.cancels.cancel`, :func:`~django_tasks_coord.store.cancels.request_cancel`,
:func:`~django_tasks_coord.store.claims.end_claims`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from django.utils import timezone

from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Task
from django_tasks_coord.store import cancels
from django_tasks_coord.validation import check_task, state_error

__all__ = ["cancel", "cancel_many"]


def _canceled(message: str | None) -> dict[str, Any]:
    return {
        "state": TaskState.CANCELED,
        "finished_at": timezone.now(),
        "owner": None,
        "message": message,
    }


def cancel(task: Task, message: str | None = None) -> Task:
    """Cancel a task that is not completed yet.

    A task that is not running (PENDING, REQUESTED) is CANCELED at once. An
    ACTIVE one is asked to stop: its ``cancel_requested_at`` is set (and ``message``), it
    stays ACTIVE while its handler runs, and ends CANCELED however the handler ends
    (:mod:`django_tasks_coord.running`: the node running it tells the handler within one
    heartbeat). Cancelling it again changes nothing. Raises
    :class:`TaskAlreadyCompletedError` if it is completed already.
    """
    task = check_task(task)
    changes = _canceled(message)
    how = cancels.cancel(task, changes)
    if how is None:
        raise state_error(task, "cancel", "not completed (PENDING, REQUESTED or ACTIVE)")
    if how == "canceled":
        for field, value in changes.items():
            setattr(task, field, value)
    else:
        task.state = TaskState.ACTIVE
        if message is not None:
            task.message = message
    return task


def cancel_many(
    tasks: Sequence[Task],
    message: str | None = None,
    *,
    states: Collection[TaskState] | None = None,
) -> list[Task]:
    """Like :func:`cancel` for a batch, in one transaction: return the tasks canceled, or
    (ACTIVE ones) asked to stop (their ``cancel_requested_at`` set).

    Tasks already completed (or, with ``states``, no longer in one of them) are left
    alone, and so are rows a node holds locked at that moment (it is claiming or
    completing them: ``SKIP LOCKED``); they are missing from the result.
    """
    changes = _canceled(message)
    canceled, requested = cancels.cancel_many(tasks, changes, states)
    for task in canceled:
        for field, value in changes.items():
            setattr(task, field, value)
    return sorted([*canceled, *requested], key=lambda task: task.sequence)
