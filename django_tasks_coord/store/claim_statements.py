"""How a claim reaches each database: the statements of :func:`~.claims.claim`.

:func:`~django_tasks_coord.db.claim_statement` says which one a connection takes: an
autocommitted ``UPDATE ... RETURNING`` of the rows a locking ``SELECT`` picks (PostgreSQL,
SQLite 3.35+), an ``UPDATE`` joined to the rows it picks plus a ``SELECT`` of them
(MariaDB), or a ``SELECT ... FOR UPDATE SKIP LOCKED`` and an ``UPDATE`` in one transaction
(MySQL, older SQLite). The locking ``SELECT`` of a topic without a condition holds no value
of the moment (its clock is the database's, its limit a parameter), so it is built once
per topic and order (:func:`picked_select`), not compiled anew by every claim.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any

from django.db import connections, models
from django.db.models import Exists, F, OuterRef, Q, Subquery

from django_tasks_coord import db
from django_tasks_coord.enums import Condition, Order, TaskState
from django_tasks_coord.flow import LIMITED
from django_tasks_coord.models import Owner, Task, TaskQuerySet, Topic

__all__ = [
    "apply_condition",
    "due_query",
    "in_claim_order",
    "locking_select",
    "picked_select",
    "take",
    "take_picked",
    "under",
]

#: Earlier tasks in these states never block a poll condition.
_NON_BLOCKING = (TaskState.FILTERED, TaskState.CANCELED, TaskState.REDUNDANT)


def apply_condition[S: models.QuerySet[Task]](qs: S, condition: Condition) -> S:
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


def take(
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
                apply_condition(due, condition).values_list("sequence", flat=True)[:limit]
            )
            if not picked:
                return []
            due = due.filter(sequence__in=picked)
        else:
            due = apply_condition(due, condition)
    how = db.claim_statement(conn)
    if how in (db.CLAIM_RETURNING, db.CLAIM_JOINED):
        tasks = take_picked(how, name, locking_select(due, limit, conn), changes, conn)
    else:
        tasks = _locked(due, limit, changes, conn)
    return in_claim_order(tasks, changes["owner"], order)


def due_query(name: str, order: Order, using: str) -> models.QuerySet[Task]:
    """The due tasks of topic ``name`` in claim order, none while the topic has limits."""
    due: models.QuerySet[Task] = Task.objects.using(using).for_topic(name).due()
    due = due.filter(~Exists(Topic.objects.using(using).filter(LIMITED, name=name)))
    return due.order_by("-priority", "sequence" if order is Order.FIFO else "-sequence")


@functools.lru_cache(maxsize=512)
def _due_select(alias: str, name: str, order: Order) -> tuple[str, tuple[Any, ...]]:
    return _locking_sql(due_query(name, order, alias), connections[alias])


def picked_select(alias: str, name: str, limit: int, order: Order) -> tuple[str, tuple[Any, ...]]:
    """:func:`locking_select` of :func:`due_query`, built once per topic and order: it
    holds no value of the moment (its clock is the database's, its limit a parameter),
    so each claim of a topic without a condition reuses it rather than build and compile
    a query."""
    sql, params = _due_select(alias, name, order)
    return sql, (*params, limit)


def take_picked(
    how: str, name: str, picked: tuple[str, tuple[Any, ...]], changes: dict[str, Any], conn: Any
) -> list[Task]:
    """Mark the rows the locking select ``picked`` chooses ACTIVE under ``changes``."""
    claim = _returning if how == db.CLAIM_RETURNING else _joined
    return claim(name, picked, changes, conn)


def in_claim_order(tasks: list[Task], owner: Owner | None, order: Order) -> list[Task]:
    """``tasks`` highest priority first, then in ``order``, each given ``owner``."""
    step = 1 if order is Order.FIFO else -1
    tasks.sort(key=lambda task: (-task.priority, step * task.sequence))
    for task in tasks:
        task.owner = owner  # the object itself, not a query of its row later
    return tasks


def locking_select(
    due: models.QuerySet[Task], limit: int, conn: Any
) -> tuple[str, tuple[Any, ...]]:
    """The SQL of the first ``limit`` of ``due`` (their sequences) with ``FOR UPDATE SKIP
    LOCKED`` (where the database locks rows), and its parameters."""
    sql, params = _locking_sql(due, conn)
    return sql, (*params, limit)


def _locking_sql(due: models.QuerySet[Task], conn: Any) -> tuple[str, tuple[Any, ...]]:
    """:func:`locking_select` whose limit is its last parameter, to be added: compiled
    without ``select_for_update``, which Django allows only inside a transaction, while
    these claims are one autocommitted statement."""
    sql, params = due.values("sequence").query.get_compiler(connection=conn).as_sql()
    sql = f"{sql} LIMIT %s"
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


def _returning(
    name: str, picked: tuple[str, tuple[Any, ...]], changes: dict[str, Any], conn: Any
) -> list[Task]:
    """One ``UPDATE ... RETURNING`` (see :func:`~django_tasks_coord.db.claim_statement`)."""
    qn = conn.ops.quote_name
    picked_sql, picked_params = picked
    sets, set_params = _assignments(changes, conn)
    table = qn(Task._meta.db_table)
    columns = ", ".join(f"{table}.{qn(field.column)}" for field in Task._meta.concrete_fields)
    sql = (
        f"WITH {qn('claim')} AS MATERIALIZED ({picked_sql}) "
        f"UPDATE {table} SET {sets} "
        f"WHERE {table}.{qn('topic_id')} = %s "  # the topic's partition only
        f"AND {table}.{qn('sequence')} IN (SELECT {qn('sequence')} FROM {qn('claim')}) "
        f"RETURNING {columns}"
    )
    rows = Task.objects.db_manager(conn.alias).raw(sql, [*picked_params, *set_params, name])
    return list(rows)


def _joined(
    name: str, picked: tuple[str, tuple[Any, ...]], changes: dict[str, Any], conn: Any
) -> list[Task]:
    """An ``UPDATE`` joined to the rows it picks, then a ``SELECT`` of them (MariaDB; see
    :func:`~django_tasks_coord.db.claim_statement`)."""
    qn = conn.ops.quote_name
    picked_sql, picked_params = picked
    table = qn(Task._meta.db_table)
    sets, set_params = _assignments(changes, conn, qualify=f"{table}.")
    sql = (
        f"UPDATE ({picked_sql}) AS {qn('claim')} STRAIGHT_JOIN {table} FORCE INDEX (PRIMARY) "
        f"ON {table}.{qn('sequence')} = {qn('claim')}.{qn('sequence')} SET {sets}"
    )
    with conn.cursor() as cursor:
        cursor.execute(sql, [*picked_params, *set_params])
        if not cursor.rowcount:
            return []
    return list(under(name, changes["exec_id"], conn.alias))


def _locked(
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


def under(name: str, exec_id: uuid.UUID, using: str) -> TaskQuerySet:
    """The tasks of topic ``name`` held under the claim ``exec_id``."""
    return Task.objects.using(using).filter(topic_id=name, state=TaskState.ACTIVE, exec_id=exec_id)
