"""The ordered, topic-based task queue: the public API every other part builds on.

::

    from django_tasks_coord import queue
    from django_tasks_coord.queue import Decision, Insertion, Order, Condition, Result

    queue.register_topic("invoices")
    queue.push("invoices", "customer-42", {"amount": 10}, insertion=Insertion.SUPERSEDE)
    for task in queue.poll("invoices", limit=10, condition=Condition.SINGULAR_BY_IDENTIFIER):
        queue.complete(task, Decision(Result.SUCCESS))

Every function runs in the caller's transaction when one is open on the app's
database alias (``TASKS_COORD["DATABASE"]``), and in a transaction of its own
otherwise: nothing is ever half-written, and a push inside a rolled-back
``transaction.atomic()`` block never existed. This module checks arguments and explains
refusals; the task store (:mod:`django_tasks_coord.store`) writes the rows.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from django.db import IntegrityError
from django.utils import timezone

from django_tasks_coord import db, observers
from django_tasks_coord.cancellation import cancel, cancel_many
from django_tasks_coord.enums import (
    Condition,
    Decision,
    Insertion,
    Junction,
    Order,
    Result,
    TaskState,
)
from django_tasks_coord.exceptions import (
    InvalidArgumentError,
    OwnerExpiredError,
    StaleClaimError,
    TaskAlreadyCompletedError,
    TaskNotActiveError,
    TaskNotClaimedError,
    TaskRedundantError,
    TaskStateError,
)
from django_tasks_coord.maintenance import count, purge, resolve
from django_tasks_coord.models import Owner, Task, Topic
from django_tasks_coord.owners import expire, heartbeat, register_owner, unregister_owner
from django_tasks_coord.retention import set_policy as set_retention
from django_tasks_coord.revival import (
    junction,
    recreate,
    recreate_many,
    reset,
    reset_many,
)
from django_tasks_coord.store import claims, finish
from django_tasks_coord.store import insert as store_insert
from django_tasks_coord.store.fencing import held
from django_tasks_coord.topics import (
    TopicRef,
    adding_tasks,
    known_topics,
    name_of,
    pause_topic,
    register_topic,
    resume_topic,
    topic_name,
)
from django_tasks_coord.validation import (
    check_handler,
    check_identifier,
    check_payload,
    check_priority,
    check_task,
    check_when,
)

__all__ = [
    "Condition",
    "Decision",
    "Insertion",
    "Junction",
    "Order",
    "Result",
    "Task",
    "TaskState",
    "Topic",
    "cancel",
    "cancel_many",
    "complete",
    "complete_many",
    "count",
    "expire",
    "heartbeat",
    "junction",
    "known_topics",
    "pause_topic",
    "poll",
    "purge",
    "push",
    "push_many",
    "recreate",
    "recreate_many",
    "register_owner",
    "register_topic",
    "release",
    "reset",
    "reset_many",
    "resolve",
    "resume_topic",
    "set_retention",
    "unregister_owner",
]

MAX_POLL_LIMIT = 10_000
PRIORITY_RANGE = range(-32768, 32768)


def format_exception(exception: BaseException | None) -> str | None:
    """The stored form of an exception: its traceback (if any), class and message."""
    if exception is None:
        return None
    return "".join(traceback.format_exception(exception)).rstrip("\n")


# --- push -----------------------------------------------------------------------------------


def push(
    topic: TopicRef,
    identifier: str,
    payload: Any = None,
    *,
    insertion: Insertion | str = Insertion.APPEND,
    priority: int = 0,
    execute_at: datetime | None = None,
    handler: str = "",
) -> Task:
    """Add a task to ``topic`` and return it (with its ``sequence``).

    ``insertion`` decides what happens to existing tasks of ``identifier`` (see
    :class:`Insertion`); ``priority`` (higher first) and ``execute_at`` (not polled
    before) shape when it runs. ``payload`` must be JSON-serializable. ``handler``
    optionally names the callable that runs it (a dotted path); by default the
    topic's consumer does (see :mod:`django_tasks_coord.handlers`).
    """
    return push_many(
        topic,
        [(identifier, payload)],
        insertion=insertion,
        priority=priority,
        execute_at=execute_at,
        handler=handler,
    )[0]


def push_many(
    topic: TopicRef,
    items: Iterable[tuple[str, Any]],
    *,
    insertion: Insertion | str = Insertion.APPEND,
    priority: int = 0,
    execute_at: datetime | None = None,
    handler: str = "",
) -> list[Task]:
    """Add several ``(identifier, payload)`` tasks in one transaction; return them in order.

    Equivalent to calling :func:`push` for each item in turn, in fewer queries: under
    REPLACE and SUPERSEDE an identifier repeated in the batch leaves only its last
    task pending (the earlier ones are returned REDUNDANT); under DELETE only its
    last task is created.
    """
    insertion = Insertion.coerce(insertion, "insertion")
    priority = check_priority(priority)
    execute_at = check_when(execute_at, "execute_at")
    handler = check_handler(handler)
    batch = _checked_items(items)
    if not batch:
        topic_name(topic)
        return []
    name = name_of(topic)
    last_index = {identifier: i for i, (identifier, _) in enumerate(batch)}
    tasks = []
    for i, (identifier, payload) in enumerate(batch):
        superseded = insertion is not Insertion.APPEND and last_index[identifier] != i
        if superseded and insertion is Insertion.DELETE:
            continue
        tasks.append(
            Task(
                topic_id=name,
                identifier=identifier,
                payload=payload,
                priority=priority,
                execute_at=execute_at,
                handler=handler,
                state=TaskState.REDUNDANT if superseded else TaskState.PENDING,
                finished_at=timezone.now() if superseded else None,
            )
        )
    return adding_tasks(name, lambda: store_insert.push(name, tasks, list(last_index), insertion))


def _checked_items(items: Iterable[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The ``(identifier, payload)`` pairs of ``items``, checked."""
    batch = []
    for item in items:
        if not isinstance(item, tuple | list) or len(item) != 2:
            raise InvalidArgumentError(
                f"push_many items must be (identifier, payload) pairs, not {item!r}."
            )
        identifier, payload = item
        check_identifier(identifier)
        check_payload(payload)
        batch.append((identifier, payload))
    return batch


