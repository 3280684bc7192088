"""Handing defined tasks out to external executors, and taking back hand-outs never started.

:func:`hand_out` is the executor API's claim (``executions.poll``): ready tasks of one
definition become REQUESTED, each under a fresh ``exec_id``, within the definition's
concurrency limit and its topic's flow limits (the claim of limited topics,
:func:`django_tasks_coord.store.flow.hand_out`); with ``start``, they are started at once
(IN PROGRESS), as the batch claim wants. :func:`report_many` writes the outcomes of many
executions in one statement (the batch completion). :func:`take_back` returns requested
tasks whose start deadline passed to the ready state (the requested-to-start timeout).
:func:`freed_a_slot` wakes the long-polls waiting for room under a concurrency limit.
"""

from __future__ import annotations

import functools
import uuid
import weakref
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.models import Case, Exists, F, Q, UUIDField, Value, When

from django_tasks_coord import db, definitions, flow
from django_tasks_coord.attempts import Attempt
from django_tasks_coord.enums import TaskState
from django_tasks_coord.flow import LIMITED
from django_tasks_coord.models import Task, Topic
from django_tasks_coord.store import flow as flow_claims

if TYPE_CHECKING:
    from django_tasks_coord.definitions import Definition

__all__ = ["expired", "freed_a_slot", "hand_out", "report_many", "take_back"]


def hand_out(
    definition: Definition, limit: int, now: datetime, *, start: bool = False
) -> list[Task]:
    """Claim up to ``limit`` ready tasks of one definition in one short transaction.

    A definition whose topic has flow limits (:func:`django_tasks_coord.flow.set_limits`:
    a ``rate``, a ``concurrency``, their totals), or which has a ``concurrency_limit`` of
    its own, is handed out by :func:`django_tasks_coord.store.flow.hand_out`, the claim of limited
    topics: the topic's row is locked first (``FOR UPDATE``), so hand-outs of a limited
    definition take turns, each one counts the tasks in flight and the starts of the rate
    window after the previous one committed, and no race can overrun a limit; both kinds of
    limits hold together. (SQLite serializes every write transaction anyway.)

    Otherwise this is the queue's claim: ``SELECT ... FOR UPDATE SKIP LOCKED``, so
    concurrent pollers never take the same task; a paused topic, or one that has limits by
    now (the cached limits said none), is ruled out in the same statement. On PostgreSQL it
    is one statement (:func:`_hand_out_at_once`).

    The tasks become REQUESTED, or with ``start`` IN PROGRESS (an attempt begun, as by
    ``executions.start``), each under a fresh ``exec_id``.
    """
    using, conn = db.alias(), db.connection()
    limited = definition.concurrency_limit is not None or flow.limits_of(definition.name).limited
    if not limited and db.hands_out_in_one_statement(conn):
        return _hand_out_at_once(definition, limit, now, start)  # no queryset to build
    ready = (
        Task.objects.using(using)
        .filter(topic_id=definition.name, state=TaskState.PENDING)
        .filter(Q(execute_at__isnull=True) | Q(execute_at__lte=now))
        .order_by("-priority", "sequence")
    )

    def mark(chosen: list[Task]) -> list[Task]:
        if chosen:
            changes = (_started if start else _requested)(chosen, definition, now)
            Task.objects.using(using).rows(chosen).update(**changes)
        return chosen

    if limited:
        return flow_claims.hand_out(
            definition.name,
            limit,
            definition.concurrency_limit,
            definition.concurrency_key_path is not None,
            ready.select_for_update(**db.lock_kwargs(conn)),
            mark,
            using,
        )
    with db.write_transaction():
        # Paused (queue.pause_topic, the admin): executors get nothing; limited since the
        # cache was read: nothing until it knows (never more than the limits allow).
        closed = Topic.objects.using(using).filter(Q(paused=True) | LIMITED, name=definition.name)
        ready = ready.filter(~Exists(closed))
        return mark(list(ready.select_for_update(**db.lock_kwargs(conn))[:limit]))


#: The claim of :func:`_hand_out_at_once` (PostgreSQL): due tasks of a topic that is not
#: paused and has no flow limits (the guard of a stale cache, as in store.claims), locked
#: skipping rows others hold, in the order of priority and age, each given a new exec_id by
#: the database; ``{started}`` is empty, or begins an attempt. The choice is a
#: materialized CTE: as a subquery joined to the UPDATE, the planner may run it again per
#: row, and each run skips the rows the previous ones locked.
_AT_ONCE = """
WITH c AS MATERIALIZED (
    SELECT {sequence}, gen_random_uuid() AS new_id FROM {task}
    WHERE {topic} = %(topic)s AND {state} = %(pending)s
        AND ({execute_at} IS NULL OR {execute_at} <= %(now)s)
        AND NOT EXISTS (
            SELECT 1 FROM {topics} WHERE {name} = %(topic)s AND {topic_pk} IN ({closed})
        )
    ORDER BY {priority} DESC, {sequence}
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {task} AS t
SET {state} = %(state)s, {exec_id} = c.new_id, {deadline} = %(deadline)s, {owner} = NULL{started}
FROM c
WHERE t.{topic} = %(topic)s AND t.{sequence} = c.{sequence}
RETURNING {returning}
"""
#: The changes of ``start``: an attempt begun (its log entry as ``Attempt.to_json`` has it).
_STARTED = """,
    {attempts} = t.{attempts} + 1, {started_at} = %(now)s, {finished_at} = NULL,
    {attempt_log} = COALESCE(t.{attempt_log}, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
        'attempt', t.{attempts} + 1, 'exec_id', c.new_id::text, 'started_at', %(started)s::text))"""


