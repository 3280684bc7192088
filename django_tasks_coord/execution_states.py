"""The vocabulary of defined tasks' lifecycle (:mod:`django_tasks_coord.executions`):
statuses, outcomes and their reasons, the filters that find them, the attempt log's
entries, locking a task under the execution id an executor quotes, and the changes an
executor's report makes (shared by the single calls and the batch completion,
:mod:`django_tasks_coord.execution_batches`).

Nothing here reads the clock: :mod:`~django_tasks_coord.executions` passes ``now``
(its ``clock``, which tests replace).
"""

from __future__ import annotations

import enum
import uuid
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db.models import Q

from django_tasks_coord import db, definitions
from django_tasks_coord.attempts import Attempt
from django_tasks_coord.enums import COMPLETED_MIN, TaskState
from django_tasks_coord.exceptions import (
    ExecutionConflictError,
    InvalidArgumentError,
    StaleExecIdError,
    UnknownDefinitionError,
)
from django_tasks_coord.models import Task

if TYPE_CHECKING:
    from django_tasks_coord.definitions import Definition

__all__ = [
    "OUTCOME_FILTERS",
    "Outcome",
    "OutcomeReason",
    "Status",
    "canceled",
    "check_exec_id",
    "check_state",
    "close_attempt",
    "coerce",
    "done_error",
    "failure",
    "is_defined",
    "lock",
    "parse_exec_id",
    "retry_count",
    "status_at",
    "status_filter",
    "success",
]


class Status(enum.StrEnum):
    """Where a defined task is in its lifecycle (derived from its state and ``execute_at``)."""

    WAITING = "waiting"  #: not due yet: ``execute_at`` or a retry delay in the future
    READY = "ready"  #: due, waiting to be polled
    REQUESTED = "requested"  #: handed to an executor by a poll, not started yet
    IN_PROGRESS = "in_progress"  #: started by its executor
    DONE = "done"  #: finished, see :class:`Outcome`


class Outcome(enum.StrEnum):
    """How a done task ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"


class OutcomeReason(enum.StrEnum):
    """Why a task ended as it did, or why its last attempt or hand-out ended while it waits again."""

    FAILED_BY_EXECUTOR = "failed_by_executor"  #: the executor reported a failure with an error
    UNKNOWN_ERROR = "unknown_error"  #: the executor reported a failure without an error
    IN_PROGRESS_TIMEOUT = "in_progress_timeout"  #: no notify nor outcome in time
    REQUESTED_TO_START_TIMEOUT = "requested_to_start_timeout"  #: polled, never started in time
    CANCELED = "canceled"  #: canceled by a user


def status_at(task: Task, now: datetime) -> tuple[Status, Outcome | None]:
    """The lifecycle status of ``task`` at ``now`` and, once done, its outcome."""
    state = task.state
    if state == TaskState.PENDING:
        due = task.execute_at is None or task.execute_at <= now
        return (Status.READY if due else Status.WAITING), None
    if state == TaskState.REQUESTED:
        return Status.REQUESTED, None
    if state == TaskState.ACTIVE:
        return Status.IN_PROGRESS, None
    if state == TaskState.SUCCEEDED:
        return Status.DONE, Outcome.SUCCEEDED
    if state == TaskState.FAILED:
        return Status.DONE, Outcome.FAILED
    return Status.DONE, Outcome.CANCELED  # CANCELED, or ended by the queue API (redundant...)


def retry_count(task: Task) -> int:
    """How many failed attempts of ``task`` were retried."""
    return sum(1 for entry in task.attempt_log or [] if entry.get("outcome") == "retry")


OUTCOME_FILTERS = {
    Outcome.SUCCEEDED: Q(state=TaskState.SUCCEEDED),
    Outcome.FAILED: Q(state=TaskState.FAILED),
    Outcome.CANCELED: Q(state__gte=COMPLETED_MIN)
    & ~Q(state__in=(TaskState.SUCCEEDED, TaskState.FAILED)),
}


def status_filter(wanted: Status, now: datetime) -> Q:
    due = Q(execute_at__isnull=True) | Q(execute_at__lte=now)
    return {
        Status.WAITING: Q(state=TaskState.PENDING) & ~due,
        Status.READY: Q(state=TaskState.PENDING) & due,
        Status.REQUESTED: Q(state=TaskState.REQUESTED),
        Status.IN_PROGRESS: Q(state=TaskState.ACTIVE),
        Status.DONE: Q(state__gte=COMPLETED_MIN),
    }[wanted]


def coerce[E: enum.StrEnum](cls: type[E], value: object, argument: str) -> E:
    try:
        return cls(str(value))
    except ValueError:
        choices = ", ".join(member.value for member in cls)
        raise InvalidArgumentError(f"{argument}={value!r} is not one of {choices}.") from None


def is_defined(topic: str) -> bool:
    try:
        definitions.get(topic)
    except UnknownDefinitionError:
        return False
    return True


def parse_exec_id(value: uuid.UUID | str) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise InvalidArgumentError(f"exec_id must be a UUID, not {value!r}.") from None


def close_attempt(task: Task, now: datetime, outcome: str, reason: str) -> None:
    """Write the end of the running attempt into ``task.attempt_log`` (in memory)."""
    log = list(task.attempt_log or [])
    if log and "finished_at" not in log[-1]:
        ended = Attempt.from_json(log[-1]).end(outcome, now=now, reason=str(reason) or None)
        log[-1] = ended.to_json()
    task.attempt_log = log


def canceled(task: Task, now: datetime) -> dict[str, Any]:
    """The changes that end ``task``, in progress, canceled: its cancel was requested, and
    whatever its executor reports now (a success, a failure) or a timeout ends it so."""
    close_attempt(task, now, "canceled", OutcomeReason.CANCELED)
    return {
        "state": TaskState.CANCELED,
        "outcome_reason": OutcomeReason.CANCELED,
        "finished_at": now,
        "deadline": None,
        "owner": None,
        "attempt_log": task.attempt_log,
    }


def lock(task_id: int, exec_id: uuid.UUID | str | None = None) -> Task:
    """Lock the row of defined task ``task_id`` (waiting for a reaper, briefly) and check the
    exec_id quoted, if any. Call inside a write transaction."""
    if isinstance(task_id, bool) or not isinstance(task_id, int):
        raise Task.DoesNotExist(f"No task has the id {task_id!r}.")
    conn = db.connection()
    task = (
        Task.objects.using(db.alias())
        .filter(pk=task_id)
        .select_for_update(**db.lock_kwargs(conn, skip_locked=False))
        .first()
    )
    if task is None or not is_defined(task.topic_id):
        raise Task.DoesNotExist(f"No task of a definition has the id {task_id}.")
    if exec_id is not None:
        check_exec_id(task, exec_id)
    return task


def check_exec_id(task: Task, exec_id: uuid.UUID | str) -> None:
    """Raise :class:`StaleExecIdError` unless ``exec_id`` is ``task``'s current execution."""
    quoted = parse_exec_id(exec_id)
    if task.exec_id != quoted:
        raise StaleExecIdError(
            f"exec_id {quoted} is not the current execution of task {task.pk}: it was "
            "handed out again since (after a timeout or a retry), or the id is wrong. "
            "Stop working on it."
        )


