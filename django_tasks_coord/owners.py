"""Owners: the nodes that hold tasks, their heartbeats, and the expiry of dead ones.

Times are compared on the database clock, so nodes with skewed clocks agree on
who is dead. This module writes owner rows; the tasks of a dead owner go back to
the queue through the task store (:func:`django_tasks_coord.store.claims.return_to_queue`),
which also deletes the owner rows.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from datetime import timedelta
from typing import NamedTuple

from django.db import IntegrityError, connections, models, transaction
from django.db.models import Count
from django.db.models.functions import Now
from django.db.models.sql import UpdateQuery

from django_tasks_coord import db
from django_tasks_coord.conf import app_settings
from django_tasks_coord.enums import TaskState
from django_tasks_coord.exceptions import DuplicateOwnerError, InvalidArgumentError
from django_tasks_coord.models import Owner, Task
from django_tasks_coord.store.claims import return_to_queue

logger = logging.getLogger(__name__)


def default_owner_name() -> str:
    """A unique name for an owner: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _older_than(bound: timedelta) -> models.Q:
    if not isinstance(bound, timedelta) or bound < timedelta(0):
        raise InvalidArgumentError(f"older_than must be a non-negative timedelta, not {bound!r}.")
    return models.Q(heartbeat__lt=db.ago(bound))


def register_owner(
    name: str | None = None, *, host: str | None = None, pid: int | None = None
) -> Owner:
    """Register a node as an owner and return it.

    ``name`` (the node id) must be unique among live owners; a dead owner (heartbeat
    older than ``LIVENESS_INTERVAL``) with the same name is expired first and its
    tasks go back to the queue. Raises :class:`DuplicateOwnerError` if a live owner
    has the name.
    """
    name = name or default_owner_name()
    if not isinstance(name, str) or not 0 < len(name) <= 200:
        raise InvalidArgumentError(
            f"owner name must be a str of 1 to 200 characters, not {name!r}."
        )
    fields = {"host": host if host is not None else socket.gethostname(), "pid": pid or os.getpid()}
    using = db.alias()
    try:
        with db.write_transaction():
            return Owner.objects.using(using).create(name=name, **fields)
    except IntegrityError:
        pass
    stale = Owner.objects.using(using).filter(
        _older_than(app_settings.liveness_interval), name=name
    )
    with db.write_transaction():
        ids = list(stale.select_for_update().values_list("pk", flat=True))
        if not ids:
            raise DuplicateOwnerError(
                f"A live owner named {name!r} already exists (its heartbeat is younger than "
                f"{app_settings.LIVENESS_INTERVAL}s). Use another node id or stop that node."
            ) from None
        _expire_owner_ids(ids, using)
        return Owner.objects.using(using).create(name=name, **fields)


def heartbeat(owner: Owner) -> bool:
    """Refresh ``owner``'s heartbeat. False means the owner was declared dead (its row is gone)."""
    updated = Owner.objects.using(db.alias()).filter(pk=owner.pk).update(heartbeat=Now())
    return updated == 1


def beat(owner: Owner, *, read: bool = True) -> tuple[bool, int | None]:
    """Refresh ``owner``'s heartbeat and read its ``cancel_requests`` count in the same round
    trip where the database allows it; return (alive, count).

    ``alive`` is False if the owner was declared dead (its row is gone). PostgreSQL and
    SQLite 3.35+ answer the count with the ``UPDATE`` (``RETURNING``); elsewhere (MariaDB,
    MySQL) it takes a ``SELECT`` of the row, made only when ``read`` (the node runs tasks),
    and the count is None otherwise. The count only grows: a change since the last beat
    means that a cancel of a task the owner holds was requested
    (:func:`cancel_requested_tasks`).
    """
    using = db.alias()
    conn = connections[using]
    if db.claim_statement(conn) == db.CLAIM_RETURNING:
        query = UpdateQuery(Owner)
        query.add_update_values({"heartbeat": Now()})
        query.add_q(models.Q(pk=owner.pk))
        sql, params = query.get_compiler(using).as_sql()
        column = conn.ops.quote_name("cancel_requests")
        with transaction.mark_for_rollback_on_error(using), conn.cursor() as cursor:
            cursor.execute(f"{sql} RETURNING {column}", params)
            row = cursor.fetchone()
        return (False, None) if row is None else (True, int(row[0]))
    if not heartbeat(owner):
        return False, None
    if not read:
        return True, None
    count = (
        Owner.objects.using(using).filter(pk=owner.pk).values_list("cancel_requests", flat=True)
    ).first()
    return count is not None, count


