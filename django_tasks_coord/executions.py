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
"""

from __future__ import annotations

import enum
import random
import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Case, Count, Min, Q, QuerySet, UUIDField, Value, When
from django.utils import timezone

from django_tasks_coord import db, definitions
from django_tasks_coord.attempts import Attempt
from django_tasks_coord.definitions import Definition
from django_tasks_coord.enums import COMPLETED_MIN, IN_FLIGHT, TaskState
from django_tasks_coord.exceptions import (
    ExecutionConflictError,
    InvalidArgumentError,
    StaleExecIdError,
    UnknownDefinitionError,
)
from django_tasks_coord.models import Task, Topic
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

#: Rounds of candidates a poll looks through for tasks whose concurrency key has room.
_MAX_ROUNDS = 20


def clock() -> datetime:
    """The current time used by this module (tests replace it to move time)."""
    return timezone.now()


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


def _now(now: datetime | None) -> datetime:
    return clock() if now is None else check_when(now, "now", optional=False)  # type: ignore[return-value]


def _seconds(value: float) -> timedelta:
    return timedelta(seconds=value)


# --- reading ------------------------------------------------------------------------------


def status(task: Task, now: datetime | None = None) -> tuple[Status, Outcome | None]:
    """The lifecycle status of ``task`` and, once done, its outcome."""
    state = task.state
    if state == TaskState.PENDING:
        due = task.execute_at is None or task.execute_at <= _now(now)
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
        qs = qs.filter(_status_filter(_coerce(Status, status, "status"), _now(now)))
    if outcome is not None:
        qs = qs.filter(_OUTCOME_FILTERS[_coerce(Outcome, outcome, "outcome")])
    return qs.order_by("-sequence")


_OUTCOME_FILTERS = {
    Outcome.SUCCEEDED: Q(state=TaskState.SUCCEEDED),
    Outcome.FAILED: Q(state=TaskState.FAILED),
    Outcome.CANCELED: Q(state__gte=COMPLETED_MIN)
    & ~Q(state__in=(TaskState.SUCCEEDED, TaskState.FAILED)),
}


def _status_filter(wanted: Status, now: datetime) -> Q:
    due = Q(execute_at__isnull=True) | Q(execute_at__lte=now)
    return {
        Status.WAITING: Q(state=TaskState.PENDING) & ~due,
        Status.READY: Q(state=TaskState.PENDING) & due,
        Status.REQUESTED: Q(state=TaskState.REQUESTED),
        Status.IN_PROGRESS: Q(state=TaskState.ACTIVE),
        Status.DONE: Q(state__gte=COMPLETED_MIN),
    }[wanted]


def _coerce[E: enum.StrEnum](cls: type[E], value: object, argument: str) -> E:
    try:
        return cls(str(value))
    except ValueError:
        choices = ", ".join(member.value for member in cls)
        raise InvalidArgumentError(f"{argument}={value!r} is not one of {choices}.") from None


def get(task_id: int) -> Task:
    """The task ``task_id`` of a definition; ``Task.DoesNotExist`` for unknown ids and for
    tasks of topics that are not definitions."""
    if isinstance(task_id, bool) or not isinstance(task_id, int):
        raise Task.DoesNotExist(f"No task has the id {task_id!r}.")
    task = Task.objects.using(db.alias()).filter(pk=task_id).first()
    if task is None or not _is_defined(task.topic_id):
        raise Task.DoesNotExist(f"No task of a definition has the id {task_id}.")
    return task


def _is_defined(topic: str) -> bool:
    try:
        definitions.get(topic)
    except UnknownDefinitionError:
        return False
    return True


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
        created = Task.objects.using(db.alias()).insert([task])[0]
        db.notify(db.connection(), found.name)
        return created

    # The topic may be declared, but not synced by a node or the API yet.
    return registering(found.name, lambda: adding_tasks(found.name, add))


def cancel(task_id: int, *, now: datetime | None = None) -> Task:
    """Cancel a task that is not done yet; a running executor's later calls are then refused."""
    now = _now(now)
    with db.write_transaction():
        task = _lock(task_id)
        if task.is_completed:
            raise _done(task, "cancel")
        if task.state == TaskState.ACTIVE:
            _close_attempt(task, now, "canceled", OutcomeReason.CANCELED)
        _save(
            task,
            state=TaskState.CANCELED,
            outcome_reason=OutcomeReason.CANCELED,
            finished_at=now,
            deadline=None,
            owner=None,
            attempt_log=task.attempt_log,
        )
        _freed_a_slot(task)
    return task


# --- the executor's calls ----------------------------------------------------------------------


