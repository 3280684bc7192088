"""Finishing claimed tasks: the queue's completions and an external executor's reports.

Each write applies only while the task is still held under the claim it quotes
(:func:`~django_tasks_coord.store.fencing.held`): a task whose claim was lost (its
owner declared dead, a timeout, a release, a cancel, a REPLACE push) is left alone,
and the caller explains why.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django_tasks_coord import db
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Task
from django_tasks_coord.store.claims import end_claims
from django_tasks_coord.store.fencing import held

__all__ = ["complete", "report"]


class _ClaimsLost(Exception):
    """Internal: a batch completion matched fewer rows than tasks; roll it back."""


def complete(tasks: Sequence[Task], changes: dict[str, Any]) -> bool:
    """Apply ``changes`` to every one of ``tasks`` still ACTIVE under its claim, in one
    statement; all or nothing: False, and nothing written, if any claim was lost. A task
    whose cancel was requested ends CANCELED instead (:func:`~.claims.end_claims`; its
    ``state`` in memory says so)."""
    expected = len({task.pk for task in tasks})
    try:
        with db.write_transaction():
            written, canceled = end_claims(held(tasks), changes, expected)
            if written != expected:
                raise _ClaimsLost
    except _ClaimsLost:
        return False
    for task in tasks:
        if task.pk in canceled:
            task.state = TaskState.CANCELED
    return True


def report(task: Task, held_in: TaskState, /, **changes: Any) -> None:
    """Apply ``changes`` to ``task`` (a defined task in state ``held_in`` under its
    ``exec_id``, its row locked by the caller) and to the object in memory: an executor's
    start, notify, success or failure, or an in-progress timeout."""
    rows = held([task], state=held_in, using=db.alias())
    for name, value in changes.items():
        setattr(task, name, value)
    rows.update(**changes)
