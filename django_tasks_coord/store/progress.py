"""Progress of running tasks: the latest value each handler reported, many tasks per statement.

A progress write is fenced by the claim the task carries (its ``exec_id``) but not by
its state: the last value a handler reported just before it returned is still written
after its completion, and a task handed out again since (a new ``exec_id``) is left alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.models import Q

from django_tasks_coord import db
from django_tasks_coord.models import Task
from django_tasks_coord.store.completion import PerRow

__all__ = ["write"]


def write(values: Sequence[tuple[Task, Any]]) -> int:
    """Write each task's progress (one ``UPDATE`` for all); return the rows written."""
    latest = {task.pk: (task, value) for task, value in values}
    if not latest:
        return 0
    under = Q(pk__in=[])
    for task, _ in latest.values():
        under |= Q(pk=task.pk, exec_id=task.exec_id)
    rows = Task.objects.using(db.alias()).rows(task for task, _ in latest.values()).filter(under)
    if len(latest) == 1:
        ((_, value),) = latest.values()
        return rows.update(progress=value)
    field = Task._meta.get_field("progress")
    per_row = PerRow({pk: value for pk, (_, value) in latest.items()}, field)
    return rows.update(progress=per_row)