def poll(names: Sequence[str], limit: int = 1, *, now: datetime | None = None) -> list[Task]:
    """Hand out up to ``limit`` ready tasks of the definitions ``names``, now REQUESTED.

    Each task gets a fresh ``exec_id`` and must be started within its definition's
    ``requested_to_start_timeout``. Concurrency limits count requested and in-progress
    tasks; they hold under any number of concurrent pollers (see :func:`_poll_one`).
    Definitions are visited from a random one on, so that no definition starves; those
    whose topic is paused (``queue.pause_topic``, the admin) hand out nothing.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidArgumentError(f"limit must be a positive int, not {limit!r}.")
    found = [definitions.get(name) for name in dict.fromkeys(names)]
    now = _now(now)
    handed: list[Task] = []
    start = random.randrange(len(found)) if found else 0
    for definition in found[start:] + found[:start]:
        if len(handed) >= limit:
            break
        handed.extend(_poll_one(definition, limit - len(handed), now))
    return handed


def _poll_one(definition: Definition, limit: int, now: datetime) -> list[Task]:
    """Claim up to ``limit`` ready tasks of one definition in one short transaction.

    Without a concurrency limit this is the queue's claim: ``SELECT ... FOR UPDATE SKIP
    LOCKED``, so concurrent pollers never take the same task. With a limit, the
    definition's topic row is locked first (``FOR UPDATE``): polls of a limited
    definition take turns, so each one counts the tasks in flight after the previous
    one committed, and the limit cannot be overrun by a race. (SQLite serializes every
    write transaction anyway.)
    """
    using, conn = db.alias(), db.connection()
    with db.write_transaction():
        room: Counter[str] | None = None
        topic = Topic.objects.using(using).filter(name=definition.name)
        if definition.concurrency_limit is not None:
            locked = topic.select_for_update(**db.lock_kwargs(conn, skip_locked=False))
            if list(locked.values_list("paused", flat=True)) != [False]:
                return []  # paused in the admin, or no task was ever created
            room = _room(definition)
            if room.total() <= 0 and definition.concurrency_key_path is None:
                return []
        elif topic.filter(paused=True).exists():
            return []  # paused (queue.pause_topic, the admin): executors get nothing
        ready = (
            Task.objects.using(using)
            .filter(topic_id=definition.name, state=TaskState.PENDING)
            .filter(Q(execute_at__isnull=True) | Q(execute_at__lte=now))
            .order_by("-priority", "sequence")
            .select_for_update(**db.lock_kwargs(conn))
        )
        chosen = _choose(ready, limit, room, definition)
        if not chosen:
            return []
        exec_ids = {task.pk: uuid.uuid4() for task in chosen}
        deadline = now + _seconds(definition.requested_to_start_timeout)
        Task.objects.using(using).rows(chosen).update(
            state=TaskState.REQUESTED,
            exec_id=Case(
                *(When(pk=pk, then=Value(exec_id)) for pk, exec_id in exec_ids.items()),
                output_field=UUIDField(),
            ),
            deadline=deadline,
            owner=None,
        )
    for task in chosen:
        task.state, task.exec_id, task.deadline = TaskState.REQUESTED, exec_ids[task.pk], deadline
    return chosen


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


def start(task_id: int, exec_id: uuid.UUID | str, *, now: datetime | None = None) -> Task:
    """Start a requested task: it is in progress until its in-progress timeout."""
    now = _now(now)
    with db.write_transaction():
        task, definition = _held(task_id, exec_id, TaskState.REQUESTED, "start", "requested")
        task.attempts += 1
        entry = Attempt(task.attempts, exec_id=str(task.exec_id), started_at=now.isoformat())
        log = [*(task.attempt_log or []), entry.to_json()]
        _save(
            task,
            state=TaskState.ACTIVE,
            attempts=task.attempts,
            started_at=now,
            finished_at=None,
            deadline=now + _seconds(definition.in_progress_timeout),
            attempt_log=log,
        )
    return task


def notify(task_id: int, exec_id: uuid.UUID | str, *, now: datetime | None = None) -> Task:
    """Heartbeat of an in-progress task: its in-progress timeout starts again from ``now``."""
    now = _now(now)
    with db.write_transaction():
        task, definition = _held(task_id, exec_id, TaskState.ACTIVE, "notify", "in progress")
        _save(task, deadline=now + _seconds(definition.in_progress_timeout))
    return task


def succeed(
    task_id: int, exec_id: uuid.UUID | str, result: Any = None, *, now: datetime | None = None
) -> Task:
    """Finish an in-progress task with ``result`` (checked against the result schema)."""
    now = _now(now)
    check_payload(result, "result")
    with db.write_transaction():
        task, definition = _held(
            task_id, exec_id, TaskState.ACTIVE, "report the success of", "in progress"
        )
        definition.validate("result", result)
        _close_attempt(task, now, "succeeded", "")
        _save(
            task,
            state=TaskState.SUCCEEDED,
            result=result,
            error_detail=None,  # a failed attempt's error is not the succeeded task's
            outcome_reason="",
            finished_at=now,
            deadline=None,
            attempt_log=task.attempt_log,
        )
        _freed_a_slot(task)
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
            task_id, exec_id, TaskState.ACTIVE, "report the failure of", "in progress"
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
    """Retry the failed attempt of ``task`` after the retry delay, or fail the task for good."""
    retrying = retry and retry_count(task) < definition.allowed_retry_count
    _close_attempt(task, now, "retry" if retrying else "failed", reason)
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
            execute_at=now + _seconds(definition.retry_delay),
        )
    else:
        changes.update(state=TaskState.FAILED, finished_at=now)
    _save(task, **changes)
    _freed_a_slot(task, definition)


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
        n = _reap_requested(names, now, batch_size)
        caught[OutcomeReason.REQUESTED_TO_START_TIMEOUT] += n
        if n < batch_size:
            break
    for _ in range(max_batches):
        n = _reap_in_progress(names, now, batch_size)
        caught[OutcomeReason.IN_PROGRESS_TIMEOUT] += n
        if n < batch_size:
            break
    return +caught


def _expired(state: TaskState, names: list[str], now: datetime, batch_size: int) -> list[Task]:
    conn = db.connection()
    return list(
        Task.objects.using(db.alias())
        .filter(state=state, deadline__lt=now, topic_id__in=names)
        .order_by("deadline")
        .select_for_update(**db.lock_kwargs(conn))[:batch_size]
    )


def _reap_requested(names: list[str], now: datetime, batch_size: int) -> int:
    with db.write_transaction():
        expired = _expired(TaskState.REQUESTED, names, now, batch_size)
        if not expired:
            return 0
        Task.objects.using(db.alias()).rows(expired).update(
            state=TaskState.PENDING,
            exec_id=None,
            deadline=None,
            outcome_reason=OutcomeReason.REQUESTED_TO_START_TIMEOUT,
        )
        for topic in sorted({t.topic_id for t in expired}):
            db.notify(db.connection(), topic)
    return len(expired)


def _reap_in_progress(names: list[str], now: datetime, batch_size: int) -> int:
    with db.write_transaction():
        expired = _expired(TaskState.ACTIVE, names, now, batch_size)
        for task in expired:
            definition = definitions.get(task.topic_id)
            _end_attempt(task, definition, now, OutcomeReason.IN_PROGRESS_TIMEOUT, error=None)
    return len(expired)


# --- helpers ------------------------------------------------------------------------------------


def _lock(task_id: int, exec_id: uuid.UUID | str | None = None) -> Task:
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
    if task is None or not _is_defined(task.topic_id):
        raise Task.DoesNotExist(f"No task of a definition has the id {task_id}.")
    if exec_id is not None:
        quoted = _uuid(exec_id)
        if task.exec_id != quoted:
            raise StaleExecIdError(
                f"exec_id {quoted} is not the current execution of task {task_id}: it was "
                "handed out again since (after a timeout or a retry), or the id is wrong. "
                "Stop working on it."
            )
    return task


def _held(
    task_id: int, exec_id: uuid.UUID | str, state: TaskState, action: str, expected: str
) -> tuple[Task, Definition]:
    """Lock task ``task_id`` held under ``exec_id`` in ``state``; return it and its definition."""
    task = _lock(task_id, exec_id)
    if task.state != state:
        raise _wrong_state(task, action, expected)
    return task, definitions.get(task.topic_id)


def _uuid(value: uuid.UUID | str) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise InvalidArgumentError(f"exec_id must be a UUID, not {value!r}.") from None


def _save(task: Task, **changes: Any) -> None:
    for name, value in changes.items():
        setattr(task, name, value)
    Task.objects.using(db.alias()).rows([task]).update(**changes)


def _close_attempt(task: Task, now: datetime, outcome: str, reason: str) -> None:
    """Write the end of the running attempt into ``task.attempt_log`` (in memory)."""
    log = list(task.attempt_log or [])
    if log and "finished_at" not in log[-1]:
        ended = Attempt.from_json(log[-1]).end(outcome, now=now, reason=str(reason) or None)
        log[-1] = ended.to_json()
    task.attempt_log = log


def _freed_a_slot(task: Task, definition: Definition | None = None) -> None:
    """Wake long-polls waiting for a concurrency slot of ``task``'s definition (PostgreSQL)."""
    definition = definition or definitions.get(task.topic_id)
    if definition.concurrency_limit is not None:
        db.notify(db.connection(), task.topic_id)


def _done(task: Task, action: str) -> ExecutionConflictError:
    outcome = status(task)[1]
    return ExecutionConflictError(
        f"Cannot {action} task {task.pk}: it is done ({outcome}).", code="task_done"
    )


def _wrong_state(task: Task, action: str, expected: str) -> ExecutionConflictError:
    if task.is_completed:
        return _done(task, action)
    current = status(task)[0]
    return ExecutionConflictError(
        f"Cannot {action} task {task.pk}: it is {current.value.replace('_', ' ')}, not {expected}."
    )
