"""Reviving completed tasks: in place (:func:`reset`), as a new task (:func:`recreate`), or
several suspended ones together (:func:`junction`). Re-exported by :mod:`~django_tasks_coord.queue`.

:func:`reset_many` and :func:`recreate_many` revive a batch of tasks in one short
transaction (``manage.py tasks_coord retry/reset/recreate`` call them batch by batch).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from django.db.models import Max

from django_tasks_coord import db
from django_tasks_coord.enums import Junction, TaskState
from django_tasks_coord.exceptions import InvalidArgumentError
from django_tasks_coord.models import Task, TaskQuerySet
from django_tasks_coord.topics import TopicRef, topic_name
from django_tasks_coord.validation import check_identifier, check_task, state_error

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
}


def reset(task: Task) -> Task:
    """Revive a completed task in place: PENDING again, result and attempts cleared, same sequence."""
    task = check_task(task)
    if Task.objects.using(db.alias()).filter(pk=task.pk).completed().update(**REVIVED) != 1:
        raise state_error(task, "reset", "completed")
    for field, value in REVIVED.items():
        setattr(task, field, value)
    return task


def lock_batch(rows: TaskQuerySet, tasks: Sequence[Task]) -> list[Task]:
    """Lock those of ``tasks`` still among ``rows``, skipping rows another transaction holds.

    Call it inside :func:`db.write_transaction`. A row locked elsewhere (a node claiming
    or completing it right now) is left out rather than waited for (``SKIP LOCKED``
    where the database has it; SQLite's write lock serializes instead), so a batch never
    deadlocks with the nodes and never undoes what they just wrote; the caller counts
    what was left out.
    """
    if not tasks:
        return []
    conn = db.connection()
    locked = rows.rows(tasks).order_by("sequence").select_for_update(**db.lock_kwargs(conn))
    return list(locked)


def _wake(tasks: Sequence[Task]) -> None:
    """Announce new pending work in the topics of ``tasks``: sleeping nodes claim it at once."""
    for topic in sorted({task.topic_id for task in tasks}):
        db.notify(db.connection(), topic)


def _completed_rows(states: Collection[TaskState] | None) -> TaskQuerySet:
    rows = Task.objects.using(db.alias()).completed()
    return rows if states is None else rows.filter(state__in=list(states))


def reset_many(tasks: Sequence[Task], *, states: Collection[TaskState] | None = None) -> list[Task]:
    """Like :func:`reset` for a batch, in one transaction: return the tasks revived.

    The topics' nodes are told (like a push does), so they claim the revived tasks at once.

    Only tasks still completed (and, with ``states``, still in one of them) are revived;
    others, and rows locked by another transaction at that moment, are left alone and
    missing from the result.
    """
    with db.write_transaction():
        revived = lock_batch(_completed_rows(states), tasks)
        if revived:
            Task.objects.using(db.alias()).rows(revived).update(**REVIVED)
            _wake(revived)
    for task in revived:
        for field, value in REVIVED.items():
            setattr(task, field, value)
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


def recreate_many(
    tasks: Sequence[Task], *, states: Collection[TaskState] | None = None
) -> list[Task]:
    """Like :func:`recreate` for a batch, in one transaction: return the new tasks.

    The topics' nodes are told (like a push does), so they claim the copies at once.

    Tasks no longer completed (or, with ``states``, no longer in one of them) and rows
    locked by another transaction at that moment get no copy.
    """
    with db.write_transaction():
        originals = lock_batch(_completed_rows(states), tasks)
        if not originals:
            return []
        copies = Task.objects.using(db.alias()).insert([_copy_of(o) for o in originals])
        _wake(copies)
        return copies


def recreate(task: Task) -> Task:
    """Revive a completed task as a new PENDING task (new sequence, ``recreated`` True, ``original`` set).

    The original keeps its state and result.
    """
    task = check_task(task)
    using = db.alias()
    with db.write_transaction():
        original = (
            Task.objects.using(using).filter(pk=task.pk).completed().select_for_update().first()
        )
        if original is None:
            raise state_error(task, "recreate", "completed")
        return Task.objects.using(using).insert([_copy_of(original)])[0]


def junction(
    topic: TopicRef, identifiers: Sequence[str], junction: Junction | str = Junction.SINGULAR
) -> list[Task]:
    """Start the suspended tasks of several identifiers together, once all are present.

    Looks at the latest task of each identifier. ``Junction.SINGULAR``: only if every
    one is SUSPENDED; ``Junction.ETERNAL``: as soon as every identifier has a task,
    in any state. The SUSPENDED ones among them go back to PENDING (like
    :func:`reset`) and are returned; otherwise nothing changes and ``[]`` is returned.
    """
    mode = Junction.coerce(junction, "junction")
    if isinstance(identifiers, str) or not identifiers:
        raise InvalidArgumentError(
            f"identifiers must be a non-empty list of str, not {identifiers!r}."
        )
    wanted = {check_identifier(identifier) for identifier in identifiers}
    name = topic_name(topic)
    using, conn = db.alias(), db.connection()
    with db.write_transaction():
        tasks = Task.objects.using(using).for_topic(name)
        latest_ids = (
            tasks.filter(identifier__in=wanted)
            .values("identifier")
            .annotate(m=Max("sequence"))
            .values_list("m", flat=True)
        )
        latest = list(
            tasks.filter(pk__in=list(latest_ids)).select_for_update(
                **db.lock_kwargs(conn, skip_locked=False)
            )
        )
        if {t.identifier for t in latest} != wanted:
            return []
        suspended = [t for t in latest if t.state == TaskState.SUSPENDED]
        if mode is Junction.SINGULAR and len(suspended) != len(latest):
            return []
        if not suspended:
            return []
        tasks.filter(pk__in=[t.pk for t in suspended], state=TaskState.SUSPENDED).update(**REVIVED)
    for task in suspended:
        for field, value in REVIVED.items():
            setattr(task, field, value)
    return sorted(suspended, key=lambda t: t.sequence)
