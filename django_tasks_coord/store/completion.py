"""The batched, fenced completion write: many tasks' outcomes (or attempt logs) per statement.

The node's completer (:mod:`django_tasks_coord.node.completer`) hands over the changes
of many running tasks at once: completions that carry values of their own (a return
value, an attempt log entry) and the attempt logs of attempts under way. :func:`write_changes`
turns them into one ``UPDATE`` per set of changed fields, with per-row values through
``CASE``, each row fenced by its claim (:func:`~django_tasks_coord.store.fencing.held`:
its ``exec_id``, still ACTIVE), so a lost claim writes nothing. A completion of a task
whose cancel was requested ends it CANCELED (:func:`~.claims.end_claims`).

A batch whose connection broke may be written again as it is: a completion keeps the
``finished_at`` its first try wrote, so a commit that went through before the answer
was lost changes nothing the second time and is recognized by that time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Expression, F, Value
from django.db.models.sql.compiler import SQLCompiler
from django.utils import timezone

from django_tasks_coord import db
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Task
from django_tasks_coord.store.claims import end_claims
from django_tasks_coord.store.fencing import held

#: Fields whose per-row values are always written through ``CASE`` (JSON lists).
_PER_ROW = frozenset({"attempt_log"})


@dataclass(eq=False)
class Change:
    """Changes of one task row, written only while it is ACTIVE under the claim it carries.

    A change of ``state`` completes the row: :func:`write_changes` sets its ``finished_at`` (one
    time for the whole batch) and puts it into ``fields``. ``ok`` says whether it was
    written (None: not yet, or its batch failed).
    """

    task: Task
    fields: dict[str, Any]
    ok: bool | None = None
    #: Set once written: it ended CANCELED instead (a cancel was requested while it ran).
    canceled: bool = False

    @property
    def completes(self) -> bool:
        """Whether it finishes the task (it changes its state)."""
        return "state" in self.fields


class PerRow(Expression):
    """A value per row of one ``UPDATE``: ``CASE sequence WHEN pk THEN value ... END``.

    What ``Case(When(pk=..., then=Value(...)), ...)`` writes, without building and resolving
    a filter per row: the completer writes hundreds of rows per statement. On PostgreSQL,
    an element of an array instead (:meth:`as_postgresql`).
    """

    def __init__(self, values: dict[int, Any], output_field: models.Field[Any, Any]) -> None:
        super().__init__(output_field=output_field)
        self.values = values
        self.key: Any = F("pk")

    def get_source_expressions(self) -> list[Any]:
        return [self.key]

    def set_source_expressions(self, exprs: Sequence[Any]) -> None:
        (self.key,) = exprs

    def as_sql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper) -> tuple[str, Any]:
        key, key_params = compiler.compile(self.key)
        whens: list[str] = []
        params: list[Any] = list(key_params)
        for pk, value in self.values.items():
            sql, value_params = compiler.compile(Value(value, output_field=self.output_field))
            whens.append(f"WHEN %s THEN {sql}")
            params += [pk, *value_params]
        return f"CASE {key} {' '.join(whens)} ELSE NULL END", params

    def as_postgresql(
        self, compiler: SQLCompiler, connection: BaseDatabaseWrapper
    ) -> tuple[str, Any]:
        """The statement's text and parameters stay the same size however many rows
        (psycopg parses each placeholder and quotes each value): a JSON column's values are
        one JSON object by key (its JSON nulls are SQL NULLs, as ``None`` is in a
        ``Value``); other values are an array beside the array of their keys."""
        key, params = compiler.compile(self.key)
        field = self.output_field
        if isinstance(field, models.JSONField):
            by_key = field.get_db_prep_save(
                {str(pk): v for pk, v in self.values.items()}, connection
            )
            return f"NULLIF((%s::jsonb) -> ({key}::text), 'null'::jsonb)", [by_key, *params]
        values = [field.get_db_prep_save(value, connection) for value in self.values.values()]
        sql = f"(%s::{field.db_type(connection)}[])[array_position(%s::bigint[], {key})]"
        return sql, [values, list(self.values), *params]


def write_changes(changes: list[Change]) -> None:
    """Write ``changes`` (see the module docstring) and set each one's ``ok``.

    Within one set of fields, a row's later change under the same claim supersedes its
    earlier ones (only the last is written; the earlier get its ``ok``). Changes of one row
    under different claims (a run whose claim was lost, finishing beside the run of the
    claim that replaced it) are written in turn, each fenced by its own claim: at most one
    of them can be written, and only its ``ok`` is True.
    """
    groups: dict[tuple[str, ...], dict[tuple[int, Any], list[Change]]] = {}
    for change in changes:
        kind = tuple(sorted(name for name in change.fields if name != "finished_at"))
        rows = groups.setdefault(kind, {})
        rows.setdefault((change.task.pk, change.task.exec_id), []).append(change)
    for fields, rows in groups.items():
        rounds: list[dict[int, Change]] = []  # one UPDATE each: a row once per statement
        for writes in rows.values():
            last = writes[-1]
            free = next((r for r in rounds if last.task.pk not in r), None)
            if free is None:
                free = {}
                rounds.append(free)
            free[last.task.pk] = last
        for round_ in rounds:
            _update(fields, list(round_.values()))
        for writes in rows.values():
            for earlier in writes[:-1]:
                earlier.ok = writes[-1].ok


def _update(fields: tuple[str, ...], changes: list[Change]) -> None:
    finished = timezone.now()
    for change in changes:  # once: a retried write must find the time its first try wrote
        if change.completes and change.fields.get("finished_at") is None:
            change.fields["finished_at"] = finished
    values: dict[str, Any] = {}
    for name in (*fields, *(("finished_at",) if "state" in fields else ())):
        column = [change.fields[name] for change in changes]
        if all(value == column[0] for value in column) and name not in _PER_ROW:
            values[name] = column[0]
            continue
        output = Task._meta.get_field(name)
        assert isinstance(output, models.Field)
        values[name] = PerRow({change.task.pk: change.fields[name] for change in changes}, output)
    rows = held(change.task for change in changes)
    if "state" not in fields:  # not the end of a claim (an attempt log)
        written, canceled = rows.update(**values), set[int]()
    else:
        written, canceled = end_claims(rows, values, len(changes))
    for change in changes:
        if change.task.pk in canceled:
            change.canceled = True
    if written == len(changes):
        for change in changes:
            change.ok = True
        return
    _find_written(changes)


def _find_written(changes: list[Change]) -> None:
    """Some rows were no longer held: find out which were written (by an earlier try)."""
    current = {
        row["pk"]: row
        for row in Task.objects.using(db.alias())
        .rows(change.task for change in changes)
        .values("pk", "exec_id", "state", "finished_at", "cancel_requested_at")
    }
    for change in changes:
        row = current.get(change.task.pk)
        if row is None or row["exec_id"] != change.task.exec_id:
            change.ok = False
        elif change.completes:
            canceled = row["state"] == TaskState.CANCELED and row["cancel_requested_at"]
            change.ok = (row["state"] == change.fields["state"] or bool(canceled)) and row[
                "finished_at"
            ] == change.fields["finished_at"]
            change.canceled = bool(change.ok and canceled)
        else:
            change.ok = row["state"] == TaskState.ACTIVE
