"""The lifecycle of a defined task, run by an executor in any language (through the HTTP API).

::

    created ─┬─> waiting ──(execute_at reached)──> ready ──poll──> requested ──start──> in progress
             └─> ready                               ^                 │                 │ notify
                                                     └─ start timeout ─┘                 v
                                  waiting <── retry (failure or in-progress timeout) ── done:
                                                                        succeeded / failed / canceled

Each state is a plain ``Task`` row of the definition's topic: waiting and ready are
PENDING (``execute_at`` in the future or not), requested is REQUESTED, in progress is
ACTIVE and done is SUCCEEDED, FAILED or CANCELED, with ``outcome_reason`` saying why.
``params`` is ``Task.payload``, ``result`` is ``Task.result``, ``error`` is
``Task.error_detail`` (the last failed attempt's, cleared when the task succeeds);
``attempt_log`` has one entry per started attempt.

Fencing: :func:`poll` hands each task out with a fresh ``exec_id``; :func:`start`,
:func:`notify`, :func:`succeed` and :func:`fail` must quote it and are refused with
:class:`StaleExecIdError` (changing nothing) once the task was handed out again. The
timeouts are enforced by :func:`reap`, which the ``runscheduler`` nodes' sweeps call
about every ``REAP_INTERVAL`` per cluster; until it has, a late executor still holds its task.

Every function takes ``now`` (default :func:`clock`), so tests move time instead of
sleeping. Deadlines are compared with the clock of the process that reaps, so keep
the machines' clocks synchronized (NTP): skew shifts the timeouts by as much.

This module checks, decides and explains; the task store writes the rows
(:mod:`~django_tasks_coord.store.handout` hands tasks out and takes back those never
started, :func:`~django_tasks_coord.store.finish.report` writes an executor's reports
under its ``exec_id``). The vocabulary (statuses, outcomes, reasons) lives in
:mod:`~django_tasks_coord.execution_states`.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Min, QuerySet
from django.utils import timezone

from django_tasks_coord import db, definitions, running
from django_tasks_coord.attempts import Attempt
from django_tasks_coord.definitions import Definition
from django_tasks_coord.enums import UNSET, TaskState
from django_tasks_coord.exceptions import InvalidArgumentError
from django_tasks_coord.execution_states import (
    OUTCOME_FILTERS,
    Outcome,
    OutcomeReason,
    Status,
    canceled,
    check_state,
    coerce,
    done_error,
    failure,
    is_defined,
    lock,
    retry_count,
    status_at,
    status_filter,
    success,
)
from django_tasks_coord.models import Task
from django_tasks_coord.store import cancels, handout
from django_tasks_coord.store import checkpoints as store_checkpoints
from django_tasks_coord.store.finish import report
from django_tasks_coord.store.insert import insert
from django_tasks_coord.topics import adding_tasks, registering
from django_tasks_coord.validation import check_payload, check_priority, check_text, check_when

__all__ = [
    "Outcome",
    "OutcomeReason",
    "Status",
    "cancel",
    "clock",
    "create",
    "fail",
    "get",
    "next_due",
    "notify",
    "poll",
    "reap",
    "retry_count",
    "start",
    "status",
    "succeed",
    "tasks",
]


def clock() -> datetime:
    """The current time used by this module (tests replace it to move time)."""
    return timezone.now()


def _now(now: datetime | None) -> datetime:
    return clock() if now is None else check_when(now, "now", optional=False)  # type: ignore[return-value]


def _seconds(value: float) -> timedelta:
    return timedelta(seconds=value)


# --- reading ------------------------------------------------------------------------------


def status(task: Task, now: datetime | None = None) -> tuple[Status, Outcome | None]:
    """The lifecycle status of ``task`` and, once done, its outcome."""
    return status_at(task, _now(now))


def tasks(
    definition: str | Sequence[str] | None = None,
    *,
    status: Status | str | None = None,
    outcome: Outcome | str | None = None,
    now: datetime | None = None,
) -> QuerySet[Task]:
    """The tasks of one or several definitions (default: all), optionally of one status or
    outcome, newest first."""
    if definition is None:
        topics = sorted(definitions.names())
    elif isinstance(definition, str):
        topics = [definitions.get(definition).name]
    else:
        topics = [definitions.get(name).name for name in definition]
    qs = Task.objects.using(db.alias()).filter(topic_id__in=topics)
    if status is not None:
        qs = qs.filter(status_filter(coerce(Status, status, "status"), _now(now)))
    if outcome is not None:
        qs = qs.filter(OUTCOME_FILTERS[coerce(Outcome, outcome, "outcome")])
    return qs.order_by("-sequence")


def get(task_id: int) -> Task:
    """The task ``task_id`` of a definition; ``Task.DoesNotExist`` for unknown ids and for
    tasks of topics that are not definitions."""
    if isinstance(task_id, bool) or not isinstance(task_id, int):
        raise Task.DoesNotExist(f"No task has the id {task_id!r}.")
    task = Task.objects.using(db.alias()).filter(pk=task_id).first()
    if task is None or not is_defined(task.topic_id):
        raise Task.DoesNotExist(f"No task of a definition has the id {task_id}.")
    return task


def next_due(names: Sequence[str], now: datetime | None = None) -> datetime | None:
    """When the next waiting task of these definitions becomes ready (None: none waits)."""
    pending = Task.objects.using(db.alias()).filter(
        topic_id__in=names, state=TaskState.PENDING, execute_at__gt=_now(now)
    )
    found: datetime | None = pending.aggregate(next=Min("execute_at"))["next"]
    return found


# --- creating and canceling ------------------------------------------------------------------


def create(
    definition: str,
    params: Any = None,
    *,
    execute_at: datetime | None = None,
    label: str = "",
    requester: str = "",
    priority: int = 0,
) -> Task:
    """Create a task of ``definition`` with ``params`` (checked against its params schema).

    It is waiting until ``execute_at`` (if given), ready otherwise. ``label`` is free
    text for people; ``requester`` says who asked for it.
    """
    found = definitions.get(definition)
    check_payload(params, "params")
    found.validate("params", params)
    execute_at = check_when(execute_at, "execute_at")
    priority = check_priority(priority)
    for argument, text in (("label", label), ("requester", requester)):
        if not isinstance(text, str) or len(text) > 255:
            raise InvalidArgumentError(
                f"{argument} must be a str of at most 255 characters, not {text!r}."
            )
        check_text(text, argument)
    task = Task(
        topic_id=found.name,
        identifier=uuid.uuid4().hex,
        payload=params,
        priority=priority,
        execute_at=execute_at,
        label=label,
        requester=requester,
        concurrency_key=found.concurrency_key(params),
        attempt_log=[],
    )

    def add() -> Task:
        return insert([task])[0]

    # The topic may be declared, but not synced by a node or the API yet.
    return registering(found.name, lambda: adding_tasks(found.name, add))


def cancel(task_id: int, *, now: datetime | None = None) -> Task:
    """Cancel a task that is not done yet.

    A task that is not in progress is done (canceled) at once; a requested one's
    executor is then refused. An in-progress task is asked to stop: its
    ``cancel_requested_at`` is set, its executor learns it in the answer to its next
    :func:`notify` (``cancel_requested``), and it ends canceled whatever the executor
    reports next (success or failure), or at its in-progress timeout.
    """
    now = _now(now)
    with db.write_transaction():
        task = lock(task_id)
        if task.is_completed:
            raise done_error(task, "cancel", now)
        if task.state == TaskState.ACTIVE:
            cancels.request_cancel([task], None)
            return task
        changes = canceled(task, now)
        for name, value in changes.items():
            setattr(task, name, value)
        cancels.cancel_execution(task, changes)
        handout.freed_a_slot(task)
    return task


# --- the executor's calls ----------------------------------------------------------------------


def poll(
    names: Sequence[str], limit: int = 1, *, start: bool = False, now: datetime | None = None
) -> list[Task]:
    """Hand out up to ``limit`` ready tasks of the definitions ``names``, now REQUESTED.

    Each task gets a fresh ``exec_id`` and must be started within its definition's
    ``requested_to_start_timeout``; with ``start``, each is started at once (IN PROGRESS,
    like :func:`start`), as the API's batch claim does. Concurrency limits (the
    definition's, its topic's) count requested and in-progress tasks, a rate limit of its
    topic counts hand-outs; they hold under any number of concurrent pollers (see
    :func:`django_tasks_coord.store.handout.hand_out`).
    Definitions are visited from a random one on, so that no definition starves; those
    whose topic is paused (``queue.pause_topic``, the admin) hand out nothing.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidArgumentError(f"limit must be a positive int, not {limit!r}.")
    found = [definitions.get(name) for name in dict.fromkeys(names)]
    now = _now(now)
    handed: list[Task] = []
    first = random.randrange(len(found)) if found else 0
    for definition in found[first:] + found[:first]:
        if len(handed) >= limit:
            break
        handed.extend(handout.hand_out(definition, limit - len(handed), now, start=start))
    return handed


