"""Claims: taking due tasks (poll), giving them back (release), ending them CANCELED when a
cancel was requested meanwhile, and returning the work of dead owners to the queue
(cancelling them is :mod:`~.cancels`).

A claim is one short statement where the database allows it: an ``UPDATE`` of the rows
a ``SELECT ... FOR UPDATE SKIP LOCKED`` picks (PostgreSQL, MariaDB), of the rows picked
under the database's write lock (SQLite), so any number of pollers never claim the same
task twice (:mod:`~.claim_statements` holds each database's statement). Each claim gives
its tasks a fresh ``exec_id``; writes on behalf of a claim are fenced by it
(:func:`~.fencing.held`).
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import DatabaseError
from django.db.models import Case, Exists, Expression, F, OuterRef, Q, Value, When
from django.db.models.functions import Now
from django.utils import timezone

from django_tasks_coord import db, flow
from django_tasks_coord.enums import IN_FLIGHT, Condition, Order, TaskState
from django_tasks_coord.models import Owner, Task, TaskQuerySet
from django_tasks_coord.store import claim_statements as statements
from django_tasks_coord.store import flow as flow_claims
from django_tasks_coord.store.fencing import held

logger = logging.getLogger(__name__)

__all__ = [
    "CANCEL_REQUESTED",
    "CLAIM_CHECK_SECONDS",
    "cancel_wins",
    "claim",
    "end_claims",
    "lock_batch",
    "release",
    "return_to_queue",
]

#: How long :func:`claim` waits for the database to tell whether a claim went through
#: when the connection broke as it committed.
CLAIM_CHECK_SECONDS = 30.0


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

    A topic under flow control (:mod:`django_tasks_coord.flow`) is claimed within its limits
    by :func:`django_tasks_coord.store.flow.claim`.

    Returned highest priority first, then in ``order``. The statement depends on the
    database (:func:`~django_tasks_coord.db.claim_statement`): one autocommitted
    ``UPDATE ... RETURNING`` on PostgreSQL and SQLite, an ``UPDATE`` joined to the rows
    it picks plus a ``SELECT`` of them on MariaDB, a transaction on MySQL; inside the
    caller's transaction, each is part of it.

    If the connection breaks as the claim commits, the commit may have gone through: the
    claimed rows are looked for by their new ``exec_id`` once the database answers, and
    returned if they are there, rather than left ACTIVE with nobody knowing of them.
    """
    if not flow.limits_of(name, using).limited:
        # Where the cached "no limits" is stale, the statement takes nothing (its guard)
        # until the cache expires: never more than the new limits allow.
        return _claim(name, limit, order, condition, owner, using, conn)
    where = (
        (lambda due: due)
        if condition is None
        else functools.partial(statements.apply_condition, condition=condition)
    )
    return flow_claims.claim(
        name,
        limit,
        order,
        owner,
        using,
        where,
        functools.partial(statements.take, name, order=order, conn=conn, condition=condition),
    )


def _claim(
    name: str,
    limit: int,
    order: Order,
    condition: Condition | None,
    owner: Owner | None,
    using: str,
    conn: Any,
) -> list[Task]:
    """:func:`claim` of a topic without limits, in one statement where the database allows
    it; none while the topic has limits (a guard in the statement, for callers whose cache
    does not know yet)."""
    now, exec_id = timezone.now(), uuid.uuid4()
    changes = {"owner": owner, "exec_id": exec_id, "started_at": now}
    how = db.claim_statement(conn)
    try:
        if condition is None and how in (db.CLAIM_RETURNING, db.CLAIM_JOINED):
            picked = statements.picked_select(conn.alias, name, limit, order)
            tasks = statements.take_picked(how, name, picked, changes, conn)
        else:
            due = statements.due_query(name, order, using)
            tasks = statements.take(
                name, due, limit, changes, order=order, conn=conn, condition=condition
            )
        return statements.in_claim_order(tasks, owner, order)
    except DatabaseError as exc:
        if not db.connection_lost(exc):
            if how == db.CLAIM_JOINED:
                # Its UPDATE may have committed before the SELECT failed.
                _give_back(name, exec_id, using)
            raise
        tasks = _claimed(name, exec_id, using)
        if not tasks:
            raise
    return statements.in_claim_order(tasks, owner, order)


def _give_back(name: str, exec_id: uuid.UUID, using: str) -> None:
    """Return the tasks a claim took to the queue, its attempt refunded: the claim failed
    after its rows were written, and nobody would start them (a failure of this is logged;
    the node's owner gives them back when it stops or registers again)."""
    try:
        statements.under(name, exec_id, using).update(
            state=TaskState.PENDING, owner=None, exec_id=None, attempts=F("attempts") - 1
        )
    except DatabaseError:
        logger.exception("Could not give back the tasks of a failed claim (%s).", exec_id)


