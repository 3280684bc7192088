"""The worker side: how a ``runscheduler`` node runs a task enqueued through ``DatabaseBackend``.

Every such task names its Django task's dotted path as its handler; the task class
points the node's handler registry at :data:`DJANGO_TASK_TYPE` (plain Django ``Task``
objects reach it as their topic's consumer). For each attempt the worker

1. appends ``{attempt, worker_id, started_at}`` to ``Task.attempt_log`` (fenced by
   the claim, so a lost claim writes nothing; not waited for, and only once the attempt
   has run for a moment, see :mod:`~django_tasks_coord.backends.writer`) and sends
   ``task_started``;
2. calls the function (a coroutine function through ``async_to_sync``; with a
   timeout, in a watched thread or under ``asyncio.timeout``);
3. on success completes the task, return value and log together (one ``UPDATE`` for
   every task the workers finished meanwhile; the node counts it done once written);
   on failure records the exception and traceback in the log and lets the node retry
   or fail it with the task's retry policy.

``task_finished`` is sent once the task is finished for good (``on_outcome``).
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import threading
from collections.abc import Callable
from datetime import datetime
from inspect import iscoroutinefunction
from typing import Any

from asgiref.sync import async_to_sync
from django.db import connections
from django.utils import timezone
from django.utils.module_loading import import_string

from django_tasks_coord import db
from django_tasks_coord.backends.compat import (
    Task,
    TaskContext,
    normalize_json,
    task_backends,
    task_finished,
    task_started,
)
from django_tasks_coord.backends.results import close_lost, failed_entry, to_result
from django_tasks_coord.backends.writer import START_DELAY, Write, writer
from django_tasks_coord.enums import Decision, ErrorPolicy, Result, TaskState
from django_tasks_coord.exceptions import TaskTimeoutError
from django_tasks_coord.handlers import TaskType
from django_tasks_coord.models import Task as TaskRow
from django_tasks_coord.retry import DEFAULT_RETRY, RetryPolicy

logger = logging.getLogger(__name__)


def _payload(row: TaskRow) -> dict[str, Any]:
    return row.payload if isinstance(row.payload, dict) else {}


def _held(row: TaskRow) -> Any:
    """The row, as long as this worker still holds it under its claim."""
    return TaskRow.objects.using(db.alias()).filter(
        pk=row.pk, exec_id=row.exec_id, state=TaskState.ACTIVE
    )


def _interrupt(thread: threading.Thread) -> None:
    """Raise :class:`TaskTimeoutError` in ``thread`` at its next Python instruction (best effort)."""
    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(thread.ident), ctypes.py_object(TaskTimeoutError)
        )


def call_with_timeout(
    func: Callable[..., Any], args: list[Any], kwargs: dict[str, Any], timeout: float | None
) -> Any:
    """Call ``func`` (sync or async); raise :class:`TaskTimeoutError` after ``timeout`` seconds.

    A coroutine is cancelled at its next ``await``. A sync function runs in a thread
    of its own that is interrupted (an exception raised in it at its next Python
    instruction; a blocking C call finishes first); the worker does not wait for it.
    """
    if iscoroutinefunction(func):

        async def run() -> Any:
            if timeout is None:
                return await func(*args, **kwargs)
            try:
                async with asyncio.timeout(timeout):
                    return await func(*args, **kwargs)
            except TimeoutError as exc:
                raise TaskTimeoutError(
                    f"The task ran longer than its timeout of {timeout}s."
                ) from exc

        return async_to_sync(run)()
    if timeout is None:
        return func(*args, **kwargs)
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = func(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the worker below
            outcome["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=target, name="task-with-timeout", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        _interrupt(thread)
        raise TaskTimeoutError(f"The task ran longer than its timeout of {timeout}s.")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def execute(row: TaskRow) -> Decision:
    """Run one attempt of a Django task (see the module docstring); never raises."""
    payload = _payload(row)
    owner = row.owner if row.owner_id is not None else None
    log = close_lost(list(row.attempt_log or []), timezone.now(), row.attempts - 1)
    entry: dict[str, Any] = {
        "attempt": row.attempts,
        "worker_id": owner.name if owner is not None else "",
        "started_at": timezone.now().isoformat(),
    }
    log.append(entry)
    # A copy (the entry changes as the attempt goes on); not waited for: see the writer.
    writer.submit(row, {"attempt_log": [dict(e) for e in log]}, delay=START_DELAY)
    row.attempt_log = log
    try:
        task = import_string(payload["task"])
        if not isinstance(task, Task):
            raise TypeError(f"{payload['task']!r} is not a Django task.")
        backend = task_backends[payload["backend"]]
        result = to_result(row, task)
        task_started.send(type(backend), task_result=result)
        args = list(payload.get("args", []))
        if task.takes_context:
            args.insert(0, TaskContext(task_result=result))
        value = call_with_timeout(
            task.func, args, payload.get("kwargs", {}), payload.get("timeout")
        )
        value = normalize_json(value)
        json.dumps(value, allow_nan=False)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - every failure is the task's, recorded below
        entry.update(finished_at=timezone.now().isoformat(), **failed_entry(exc))
        if writer.submit(row, {"attempt_log": log}).wait() is None:
            _held(row).update(attempt_log=log)  # the batch failed: write it alone
        return Decision(Result.FAILURE, exception=exc)
    entry.update(finished_at=timezone.now().isoformat(), outcome="succeeded")
    changes: dict[str, Any] = {
        "state": TaskState.SUCCEEDED,
        "result": value,
        "attempt_log": log,
        "owner": None,
        "message": None,
        "error": None,
    }
    # Completed in memory now, in the database by the writer; the node's completer waits
    # for that write (outcome_committed) before the task counts as done or is signalled.
    write = writer.submit(row, changes)
    for name, new in changes.items():
        setattr(row, name, new)
    row._outcome_write = write  # type: ignore[attr-defined]
    return Decision(Result.SUCCESS)


class DjangoTaskType(TaskType):
    """Runs Django tasks with the retry policy each one was enqueued with."""

    keeps_attempt_log = True  # execute() writes it

    def _policy(self, task: TaskRow) -> RetryPolicy:
        data = _payload(task).get("retry")
        try:
            return RetryPolicy(**data) if isinstance(data, dict) else DEFAULT_RETRY
        except (TypeError, ValueError):
            return DEFAULT_RETRY

    def max_attempts_for(self, task: TaskRow) -> int:
        """The attempts the task was enqueued with."""
        return self._policy(task).max_attempts

    def retry_at(self, task: TaskRow, decision: Decision, now: datetime) -> datetime | None:
        """When to run a failed attempt again (its own policy's backoff); None: fail it."""
        policy = self._policy(task)
        if not policy.can_retry(task.attempts):
            return None
        return now + policy.delay(task.attempts)

    def outcome_committed(self, task: TaskRow) -> bool:
        """Wait for the outcome's write (a success): whether it is committed."""
        write: Write | None = getattr(task, "_outcome_write", None)
        if write is not None:
            written = write.wait()
            if written is None:  # the batch failed: complete it alone
                changes = {**write.changes, "finished_at": timezone.now()}
                update = _held(task).update
                written = (
                    db.retry_while_lost(lambda: update(**changes), what="Writing an outcome") == 1
                )
            if not written:
                logger.warning(
                    "Task %s succeeded but its outcome was not stored: its claim was lost "
                    "(replaced, cancelled, or handed to another node).",
                    task,
                )
                return False
            task.finished_at = write.changes["finished_at"] or task.finished_at
        return True

    def on_outcome(self, task: TaskRow, decision: Decision) -> None:
        """Send Django's ``task_finished`` (the outcome is committed: :meth:`outcome_committed`)."""
        payload = _payload(task)
        try:
            backend = task_backends[payload["backend"]]
            task_finished.send(type(backend), task_result=to_result(task))
        except Exception:
            logger.exception("Sending task_finished for %s failed.", task)


#: The one task type of every Django task (named per handler path by the registry).
DJANGO_TASK_TYPE = DjangoTaskType(
    name="django.tasks", func=execute, error_policy=ErrorPolicy.LOG_AND_CONTINUE
)
