"""Handing defined tasks out to external executors, and taking back hand-outs never started.

:func:`hand_out` is the executor API's claim (``executions.poll``): ready tasks of one
definition become REQUESTED, each under a fresh ``exec_id``, within the definition's
concurrency limit; with ``start``, they are started at once (IN PROGRESS), as the batch
claim wants. :func:`report_many` writes the outcomes of many executions in one statement
(the batch completion). :func:`take_back` returns requested tasks whose start deadline
passed to the ready state (the requested-to-start timeout). :func:`freed_a_slot` wakes
the long-polls waiting for room under a concurrency limit.
"""

from __future__ import annotations

import functools
import uuid
import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.models import Case, Count, Exists, F, Q, QuerySet, UUIDField, Value, When

from django_tasks_coord import db, definitions
from django_tasks_coord.attempts import Attempt
from django_tasks_coord.enums import IN_FLIGHT, TaskState
from django_tasks_coord.models import Task, Topic

if TYPE_CHECKING:
    from django_tasks_coord.definitions import Definition

__all__ = ["expired", "freed_a_slot", "hand_out", "report_many", "take_back"]

#: Rounds of candidates a poll looks through for tasks whose concurrency key has room.
_MAX_ROUNDS = 20


def hand_out(
    definition: Definition, limit: int, now: datetime, *, start: bool = False
) -> list[Task]:
    """Claim up to ``limit`` ready tasks of one definition in one short transaction.

    Without a concurrency limit this is the queue's claim: ``SELECT ... FOR UPDATE SKIP
    LOCKED``, so concurrent pollers never take the same task (a paused topic is ruled out
    in the same statement). With a limit, the definition's topic row is locked first
    (``FOR UPDATE``): polls of a limited definition take turns, so each one counts the
    tasks in flight after the previous one committed, and the limit cannot be overrun by
    a race. (SQLite serializes every write transaction anyway.)

    The tasks become REQUESTED, or with ``start`` IN PROGRESS (an attempt begun, as by
    ``executions.start``), each under a fresh ``exec_id``. On PostgreSQL, a definition
    without a limit is handed out in one statement (:func:`_hand_out_at_once`).
    """
    using, conn = db.alias(), db.connection()
    if definition.concurrency_limit is None and db.hands_out_in_one_statement(conn):
        return _hand_out_at_once(definition, limit, now, start)
    with db.write_transaction():
        room: Counter[str] | None = None
        topic = Topic.objects.using(using).filter(name=definition.name)
        ready = (
            Task.objects.using(using)
            .filter(topic_id=definition.name, state=TaskState.PENDING)
            .filter(Q(execute_at__isnull=True) | Q(execute_at__lte=now))
            .order_by("-priority", "sequence")
        )
        if definition.concurrency_limit is not None:
            locked = topic.select_for_update(**db.lock_kwargs(conn, skip_locked=False))
            if list(locked.values_list("paused", flat=True)) != [False]:
                return []  # paused in the admin, or no task was ever created
            room = _room(definition)
            if room.total() <= 0 and definition.concurrency_key_path is None:
                return []
        else:  # paused (queue.pause_topic, the admin): executors get nothing
            ready = ready.filter(~Exists(topic.filter(paused=True)))
        chosen = _choose(ready.select_for_update(**db.lock_kwargs(conn)), limit, room, definition)
        if not chosen:
            return []
        changes = (_started if start else _requested)(chosen, definition, now)
        Task.objects.using(using).rows(chosen).update(**changes)
    return chosen


#: The claim of :func:`_hand_out_at_once` (PostgreSQL): due tasks of a topic that is not
#: paused, locked skipping rows others hold, in the order of priority and age, each given a
#: new exec_id by the database; ``{started}`` is empty, or begins an attempt. The choice is a
#: materialized CTE: as a subquery joined to the UPDATE, the planner may run it again per
#: row, and each run skips the rows the previous ones locked.
_AT_ONCE = """
WITH c AS MATERIALIZED (
    SELECT {sequence}, gen_random_uuid() AS new_id FROM {task}
    WHERE {topic} = %(topic)s AND {state} = %(pending)s
        AND ({execute_at} IS NULL OR {execute_at} <= %(now)s)
        AND NOT EXISTS (SELECT 1 FROM {topics} WHERE {name} = %(topic)s AND {paused})
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
        paused=quote(_column(Topic, "paused")),
    )
    columns = (_column(Task, field.name) for field in Task._meta.concrete_fields)
    returning = ", ".join(f"t.{quote(column)}" for column in columns)
    started = _STARTED.format(**names) if start else ""
    return _AT_ONCE.format(started=started, returning=returning, **names)


def _hand_out_at_once(definition: Definition, limit: int, now: datetime, start: bool) -> list[Task]:
    """:func:`hand_out` in one statement (PostgreSQL, a definition without a limit)."""
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


def _room(definition: Definition) -> Counter[str]:
    """Free places per concurrency key (the key ``""`` only, without a key path)."""
    assert definition.concurrency_limit is not None
    in_flight = (
        Task.objects.using(db.alias())
        .filter(topic_id=definition.name, state__in=IN_FLIGHT)
        .values("concurrency_key")
        .annotate(n=Count("pk"))
        .values_list("concurrency_key", "n")
    )
    taken = dict(in_flight)
    if definition.concurrency_key_path is None:
        return Counter({"": definition.concurrency_limit - sum(taken.values())})
    return Counter({key: definition.concurrency_limit - n for key, n in taken.items()})


def _choose(
    ready: QuerySet[Task], limit: int, room: Counter[str] | None, definition: Definition
) -> list[Task]:
    """Take up to ``limit`` tasks of ``ready`` that fit the free places of their keys."""
    if room is None:
        return list(ready[:limit])
    if definition.concurrency_key_path is None:
        return list(ready[: min(limit, room[""])])
    assert definition.concurrency_limit is not None
    limit_per_key = definition.concurrency_limit
    chosen: list[Task] = []
    seen: list[int] = []
    full = {key for key, free in room.items() if free <= 0}
    for _ in range(_MAX_ROUNDS):
        wanted = limit - len(chosen)
        batch = list(ready.exclude(concurrency_key__in=full).exclude(pk__in=seen)[:wanted])
        for task in batch:
            seen.append(task.pk)
            key = task.concurrency_key
            free = room.get(key, limit_per_key)
            if free > 0 and len(chosen) < limit:
                chosen.append(task)
                room[key] = free - 1
            if room.get(key, limit_per_key) <= 0:
                full.add(key)
        if len(chosen) >= limit or len(batch) < wanted:
            break
    return chosen


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
    call it once a write took ``task`` out of flight."""
    definition = definition or definitions.get(task.topic_id)
    if definition.concurrency_limit is not None:
        db.notify(db.connection(), task.topic_id)
