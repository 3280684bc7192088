"""Reviving completed tasks: in place (:func:`reset`), as a new task (:func:`recreate`), or
several suspended ones together (:func:`junction`). Re-exported by :mod:`~django_tasks_coord.queue`.

:func:`reset_many` and :func:`recreate_many` revive a batch of tasks in one short
transaction (``manage.py tasks_coord retry/reset/recreate`` call them batch by batch).
This module checks the arguments and says what went wrong; the task store writes the
rows (:mod:`django_tasks_coord.store.revive`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from django.db.models import Max

from django_tasks_coord import db
from django_tasks_coord.enums import Junction, TaskState
from django_tasks_coord.exceptions import InvalidArgumentError
from django_tasks_coord.models import Task
from django_tasks_coord.store import revive
from django_tasks_coord.store.claims import lock_batch
from django_tasks_coord.store.revive import REVIVED
from django_tasks_coord.topics import TopicRef, topic_name
from django_tasks_coord.validation import check_identifier, check_task, state_error

__all__ = [
    "REVIVED",
    "junction",
    "lock_batch",
    "recreate",
    "recreate_many",
    "reset",
    "reset_many",
]


def reset(task: Task) -> Task:
    """Revive a completed task in place: PENDING again, result and attempts cleared, same sequence."""
    task = check_task(task)
    if not revive.reset(task):
        raise state_error(task, "reset", "completed")
    return task


def reset_many(tasks: Sequence[Task], *, states: Collection[TaskState] | None = None) -> list[Task]:
    """Like :func:`reset` for a batch, in one transaction: return the tasks revived.

    The topics' nodes are told (like a push does), so they claim the revived tasks at once.

    Only tasks still completed (and, with ``states``, still in one of them) are revived;
    others, and rows locked by another transaction at that moment, are left alone and
    missing from the result.
    """
    return revive.reset_many(tasks, states)


def recreate_many(
    tasks: Sequence[Task], *, states: Collection[TaskState] | None = None
) -> list[Task]:
    """Like :func:`recreate` for a batch, in one transaction: return the new tasks.

    The topics' nodes are told (like a push does), so they claim the copies at once.

    Tasks no longer completed (or, with ``states``, no longer in one of them) and rows
    locked by another transaction at that moment get no copy.
    """
    return revive.recreate_many(tasks, states)


def recreate(task: Task) -> Task:
    """Revive a completed task as a new PENDING task (new sequence, ``recreated`` True, ``original`` set).

    The original keeps its state and result.
    """
    task = check_task(task)
    copy = revive.recreate(task)
    if copy is None:
        raise state_error(task, "recreate", "completed")
    return copy


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
        revive.revive_suspended(suspended, using)
    return sorted(suspended, key=lambda t: t.sequence)
