"""Attempt log writes: a running task's ``attempt_log``, fenced by its claim.

The node's completer writes attempt logs in batches
(:mod:`django_tasks_coord.store.completion`); this is the write of one task's log on
its own, for when no completer runs (it stopped, or its batch failed).
"""

from __future__ import annotations

from typing import Any

from django_tasks_coord import db
from django_tasks_coord.models import Task
from django_tasks_coord.store.fencing import held


def write_log(task: Task, log: list[Any]) -> bool:
    """Store ``log`` as ``task``'s attempt log if ``task`` is still ACTIVE under its claim.

    Returns whether it was written. A lost connection is waited out
    (:func:`~django_tasks_coord.db.retry_while_lost`): the write is fenced, so repeating
    it is safe.
    """
    rows = held([task])
    written = db.retry_while_lost(
        lambda: rows.update(attempt_log=log), what="Writing an attempt log"
    )
    if written != 1:
        return False
    task.attempt_log = log
    return True
