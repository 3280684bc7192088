"""Claims: taking due tasks (poll), giving them back (release), ending them CANCELED when a
cancel was requested meanwhile, and returning the work of dead owners to the queue
(cancelling them is :mod:`~.cancels`).

A claim is one short statement where the database allows it: an ``UPDATE`` of the rows
a ``SELECT ... FOR UPDATE SKIP LOCKED`` picks (PostgreSQL, MariaDB), of the rows picked
under the database's write lock (SQLite), so any number of pollers never claim the same
task twice (:func:`~django_tasks_coord.db.claim_statement` says how each database does it). Each claim gives its tasks a fresh
``exec_id``; writes on behalf of a claim are fenced by it (:func:`~.fencing.held`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from datetime import datetime
from functools import partial
from typing import Any

from django.db import DatabaseError, models
from django.db.models import Case, Exists, Expression, F, OuterRef, Q, Subquery, Value, When
from django.db.models.functions import Now
from django.utils import timezone

from django_tasks_coord import db, flow
from django_tasks_coord.enums import IN_FLIGHT, Condition, Order, TaskState
from django_tasks_coord.flow import LIMITED
from django_tasks_coord.models import Owner, Task, TaskQuerySet, Topic
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
#: Earlier tasks in these states never block a poll condition.
_NON_BLOCKING = (TaskState.FILTERED, TaskState.CANCELED, TaskState.REDUNDANT)


def _apply_condition[S: models.QuerySet[Task]](qs: S, condition: Condition) -> S:
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
        (lambda due: due) if condition is None else partial(_apply_condition, condition=condition)
    )
    return flow_claims.claim(
        name,
        limit,
        order,
        owner,
        using,
        where,
        partial(_claim_statement, name, order=order, conn=conn, condition=condition),
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
    due: models.QuerySet[Task] = Task.objects.using(using).for_topic(name).due()
    due = due.filter(~Exists(Topic.objects.using(using).filter(LIMITED, name=name)))
    sequence = "sequence" if order is Order.FIFO else "-sequence"
    due = due.order_by("-priority", sequence)
    changes = {"owner": owner, "exec_id": exec_id, "started_at": now}
    try:
        return _claim_statement(
            name, due, limit, changes, order=order, conn=conn, condition=condition
        )
    except DatabaseError as exc:
        if not db.connection_lost(exc):
            if db.claim_statement(conn) == db.CLAIM_JOINED:
                # Its UPDATE may have committed before the SELECT failed.
                _give_back(name, exec_id, using)
            raise
        tasks = _claimed(name, exec_id, using)
        if not tasks:
            raise
    return _in_claim_order(tasks, owner, order)


def _claim_statement(
    name: str,
    due: models.QuerySet[Task],
    limit: int,
    changes: dict[str, Any],
    *,
    order: Order,
    conn: Any,
    condition: Condition | None = None,
) -> list[Task]:
    """Mark the first ``limit`` of ``due`` (ordered, locked rows skipped) that ``condition``
    lets through ACTIVE under ``changes`` (owner, exec_id, started_at) in the database's
    claim statement (:func:`~django_tasks_coord.db.claim_statement`); the tasks, highest
    priority first, then in ``order`` (``due``'s). Also the claim of a topic whose limits
    have no key, inside its transaction (:func:`django_tasks_coord.store.flow.claim`)."""
    if condition is not None:
        if db.subqueries_lock(conn):
            # Its subqueries would lock the earlier tasks they read, and wait for those
            # another transaction holds: pick the tasks the condition lets through with a
            # plain read first. An earlier task that was finished stays so, so what that
            # read let through still may go; the claim skips what was locked meanwhile.
            picked = list(
                _apply_condition(due, condition).values_list("sequence", flat=True)[:limit]
            )
            if not picked:
                return []
            due = due.filter(sequence__in=picked)
        else:
            due = _apply_condition(due, condition)
    how = db.claim_statement(conn)
    if how == db.CLAIM_RETURNING:
        tasks = _claim_returning(name, due, limit, changes, conn)
    elif how == db.CLAIM_JOINED:
        tasks = _claim_joined(name, due, limit, changes, conn)
    else:
        tasks = _claim_locked(due, limit, changes, conn)
    return _in_claim_order(tasks, changes["owner"], order)


def _in_claim_order(tasks: list[Task], owner: Owner | None, order: Order) -> list[Task]:
    """``tasks`` highest priority first, then in ``order``, each given ``owner``."""
    step = 1 if order is Order.FIFO else -1
    tasks.sort(key=lambda task: (-task.priority, step * task.sequence))
    for task in tasks:
        task.owner = owner  # the object itself, not a query of its row later
    return tasks


def _locking_select(
    due: models.QuerySet[Task], limit: int, conn: Any
) -> tuple[str, tuple[Any, ...]]:
    """The SQL of the first ``limit`` of ``due`` (their sequences) with ``FOR UPDATE SKIP LOCKED`` (where the
    database locks rows): compiled without ``select_for_update``, which Django allows only
    inside a transaction, while these claims are one autocommitted statement."""
    picked = due.values("sequence")[:limit]
    sql, params = picked.query.get_compiler(connection=conn).as_sql()
    features = conn.features
    if features.has_select_for_update:
        table = conn.ops.quote_name(Task._meta.db_table)
        of = (table,) if features.has_select_for_update_of else ()
        lock = conn.ops.for_update_sql(
            skip_locked=features.has_select_for_update_skip_locked, of=of
        )
        sql = f"{sql} {lock}"
    return sql, tuple(params)


def _assignments(changes: dict[str, Any], conn: Any, qualify: str = "") -> tuple[str, list[Any]]:
    """``SET`` of a claim: ACTIVE under ``changes`` (owner, exec_id, started_at), one more
    attempt, not finished; each column prefixed with ``qualify``."""
    columns, params = [], []
    values = {"state": TaskState.ACTIVE, **changes, "finished_at": None}
    for name, value in values.items():
        field = Task._meta.get_field(name)
        assert isinstance(field, models.Field)
        column = qualify + conn.ops.quote_name(field.column)
        if isinstance(value, models.Model):
            value = value.pk
        columns.append(f"{column} = %s")
        params.append(field.get_db_prep_save(value, connection=conn))
    attempts = qualify + conn.ops.quote_name("attempts")
    columns.append(f"{attempts} = {attempts} + 1")
    return ", ".join(columns), params


def _claim_returning(
    name: str, due: models.QuerySet[Task], limit: int, changes: dict[str, Any], conn: Any
) -> list[Task]:
    """One ``UPDATE ... RETURNING`` (see :func:`~django_tasks_coord.db.claim_statement`)."""
    qn = conn.ops.quote_name
    picked, picked_params = _locking_select(due, limit, conn)
    sets, set_params = _assignments(changes, conn)
    table = qn(Task._meta.db_table)
    columns = ", ".join(f"{table}.{qn(field.column)}" for field in Task._meta.concrete_fields)
    sql = (
        f"WITH {qn('claim')} AS MATERIALIZED ({picked}) "
        f"UPDATE {table} SET {sets} "
        f"WHERE {table}.{qn('topic_id')} = %s "  # the topic's partition only
        f"AND {table}.{qn('sequence')} IN (SELECT {qn('sequence')} FROM {qn('claim')}) "
        f"RETURNING {columns}"
    )
    rows = Task.objects.db_manager(conn.alias).raw(sql, [*picked_params, *set_params, name])
    return list(rows)


def _claim_joined(
    name: str, due: models.QuerySet[Task], limit: int, changes: dict[str, Any], conn: Any
) -> list[Task]:
    """An ``UPDATE`` joined to the rows it picks, then a ``SELECT`` of them (MariaDB; see
    :func:`~django_tasks_coord.db.claim_statement`)."""
    qn = conn.ops.quote_name
    picked, picked_params = _locking_select(due, limit, conn)
    table = qn(Task._meta.db_table)
    sets, set_params = _assignments(changes, conn, qualify=f"{table}.")
    sql = (
        f"UPDATE ({picked}) AS {qn('claim')} STRAIGHT_JOIN {table} FORCE INDEX (PRIMARY) "
        f"ON {table}.{qn('sequence')} = {qn('claim')}.{qn('sequence')} SET {sets}"
    )
    with conn.cursor() as cursor:
        cursor.execute(sql, [*picked_params, *set_params])
        if not cursor.rowcount:
            return []
    return list(_under(name, changes["exec_id"], conn.alias))


def _claim_locked(
    due: models.QuerySet[Task], limit: int, changes: dict[str, Any], conn: Any
) -> list[Task]:
    """``SELECT ... FOR UPDATE SKIP LOCKED``, then ``UPDATE``, in one transaction (MySQL,
    older SQLite; see :func:`~django_tasks_coord.db.claim_statement`)."""
    with db.write_transaction():
        tasks = list(due.select_for_update(**db.lock_kwargs(conn))[:limit])
        if tasks:
            Task.objects.using(conn.alias).rows(tasks).update(
                state=TaskState.ACTIVE,
                attempts=F("attempts") + 1,
                finished_at=None,
                **changes,
            )
    for task in tasks:  # what the UPDATE wrote
        task.state, task.attempts, task.finished_at = TaskState.ACTIVE, task.attempts + 1, None
        task.exec_id, task.started_at = changes["exec_id"], changes["started_at"]
    return tasks


def _give_back(name: str, exec_id: uuid.UUID, using: str) -> None:
    """Return the tasks a claim took to the queue, its attempt refunded: the claim failed
    after its rows were written, and nobody would start them (a failure of this is logged;
    the node's owner gives them back when it stops or registers again)."""
    try:
        _under(name, exec_id, using).update(
            state=TaskState.PENDING, owner=None, exec_id=None, attempts=F("attempts") - 1
        )
    except DatabaseError:
        logger.exception("Could not give back the tasks of a failed claim (%s).", exec_id)


def _under(name: str, exec_id: uuid.UUID, using: str) -> TaskQuerySet:
    """The tasks of topic ``name`` held under the claim ``exec_id``."""
    return Task.objects.using(using).filter(topic_id=name, state=TaskState.ACTIVE, exec_id=exec_id)


def _claimed(name: str, exec_id: uuid.UUID, using: str) -> list[Task]:
    """The tasks of a claim whose commit lost its answer, if it went through (waits for the
    database for up to :data:`CLAIM_CHECK_SECONDS`; none if it does not answer by then)."""
    deadline = time.monotonic() + CLAIM_CHECK_SECONDS
    rows = _under(name, exec_id, using)

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
