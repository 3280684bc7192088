"""Checkpoints: the one module that writes the checkpoint table.

A checkpoint is written under the claim of the attempt that records it, in one statement:
an ``INSERT ... SELECT`` from the task's row that matches only while the task is ACTIVE
under that attempt's ``exec_id`` (:func:`~.fencing.held`), read with a share lock
(PostgreSQL ``FOR SHARE``, MySQL/MariaDB ``LOCK IN SHARE MODE``: the latest committed
version, waiting for a concurrent reclaim to commit; SQLite has one writer at a time), and
an upsert on ``(task, name)``. A node declared dead, whose task was handed out again
since, writes nothing: :func:`write` returns False.

Checkpoints are kept while their task exists: a retry and a return to the queue keep
them (the next attempt resumes), and they are deleted with the task by the task store's
pruning (:mod:`.prune`, which calls :func:`delete_of` and :func:`delete_orphans`) and by
an insertion in DELETE mode (:mod:`.insert`, :func:`delete_of_tasks`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone

from django_tasks_coord import db
from django_tasks_coord.models import Checkpoint, Task
from django_tasks_coord.store.fencing import held

__all__ = ["delete_of", "delete_of_tasks", "delete_orphans", "read", "write"]


#: The checkpoint's unique columns, and those a second write of it replaces.
_UNIQUE = ("task_id", "name")
_REPLACED = ("value", "attempt", "exec_id", "written_at")


def write(task: Task, name: str, value: Any) -> bool:
    """Store ``value`` (JSON) under ``name`` for ``task`` if ``task`` is still ACTIVE under
    the claim (``exec_id``) it carries; return whether it was written.

    One statement (see the module). A lost connection is waited out
    (:func:`~django_tasks_coord.db.retry_while_lost`): the write is an idempotent upsert,
    so repeating it is safe.
    """
    alias = db.alias()
    conn = db.connection()
    quote = conn.ops.quote_name
    source = held([task], using=alias).values_list("sequence", "attempts", "exec_id")
    select, where_params = source.query.get_compiler(using=alias).as_sql()
    head, sep, tail = select.partition(" FROM ")
    value_field = Checkpoint._meta.get_field("value")
    at_field = Checkpoint._meta.get_field("written_at")
    json.dumps(value, allow_nan=False)  # refuse what is not JSON before any statement
    table = quote(Checkpoint._meta.db_table)
    columns = ", ".join(
        quote(c) for c in ("task_id", "attempt", "exec_id", "name", "value", "written_at")
    )
    sql = (
        f"INSERT INTO {table} ({columns}) {head}, %s, %s, %s{sep}{tail}"
        f"{db.share_lock_clause(conn)}{db.upsert_clause(conn, _UNIQUE, _REPLACED)}"
    )
    params = [
        name,
        value_field.get_db_prep_save(value, conn),
        at_field.get_db_prep_save(timezone.now(), conn),
        *where_params,
    ]

    def run() -> int:
        with conn.cursor() as cursor:
            cursor.execute(sql, params)
            return int(cursor.rowcount)

    return db.retry_while_lost(run, what="Writing a checkpoint") > 0


def read(tasks: Iterable[Task], *, prefix: str = "") -> dict[int, dict[str, Any]]:
    """The checkpoints of ``tasks`` (names starting with ``prefix``): by task sequence, a
    dict of name to value (a task without any is left out). One query."""
    pks = [task.pk for task in tasks]
    rows = Checkpoint.objects.using(db.alias()).filter(task_id__in=pks)
    if prefix:
        rows = rows.filter(name__startswith=prefix)
    found: dict[int, dict[str, Any]] = {}
    for task_id, name, value in rows.order_by("id").values_list("task_id", "name", "value"):
        found.setdefault(task_id, {})[name] = value
    return found


def delete_of(pks: Sequence[int]) -> int:
    """Delete the checkpoints of the tasks ``pks`` (deleted, or being deleted, in the
    caller's transaction); return how many. Reads first, so that tasks that recorded none
    (the common case) cost no ``DELETE``."""
    if not pks:
        return 0
    rows = Checkpoint.objects.using(db.alias()).filter(task_id__in=list(pks))
    if not rows.exists():
        return 0
    return int(rows.delete()[0])


def delete_of_tasks(tasks: QuerySet[Task]) -> int:
    """Delete the checkpoints of the tasks ``tasks`` selects (about to be deleted in the
    caller's transaction); return how many. Reads first, like :func:`delete_of`.

    A task among them claimed by a node between this and the caller's delete is not
    deleted (it is in flight by then), but loses its checkpoints: it starts again from its
    first step, which at-least-once allows.
    """
    rows = Checkpoint.objects.using(db.alias()).filter(task_id__in=tasks.values("sequence"))
    if not rows.exists():
        return 0
    return int(rows.delete()[0])


def delete_orphans(below: int | None = None) -> int:
    """Delete the checkpoints whose task is gone (with a sequence under ``below``, if
    given); return how many. For deletions that do not know the tasks they deleted."""
    alias = db.alias()
    rows = Checkpoint.objects.using(alias).filter(
        ~Exists(Task.objects.using(alias).filter(sequence=OuterRef("task_id")))
    )
    if below is not None:
        rows = rows.filter(task_id__lt=below)
    return int(rows.delete()[0])
