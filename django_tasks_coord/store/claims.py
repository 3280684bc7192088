"""Claims: taking due tasks (poll), giving them back (release), cancelling them, and
returning the work of dead owners to the queue.

A claim is one short transaction: ``SELECT ... FOR UPDATE SKIP LOCKED`` where the
database has it (PostgreSQL, MySQL/MariaDB), a serialized write on SQLite, so any
number of pollers never claim the same task twice. Each claim gives its tasks a fresh
``exec_id``; writes on behalf of a claim are fenced by it (:func:`~.fencing.held`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection, Sequence
from typing import Any

from django.db import DatabaseError, models
from django.db.models import Exists, F, OuterRef, Q, Subquery
from django.utils import timezone

from django_tasks_coord import db
from django_tasks_coord.enums import IN_FLIGHT, Condition, Order, TaskState
from django_tasks_coord.models import Owner, Task, TaskQuerySet
from django_tasks_coord.store.fencing import held

__all__ = [
    "CLAIM_CHECK_SECONDS",
    "cancel",
    "cancel_execution",
    "cancel_many",
    "claim",
    "lock_batch",
    "release",
    "return_to_queue",
]

#: How long :func:`claim` waits for the database to tell whether a claim went through
#: when the connection broke as it committed.
CLAIM_CHECK_SECONDS = 30.0
#: Earlier tasks in these states never block a poll condition.
_NON_BLOCKING = (TaskState.FILTERED, TaskState.CANCELED, TaskState.REDUNDANT)


def _apply_condition(qs: models.QuerySet[Task], condition: Condition) -> models.QuerySet[Task]:
    """Keep back tasks while earlier tasks of their identifier block them (see :class:`Condition`)."""
    before = Task.objects.filter(topic_id=OuterRef("topic_id"), sequence__lt=OuterRef("sequence"))
    earlier = before.filter(identifier=OuterRef("identifier"))
    earlier_unfinished = before.unfinished_of(OuterRef("identifier"))
    qs = qs.filter(~Exists(earlier_unfinished))
    if condition is Condition.SINGULAR_BY_IDENTIFIER:
        return qs
    latest = earlier.exclude(state__in=_NON_BLOCKING).order_by("-sequence").values("state")[:1]
    qs = qs.annotate(_latest_earlier_state=Subquery(latest))
    unblocked = Q(_latest_earlier_state__isnull=True)
    if condition is Condition.SINGULAR_BY_IDENTIFIER_SUSPEND_ON_FAILURE:
        return qs.filter(unblocked | ~Q(_latest_earlier_state=TaskState.FAILED))
    return qs.filter(unblocked | Q(_latest_earlier_state=TaskState.SUCCEEDED))


def claim(
    name: str,
    limit: int,
    order: Order,
    condition: Condition | None,
    owner: Owner | None,
    using: str,
    conn: Any,
) -> list[Task]:
    """Lock up to ``limit`` due tasks (skipping locked ones) and mark them ACTIVE for ``owner``.

    If the connection breaks as the claim commits, the commit may have gone through: the
    claimed rows are looked for by their new ``exec_id`` once the database answers, and
    returned if they are there, rather than left ACTIVE with nobody knowing of them.
    """
    tasks: list[Task] = []
    now, exec_id = timezone.now(), uuid.uuid4()
    try:
        with db.write_transaction():
            qs: models.QuerySet[Task] = Task.objects.using(using).for_topic(name).due()
            if condition is not None:
                qs = _apply_condition(qs, condition)
            sequence = "sequence" if order is Order.FIFO else "-sequence"
            qs = qs.order_by("-priority", sequence).select_for_update(**db.lock_kwargs(conn))
            tasks = list(qs[:limit])
            if not tasks:
                return []
            now = timezone.now()
            Task.objects.using(using).rows(tasks).update(
                state=TaskState.ACTIVE,
                owner=owner,
                exec_id=exec_id,
                attempts=F("attempts") + 1,
                started_at=now,
                finished_at=None,
            )
    except DatabaseError as exc:
        if not tasks or not db.connection_lost(exc) or not _claimed(exec_id, using):
            raise
    for task in tasks:
        task.exec_id, task.started_at = exec_id, now
    return tasks


def _claimed(exec_id: uuid.UUID, using: str) -> bool:
    """Whether a claim whose commit lost its answer went through (waits for the database for
    up to :data:`CLAIM_CHECK_SECONDS`; False if it does not answer by then)."""
    deadline = time.monotonic() + CLAIM_CHECK_SECONDS
    rows = Task.objects.using(using).filter(exec_id=exec_id, state=TaskState.ACTIVE)

    def wait(seconds: float) -> bool:
        time.sleep(seconds)  # backing off while the database is unreachable
        return time.monotonic() > deadline

    try:
        return db.retry_while_lost(rows.exists, what="Checking a claim", wait=wait, using=using)
    except DatabaseError:
        return False


def release(task: Task, changes: dict[str, Any]) -> bool:
    """Apply ``changes`` to ``task`` if it is still ACTIVE under its claim, and announce the
    topic (the task is pending again); False, changing nothing, if the claim was lost."""
    with db.write_transaction():
        if held([task]).update(**changes) != 1:
            return False
        db.notify(db.connection(), task.topic_id)
    return True


def cancel(task: Task, changes: dict[str, Any]) -> bool:
    """Apply ``changes`` (a cancellation) to ``task`` if it is not completed; False otherwise."""
    rows = Task.objects.using(db.alias()).rows([task]).not_completed()
    return rows.update(**changes) == 1


def cancel_many(
    tasks: Sequence[Task], changes: dict[str, Any], states: Collection[TaskState] | None
) -> list[Task]:
    """Apply ``changes`` (a cancellation) to those of ``tasks`` not completed (and, with
    ``states``, in one of them), in one transaction, skipping rows locked elsewhere;
    return those changed."""
    rows = Task.objects.using(db.alias()).not_completed()
    if states is not None:
        rows = rows.filter(state__in=list(states))
    with db.write_transaction():
        canceled = lock_batch(rows, tasks)
        if canceled:
            Task.objects.using(db.alias()).rows(canceled).update(**changes)
    return canceled


def cancel_execution(task: Task, changes: dict[str, Any]) -> None:
    """Apply ``changes`` (a cancellation) to a defined task whose row the caller locked."""
    Task.objects.using(db.alias()).rows([task]).update(**changes)


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


def return_to_queue(owner_ids: list[int], using: str) -> list[Task]:
    """Return the in-flight tasks of owners ``owner_ids`` to PENDING and delete the owners.

    Call it inside :func:`db.write_transaction`. Task rows locked by another transaction
    (a dead process frozen mid-statement) are skipped, never waited for, so a reaper
    cannot get stuck behind them; their owner is kept and the next sweep tries again.
    Tasks keep their attempt count. Returns the tasks returned to the queue.
    """
    conn = db.connection()
    in_flight = Task.objects.using(using).filter(owner_id__in=owner_ids, state__in=IN_FLIGHT)
    tasks = list(in_flight.select_for_update(**db.lock_kwargs(conn)).order_by("sequence"))
    if tasks:
        Task.objects.using(using).filter(pk__in=[t.pk for t in tasks]).update(
            state=TaskState.PENDING, owner=None, exec_id=None
        )
        for task in tasks:
            task.state, task.owner, task.exec_id = TaskState.PENDING, None, None
    still_held = Task.objects.using(using).filter(owner_id=OuterRef("pk"), state__in=IN_FLIGHT)
    # The owners' other tasks (finished ones) lose their owner here (on_delete SET_NULL).
    Owner.objects.using(using).filter(pk__in=owner_ids).exclude(Exists(still_held)).delete()
    return tasks
