"""Cancels: a task not in progress canceled at once, an ACTIVE one asked to stop.

A cancel of an ACTIVE task is a request (``cancel_requested_at``) counted on its owner's row,
which the owner's next heartbeat reads (:func:`django_tasks_coord.owners.beat`); every write
that ends the claim then ends the task CANCELED (:func:`~.claims.cancel_wins`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from django.db.models import F
from django.utils import timezone

from django_tasks_coord import db
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Owner, Task
from django_tasks_coord.store.claims import lock_batch

__all__ = ["cancel", "cancel_execution", "cancel_many", "request_cancel"]


def cancel(task: Task, changes: dict[str, Any]) -> str | None:
    """Cancel ``task`` if it is not completed: at once (``changes``, a cancellation) unless
    it is ACTIVE, else request it (:func:`request_cancel`). Returns ``"canceled"``,
    ``"requested"``, or None if it was completed already."""
    rows = Task.objects.using(db.alias()).rows([task]).not_completed()
    with db.write_transaction():
        if rows.exclude(state=TaskState.ACTIVE).update(**changes) == 1:
            return "canceled"
        active = list(rows.filter(state=TaskState.ACTIVE).select_for_update())
        if not active:
            return None
        request_cancel(active, changes.get("message"))
        task.cancel_requested_at = active[0].cancel_requested_at
    return "requested"


def request_cancel(tasks: Sequence[Task], message: str | None) -> None:
    """Ask the handlers of the ACTIVE ``tasks`` (rows the caller locked) to stop: stamp
    their ``cancel_requested_at`` (the first request's time stays) and ``message``, and
    count the request on their owners' rows, which the owners' next heartbeats read
    (:func:`django_tasks_coord.owners.beat`). Call it inside :func:`db.write_transaction`."""
    using = db.alias()
    first = [task for task in tasks if task.cancel_requested_at is None]
    now = timezone.now()
    changes: dict[str, Any] = {"cancel_requested_at": now}
    if message is not None:
        changes["message"] = message
    if first:
        Task.objects.using(using).rows(first).update(**changes)
        for task in first:
            task.cancel_requested_at = now
            if message is not None:
                task.message = message
    owner_ids = sorted({task.owner_id for task in first if task.owner_id is not None})
    if owner_ids:
        Owner.objects.using(using).filter(pk__in=owner_ids).update(
            cancel_requests=F("cancel_requests") + 1
        )


def cancel_many(
    tasks: Sequence[Task], changes: dict[str, Any], states: Collection[TaskState] | None
) -> tuple[list[Task], list[Task]]:
    """Cancel those of ``tasks`` not completed (and, with ``states``, in one of them), in
    one transaction, skipping rows locked elsewhere: ACTIVE ones by a request
    (:func:`request_cancel`), the others at once (``changes``). Returns (canceled,
    requested)."""
    rows = Task.objects.using(db.alias()).not_completed()
    if states is not None:
        rows = rows.filter(state__in=list(states))
    with db.write_transaction():
        locked = lock_batch(rows, tasks)
        active = [task for task in locked if task.state == TaskState.ACTIVE]
        canceled = [task for task in locked if task.state != TaskState.ACTIVE]
        if canceled:
            Task.objects.using(db.alias()).rows(canceled).update(**changes)
        if active:
            request_cancel(active, changes.get("message"))
    return canceled, active


def cancel_execution(task: Task, changes: dict[str, Any]) -> None:
    """Apply ``changes`` (a cancellation) to a defined task whose row the caller locked."""
    Task.objects.using(db.alias()).rows([task]).update(**changes)
