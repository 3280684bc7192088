"""Inserting task rows, each insert announced (NOTIFY) to the nodes of its topics.

Pushes with their insertion mode (:func:`push`: REPLACE and SUPERSEDE make earlier
tasks of the identifiers redundant, DELETE deletes them), tasks created for external
executors and recreated copies (:func:`insert`). The rows themselves are written by
:meth:`TaskQuerySet.insert <django_tasks_coord.models.TaskQuerySet.insert>`, the
data layer's primitive (one statement where the database returns the keys of a
multi-row insert), which nothing outside this package calls.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.utils import timezone

from django_tasks_coord import db
from django_tasks_coord.enums import IN_FLIGHT, Insertion, TaskState
from django_tasks_coord.models import Task

__all__ = ["insert", "push"]

#: Identifiers per statement when an insertion mode changes earlier tasks.
_CHUNK = 500


def insert(tasks: list[Task], *, using: str | None = None, announce: bool = True) -> list[Task]:
    """Insert ``tasks`` and return them with their sequence and database-made fields.

    With ``announce`` (the default), the nodes of their topics are told (NOTIFY, in the
    transaction of the insert where one is open), so that sleeping nodes claim them at once.
    """
    if not tasks:
        return []
    using = using or db.alias()
    created = Task.objects.using(using).insert(tasks)
    if announce:
        for topic in sorted({task.topic_id for task in created}):
            db.notify(db.connection(), topic)
    return created


def push(
    topic: str,
    tasks: list[Task],
    identifiers: Sequence[str],
    insertion: Insertion,
    *,
    using: str | None = None,
) -> list[Task]:
    """Apply ``insertion`` to the earlier tasks of ``identifiers`` in ``topic``, then insert
    ``tasks`` (all of ``topic``) and announce them. Run it inside one transaction."""
    using = using or db.alias()
    if insertion is not Insertion.APPEND:
        _apply_insertion(topic, list(identifiers), insertion, using)
    created = Task.objects.using(using).insert(tasks)
    db.notify(db.connection(), topic)
    return created


def _apply_insertion(topic: str, identifiers: list[str], insertion: Insertion, using: str) -> None:
    """REPLACE: unfinished tasks (in flight too) become REDUNDANT; SUPERSEDE: pending ones
    do; DELETE: every earlier task that is not in flight is deleted."""
    for start in range(0, len(identifiers), _CHUNK):
        chunk = identifiers[start : start + _CHUNK]
        existing = Task.objects.using(using).filter(topic_id=topic)
        if insertion is Insertion.REPLACE:
            existing.unfinished_of(chunk).update(
                state=TaskState.REDUNDANT, finished_at=timezone.now(), owner=None
            )
        elif insertion is Insertion.SUPERSEDE:
            existing.unfinished_of(chunk).pending().update(
                state=TaskState.REDUNDANT, finished_at=timezone.now()
            )
        else:
            existing.filter(identifier__in=chunk).exclude(state__in=IN_FLIGHT).delete()