def _claimed(name: str, exec_id: uuid.UUID, using: str) -> list[Task]:
    """The tasks of a claim whose commit lost its answer, if it went through (waits for the
    database for up to :data:`CLAIM_CHECK_SECONDS`; none if it does not answer by then)."""
    deadline = time.monotonic() + CLAIM_CHECK_SECONDS
    rows = statements.under(name, exec_id, using)

    def wait(seconds: float) -> bool:
        time.sleep(seconds)  # backing off while the database is unreachable
        return time.monotonic() > deadline

    try:
        return db.retry_while_lost(
            lambda: list(rows.all()), what="Checking a claim", wait=wait, using=using
        )
    except DatabaseError:
        return []


def release(task: Task, changes: dict[str, Any]) -> bool:
    """Apply ``changes`` to ``task`` if it is still ACTIVE under its claim, and announce the
    topic (the task is pending again); False, changing nothing, if the claim was lost.
    A task whose cancel was requested ends CANCELED instead (:func:`end_claims`; its
    ``state`` in memory says so)."""
    with db.write_transaction():
        written, canceled = end_claims(held([task]), changes, 1)
        if written != 1:
            return False
        if canceled:
            task.state = TaskState.CANCELED
        else:
            db.notify(db.connection(), task.topic_id)
    return True


#: A cancel of the task was requested while it ran (:mod:`django_tasks_coord.running`).
CANCEL_REQUESTED = Q(cancel_requested_at__isnull=False)


def cancel_wins(changes: dict[str, Any]) -> dict[str, Any]:
    """``changes`` of a write that ends a claim (a completion, a release, a return to the
    queue), made to end the task CANCELED instead, in the database itself, where a cancel
    was requested: whatever its handler did, and however late the request came, such a
    task is never SUCCEEDED nor handed out again. The message of the request is kept."""
    if "state" not in changes:
        return changes
    out = dict(changes)
    state = out["state"]
    state_field = Task._meta.get_field("state")
    out["state"] = Case(
        When(CANCEL_REQUESTED, then=Value(int(TaskState.CANCELED))),
        default=state if isinstance(state, Expression) else Value(int(state)),
        output_field=state_field,
    )
    if "message" in out:
        message = out["message"]
        out["message"] = Case(
            When(CANCEL_REQUESTED, then=F("message")),
            default=message if isinstance(message, Expression) else Value(message),
            output_field=Task._meta.get_field("message"),
        )
    if not isinstance(state, Expression) and not TaskState(state).is_completed:
        finished = out.get("finished_at")
        out["finished_at"] = Case(
            When(CANCEL_REQUESTED, then=Now()),
            default=finished if isinstance(finished, Expression) else Value(finished),
            output_field=Task._meta.get_field("finished_at"),
        )
    return out


def end_claims(rows: TaskQuerySet, values: dict[str, Any], expected: int) -> tuple[int, set[int]]:
    """``UPDATE`` the held ``rows`` (a claim's end: a completion, a release) with ``values``,
    except those whose cancel was requested, which end CANCELED instead (the request's
    message kept); return how many rows were written and the sequences of those canceled.

    One statement as long as no cancel was requested (its rows are left out by the
    ``UPDATE``'s own filter, so its count tells): only a shortfall against ``expected``
    costs a look for requested rows, and their ``UPDATE``. So whatever a handler did, and
    however late the request came, a task whose cancel was requested is never
    SUCCEEDED nor handed out again, and the caller knows which ended CANCELED. Call it
    inside :func:`db.write_transaction` for all or nothing.
    """
    written = rows.filter(cancel_requested_at__isnull=True).update(**values)
    if written >= expected:
        return written, set()
    requested = rows.filter(CANCEL_REQUESTED)
    pks = set(requested.values_list("pk", flat=True))
    if not pks:
        return written, set()
    canceled = {
        name: value for name, value in values.items() if name not in ("message", "execute_at")
    }
    canceled["state"] = TaskState.CANCELED
    canceled["owner"] = None
    if not isinstance(canceled.get("finished_at"), datetime):
        canceled["finished_at"] = timezone.now()
    canceled.pop("attempts", None)  # a release's refund: the attempt did run
    return written + requested.filter(pk__in=pks).update(**canceled), pks


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
            **cancel_wins({"state": TaskState.PENDING, "owner": None, "exec_id": None})
        )
        for task in tasks:  # a task whose cancel was requested ends CANCELED instead
            task.state = TaskState.CANCELED if task.cancel_is_requested else TaskState.PENDING
            task.owner, task.exec_id = None, None
    still_held = Task.objects.using(using).filter(owner_id=OuterRef("pk"), state__in=IN_FLIGHT)
    # The owners' other tasks (finished ones) lose their owner here (on_delete SET_NULL).
    Owner.objects.using(using).filter(pk__in=owner_ids).exclude(Exists(still_held)).delete()
    return tasks