def _column(model: type[models.Model], name: str) -> str:
    field = model._meta.get_field(name)
    assert isinstance(field, models.Field)
    assert field.column is not None
    return field.column


@functools.cache
def _at_once_sql(start: bool, quote: Callable[[str], str]) -> str:
    """:data:`_AT_ONCE` with the tables' and columns' names."""
    names = {
        name: quote(_column(Task, name))
        for name in (
            "state",
            "exec_id",
            "deadline",
            "owner",
            "sequence",
            "topic",
            "execute_at",
            "priority",
            "attempts",
            "started_at",
            "finished_at",
            "attempt_log",
        )
    }
    names.update(
        task=quote(Task._meta.db_table),
        topics=quote(Topic._meta.db_table),
        name=quote(_column(Topic, "name")),
        topic_pk=quote(_column(Topic, "name")),
        closed=_closed_sql()[0],
    )
    columns = (_column(Task, field.name) for field in Task._meta.concrete_fields)
    returning = ", ".join(f"t.{quote(column)}" for column in columns)
    started = _STARTED.format(**names) if start else ""
    return _AT_ONCE.format(started=started, returning=returning, **names)


@functools.cache
def _closed_sql() -> tuple[str, dict[str, Any]]:
    """The topics a hand-out at once must leave alone, paused or under flow limits (the
    same ``flow.LIMITED`` guard as store.claims), as SQL with named parameters and those
    parameters: the statement of :data:`_AT_ONCE` takes named ones."""
    closed = Topic.objects.using(db.alias()).filter(Q(paused=True) | LIMITED)
    sql, params = closed.order_by().values("pk").query.sql_with_params()
    names = {f"closed_{n}": value for n, value in enumerate(params)}
    parts = sql.split("%s")
    assert len(parts) == len(names) + 1
    named = parts[0] + "".join(
        f"%({name})s{part}" for name, part in zip(names, parts[1:], strict=True)
    )
    return named, names


def _hand_out_at_once(definition: Definition, limit: int, now: datetime, start: bool) -> list[Task]:
    """:func:`hand_out` in one statement (PostgreSQL, a definition without limits)."""
    conn = db.connection()
    timeout = definition.in_progress_timeout if start else definition.requested_to_start_timeout
    params = {
        "state": TaskState.ACTIVE if start else TaskState.REQUESTED,
        "pending": TaskState.PENDING,
        "deadline": now + timedelta(seconds=timeout),
        "topic": definition.name,
        "now": now,
        "started": now.isoformat(),
        "limit": limit,
        **_closed_sql()[1],
    }
    with conn.cursor() as cursor:
        cursor.execute(_at_once_sql(start, conn.ops.quote_name), params)
        rows = cursor.fetchall()
    chosen = _tasks(conn, rows)
    chosen.sort(key=lambda task: (-task.priority, task.sequence))
    return chosen


#: The converters of each connection for the task table's columns, by column position.
_converters: weakref.WeakKeyDictionary[Any, dict[int, Any]] = weakref.WeakKeyDictionary()


def _tasks(conn: Any, rows: list[tuple[Any, ...]]) -> list[Task]:
    """Tasks from rows of every concrete column of the task table, in the model's order,
    converted as a query of the ORM converts them."""
    fields = Task._meta.concrete_fields
    compiler = Task.objects.none().query.get_compiler(connection=conn)
    converters = _converters.get(conn)
    if converters is None:
        columns = [field.get_col(Task._meta.db_table) for field in fields]
        converters = _converters[conn] = compiler.get_converters(columns)
    if converters:
        rows = list(compiler.apply_converters(rows, converters))
    names = [field.attname for field in fields]
    return [Task.from_db(conn.alias, names, row) for row in rows]


def _per_row(values: dict[int, Any], field: models.Field[Any, Any]) -> Case:
    """A ``CASE`` giving each row (by key) its own value."""
    whens = (When(pk=pk, then=Value(value, output_field=field)) for pk, value in values.items())
    return Case(*whens, output_field=field)