def start(task_id: int, exec_id: uuid.UUID | str, *, now: datetime | None = None) -> Task:
    """Start a requested task: it is in progress until its in-progress timeout."""
    now = _now(now)
    with db.write_transaction():
        task, definition = _held(task_id, exec_id, TaskState.REQUESTED, "start", "requested", now)
        task.attempts += 1
        entry = Attempt(task.attempts, exec_id=str(task.exec_id), started_at=now.isoformat())
        log = [*(task.attempt_log or []), entry.to_json()]
        report(
            task,
            TaskState.REQUESTED,
            state=TaskState.ACTIVE,
            attempts=task.attempts,
            started_at=now,
            finished_at=None,
            deadline=now + _seconds(definition.in_progress_timeout),
            attempt_log=log,
        )
    return task


def notify(
    task_id: int,
    exec_id: uuid.UUID | str,
    *,
    progress: Any = UNSET,
    checkpoints: Mapping[str, Any] | None = None,
    now: datetime | None = None,
) -> Task:
    """Heartbeat of an in-progress task: its in-progress timeout starts again from ``now``.

    ``progress`` (a small JSON value, :func:`django_tasks_coord.running.check_progress`)
    is stored with it as ``Task.progress``; ``checkpoints`` (names to JSON values,
    :func:`django_tasks_coord.running.check_checkpoint`) are stored as the task's
    checkpoints, under the same claim (:func:`checkpoints_of` reads them). The task
    returned says whether a cancel was requested (``cancel_requested_at``): the executor
    should then stop and report.
    """
    now = _now(now)
    changes: dict[str, Any] = {}
    if progress is not UNSET:
        changes["progress"] = running.check_progress(progress)
    if not isinstance(checkpoints, Mapping | None):
        raise InvalidArgumentError("checkpoints must map names to JSON values.")
    if len(checkpoints or ()) > (most := running.CHECKPOINTS_PER_NOTIFY):
        raise InvalidArgumentError(
            f"A notify stores at most {most} checkpoints, not {len(checkpoints or ())}."
        )
    saved = {name: running.check_checkpoint(name, v) for name, v in (checkpoints or {}).items()}
    with db.write_transaction():
        task, definition = _held(task_id, exec_id, TaskState.ACTIVE, "notify", "in progress", now)
        for name, value in saved.items():  # the row is held and locked: each write applies
            store_checkpoints.write(task, name, value)
        deadline = now + _seconds(definition.in_progress_timeout)
        report(task, TaskState.ACTIVE, deadline=deadline, **changes)
    return task