def done_error(task: Task, action: str, now: datetime) -> ExecutionConflictError:
    """The conflict of an ``action`` on a task that is done."""
    outcome = status_at(task, now)[1]
    return ExecutionConflictError(
        f"Cannot {action} task {task.pk}: it is done ({outcome}).", code="task_done"
    )


def check_state(task: Task, state: TaskState, action: str, expected: str, now: datetime) -> None:
    """Raise :class:`ExecutionConflictError` (``task_done``, ``wrong_state``) unless ``task``
    is in ``state``: ``action`` could not be done to it, ``expected`` says in which status."""
    if task.state == state:
        return
    if task.is_completed:
        raise done_error(task, action, now)
    current = status_at(task, now)[0]
    raise ExecutionConflictError(
        f"Cannot {action} task {task.pk}: it is {current.value.replace('_', ' ')}, not {expected}."
    )


# --- the changes of an executor's report ------------------------------------------------------


def success(task: Task, result: Any, now: datetime) -> dict[str, Any]:
    """The changes that finish ``task`` (in progress) with ``result``; its attempt log's
    last entry is closed in memory."""
    close_attempt(task, now, "succeeded", "")
    return {
        "state": TaskState.SUCCEEDED,
        "result": result,
        "error_detail": None,  # a failed attempt's error is not the succeeded task's
        "outcome_reason": "",
        "finished_at": now,
        "deadline": None,
        "attempt_log": task.attempt_log,
    }


def failure(
    task: Task,
    definition: Definition,
    now: datetime,
    reason: OutcomeReason,
    *,
    error: Any,
    retry: bool = True,
) -> dict[str, Any]:
    """The changes that end ``task``'s failed attempt: retried after the retry delay while
    retries remain (and ``retry``), failed for good otherwise; its attempt log's last entry
    is closed in memory."""
    retrying = retry and retry_count(task) < definition.allowed_retry_count
    close_attempt(task, now, "retry" if retrying else "failed", reason)
    changes: dict[str, Any] = {
        "error_detail": error,
        "outcome_reason": reason,
        "deadline": None,
        "attempt_log": task.attempt_log,
    }
    if retrying:
        changes.update(
            state=TaskState.PENDING,
            exec_id=None,
            owner=None,
            execute_at=now + timedelta(seconds=definition.retry_delay),
        )
    else:
        changes.update(state=TaskState.FAILED, finished_at=now)
    return changes
