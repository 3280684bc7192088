"""What an enqueue writes: the READY result, the checked payloads, and the rows.

:class:`~django_tasks_coord.backends.DatabaseBackend` builds a result per call
(:func:`ready`), checks and turns them into ``(identifier, payload)`` items before
anything is written (:func:`checked_items`), and writes them (:func:`write`): calls
without a unique key through the task store's :func:`~django_tasks_coord.store.insert.append`
(one statement, no ``Task`` objects), the others through
:func:`queue.push_many <django_tasks_coord.queue.push_many>` with their insertion mode.
"""

from __future__ import annotations

import dataclasses
import functools
from datetime import datetime
from typing import Any

from django_tasks_coord import queue, topics
from django_tasks_coord.backends import limits
from django_tasks_coord.backends.compat import Task, TaskResult, TaskResultStatus
from django_tasks_coord.backends.tasks import CoordTask
from django_tasks_coord.enums import Insertion
from django_tasks_coord.retry import RetryPolicy
from django_tasks_coord.store import insert as store_insert
from django_tasks_coord.validation import check_identifier, check_payload, check_when


def retry_data(policy: RetryPolicy) -> dict[str, Any]:
    """A retry policy as stored in a task's payload."""
    return dict(_retry_data(policy))


@functools.lru_cache(maxsize=64)
def _retry_data(policy: RetryPolicy) -> dict[str, Any]:
    data = dataclasses.asdict(policy)
    data["backoff"] = str(policy.backoff)
    return data


def ready(backend: str, task: Task, identifier: str, args: Any, kwargs: Any) -> TaskResult:  # type: ignore[type-arg]
    """The READY result of one call of ``task`` on the backend named ``backend``."""
    return TaskResult(
        task=task,
        id=identifier,
        status=TaskResultStatus.READY,
        enqueued_at=None,
        started_at=None,
        last_attempted_at=None,
        finished_at=None,
        args=list(args),
        kwargs=dict(kwargs),
        backend=backend,
        errors=[],
        worker_ids=[],
    )


@dataclasses.dataclass
class Items:
    """The checked payloads of an enqueue: what every call shares, and each call's arguments."""

    shared: dict[str, Any]  # task, backend, run_after, retry, timeout
    rows: list[tuple[str, dict[str, Any]]]  # (result id, {"args": ..., "kwargs": ...})

    def payloads(self) -> list[tuple[str, dict[str, Any]]]:
        """Each call's whole payload (task, backend, args, kwargs, run_after, retry, timeout)."""
        head = {key: self.shared[key] for key in ("task", "backend")}
        tail = {key: value for key, value in self.shared.items() if key not in head}
        return [(identifier, {**head, **arguments, **tail}) for identifier, arguments in self.rows]


def checked_items(
    backend: str,
    task: Task,  # type: ignore[type-arg]
    results: list[TaskResult],  # type: ignore[type-arg]
    policy: RetryPolicy,
    default_timeout: float | None,
) -> Items:
    """The payloads of ``results``, checked as ``queue.push`` checks a payload."""
    check_when(task.run_after, "run_after")
    timeout = task.timeout if isinstance(task, CoordTask) else None
    shared = {
        "task": task.module_path,
        "backend": backend,
        "run_after": task.run_after.isoformat() if task.run_after else None,
        "retry": retry_data(policy),
        "timeout": timeout if timeout is not None else default_timeout,
    }
    rows = []
    for result in results:
        check_identifier(result.id)
        arguments = {"args": result.args, "kwargs": result.kwargs}
        check_payload(arguments)  # the rest of the payload is this backend's own
        rows.append((result.id, arguments))
    return Items(shared, rows)


def write(
    task: Task,  # type: ignore[type-arg]
    results: list[TaskResult],  # type: ignore[type-arg]
    items: Items,
    insertion: Insertion,
) -> list[datetime | None]:
    """Write the rows of ``items`` to the task's queue; each result's creation time.

    A function with ``rate`` or ``concurrency`` has them written to its queue's topic first
    (:func:`~django_tasks_coord.backends.limits.ensure`). APPEND (no unique key): one statement of the task store without ``Task`` objects, the
    shared part of the payloads sent once; the other insertion modes through
    ``queue.push_many`` (None for a result whose row a later call of the batch deleted, as
    its enqueue one by one would have).
    """
    name = task.queue_name
    handler = task.module_path if isinstance(task, CoordTask) else ""
    limits.ensure(task)  # the function's own rate and concurrency, if it has some
    if insertion is Insertion.APPEND:
        created: list[datetime | None] = list(
            topics.registering(
                name,
                lambda: topics.adding_tasks(
                    name,
                    lambda: store_insert.append(
                        name,
                        items.rows,
                        defaults=items.shared,
                        priority=task.priority,
                        execute_at=task.run_after,
                        handler=handler,
                    ),
                ),
            )
        )
        return created
    rows = topics.registering(
        name,
        lambda: queue.push_many(
            name,
            items.payloads(),
            insertion=insertion,
            priority=task.priority,
            execute_at=task.run_after,
            handler=handler,
        ),
    )
    latest = {row.identifier: row.created_at for row in rows}
    return [latest.get(result.id) for result in results]