# --- poll -----------------------------------------------------------------------------------


def poll(
    topic: TopicRef,
    limit: int = 1,
    *,
    order: Order | str = Order.FIFO,
    condition: Condition | str | None = None,
    owner: Owner | None = None,
    heartbeat_owner: bool = True,
) -> list[Task]:
    """Claim up to ``limit`` due tasks of ``topic`` and return them, now ACTIVE.

    Highest ``priority`` first, then by sequence (``Order.FIFO``: oldest first;
    ``Order.LIFO``: newest first). A :class:`Condition` keeps tasks back while
    earlier tasks of their identifier are unfinished (or failed). Each claimed task
    gets a fresh ``exec_id`` and one more ``attempts``; ``owner`` (if given) holds
    it, and polling also refreshes the owner's heartbeat (unless ``heartbeat_owner``
    is False, as for nodes, which heartbeat on their own schedule; a claim for an
    owner that was declared dead fails either way, with :class:`OwnerExpiredError`).

    A claim is one short statement where the database allows it (one ``UPDATE ...
    RETURNING`` on PostgreSQL and SQLite, an ``UPDATE`` and a ``SELECT`` on MariaDB, a
    transaction on MySQL), whose rows are picked with ``SELECT ... FOR UPDATE SKIP
    LOCKED`` (a serialized write on SQLite), so any number of pollers never claim the
    same task twice.
    """
    if not isinstance(limit, int) or isinstance(limit, bool) or not 0 < limit <= MAX_POLL_LIMIT:
        raise InvalidArgumentError(
            f"limit must be an int from 1 to {MAX_POLL_LIMIT}, not {limit!r}."
        )
    order = Order.coerce(order, "order")
    condition = None if condition is None else Condition.coerce(condition, "condition")
    if owner is not None and not isinstance(owner, Owner):
        raise InvalidArgumentError(
            f"owner must be an Owner (see queue.register_owner), not {owner!r}."
        )
    name = topic_name(topic)
    using, conn = db.alias(), db.connection()
    # The heartbeat is its own statement, not part of the claim: a process frozen in the
    # middle of a claim must not keep its owner row locked (expire skips locked owners).
    if owner is not None and heartbeat_owner and not heartbeat(owner):
        raise OwnerExpiredError(f"Owner {owner.name!r} was declared dead; register again.")
    started = time.monotonic()
    try:
        tasks = claims.claim(name, limit, order, condition, owner, using, conn)
    except IntegrityError as exc:  # the owner was deleted (declared dead) while we claimed
        if owner is not None and not Owner.objects.using(using).filter(pk=owner.pk).exists():
            raise OwnerExpiredError(
                f"Owner {owner.name!r} was declared dead; register again."
            ) from exc
        raise
    if observers.active():
        observers.claimed(name, tasks, time.monotonic() - started)
    return tasks


# --- complete, release, cancel ---------------------------------------------------------------