def _requested(chosen: list[Task], definition: Definition, now: datetime) -> dict[str, Any]:
    """The changes that hand ``chosen`` out (REQUESTED until the start timeout); applied to
    the objects in memory too."""
    deadline = now + timedelta(seconds=definition.requested_to_start_timeout)
    for task in chosen:
        task.state, task.exec_id, task.deadline = TaskState.REQUESTED, uuid.uuid4(), deadline
    return {
        "state": TaskState.REQUESTED,
        "exec_id": _per_row({task.pk: task.exec_id for task in chosen}, UUIDField()),
        "deadline": deadline,
        "owner": None,
    }


def _started(chosen: list[Task], definition: Definition, now: datetime) -> dict[str, Any]:
    """The changes that hand ``chosen`` out and start them (a new attempt each, IN PROGRESS
    until the in-progress timeout); applied to the objects in memory too."""
    deadline = now + timedelta(seconds=definition.in_progress_timeout)
    for task in chosen:
        task.exec_id, task.attempts = uuid.uuid4(), task.attempts + 1
        entry = Attempt(task.attempts, exec_id=str(task.exec_id), started_at=now.isoformat())
        task.attempt_log = [*(task.attempt_log or []), entry.to_json()]
        task.state, task.deadline, task.started_at, task.finished_at = (
            TaskState.ACTIVE,
            deadline,
            now,
            None,
        )
    log_field = Task._meta.get_field("attempt_log")
    assert isinstance(log_field, models.Field)
    return {
        "state": TaskState.ACTIVE,
        "exec_id": _per_row({task.pk: task.exec_id for task in chosen}, UUIDField()),
        "attempts": F("attempts") + 1,
        "attempt_log": _per_row({task.pk: task.attempt_log for task in chosen}, log_field),
        "started_at": now,
        "finished_at": None,
        "deadline": deadline,
        "owner": None,
    }


def report_many(reports: Sequence[tuple[Task, dict[str, Any]]]) -> None:
    """Apply each report's changes to the row of its task: the batch completion's writes,
    one ``UPDATE`` per set of changed fields, with per-row values through ``CASE``.

    Each task is a defined task IN PROGRESS under the ``exec_id`` its report quoted, its row
    locked by the caller in this transaction since it checked that (so the rows are still
    held: no fence is needed beyond the state), each task once. The objects in memory are
    left as they are.
    """
    groups: dict[tuple[str, ...], list[tuple[Task, dict[str, Any]]]] = {}
    for task, changes in reports:
        groups.setdefault(tuple(sorted(changes)), []).append((task, changes))
    for names, group in groups.items():
        values: dict[str, Any] = {}
        for name in names:
            column = {task.pk: changes[name] for task, changes in group}
            field = Task._meta.get_field(name)
            assert isinstance(field, models.Field)
            if len(column) == 1 or (
                name != "attempt_log" and len({repr(value) for value in column.values()}) == 1
            ):
                values[name] = next(iter(column.values()))
            else:
                values[name] = _per_row(column, field)
        rows = Task.objects.using(db.alias()).rows(task for task, _ in group)
        rows.filter(state=TaskState.ACTIVE).update(**values)


def expired(state: TaskState, names: list[str], now: datetime, batch_size: int) -> list[Task]:
    """Lock up to ``batch_size`` tasks of ``names`` in ``state`` past their deadline, oldest
    deadline first, skipping rows locked elsewhere. Call it inside a write transaction."""
    conn = db.connection()
    return list(
        Task.objects.using(db.alias())
        .filter(state=state, deadline__lt=now, topic_id__in=names)
        .order_by("deadline")
        .select_for_update(**db.lock_kwargs(conn))[:batch_size]
    )


def take_back(names: list[str], now: datetime, batch_size: int, reason: str) -> int:
    """Return requested tasks of ``names`` past their deadline to ready (``reason`` says
    why); at most ``batch_size``, skipping rows locked elsewhere; return how many."""
    with db.write_transaction():
        late = expired(TaskState.REQUESTED, names, now, batch_size)
        if not late:
            return 0
        Task.objects.using(db.alias()).rows(late).update(
            state=TaskState.PENDING,
            exec_id=None,
            deadline=None,
            outcome_reason=reason,
        )
        for topic in sorted({t.topic_id for t in late}):
            db.notify(db.connection(), topic)
    return len(late)


def freed_a_slot(task: Task, definition: Definition | None = None) -> None:
    """Wake long-polls waiting for a concurrency slot of ``task``'s definition (PostgreSQL):
    call it once a write took ``task`` out of flight. A slot of the definition's
    ``concurrency_limit`` or of its topic's ``concurrency`` or ``total_concurrency`` (flow
    limits)."""
    definition = definition or definitions.get(task.topic_id)
    if definition.concurrency_limit is not None or flow.limits_of(task.topic_id).concurrencies():
        db.notify(db.connection(), task.topic_id)
