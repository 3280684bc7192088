"""Inserting task rows, each insert announced to the nodes of its topics once it is committed.

Pushes with their insertion mode (:func:`push`: REPLACE and SUPERSEDE make earlier
tasks of the identifiers redundant, DELETE deletes them), tasks created for external
executors and recreated copies (:func:`insert`). The statements are built by
:meth:`TaskQuerySet.insert_statements
<django_tasks_coord.models.TaskQuerySet.insert_statements>` (what ``bulk_create`` would
send), which nothing outside this package calls; this module decides how they travel:

- **In autocommit** (no transaction open), an insert is one statement, a transaction by
  itself, followed by the wake-up of the nodes. On PostgreSQL the wake-up is a
  transaction of its own, so that it never holds up concurrent producers' commits, but
  it travels with the insert: one query string, one round trip
  (:func:`~django_tasks_coord.db.with_wake`; see :mod:`django_tasks_coord.db.notifications`).
- **Inside a transaction** (the caller's, or one of an insertion mode), the statement
  joins it and the wake-up waits for its commit: one per topic and transaction, none
  after a rollback (:func:`~django_tasks_coord.db.announce`). On PostgreSQL the
  statement also checks that its topics exist (a stale topic cache would otherwise only
  show at the caller's commit).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from django_tasks_coord import db, flow, topics, tracing
from django_tasks_coord.enums import IN_FLIGHT, Insertion, TaskState
from django_tasks_coord.models import Task, Topic
from django_tasks_coord.models.inserts import InsertStatement, from_arrays, from_values
from django_tasks_coord.store import checkpoints

__all__ = ["append", "insert", "push"]

#: Identifiers per statement when an insertion mode changes earlier tasks.
_CHUNK = 500


def insert(tasks: list[Task], *, using: str | None = None, announce: bool = True) -> list[Task]:
    """Insert ``tasks`` and return them with their sequence and database-made fields.

    With ``announce`` (the default), the nodes of their topics are woken once the insert
    is committed, so that sleeping nodes claim them at once.
    """
    if not tasks:
        return []
    topics = {task.topic_id for task in tasks} if announce else set()
    return _write(tasks, using or db.alias(), topics)


def push(
    topic: str,
    tasks: list[Task],
    identifiers: Sequence[str],
    insertion: Insertion,
    *,
    using: str | None = None,
) -> list[Task]:
    """Apply ``insertion`` to the earlier tasks of ``identifiers`` in ``topic``, then insert
    ``tasks`` (all of ``topic``) and announce them.

    APPEND is the insert alone (one statement); the other modes run in one transaction.
    Raises ``IntegrityError`` if ``topic`` does not exist (nothing is left written).
    """
    using = using or db.alias()
    if insertion is Insertion.APPEND:
        return _write(tasks, using, {topic})
    with db.write_transaction():
        _apply_insertion(topic, list(identifiers), insertion, using)
        return _write(tasks, using, {topic})


def append(
    topic: str,
    rows: Sequence[tuple[str, Any]],
    *,
    defaults: dict[str, Any] | None = None,
    priority: int = 0,
    execute_at: datetime | None = None,
    handler: str = "",
    using: str | None = None,
) -> list[datetime]:
    """Append a pending task of ``topic`` per ``(identifier, payload)`` of ``rows``; return
    their creation times, in order.

    :func:`push` with APPEND for callers that need no ``Task`` objects back (the
    ``django.tasks`` backend). A row's stored payload is ``{**defaults, **payload}`` (a
    None payload stays None). On PostgreSQL one ``INSERT ... SELECT ... FROM UNNEST``:
    the columns and ``defaults`` that all rows share are sent once, the identifiers,
    payloads (and traceparents, when traced; the rows' limit keys,
    :mod:`django_tasks_coord.flow`, where they differ) as arrays
    (:func:`~django_tasks_coord.models.inserts.from_arrays`); a single row is one
    ``INSERT ... VALUES`` of the same columns, its payload merged here
    (:func:`~django_tasks_coord.models.inserts.from_values`); elsewhere :func:`push`.
    Announced like it; ``IntegrityError`` if ``topic`` does not exist.
    """
    using = using or db.alias()
    conn = connections[using]
    if not db.inserts_from_arrays(conn):
        tasks = [
            Task(
                topic_id=topic,
                identifier=identifier,
                payload=_merged(defaults, payload),
                priority=priority,
                execute_at=execute_at,
                handler=handler,
            )
            for identifier, payload in rows
        ]
        return [task.created_at for task in push(topic, tasks, (), Insertion.APPEND, using=using)]
    keys = _keys(topic, rows, defaults, using)
    keyed = len(set(keys)) > 1  # else the key is shared: sent once
    key = "" if keyed or not keys else keys[0]
    with tracing.producing_rows(topic, len(rows)) as spans:
        traced = any(spans.traceparents)
        dumped = json.dumps(defaults) if defaults else None
        shared_by = (topic, priority, execute_at, handler, dumped)
        one = len(rows) == 1
        sql, shared = _append_sql(using, type(conn).__module__, traced, *shared_by, key, keyed, one)
        params = [
            *shared,
            *_varying(rows, defaults, keys if keyed else None, spans.traceparents, traced),
        ]
        found = _rows_announced(conn, sql, params, [topic], key=0)
        spans.sequences = [row[0] for row in found]
    return [row[1] for row in found]


def _varying(
    rows: Sequence[tuple[str, Any]],
    defaults: dict[str, Any] | None,
    keys: list[str] | None,
    traceparents: list[str | None],
    traced: bool,
) -> list[Any]:
    """The parameters of :func:`append`'s statement that vary from row to row, in the order
    of its varying fields (:func:`_append_sql`): the identifiers, the payloads as JSON, the
    limit keys (unless None: shared) and the traceparents (when ``traced``). For several
    rows one array per field (the statement merges ``defaults`` into the payloads); for
    one row its values, its payload merged here."""
    one = len(rows) == 1
    payloads = [_merged(defaults, payload) if one else payload for _, payload in rows]
    columns: list[list[Any]] = [
        [identifier for identifier, _ in rows],
        [None if payload is None else json.dumps(payload) for payload in payloads],
        *([keys] if keys is not None else []),
        *([traceparents] if traced else []),
    ]
    return [column[0] for column in columns] if one else columns


@functools.lru_cache(maxsize=256)
def _append_sql(
    using: str,
    wrapper: str,
    traced: bool,
    topic: str,
    priority: int,
    execute_at: datetime | None,
    handler: str,
    defaults: str | None,
    concurrency_key: str = "",
    keyed: bool = False,
    one: bool = False,
) -> tuple[str, tuple[Any, ...]]:
    """:func:`append`'s statement and shared parameters for these shared values (``defaults``
    as JSON) on the database ``using`` (``wrapper``: its backend's module), with the
    traceparents as a column or without, and the limit keys (``keyed``) as a column or
    ``concurrency_key`` shared: kept, so that the enqueues of one task to one queue
    prepare them once. For ``one`` row, ``INSERT ... VALUES`` (its payload is merged with
    ``defaults`` by the caller); else ``UNNEST``."""
    template = Task(
        topic_id=topic,
        identifier="",
        payload=None if defaults is None else json.loads(defaults),
        priority=priority,
        execute_at=execute_at,
        handler=handler,
        concurrency_key=concurrency_key,
    )
    varying = (
        "identifier",
        "payload",
        *(("concurrency_key",) if keyed else ()),
        *(("traceparent",) if traced else ()),
    )
    returning = ("sequence", "created_at")
    if one:
        sql, shared = from_values(Task, template, varying, returning, using)
    else:
        merged = ("payload",) if defaults is not None else ()
        sql, shared = from_arrays(Task, template, varying, returning, using, merged=merged)
    return sql, tuple(shared)


def _write(tasks: list[Task], using: str, topics: set[str]) -> list[Task]:
    """Insert ``tasks`` and wake the nodes of ``topics`` once the insert is committed."""
    conn = connections[using]
    _key(tasks, using)
    with tracing.producing(tasks):  # a producer span each, and its traceparent stored
        statements = Task.objects.using(using).insert_statements(tasks)
        if statements is None:  # MySQL 8: row by row
            with db.write_transaction():
                Task.objects.using(using).insert(tasks)
                db.announce(conn, topics)
        elif len(statements) > 1 and conn.get_autocommit():  # more rows than one takes (SQLite)
            with db.write_transaction():
                for statement in statements:
                    _run(conn, statement)
                db.announce(conn, topics)
        elif conn.get_autocommit():  # one statement, a transaction by itself
            (statement,) = statements
            _run(conn, statement, announce=sorted(topics))
        else:  # in the caller's transaction
            for statement in statements:
                _run(conn, statement)
            db.announce(conn, topics)
    return tasks


def _spec(topic: str, using: str) -> str:
    """The limit key of ``topic``: the one read with the topic when the push checked that
    it exists (:data:`~django_tasks_coord.topics.known_topics`), else the cached limits'."""
    known = topics.known_topics.limits(topic)
    return flow.limits_of(topic, using).key if known is None else str(known[2])


def _keys(
    topic: str, rows: Sequence[tuple[str, Any]], defaults: dict[str, Any] | None, using: str
) -> list[str]:
    """The limit key of each row of :func:`append` (all ``""`` when the topic has no limit
    key), as :func:`_key` gives ``Task`` objects theirs. A ``@task`` function's limits key
    its queue by ``payload.task``, which the shared part of the payloads holds."""
    spec = _spec(topic, using)
    if not spec:
        return [""] * len(rows)
    return [
        flow.key_of(spec, identifier, _merged(defaults, payload)) for identifier, payload in rows
    ]


def _merged(defaults: dict[str, Any] | None, payload: Any) -> Any:
    """The payload :func:`append` stores for a row: ``{**defaults, **payload}`` (None stays)."""
    return payload if payload is None or not defaults else {**defaults, **payload}


def _key(tasks: list[Task], using: str) -> None:
    """Give each task without a concurrency key (a defined task has its definition's) the
    key of its topic's flow limits (:func:`django_tasks_coord.flow.key_of`), if it has one;
    the limit key is the one read with the topic when the push checked that it exists
    (:data:`~django_tasks_coord.topics.known_topics`), else the cached limits'."""
    specs: dict[str, str] = {}
    for task in tasks:
        if task.concurrency_key:
            continue
        spec = specs.get(task.topic_id)
        if spec is None:  # read with the topic's existence where the push checked it
            spec = specs[task.topic_id] = _spec(task.topic_id, using)
        if spec:
            task.concurrency_key = flow.key_of(spec, task.identifier, task.payload)


def _run(
    conn: BaseDatabaseWrapper, statement: InsertStatement, *, announce: list[str] | None = None
) -> None:
    """Run ``statement`` (:func:`_rows`) and set what it returned on its tasks; with
    ``announce``, announce those topics too (:func:`_rows_announced`)."""
    topics = sorted({task.topic_id for task in statement.tasks})
    key = Task._meta.db_returning_fields.index(Task._meta.pk)
    if announce is None:
        statement.read(_rows(conn, statement.sql, statement.params, topics, key=key))
    else:
        statement.read(
            _rows_announced(conn, statement.sql, statement.params, topics, key=key, to=announce)
        )


def _rows_announced(
    conn: BaseDatabaseWrapper,
    sql: str,
    params: Sequence[Any],
    topics: list[str],
    *,
    key: int,
    to: list[str] | None = None,
) -> list[tuple[Any, ...]]:
    """:func:`_rows`, then :func:`~django_tasks_coord.db.announce` the topics ``to`` (default
    ``topics``). In autocommit on PostgreSQL, the insert and its wake-up in one round trip
    (:func:`~django_tasks_coord.db.with_wake`): two transactions, the insert's committed
    first, the wake-up sent only if it succeeded."""
    to = topics if to is None else to
    if not to or not db.wakes_with_statement(conn):
        rows = _rows(conn, sql, params, topics, key=key)
        db.announce(conn, to)
        return rows
    combined, combined_params = db.with_wake(sql, list(params), to)
    with conn.cursor() as cursor:
        cursor.execute(combined, combined_params)
        return list(cursor.fetchall())


def _rows(
    conn: BaseDatabaseWrapper, sql: str, params: Sequence[Any], topics: list[str], *, key: int
) -> list[tuple[Any, ...]]:
    """Run the insert ``sql`` and return its rows; inside a transaction on PostgreSQL, checking
    that its ``topics`` exist.

    A missing topic would show only at the commit of the transaction (the foreign key is
    checked then); the check makes it an ``IntegrityError`` now, the rows (their sequence
    in column ``key``) deleted again, so that the caller's transaction can go on
    (``topics.adding_tasks`` relies on it).
    """
    if conn.get_autocommit() or not db.checks_topic_in_insert(conn):
        with conn.cursor() as cursor:
            cursor.execute(sql, params)
            return list(cursor.fetchall())
    table = conn.ops.quote_name(Topic._meta.db_table)
    name = conn.ops.quote_name(Topic._meta.get_field("name").column or "name")
    checked = (
        f"WITH inserted AS ({sql}) SELECT inserted.*, "
        f"(SELECT count(*) FROM {table} WHERE {name} = ANY(%s)) FROM inserted"
    )
    with conn.cursor() as cursor:
        cursor.execute(checked, [*params, topics])
        rows = cursor.fetchall()
    if rows and rows[0][-1] != len(topics):
        Task.objects.using(conn.alias).filter(pk__in=[row[key] for row in rows]).delete()
        raise IntegrityError(f"A topic of {topics} does not exist.")
    return [row[:-1] for row in rows]


def _apply_insertion(topic: str, identifiers: list[str], insertion: Insertion, using: str) -> None:
    """REPLACE: unfinished tasks (in flight too) become REDUNDANT; SUPERSEDE: pending ones
    do; DELETE: every earlier task that is not in flight is deleted, with its checkpoints."""
    for start in range(0, len(identifiers), _CHUNK):
        chunk = identifiers[start : start + _CHUNK]
        existing = Task.objects.using(using).filter(topic_id=topic)
        if insertion is Insertion.REPLACE:
            existing.unfinished_of(chunk).update(
                state=TaskState.REDUNDANT, finished_at=timezone.now(), owner=None
            )
        elif insertion is Insertion.SUPERSEDE:
            existing.unfinished_of(chunk).pending().update(
                state=TaskState.REDUNDANT, finished_at=timezone.now()
            )
        else:
            doomed = existing.filter(identifier__in=chunk).exclude(state__in=IN_FLIGHT)
            checkpoints.delete_of_tasks(doomed)  # named while the tasks are still there
            doomed.delete()
