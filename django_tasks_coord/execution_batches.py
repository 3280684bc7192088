"""Reporting the outcomes of many executions at once: the batch completion of the HTTP API.

An executor that runs many tasks (claimed together with ``executions.poll(...,
start=True)``, the API's ``claim``) reports their outcomes together::

    from django_tasks_coord import execution_batches

    done = execution_batches.complete([
        execution_batches.Report(41, exec_id_41, succeeded=True, result={"sent": True}),
        execution_batches.Report(42, exec_id_42, succeeded=False, error={"code": "E1"}),
    ])
    [completion.ok for completion in done]      # e.g. [True, False]

Each report is checked as :func:`~django_tasks_coord.executions.succeed` and
:func:`~django_tasks_coord.executions.fail` check one (the task exists, the ``exec_id`` is
its current execution, it is in progress, the result or error matches the definition's
schema) and accepted or refused on its own: a stale ``exec_id`` refuses that report only,
and its :attr:`Completion.error` says why, as the single call would raise it. The
accepted ones are written in one transaction: one statement locks every task of the
batch, one ``UPDATE`` per kind of outcome writes them.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.core.exceptions import ObjectDoesNotExist

from django_tasks_coord import db, definitions, executions
from django_tasks_coord.enums import TaskState
from django_tasks_coord.exceptions import TasksCoordError
from django_tasks_coord.execution_states import (
    OutcomeReason,
    canceled,
    check_exec_id,
    check_state,
    failure,
    is_defined,
    success,
)
from django_tasks_coord.models import Task
from django_tasks_coord.store import handout
from django_tasks_coord.validation import check_payload, check_when

__all__ = ["Completion", "Report", "complete"]


@dataclass(frozen=True)
class Report:
    """The outcome of one execution, as its executor reports it: ``succeeded`` with a
    ``result``, or failed with an ``error`` (``retry`` False: no retry even if some remain)."""

    task_id: int
    exec_id: uuid.UUID | str
    succeeded: bool
    result: Any = None
    error: Any = None
    retry: bool = True


@dataclass
class Completion:
    """What became of a :class:`Report`: the task it finished or sent back to wait for its
    retry (``task``), or why it was refused (``error``; nothing changed for it)."""

    report: Report
    task: Task | None = None
    error: Exception | None = None

    @property
    def ok(self) -> bool:
        """Whether the report was accepted."""
        return self.error is None


def complete(reports: Sequence[Report], *, now: datetime | None = None) -> list[Completion]:
    """Apply ``reports`` (see the module docstring); one :class:`Completion` per report, in
    their order. A task reported twice is treated as if by two calls in turn: the second
    finds it done (or handed out again) and is refused."""
    now = executions.clock() if now is None else check_when(now, "now", optional=False)
    assert now is not None
    completions = [Completion(report) for report in reports]
    ids = {
        r.task_id for r in reports if isinstance(r.task_id, int) and not isinstance(r.task_id, bool)
    }
    writes: list[tuple[Task, dict[str, Any]]] = []
    with db.write_transaction():
        locked = (
            Task.objects.using(db.alias())
            .filter(pk__in=sorted(ids))
            .order_by("pk")
            .select_for_update(**db.lock_kwargs(db.connection(), skip_locked=False))
        )
        tasks = {task.pk: task for task in locked} if ids else {}
        for completion in completions:
            try:
                writes.append(_accept(completion, tasks, now))
            except (ObjectDoesNotExist, TasksCoordError) as exc:
                completion.error = exc
        handout.report_many(writes)
        for _, task in sorted({task.topic_id: task for task, _ in writes}.items()):
            handout.freed_a_slot(task)
    return completions


def _accept(
    completion: Completion, tasks: dict[int, Task], now: datetime
) -> tuple[Task, dict[str, Any]]:
    """Check one report against its task (locked, in ``tasks``), apply it to the task in memory
    and return the row to write: the task as it was held (its ``exec_id``) and the changes."""
    report = completion.report
    task = tasks.get(report.task_id)
    if task is None or not is_defined(task.topic_id):
        raise Task.DoesNotExist(f"No task of a definition has the id {report.task_id!r}.")
    check_exec_id(task, report.exec_id)
    definition = definitions.get(task.topic_id)
    held = Task(pk=task.pk, topic_id=task.topic_id, exec_id=task.exec_id)
    if report.succeeded:
        check_state(task, TaskState.ACTIVE, "report the success of", "in progress", now)
        check_payload(report.result, "result")
        definition.validate("result", report.result)
        changes = success(task, report.result, now)
    else:
        check_state(task, TaskState.ACTIVE, "report the failure of", "in progress", now)
        check_payload(report.error, "error")
        if report.error is not None:
            definition.validate("error", report.error)
        reason = (
            OutcomeReason.UNKNOWN_ERROR
            if report.error is None
            else OutcomeReason.FAILED_BY_EXECUTOR
        )
        changes = failure(task, definition, now, reason, error=report.error, retry=report.retry)
    if task.cancel_requested_at is not None:  # canceled, never succeeded nor retried
        changes = canceled(task, now)
    for name, value in changes.items():
        setattr(task, name, value)
    completion.task = task
    return held, changes
