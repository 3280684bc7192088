"""Reviving completed tasks: in place (:func:`reset`), as a new task (:func:`recreate`), or
several suspended ones together (:func:`junction`). Re-exported by :mod:`~django_tasks_coord.queue`."""

from __future__ import annotations

from collections.abc import Sequence

from django.db.models import Max

from django_tasks_coord import db
from django_tasks_coord.enums import Junction, TaskState
from django_tasks_coord.exceptions import InvalidArgumentError
from django_tasks_coord.models import Task
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
        copy = Task(
            topic_id=original.topic_id,
            identifier=original.identifier,
            payload=original.payload,
            priority=original.priority,
            recreated=True,
            original=original,
        )
        return Task.objects.using(using).insert([copy])[0]


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