def checkpoints_of(task: Task) -> dict[str, Any]:
    """The checkpoints ``task`` stored (its executor's ``notify``, a handler's
    :func:`django_tasks_coord.running.checkpoint`): name to value, in the order written."""
    return store_checkpoints.read([task]).get(task.pk, {})


def succeed(
    task_id: int, exec_id: uuid.UUID | str, result: Any = None, *, now: datetime | None = None
) -> Task:
    """Finish an in-progress task with ``result`` (checked against the result schema)."""
    now = _now(now)
    check_payload(result, "result")
    with db.write_transaction():
        task, definition = _held(
            task_id, exec_id, TaskState.ACTIVE, "report the success of", "in progress", now
        )
        definition.validate("result", result)
        if task.cancel_requested_at is not None:  # canceled, never succeeded
            report(task, TaskState.ACTIVE, **canceled(task, now))
        else:
            report(task, TaskState.ACTIVE, **success(task, result, now))
        handout.freed_a_slot(task, definition)
    return task


def fail(
    task_id: int,
    exec_id: uuid.UUID | str,
    error: Any = None,
    *,
    retry: bool = True,
    now: datetime | None = None,
) -> Task:
    """Report a failed attempt with ``error`` (checked against the error schema).

    The task is retried after ``retry_delay`` while it has retries left and ``retry``
    is True; otherwise it is done, failed.
    """
    now = _now(now)
    check_payload(error, "error")
    with db.write_transaction():
        task, definition = _held(
            task_id, exec_id, TaskState.ACTIVE, "report the failure of", "in progress", now
        )
        if error is not None:
            definition.validate("error", error)
        reason = OutcomeReason.UNKNOWN_ERROR if error is None else OutcomeReason.FAILED_BY_EXECUTOR
        _end_attempt(task, definition, now, reason, error=error, retry=retry)
    return task