def _claim_lost(task: Task, action: str) -> TaskStateError:
    """Explain why ``task`` (as the caller knows it) cannot be completed or released now."""
    current = (
        Task.objects.using(db.alias())
        .filter(pk=task.pk)
        .values("state", "exec_id", "owner__name")
        .first()
    )
    if current is None:
        return TaskStateError(
            f"Cannot {action} task #{task.pk}: it was deleted (purged or replaced)."
        )
    state = TaskState(current["state"])
    if state is TaskState.REDUNDANT:
        return TaskRedundantError(
            f"Cannot {action} task #{task.pk}: a REPLACE push made it redundant while it ran."
        )
    if state.is_completed:
        return TaskAlreadyCompletedError(
            f"Cannot {action} task #{task.pk}: it is already completed ({state.label})."
        )
    if task.exec_id is None and state is TaskState.ACTIVE:
        return TaskNotClaimedError(
            f"Cannot {action} task #{task.pk}: this Task object carries no claim (its exec_id "
            f"is None): it was not returned by queue.poll (it came from queue.push, or from a "
            f"lookup made before the task was claimed). The task is active under the claim "
            f"{current['exec_id']} of {current['owner__name']!r}; a claim is identified by "
            f"the exec_id queue.poll gives the task. {action.capitalize()} the Task object "
            f"queue.poll returned, or look the task up again (Task.objects.get(pk={task.pk})) "
            f"to {action} it under its current claim."
        )
    if task.exec_id is not None and current["exec_id"] != task.exec_id:
        now = (
            f"it was claimed again and is now {state.label} under the claim {current['exec_id']}"
            if current["exec_id"] is not None
            else f"it is now {state.label}"
        )
        return StaleClaimError(
            f"Cannot {action} task #{task.pk}: its claim {task.exec_id} was lost (it expired "
            f"because its owner was declared dead, or it was released); {now}. Do not retry."
        )
    return TaskNotActiveError(
        f"Cannot {action} task #{task.pk}: it is {state.label}, not active. Only a task "
        f"claimed by queue.poll can be {action}d, through the Task object queue.poll returned."
    )


def complete(task: Task, decision: Decision | Result | str) -> Task:
    """Finish an ACTIVE task with a :class:`Decision` and return it.

    The result sets the state (SUCCESS → SUCCEEDED, SUSPENSION → SUSPENDED, FILTER →
    FILTERED, FAILURE → FAILED); ``message`` and ``exception`` (class, message and
    traceback) are stored. The task must still be held under the claim it was
    polled with (its ``exec_id``); otherwise a :class:`TaskNotActiveError` subclass says
    what happened (already completed, made redundant, the claim was lost to an expiry,
    or ``task`` is an object that carries no claim because ``queue.poll`` did not return it).
    """
    return complete_many([task], decision)[0]


def complete_many(tasks: Sequence[Task], decision: Decision | Result | str) -> list[Task]:
    """Finish several ACTIVE tasks with the same decision in one statement; return them.

    All or nothing: if any task is no longer held under its claim, nothing is written
    and the error :func:`complete` would raise for that task is raised (complete the
    others one by one if you need to).
    """
    tasks = [check_task(task) for task in tasks]
    if not tasks:
        return []
    if not isinstance(decision, Decision):
        decision = Decision(Result.coerce(decision, "decision"))
    changes = {
        "state": decision.result.state,
        "message": decision.message,
        "error": format_exception(decision.exception),
        "finished_at": timezone.now(),
        "owner": None,
    }
    if not finish.complete(tasks, changes):
        for task in tasks:
            if not held([task]).exists():
                raise _claim_lost(task, "complete") from None
        raise TaskStateError("Cannot complete the batch: its tasks changed meanwhile.") from None
    for task in tasks:
        ended = task.state  # CANCELED if a cancel was requested (store.claims.end_claims)
        for field, value in changes.items():
            setattr(task, field, value)
        if ended == TaskState.CANCELED:
            task.state = TaskState.CANCELED
            task.message = (
                Task.objects.using(db.alias())
                .filter(pk=task.pk)
                .values_list("message", flat=True)
                .first()
            )
    return tasks


def release(
    task: Task,
    *,
    execute_at: datetime | None = None,
    refund_attempt: bool = False,
    decision: Decision | None = None,
) -> Task:
    """Give an ACTIVE task back to the queue (PENDING), optionally not before ``execute_at``.

    Used for retries (with a delay; ``decision`` keeps the failed attempt's message
    and error on the task) and by a stopping node for work it did not start
    (``refund_attempt`` undoes the attempt counted when it was polled).
    """
    task = check_task(task)
    execute_at = check_when(execute_at, "execute_at")
    changes: dict[str, Any] = {
        "state": TaskState.PENDING,
        "owner": None,
        "exec_id": None,
        "execute_at": execute_at,
    }
    if decision is not None:
        changes["message"] = decision.message
        changes["error"] = format_exception(decision.exception)
    if refund_attempt:
        changes["attempts"] = max(task.attempts - 1, 0)
    if not claims.release(task, changes):
        raise _claim_lost(task, "release")
    canceled = task.state == TaskState.CANCELED  # its cancel was requested: it ended
    for field, value in changes.items():
        setattr(task, field, value)
    if canceled:
        task.state = TaskState.CANCELED
    return task
