"""The batched, fenced completion write: many tasks' outcomes (or attempt logs) per statement.

The node's completer (:mod:`django_tasks_coord.node.completer`) hands over the changes
of many running tasks at once: completions that carry values of their own (a return
value, an attempt log entry) and the attempt logs of attempts under way. :func:`write_changes`
turns them into one ``UPDATE`` per set of changed fields, with per-row values through
``CASE``, each row fenced by its claim (:func:`~django_tasks_coord.store.fencing.held`:
its ``exec_id``, still ACTIVE), so a lost claim writes nothing.

A batch whose connection broke may be written again as it is: a completion keeps the
``finished_at`` its first try wrote, so a commit that went through before the answer
was lost changes nothing the second time and is recognized by that time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import models
from django.db.models import Case, Value, When
from django.utils import timezone

from django_tasks_coord import db
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Task
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

    @property
    def completes(self) -> bool:
        """Whether it finishes the task (it changes its state)."""
        return "state" in self.fields


def write_changes(changes: list[Change]) -> None:
    """Write ``changes`` (see the module docstring) and set each one's ``ok``.

    Within one set of fields, a row's later change supersedes its earlier ones (only
    the last is written; the earlier get its ``ok``).
    """
    groups: dict[tuple[str, ...], dict[int, list[Change]]] = {}
    for change in changes:
        kind = tuple(sorted(name for name in change.fields if name != "finished_at"))
        rows = groups.setdefault(kind, {})
        rows.setdefault(change.task.pk, []).append(change)
    for fields, rows in groups.items():
        _update(fields, [writes[-1] for writes in rows.values()])
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
        values[name] = Case(
            *(
                When(pk=change.task.pk, then=Value(change.fields[name], output_field=output))
                for change in changes
            ),
            output_field=output,
        )
    if held(change.task for change in changes).update(**values) == len(changes):
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
        .values("pk", "exec_id", "state", "finished_at")
    }
    for change in changes:
        row = current.get(change.task.pk)
        if row is None or row["exec_id"] != change.task.exec_id:
            change.ok = False
        elif change.completes:
            change.ok = (
                row["state"] == change.fields["state"]
                and row["finished_at"] == change.fields["finished_at"]
            )
        else:
            change.ok = row["state"] == TaskState.ACTIVE
