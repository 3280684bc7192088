"""Reading a stored task as Django's ``TaskResult``, from its row and its attempt log.

``Task.attempt_log`` holds one :class:`~django_tasks_coord.attempts.Attempt` entry per
attempt, written by the node when the attempt starts (``attempt``, ``worker_id``,
``started_at``) and completed when it ends (``finished_at``, ``outcome`` and, for a
failure, ``exception_class_path`` and ``traceback``). An attempt whose node died never
ends: the next attempt marks it ``lost``, and so does this module when no attempt
follows.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.module_loading import import_string

from django_tasks_coord.attempts import LOST_CLASS, UNKNOWN_WORKER, Attempt, close_lost
from django_tasks_coord.backends.compat import (
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
)
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Task as TaskRow

__all__ = ["LOST_CLASS", "UNKNOWN_WORKER", "CoordTaskResult", "django_task", "to_result"]

_STATUS = {
    TaskState.PENDING: TaskResultStatus.READY,
    TaskState.REQUESTED: TaskResultStatus.RUNNING,
    TaskState.ACTIVE: TaskResultStatus.RUNNING,
    TaskState.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
}
#: Why a task ended without an exception of its own (cancelled, replaced...), as an error.
_ENDED = {
    TaskState.CANCELED: "django_tasks_coord.exceptions.TaskStateError",
    TaskState.REDUNDANT: "django_tasks_coord.exceptions.TaskRedundantError",
    TaskState.FILTERED: "django_tasks_coord.exceptions.TaskStateError",
    TaskState.SUSPENDED: "django_tasks_coord.exceptions.TaskStateError",
    TaskState.FAILED: "django_tasks_coord.exceptions.TasksCoordError",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class CoordTaskResult(TaskResult):  # type: ignore[type-arg,misc]
    """Django's ``TaskResult``, with what this backend knows more of a running task.

    ``progress``: what the task last reported (``context.report_progress`` or
    :func:`django_tasks_coord.running.report_progress`), or None. ``cancel_requested``:
    the task was canceled while it ran (``queue.cancel``, the admin); it ends with the
    status FAILED (canceled) once its function returns.
    """

    progress: Any = None
    cancel_requested: bool = False

    def refresh(self) -> None:
        """Reload the result from the task store (Django's fields, and these)."""
        self._refreshed(self.task.get_backend().get_result(self.id))

    async def arefresh(self) -> None:
        """Reload the result from the task store (Django's fields, and these)."""
        self._refreshed(await self.task.get_backend().aget_result(self.id))

    def _refreshed(self, fresh: TaskResult) -> None:  # type: ignore[type-arg]
        for item in fields(self):
            if item.name not in _FIXED:
                object.__setattr__(self, item.name, getattr(fresh, item.name, None))


#: What a refresh leaves as it is: what the result was enqueued with.
_FIXED = frozenset({"task", "id", "args", "kwargs", "backend"})


def _when(value: object) -> datetime | None:
    return parse_datetime(value) if isinstance(value, str) else None


def django_task(row: TaskRow) -> Task:  # type: ignore[type-arg]
    """The Django ``Task`` a stored row was enqueued from, with the row's queue and priority."""
    payload = row.payload if isinstance(row.payload, dict) else {}
    return _django_task(
        str(payload.get("task", "")),
        row.priority,
        row.topic_id,
        payload.get("run_after"),
        payload.get("backend"),
        row.pk,
    )


@functools.lru_cache(maxsize=1024)
def _task_variant(
    path: str, priority: int, queue: str, run_after: str | None, backend: str | None
) -> Task:  # type: ignore[type-arg]
    task = import_string(path)
    if not isinstance(task, Task):
        raise TypeError(f"{path!r} is not a Django task.")
    return task.using(
        priority=priority, queue_name=queue, run_after=_when(run_after), backend=backend
    )


def _django_task(
    path: str, priority: int, queue: str, run_after: Any, backend: Any, pk: int
) -> Task:  # type: ignore[type-arg]
    """Tasks are immutable: one per variant is imported and validated, then shared."""
    try:
        return _task_variant(
            path,
            priority,
            queue,
            run_after if isinstance(run_after, str) else None,
            backend if isinstance(backend, str) else None,
        )
    except (ImportError, TypeError) as exc:
        raise TaskResultDoesNotExist(
            f"Task #{pk}: {path!r} is not an importable Django task ({exc})."
        ) from exc


def to_result(row: TaskRow, task: Task | None = None) -> TaskResult:  # type: ignore[type-arg]
    """Django's view of a stored row: status, times, arguments, every error, every worker."""
    state = TaskState(row.state)
    payload = row.payload if isinstance(row.payload, dict) else {}
    log = [entry for entry in (row.attempt_log or []) if isinstance(entry, dict)]
    running = state in (TaskState.ACTIVE, TaskState.REQUESTED)
    ended = row.attempts - 1 if running else row.attempts  # attempts that must have an entry
    if len(log) < ended:
        log = close_lost(log, row.finished_at or timezone.now(), ended)[: max(ended, len(log))]
    errors = []
    for index, entry in enumerate(log):
        if "finished_at" not in entry:
            if running and index == len(log) - 1:
                continue  # the attempt under way
            entry = {**entry, **Attempt.from_json(entry).lost(None).to_json()}
        if "exception_class_path" in entry:
            errors.append(
                TaskError(
                    exception_class_path=entry["exception_class_path"],
                    traceback=entry.get("traceback", ""),
                )
            )
    status = _STATUS.get(state, TaskResultStatus.FAILED)
    if status == TaskResultStatus.FAILED:
        last = log[-1] if log else {}
        if (
            state != TaskState.FAILED
            or ("exception_class_path" not in last and "finished_at" in last)
            or not log
        ):
            errors.append(
                TaskError(
                    exception_class_path=_ENDED.get(state, _ENDED[TaskState.FAILED]),
                    traceback=row.error or row.message or f"The task ended {state.label}.",
                )
            )
    starts = [_when(entry.get("started_at")) for entry in log]
    result: TaskResult = CoordTaskResult(  # type: ignore[type-arg]
        task=task if task is not None else django_task(row),
        id=row.identifier,
        status=status,
        enqueued_at=row.created_at,
        started_at=starts[0] if starts else row.started_at,
        last_attempted_at=starts[-1] if starts else row.started_at,
        finished_at=row.finished_at if state.is_completed else None,
        args=list(payload.get("args", [])),
        kwargs=dict(payload.get("kwargs", {})),
        backend=str(payload.get("backend", "")),
        errors=errors,
        worker_ids=[str(entry.get("worker_id", "")) for entry in log],
        progress=row.progress,
        cancel_requested=row.cancel_requested_at is not None,
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", row.result)
    return result
