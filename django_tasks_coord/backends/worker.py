"""The worker side: how a ``runscheduler`` node runs a task enqueued through ``DatabaseBackend``.

Every such task names its Django task's dotted path as its handler; the task class
points the node's handler registry at :data:`DJANGO_TASK_TYPE` (plain Django ``Task``
objects reach it as their topic's consumer). Every attempt is logged
(:attr:`DjangoTaskType.logs_every_attempt`): the node begins its entry
``{attempt, worker_id, started_at}`` and writes it once the attempt has run for a
moment (:meth:`~django_tasks_coord.node.completer.Completer.starting`). Then
:func:`execute`

1. sends ``task_started``;
2. calls the function (a coroutine function through ``async_to_sync``; with a
   timeout, in a watched thread or under ``asyncio.timeout``);
3. returns its outcome in a :class:`~django_tasks_coord.enums.Decision`, writing
   nothing: on success the return value (``value``) and the attempt's entry
   (``attempt``), which the node's completer writes with the completion (one ``UPDATE``
   for every task the workers finished meanwhile); on failure the exception, its class
   and traceback in the entry, which the node writes before it retries or fails the
   task with the task's retry policy.

``task_finished`` is sent once the task is finished for good (``on_outcome``).
"""

from __future__ import annotations

import asyncio
import contextvars
import ctypes
import functools
import json
import logging
import threading
from collections.abc import Callable
from datetime import datetime
from inspect import iscoroutinefunction
from typing import Any

from asgiref.sync import async_to_sync
from django.db import connections
from django.utils.module_loading import import_string

from django_tasks_coord import attempts, running
from django_tasks_coord.backends.compat import (
    Task,
    TaskContext,
    normalize_json,
    task_backends,
    task_finished,
    task_started,
)
from django_tasks_coord.backends.results import to_result
from django_tasks_coord.enums import Decision, ErrorPolicy, Result
from django_tasks_coord.exceptions import TaskTimeoutError
from django_tasks_coord.handlers import TaskType
from django_tasks_coord.models import Task as TaskRow
from django_tasks_coord.retry import DEFAULT_RETRY, RetryPolicy

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=256)
def _stored_policy(items: tuple[tuple[str, Any], ...]) -> RetryPolicy:
    """The retry policy a task was enqueued with, from its payload's ``retry`` items; read
    once per distinct policy (every task of a ``@task`` stores the same)."""
    try:
        return RetryPolicy(**dict(items))
    except (TypeError, ValueError):
        return DEFAULT_RETRY


#: By alias: the ``TASKS`` backends configured (a new dict once the setting changes) and
#: the class of that alias's backend.
_backend_classes: dict[str, tuple[Any, type]] = {}


def _backend_class(alias: str) -> type:
    """The class of backend ``alias`` (the sender of Django's task signals), looked up once
    per alias and setting rather than through ``task_backends``' per-thread lock twice per
    task."""
    configured = task_backends.settings  # replaced by Django when TASKS changes
    known = _backend_classes.get(alias)
    if known is None or known[0] is not configured:
        known = _backend_classes[alias] = (configured, type(task_backends[alias]))
    return known[1]


def _payload(row: TaskRow) -> dict[str, Any]:
    return row.payload if isinstance(row.payload, dict) else {}


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

    context = contextvars.copy_context()  # the task's run (cancel flag, progress) goes along
    thread = threading.Thread(
        target=context.run, args=(target,), name="task-with-timeout", daemon=True
    )
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        _interrupt(thread)
        raise TaskTimeoutError(f"The task ran longer than its timeout of {timeout}s.")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


class CoordTaskContext(TaskContext):  # type: ignore[type-arg]
    """Django's ``TaskContext`` (``@task(takes_context=True)``), plus what a task running
    on this backend can ask and tell (see :mod:`django_tasks_coord.running`)."""

    __slots__ = ()

    def cancel_requested(self) -> bool:
        """Whether the task was canceled while it runs (the node learns it within a heartbeat)."""
        return running.cancel_requested()

    def raise_if_canceled(self) -> None:
        """A checkpoint: raise :class:`~django_tasks_coord.exceptions.TaskCanceledError` if
        the task was canceled; let it propagate, and the task ends canceled."""
        running.raise_if_canceled()

    def report_progress(self, value: Any) -> None:
        """Report the task's progress (a small JSON value): ``TaskResult.progress``."""
        running.report_progress(value)

    def checkpoint(self, name: str, value: Any) -> None:
        """Store a JSON value under ``name``, durably, under this attempt's claim
        (:func:`django_tasks_coord.running.checkpoint`)."""
        running.checkpoint(name, value)

    def checkpoints(self) -> dict[str, Any]:
        """What this task stored, in this attempt and earlier ones
        (:func:`django_tasks_coord.running.checkpoints`)."""
        return running.checkpoints()

    def step(self, name: str, func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``func(*args, **kwargs)`` once for this task: the value stored by an earlier
        attempt, else its result, stored (:func:`django_tasks_coord.running.step`)."""
        return running.step(name, func, *args, **kwargs)


def execute(row: TaskRow) -> Decision:
    """Run one attempt of a Django task and return its outcome (see the module docstring);
    never raises, writes nothing."""
    payload = _payload(row)
    owner = row.owner if row.owner_id is not None else None
    worker_id = owner.name if owner is not None else ""
    entry = attempts.begin(row, worker_id)  # begun by the node already, as a rule
    try:
        task = import_string(payload["task"])
        if not isinstance(task, Task):
            raise TypeError(f"{payload['task']!r} is not a Django task.")
        sender = _backend_class(payload["backend"])
        result = to_result(row, task)
        task_started.send(sender, task_result=result)
        args = list(payload.get("args", []))
        if task.takes_context:
            args.insert(0, CoordTaskContext(task_result=result))
        value = call_with_timeout(
            task.func, args, payload.get("kwargs", {}), payload.get("timeout")
        )
        value = normalize_json(value)
        json.dumps(value, allow_nan=False)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - every failure is the task's, recorded below
        return Decision(Result.FAILURE, exception=exc, attempt=entry.failed(exc))
    return Decision(Result.SUCCESS, value=value, attempt=entry.end("succeeded"))


class DjangoTaskType(TaskType):
    """Runs Django tasks with the retry policy each one was enqueued with."""

    logs_every_attempt = True  # execute() returns each attempt's entry

    def _policy(self, task: TaskRow) -> RetryPolicy:
        data = _payload(task).get("retry")
        if not isinstance(data, dict):
            return DEFAULT_RETRY
        try:
            return _stored_policy(tuple(sorted(data.items())))
        except TypeError:  # a value that is not hashable: not a policy this backend stored
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

    def on_outcome(self, task: TaskRow, decision: Decision) -> None:
        """Send Django's ``task_finished`` (the node calls it once the outcome is written)."""
        payload = _payload(task)
        try:
            sender = _backend_class(payload["backend"])
            task_finished.send(sender, task_result=to_result(task))
        except Exception:
            logger.exception("Sending task_finished for %s failed.", task)


#: The one task type of every Django task (named per handler path by the registry).
DJANGO_TASK_TYPE = DjangoTaskType(
    name="django.tasks", func=execute, error_policy=ErrorPolicy.LOG_AND_CONTINUE
)