def cancel_requested_tasks(owner: Owner) -> list[int]:
    """The ACTIVE tasks ``owner`` holds whose cancel was requested (their sequences)."""
    return list(
        Task.objects.using(db.alias())
        .filter(owner_id=owner.pk, state=TaskState.ACTIVE, cancel_requested_at__isnull=False)
        .values_list("pk", flat=True)
    )


def unregister_owner(owner: Owner) -> list[Task]:
    """Remove ``owner`` (a graceful stop); tasks it still holds go back to PENDING and are returned."""
    using = db.alias()
    with db.write_transaction():
        return _expire_owner_ids([owner.pk], using)


def expire(older_than: timedelta | None = None) -> list[Task]:
    """Declare owners dead whose heartbeat is older than ``older_than`` and free their tasks.

    ``older_than`` defaults to ``TASKS_COORD["LIVENESS_INTERVAL"]``. Tasks the dead
    owners held (ACTIVE or REQUESTED) return to PENDING, keeping their attempt count,
    so another owner can poll them; the owners' rows are deleted. Returns the freed
    tasks. Owners that are busy polling right now (row locked) are alive and skipped.
    """
    bound = app_settings.liveness_interval if older_than is None else older_than
    using = db.alias()
    conn = db.connection()
    with db.write_transaction():
        stale = Owner.objects.using(using).filter(_older_than(bound))
        ids = list(stale.select_for_update(**db.lock_kwargs(conn)).values_list("pk", flat=True))
        return _expire_owner_ids(ids, using) if ids else []


class Survey(NamedTuple):
    """What one sweep (:func:`survey`) found: the tasks it freed, the live owners (at
    least 1) and the rank of the asking owner among them (0 for the oldest)."""

    freed: list[Task]
    live: int
    rank: int


def survey(owner: Owner | None = None, older_than: timedelta | None = None) -> Survey:
    """:func:`expire`, count the owners still alive and rank ``owner`` among them (by
    registration: the number of live owners registered before it), in one statement when
    none is dead.

    The count and the rank are how a node takes its turns at the cluster-wide chores
    (this sweep, timeouts of external executors): see
    :meth:`django_tasks_coord.node.lifeline.Lifeline.sweep_wait`. The common case, nobody
    dead, is one read-only ``SELECT`` of three counts; only when some owner is stale does
    :func:`expire` run.
    """
    bound = app_settings.liveness_interval if older_than is None else older_than
    stale_q = _older_than(bound)
    before = models.Q(pk__lt=owner.pk if owner is not None else 0) & ~stale_q
    counts = Owner.objects.using(db.alias()).aggregate(
        total=Count("pk"), stale=Count("pk", filter=stale_q), before=Count("pk", filter=before)
    )
    total, stale = counts["total"] or 0, counts["stale"] or 0
    live, rank = max(total - stale, 1), min(counts["before"] or 0, max(total - stale - 1, 0))
    return Survey(expire(bound) if stale else [], live, rank)


def sweep(older_than: timedelta | None = None) -> tuple[list[Task], int]:
    """:func:`expire`, and count the owners still alive, in one statement when none is dead.

    Returns the freed tasks and the number of live owners (at least 1): :func:`survey`
    without a rank.
    """
    freed, live, _ = survey(None, older_than)
    return freed, live


def _expire_owner_ids(ids: list[int], using: str) -> list[Task]:
    """Return the in-flight tasks of owners ``ids`` to the queue and delete the owners
    (:func:`django_tasks_coord.store.claims.return_to_queue`); log each task returned."""
    tasks = return_to_queue(ids, using)
    for task in tasks:
        logger.warning(
            "Task %s returned to the queue: its owner died (attempt %s).",
            task,
            task.attempts,
            extra={"task_sequence": task.sequence, "topic": task.topic_id},
        )
    return tasks