def _end_attempt(
    task: Task,
    definition: Definition,
    now: datetime,
    reason: OutcomeReason,
    *,
    error: Any,
    retry: bool = True,
) -> None:
    """Retry the failed attempt of ``task`` after the retry delay, or fail the task for good;
    end it canceled instead if its cancel was requested."""
    if task.cancel_requested_at is not None:
        report(task, TaskState.ACTIVE, **canceled(task, now))
    else:
        changes = failure(task, definition, now, reason, error=error, retry=retry)
        report(task, TaskState.ACTIVE, **changes)
    handout.freed_a_slot(task, definition)


# --- timeouts ---------------------------------------------------------------------------------


def reap(
    *, now: datetime | None = None, batch_size: int = 100, max_batches: int = 10
) -> Counter[str]:
    """Enforce the timeouts of defined tasks; return how many tasks each rule caught.

    Requested tasks past their deadline go back to ready
    (``requested_to_start_timeout``); in-progress tasks past theirs end their attempt
    with ``in_progress_timeout``: retried if retries remain, failed otherwise. Works in
    transactions of at most ``batch_size`` tasks through the ``(state, deadline)``
    index, skipping rows another transaction holds (an executor reporting right now),
    so it never waits on anyone. Called by the ``runscheduler`` nodes' sweeps, about
    every ``REAP_INTERVAL`` per cluster (a node alone: every ``REAP_INTERVAL``).
    """
    now = _now(now)
    names = sorted(definitions.names())
    caught: Counter[str] = Counter()
    if not names:
        return caught
    for _ in range(max_batches):
        n = handout.take_back(names, now, batch_size, OutcomeReason.REQUESTED_TO_START_TIMEOUT)
        caught[OutcomeReason.REQUESTED_TO_START_TIMEOUT] += n
        if n < batch_size:
            break
    for _ in range(max_batches):
        n = _reap_in_progress(names, now, batch_size)
        caught[OutcomeReason.IN_PROGRESS_TIMEOUT] += n
        if n < batch_size:
            break
    return +caught


def _reap_in_progress(names: list[str], now: datetime, batch_size: int) -> int:
    with db.write_transaction():
        expired = handout.expired(TaskState.ACTIVE, names, now, batch_size)
        for task in expired:
            definition = definitions.get(task.topic_id)
            _end_attempt(task, definition, now, OutcomeReason.IN_PROGRESS_TIMEOUT, error=None)
    return len(expired)


# --- helpers ------------------------------------------------------------------------------------


def _held(
    task_id: int,
    exec_id: uuid.UUID | str,
    state: TaskState,
    action: str,
    expected: str,
    now: datetime,
) -> tuple[Task, Definition]:
    """Lock task ``task_id`` held under ``exec_id`` in ``state``; return it and its definition."""
    task = lock(task_id, exec_id)
    check_state(task, state, action, expected, now)
    return task, definitions.get(task.topic_id)
