"""Fencing: the rows still held under the claims the given tasks carry.

A claim is identified by the ``exec_id`` a poll gave the task; a write on behalf of a
claim (finish, release, a fenced run's last step) applies only to the rows that are
still in the state the claim left them in under that same ``exec_id``. This is the one
place that spells that predicate.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from django.db.models import Q

from django_tasks_coord import db
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Task, TaskQuerySet


def held(
    tasks: Iterable[Task], *, state: TaskState = TaskState.ACTIVE, using: str | None = None
) -> TaskQuerySet:
    """The rows of ``tasks`` still in ``state`` under the claim (``exec_id``) each carries.

    Tasks may carry different claims (a batch of completions from several polls); each
    row matches only under its own. ``UPDATE`` it and compare the count with the number
    of distinct tasks to learn whether every claim still held.
    """
    tasks = list(tasks)
    claims: dict[uuid.UUID | None, set[int]] = {}
    for task in tasks:
        claims.setdefault(task.exec_id, set()).add(task.pk)
    rows = Task.objects.using(using or db.alias()).rows(tasks)
    if len(claims) == 1:  # one claim: each of the rows under it
        (exec_id,) = claims
        return rows.filter(exec_id=exec_id, state=state)
    under = Q(pk__in=[])
    for exec_id, pks in claims.items():
        under |= Q(pk__in=pks, exec_id=exec_id)
    return rows.filter(under, state=state)
