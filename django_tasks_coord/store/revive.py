"""Reviving completed tasks: in place (PENDING again, result and attempts cleared) or as
new copies, and starting suspended tasks together (a junction)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from django_tasks_coord import db
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Task, TaskQuerySet
from django_tasks_coord.store.claims import lock_batch
from django_tasks_coord.store.insert import insert

__all__ = ["REVIVED", "recreate", "recreate_many", "reset", "reset_many", "revive_suspended"]

#: What a revived task looks like: pending, as if never run.
REVIVED = {
    "state": TaskState.PENDING,
    "owner": None,
    "exec_id": None,
    "attempts": 0,
    "message": None,
    "error": None,
    "execute_at": None,
    "started_at": None,
    "finished_at": None,
    "cancel_requested_at": None,
    "progress": None,
}


def _revived(tasks: Sequence[Task]) -> None:
    for task in tasks:
        for field, value in REVIVED.items():
            setattr(task, field, value)


def reset(task: Task) -> bool:
    """Revive ``task`` in place if it is completed; False (nothing changed) otherwise."""
    if Task.objects.using(db.alias()).filter(pk=task.pk).completed().update(**REVIVED) != 1:
        return False
    _revived([task])
    return True


def _completed_rows(states: Collection[TaskState] | None) -> TaskQuerySet:
    rows = Task.objects.using(db.alias()).completed()
    return rows if states is None else rows.filter(state__in=list(states))


def reset_many(tasks: Sequence[Task], states: Collection[TaskState] | None) -> list[Task]:
    """Revive in place those of ``tasks`` still completed (and in ``states``), skipping rows
    locked elsewhere, in one transaction; announce their topics; return them."""
    with db.write_transaction():
        revived = lock_batch(_completed_rows(states), tasks)
        if revived:
            Task.objects.using(db.alias()).rows(revived).update(**REVIVED)
            _announce(revived)
    _revived(revived)
    return revived


def _copy_of(original: Task) -> Task:
    return Task(
        topic_id=original.topic_id,
        identifier=original.identifier,
        payload=original.payload,
        priority=original.priority,
        recreated=True,
        original=original,
    )


def recreate_many(tasks: Sequence[Task], states: Collection[TaskState] | None) -> list[Task]:
    """Insert a copy of those of ``tasks`` still completed (and in ``states``), skipping rows
    locked elsewhere, in one transaction; announce their topics; return the copies."""
    with db.write_transaction():
        originals = lock_batch(_completed_rows(states), tasks)
        if not originals:
            return []
        return insert([_copy_of(o) for o in originals])


def recreate(task: Task) -> Task | None:
    """Insert a copy of ``task`` if it is completed (None otherwise) and return it."""
    using = db.alias()
    with db.write_transaction():
        original = (
            Task.objects.using(using).filter(pk=task.pk).completed().select_for_update().first()
        )
        if original is None:
            return None
        return insert([_copy_of(original)], using=using, announce=False)[0]


def revive_suspended(tasks: Sequence[Task], using: str) -> None:
    """Revive those of ``tasks`` (locked by the caller) that are still SUSPENDED."""
    rows = Task.objects.using(using).rows(tasks).filter(state=TaskState.SUSPENDED)
    rows.update(**REVIVED)
    _revived(tasks)


def _announce(tasks: Sequence[Task]) -> None:
    """Announce new pending work in the topics of ``tasks``: sleeping nodes claim it at once."""
    for topic in sorted({task.topic_id for task in tasks}):
        db.notify(db.connection(), topic)
